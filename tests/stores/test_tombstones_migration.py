"""Revision 0011 (the purge's tombstones, ``scheduler_purged``): up, down, and up again."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, inspect, text

from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore, head_revision, schema_revision, upgrade_schema

from .migrations import migrate_to

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
PURGED = "scheduler_purged"
BY_PURGED_AT = "ix_scheduler_purged_purged_at"


def tables(uri: str) -> set[str]:
    engine = create_engine(uri)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def tombstone_table(uri: str) -> tuple[dict[str, bool], set[str], list[str]]:
    """The columns of ``scheduler_purged`` (name: nullable), its indexes, its key."""
    engine = create_engine(uri)
    try:
        schema = inspect(engine)
        columns = {c["name"]: c["nullable"] for c in schema.get_columns(PURGED)}
        indexes = {str(i["name"]) for i in schema.get_indexes(PURGED)}
        key = list(schema.get_pk_constraint(PURGED)["constrained_columns"])
    finally:
        engine.dispose()
    return columns, indexes, key


def ended(job_id: str) -> JobRecord:
    return JobRecord(id=job_id, status=Status.COMPLETED, created=T0, updated=T0)


@pytest.mark.postgres
def test_0011_adds_the_tombstones_and_its_downgrade_removes_them(empty_postgres_uri: str) -> None:
    migrate_to(empty_postgres_uri, "0010")
    assert PURGED not in tables(empty_postgres_uri)
    engine = create_engine(empty_postgres_uri)
    with engine.begin() as conn:  # a job ended under the previous release
        conn.execute(
            text(
                "INSERT INTO scheduler_jobs (id, channel_id, status, version, created, updated,"
                " state) VALUES ('old', 'default', 'Completed', 2, :t, :t, '{}')"
            ),
            {"t": T0},
        )
    engine.dispose()

    migrate_to(empty_postgres_uri, "0011")
    assert schema_revision(empty_postgres_uri) == "0011"
    assert tombstone_table(empty_postgres_uri) == (
        {"job_id": False, "purged_at": False},
        {BY_PURGED_AT},
        ["job_id"],
    )
    upgrade_schema(empty_postgres_uri)  # the later revisions, which the store needs
    store = SqlJobStore(empty_postgres_uri)
    try:
        assert not store.was_purged("old")  # purged before 0011 would have no tombstone
        assert store.put(ended("new"))
        assert sorted(store.purge(Status.COMPLETED, T0 + timedelta(days=1), 10)) == ["new", "old"]
        assert store.was_purged("old") and store.was_purged("new")
    finally:
        store.close()

    migrate_to(empty_postgres_uri, "0010", down=True)
    assert schema_revision(empty_postgres_uri) == "0010"
    assert PURGED not in tables(empty_postgres_uri)
    assert "scheduler_jobs" in tables(empty_postgres_uri)

    assert upgrade_schema(empty_postgres_uri) == head_revision()
    store = SqlJobStore(empty_postgres_uri)
    try:
        assert not store.was_purged("old")  # the tombstones went with the table
        assert store.put(ended("later"))
        assert store.purge(Status.COMPLETED, T0 + timedelta(days=1), 10) == ["later"]
        assert store.was_purged("later")
    finally:
        store.close()
