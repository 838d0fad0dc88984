"""The SQL store's one classification of failures: what retrying cannot cure is a
``StoreDataError``, an outage a ``StoreUnavailableError`` (real servers).

Found with real workers: a NUL refused by PostgreSQL was a plain ``StoreError``
(the step was left to its lease, forever), and a CHECK refusal on MariaDB an
"unavailable" store (the message was deferred forever).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from refusals import POISON, refusing
from services import PostgresServer

from pypepper_dramatiq import JobRecord, Status
from pypepper_dramatiq.errors import (
    DuplicateJobError,
    StoreDataError,
    StoreUnavailableError,
    retry_may_cure,
)
from pypepper_dramatiq.stores.sql import SqlJobStore


def new_record(**fields: Any) -> JobRecord:
    return JobRecord(
        id=uuid.uuid4().hex,
        channel_id="data-errors",
        status=Status.SCHEDULED,
        payload={"workflows": []},
        **fields,
    )


def stored_in_progress(store: SqlJobStore) -> JobRecord:
    """A row as a claim leaves it: the kind of row an outcome write updates."""
    record = new_record()
    assert store.put(record)
    row = store.get(record.id)
    assert row is not None
    return row.evolve(status=Status.IN_PROGRESS)


def refused(call: Any) -> StoreDataError:
    with pytest.raises(StoreDataError) as caught:
        call()
    assert not retry_may_cure(caught.value)
    return caught.value


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_nul_postgresql_refuses_is_a_data_error_on_every_path(pg_store: SqlJobStore) -> None:
    # The hot statements go straight to psycopg (put, advance); the others through
    # SQLAlchemy (advance_many): both are classified alike.
    exc = refused(lambda: pg_store.put(new_record(error="a\x00b")))
    assert isinstance(exc.__cause__, psycopg.DataError)
    assert "NUL" in str(exc)
    row = stored_in_progress(pg_store)
    refused(lambda: pg_store.advance(row.evolve(state={"errors": {"0.0": "a\x00b"}})))
    refused(lambda: pg_store.advance_many([row.evolve(error="a\x00b")]))
    assert pg_store.get(row.id) == row.evolve(status=Status.SCHEDULED)  # nothing written


@pytest.mark.postgres
def test_unencodable_text_and_a_value_too_long_are_data_errors(pg_store: SqlJobStore) -> None:
    row = stored_in_progress(pg_store)
    exc = refused(lambda: pg_store.advance(row.evolve(error="lone \udc80")))
    assert "U+DC80" in str(exc)
    refused(lambda: pg_store.advance(row.evolve(state={"e": "lone \udc80"})))
    refused(lambda: pg_store.advance(row.evolve(lease_owner="w" * 300)))
    refused(lambda: pg_store.advance(row.evolve(state={"n": float("nan")})))


@pytest.mark.postgres
def test_a_check_refusal_is_a_data_error_and_a_taken_key_stays_a_duplicate(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    row = stored_in_progress(pg_store)
    with refusing(postgres_uri):
        exc = refused(lambda: pg_store.advance(row.evolve(state={"results": {"0.0": POISON}})))
        assert isinstance(exc.__cause__, psycopg.errors.CheckViolation)
    # The unique key refusal the store answers itself is not a data error.
    assert pg_store.put(new_record(unique_key="k"))
    with pytest.raises(DuplicateJobError):
        pg_store.put(new_record(unique_key="k"))


@pytest.mark.postgres
def test_a_stopped_server_is_an_outage_not_a_data_error(own_postgres: PostgresServer) -> None:
    store = SqlJobStore(own_postgres.uri, migrate=True)
    try:
        row = stored_in_progress(store)
        own_postgres.stop()
        for call in (
            lambda: store.get(row.id),
            lambda: store.advance(row),
            lambda: store.advance_many([row]),
        ):
            with pytest.raises(StoreUnavailableError) as caught:
                call()
            assert retry_may_cure(caught.value)
    finally:
        store.close()


# -- group commit ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "store_fixture, uri_fixture",
    [
        pytest.param("pg_store", "postgres_uri", marks=pytest.mark.postgres),
        pytest.param("mysql_store", "mysql_uri", marks=pytest.mark.mysql),
    ],
)
def test_a_batch_with_one_refused_row_writes_the_others(
    request: pytest.FixtureRequest, store_fixture: str, uri_fixture: str
) -> None:
    # One statement for all rows would be refused whole: the rows of others
    # (other threads' outcomes) must not share one row's refusal.
    store: SqlJobStore = request.getfixturevalue(store_fixture)
    good, bad, other = (stored_in_progress(store) for _ in range(3))
    with refusing(str(request.getfixturevalue(uri_fixture))):
        answers = store.advance_each(
            [
                good.evolve(error="fine"),
                bad.evolve(state={"results": {"0.0": POISON}}),
                other.evolve(error="fine too"),
            ]
        )
    assert answers[0] is True and answers[2] is True
    assert isinstance(answers[1], StoreDataError)
    assert [store.get(r.id).error for r in (good, bad, other)] == ["fine", None, "fine too"]  # type: ignore[union-attr]


# -- MariaDB ---------------------------------------------------------------------------------


@pytest.mark.mysql
def test_mariadb_keeps_a_nul_as_it_was_given(mysql_store: SqlJobStore) -> None:
    row = stored_in_progress(mysql_store)
    assert mysql_store.advance(row.evolve(error="a\x00b", state={"note": "c\x00d"}))
    read = mysql_store.get(row.id)
    assert read is not None
    assert (read.error, read.state["note"]) == ("a\x00b", "c\x00d")


@pytest.mark.mysql
def test_mariadb_refusals_are_data_errors_not_outages(
    mysql_store: SqlJobStore, mysql_uri: str
) -> None:
    row = stored_in_progress(mysql_store)
    # MariaDB's JSON check on state is a CHECK constraint: error 4025, which
    # PyMySQL raises as an OperationalError (once taken for an outage).
    refused(lambda: mysql_store.advance(row.evolve(state={"e": "lone \udc80"})))
    refused(lambda: mysql_store.advance(row.evolve(error="lone \udc80")))
    refused(lambda: mysql_store.advance(row.evolve(lease_owner="w" * 300)))
    with refusing(mysql_uri):
        refused(lambda: mysql_store.advance(row.evolve(state={"results": {"0.0": POISON}})))
    assert mysql_store.get(row.id) == row.evolve(status=Status.SCHEDULED)
    assert mysql_store.put(new_record(unique_key="k"))
    with pytest.raises(DuplicateJobError):
        mysql_store.put(new_record(unique_key="k"))
