"""Revision 0014 (the charts' rollup, ``scheduler_activity`` and its mark): up,
down and up again, over a database that already holds ended jobs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, inspect

from pypepper_dramatiq.records.activity import Activity, ActivityMark
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore, schema_revision, upgrade_schema

from .migrations import migrate_to

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
ACTIVITY, MARK = "scheduler_activity", "scheduler_activity_mark"
#: This revision's id and the one before it (a plain string: renumbered at merge if need be).
REVISION, BEFORE = "0014", "0013"


def tables(uri: str) -> set[str]:
    engine = create_engine(uri)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def key_of(uri: str, table: str) -> list[str]:
    engine = create_engine(uri)
    try:
        return list(inspect(engine).get_pk_constraint(table)["constrained_columns"])
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_0014_adds_the_rollup_and_its_downgrade_removes_it(empty_postgres_uri: str) -> None:
    migrate_to(empty_postgres_uri, BEFORE)
    assert not {ACTIVITY, MARK} & tables(empty_postgres_uri)
    migrate_to(empty_postgres_uri, REVISION)
    assert {ACTIVITY, MARK} <= tables(empty_postgres_uri)
    assert key_of(empty_postgres_uri, ACTIVITY) == ["span_minutes", "at_minute", "channel_id"]
    assert schema_revision(empty_postgres_uri) == REVISION
    upgrade_schema(empty_postgres_uri)  # the later revisions, which the store needs
    store = SqlJobStore(empty_postgres_uri)
    try:
        ended = JobRecord(id="old", status=Status.COMPLETED, created=T0, updated=T0)
        assert store.put(ended)
        # Nothing is filled in for the ends before it: the charts count those from the table.
        assert store.activity_mark() is None
        mark = ActivityMark(T0, T0 + timedelta(minutes=1))
        assert store.add_activity({(T0, "default"): Activity(ended=(1, 0, 0))}, moved=(None, mark))
        assert store.activity(T0, T0 + timedelta(hours=1), 3600)[0, "default"].ended == (1, 0, 0)
    finally:
        store.close()
    migrate_to(empty_postgres_uri, BEFORE, down=True)
    assert not {ACTIVITY, MARK} & tables(empty_postgres_uri)
    migrate_to(empty_postgres_uri, REVISION)
    assert {ACTIVITY, MARK} <= tables(empty_postgres_uri)
