"""A SQL store writing through the caller's connection (``IJobStore.within``) keeps the
rules of ``put`` on PostgreSQL and MariaDB: insert, update a stored row under its
version, refuse a stale one; visible only once the caller commits."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SQL_STORES = [
    pytest.param("pg_store", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql_store", marks=pytest.mark.mysql, id="mysql"),
]


@pytest.fixture(params=SQL_STORES)
def store(request: pytest.FixtureRequest) -> SqlJobStore:
    found = request.getfixturevalue(request.param)
    assert isinstance(found, SqlJobStore)
    return found


@pytest.fixture
def app_engine(store: SqlJobStore) -> Iterator[Engine]:
    """The application's own engine on the job store's database."""
    made = create_engine(store.engine.url)
    yield made
    made.dispose()


def job(**fields: Any) -> JobRecord:
    fields.setdefault("created", T0)
    fields.setdefault("updated", T0)
    fields.setdefault("status", Status.SCHEDULED)
    return JobRecord(id="within-1", **fields)


def test_a_put_of_a_stored_row_updates_it_in_the_caller_s_transaction(
    store: SqlJobStore, app_engine: Engine
) -> None:
    assert store.put(job())
    with app_engine.begin() as connection:
        mine = store.within(connection)
        assert mine.put(job(version=1, state={"n": 1})) is True
        assert mine.put(job(version=1, state={"n": 2})) is False  # stale now: refused
        assert mine.get("within-1").state == {"n": 1}  # type: ignore[union-attr]
    after = store.get("within-1")
    assert after is not None and after.version == 2 and after.state == {"n": 1}


def test_a_rolled_back_put_leaves_the_stored_row_as_it_was(
    store: SqlJobStore, app_engine: Engine
) -> None:
    assert store.put(job())
    connection = app_engine.connect()
    try:
        transaction = connection.begin()
        assert store.within(connection).put(job(version=1, state={"n": 1}))
        transaction.rollback()
    finally:
        connection.close()
    after = store.get("within-1")
    assert after is not None and after.version == 1 and after.state == {}
