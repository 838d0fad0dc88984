"""PostgreSQL's batched claim and outcome write find their rows by primary key, whatever
the table's statistics say.

A burst lands on a table whose statistics are older than it (a new installation, a
backlog larger than autovacuum's threshold, within its nap): joined with the rows of
a JSON parameter (which the planner guesses at 100), the batch statements read every
Scheduled or InProgress row by a hash join, so each claim cost grew with the backlog.
Each plan here is read with ``EXPLAIN ANALYZE`` (no timing): no scan of the job table
may return more rows than the batch holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import StepClaim
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.stores.sql.mapping import pg_advance_rows, pg_claim_rows
from pypepper_dramatiq.stores.sql.statements import PG_ADVANCE_MANY, PG_CLAIM_MANY

from .test_store_contract import T0, job

#: Scheduled rows in the table beside the batch: the backlog a claim must not read.
BACKLOG = 3000
#: Rows of one batch.
BATCH = 12
START = [0, 0, 0, 0]
NOW = T0 + timedelta(minutes=1)


def scans_of_jobs(plan: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """Each node of ``plan`` that reads ``scheduler_jobs``: its kind and the rows it
    returned over all its loops."""
    if plan.get("Relation Name") == "scheduler_jobs" and "Scan" in plan["Node Type"]:
        yield plan["Node Type"], plan["Actual Rows"] * plan["Actual Loops"]
    for child in plan.get("Plans", ()):
        yield from scans_of_jobs(child)


def explained(store: SqlJobStore, sql: str, params: dict[str, Any]) -> list[tuple[str, int]]:
    """The job-table scans of ``sql`` run once with ``params``, then rolled back."""
    connection = store.engine.raw_connection()
    try:
        driver = connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        with psycopg.ClientCursor(driver) as cursor:
            cursor.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params)
            row = cursor.fetchone()
        driver.rollback()
    finally:
        connection.close()
    assert row is not None
    return list(scans_of_jobs(row[0][0]["Plan"]))


@pytest.fixture(params=["stale statistics", "fresh statistics"])
def backlog(request: pytest.FixtureRequest, pg_store: SqlJobStore) -> SqlJobStore:
    """``pg_store`` holding BACKLOG Scheduled jobs, with statistics taken when the table
    was empty (as after a burst), or taken afresh."""
    with pg_store.engine.begin() as connection:
        connection.execute(text("ANALYZE scheduler_jobs"))
    for first in range(0, BACKLOG, 1000):
        pg_store.put_many(
            [
                job(f"job-{n:05d}", status=Status.SCHEDULED, state={"cursor": START})
                for n in range(first, first + 1000)
            ]
        )
    if request.param == "fresh statistics":
        with pg_store.engine.begin() as connection:
            connection.execute(text("ANALYZE scheduler_jobs"))
    return pg_store


def claims() -> list[StepClaim]:
    lease = NOW + timedelta(seconds=30)
    return [StepClaim(f"job-{n:05d}", START, "me", NOW, lease, True) for n in range(BATCH)]


def test_a_batch_claim_reads_only_its_own_rows(backlog: SqlJobStore) -> None:
    scans = explained(backlog, PG_CLAIM_MANY, pg_claim_rows(claims(), range(BATCH)))
    assert scans, "the plan reads the job table"
    assert all(rows <= BATCH for _, rows in scans), scans


def test_a_batch_outcome_write_reads_only_its_own_rows(backlog: SqlJobStore) -> None:
    claimed = backlog.claim_steps(claims())
    ended = []
    for record in claimed:
        assert record is not None and not isinstance(record, Exception)
        ended.append(record.evolve(status=Status.COMPLETED, updated=NOW, lease_owner=None))
    scans = explained(backlog, PG_ADVANCE_MANY, pg_advance_rows(ended, range(BATCH)))
    assert scans, "the plan reads the job table"
    assert all(rows <= BATCH for _, rows in scans), scans
