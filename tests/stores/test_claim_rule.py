"""The claim rule's two forms agree: what Python refuses PostgreSQL does not claim.

The rule (:mod:`pypepper_dramatiq.stores.claims`) is each condition written in
Python (the memory store, MySQL's batch claims) and in PostgreSQL (the claiming
statements). Here every condition is evaluated both ways over the same rows, a
grid of the columns the rule reads, so that one form changed alone fails.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import delete, text

from pypepper_dramatiq.rules.start_times import is_retry
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores import claims
from pypepper_dramatiq.stores.base import JobRecord, why_not_claimable
from pypepper_dramatiq.stores.schema import jobs
from pypepper_dramatiq.stores.sql import SqlJobStore

NOW = datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc)
BEFORE, AFTER = NOW - timedelta(minutes=1), NOW + timedelta(minutes=1)
FIRST, RETRY = [0, 0, 0, 0], [0, 0, 0, 1]

#: The columns the rule reads, each over values on both sides of every bound.
STATUSES = (Status.SCHEDULED, Status.IN_PROGRESS, Status.COMPLETED)
AT = (FIRST, RETRY)
ASKED = (FIRST, RETRY, [0, 1, 0, 0])
LEASES = ((None, None), ("w", None), ("w", BEFORE), ("w", NOW), ("w", AFTER))
TIMES = (None, BEFORE, NOW, AFTER)
WAITING = (None, BEFORE)
START = (False, True)

#: The asked values as the columns of the unnest below.
ASKED_SQL = {"cursor": "c.cursor", "now": "c.now", "start": "c.start", "retry": "c.retry"}


def grid() -> list[tuple[JobRecord, tuple[list[int], datetime, bool]]]:
    cases = []
    for n, (status, at, asked, (owner, expires), deadline, not_before, since, start) in enumerate(
        itertools.product(STATUSES, AT, ASKED, LEASES, TIMES, TIMES, WAITING, START)
    ):
        record = JobRecord(
            id=f"claim-{n}",
            status=status,
            created=BEFORE,
            updated=BEFORE,
            state={"cursor": at},
            lease_owner=owner,
            lease_expires=expires,
            start_deadline=deadline,
            not_before=not_before,
            waiting_since=since,
        )
        cases.append((record, (asked, NOW, start)))
    return cases


def claimable_in_postgres(
    store: SqlJobStore, cases: list[tuple[JobRecord, tuple[list[int], datetime, bool]]], sql: str
) -> set[str]:
    """The ids of the rows meeting ``sql`` (over ``j.`` and the asked ``c.``)."""
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(
            "SELECT j.id FROM scheduler_jobs AS j JOIN unnest("
            "%(id)s::text[], %(cursor)s::text[], %(now)s::timestamptz[], %(start)s::bool[],"
            " %(retry)s::bool[]) AS c(id, cursor, now, start, retry) ON j.id = c.id"
            f" WHERE {sql}",
            {
                "id": [record.id for record, _ in cases],
                "cursor": [json.dumps(asked[0]) for _, asked in cases],
                "now": [asked[1] for _, asked in cases],
                "start": [asked[2] for _, asked in cases],
                "retry": [is_retry(asked[0]) for _, asked in cases],
            },
        )
        return {row[0] for row in cursor.fetchall()}
    finally:
        raw.close()


@pytest.mark.postgres
def test_each_condition_and_the_whole_rule_agree_in_python_and_postgres(
    pg_store: SqlJobStore,
) -> None:
    cases = grid()
    assert pg_store.put_many([record for record, _ in cases]) == [True] * len(cases)
    try:
        check_both_forms(pg_store, cases)
    finally:
        leave_the_table_compact(pg_store)


def leave_the_table_compact(store: SqlJobStore) -> None:
    """Delete the grid and VACUUM: thousands of dead rows would change where the
    next tests' rows land in the table, and so the order of what a statement
    without ORDER BY (a ``DELETE ... RETURNING``) answers them."""
    with store.engine.connect() as connection:  # autocommit: VACUUM runs outside a transaction
        connection.execute(delete(jobs))
        connection.execute(text("VACUUM scheduler_jobs"))


def check_both_forms(
    pg_store: SqlJobStore, cases: list[tuple[JobRecord, tuple[list[int], datetime, bool]]]
) -> None:
    for condition in (*claims.RUNNING, *claims.STARTING):
        in_python = {r.id for r, asked in cases if condition.refusal(r, asked) is None}
        in_sql = condition.postgres.format(row="j.", **ASKED_SQL)
        assert claimable_in_postgres(pg_store, cases, in_sql) == in_python, condition.postgres

    whole = claims.postgres_condition("j.", ASKED_SQL)
    claimable = {
        r.id for r, (at, now, start) in cases if why_not_claimable(r, at, now, start) is None
    }
    assert claimable_in_postgres(pg_store, cases, whole) == claimable
    # The grid reaches both answers of each branch.
    assert {r.status for r, _ in cases if r.id in claimable} == {
        Status.SCHEDULED,
        Status.IN_PROGRESS,
    }
    assert len(claimable) < len(cases)
