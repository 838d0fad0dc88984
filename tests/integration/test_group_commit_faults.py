"""Group commit when the store fails in the middle of a batch (PostgreSQL stopped).

Threads of one worker process line up behind a running batch and go together
in the next one; the server is stopped as that batch reaches it (or between its two
rounds). Every thread of the failed batch is told with a StoreError of its own
(a claim's caller then defers its message, an outcome's caller gets
OutcomeNotRecorded), a thread whose row was written before the failure gets its
answer, and after the restart nothing is lost: the rows the failure left alone
are as they were, and claimed or recorded on the next try.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from services import PostgresServer

from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import Claim, Outcome, OutcomeNotRecorded, StepIO
from pypepper_dramatiq.errors import StoreError
from pypepper_dramatiq.ops.group_commit import Combiner
from pypepper_dramatiq.records.record import JobRecord, utcnow
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

#: Threads lined up behind the first batch.
CALLERS = 5
AT = Position()  # the first step of a one-task job: [0, 0, 0, 0]


def task(name: str) -> dict[str, Any]:
    return {"name": name, "executor_id": "noop", "retry_count": 0}


@pytest.fixture
def store(own_postgres: PostgresServer) -> Iterator[SqlJobStore]:
    store = SqlJobStore(own_postgres.uri, migrate=True)
    yield store
    store.close()


def running(store: SqlJobStore, job_id: str) -> JobRecord:
    """A one-task job InProgress at its first step, free to claim."""
    now = utcnow()
    record = JobRecord(
        id=job_id,
        channel_id="c",
        status=Status.IN_PROGRESS,
        created=now,
        updated=now,
        payload={"workflows": [{"tasks": [task(job_id)]}]},
        state={"cursor": AT.to_list()},
    )
    assert store.put(record)
    stored = store.get(job_id)
    assert stored is not None
    return stored


class Gate:
    """Holds the first call of a store method until opened; runs ``then`` before the
    next call reaches the store (to stop the server as that batch runs)."""

    def __init__(self, real: Callable[..., Any], then: Callable[[], None]) -> None:
        self.real, self.then = real, then
        self.calls = 0
        self.entered, self.opened = threading.Event(), threading.Event()

    def __call__(self, rows: Sequence[Any]) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.opened.wait(30)
        elif self.calls == 2:
            self.then()
        return self.real(rows)


def line_up(
    combiner: Combiner[Any, Any], gate: Gate, calls: list[Callable[[], Any]]
) -> list[Future[Any]]:
    """Run ``calls[0]`` (held in its batch), then the rest, queued behind it together."""
    pool = ThreadPoolExecutor(len(calls))
    futures = [pool.submit(calls[0])]
    assert gate.entered.wait(30)
    futures += [pool.submit(call) for call in calls[1:]]
    deadline = time.monotonic() + 30
    while combiner.pending < len(calls) - 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    gate.opened.set()
    pool.shutdown(wait=True)
    return futures


def claimed(store: SqlJobStore) -> tuple[StepIO, list[Claim]]:
    """A book that writes each outcome once, and its claims of CALLERS + 1 running jobs."""
    rows = [running(store, f"job-{n}") for n in range(CALLERS + 1)]
    book = StepIO(lambda: store, "worker-1", lease_seconds=30, write_attempts=1)
    return book, [book.claim(StepMessage(row.id, AT)) for row in rows]


def test_claims_of_a_batch_the_server_fails_are_each_told_and_lost_nothing(
    store: SqlJobStore, own_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [running(store, f"job-{n}") for n in range(CALLERS + 1)]
    gate = Gate(store.claim_steps, lambda: own_postgres.stop())
    monkeypatch.setattr(store, "claim_steps", gate)
    book = StepIO(lambda: store, "worker-1", lease_seconds=30)
    steps = [StepMessage(row.id, AT) for row in rows]
    futures = line_up(book.claims, gate, [lambda s=s: book.claim(s) for s in steps])

    assert isinstance(futures[0].result(), Claim)  # its batch ran before the stop
    for future in futures[1:]:  # one failed batch: each of its callers told
        assert isinstance(future.exception(), StoreError)
    assert book.claims.stats.batches == 2 and book.claims.stats.largest == CALLERS

    own_postgres.start()
    for row in rows[1:]:
        assert store.get(row.id) == row  # untouched: the deferred messages will claim them
    claims = [book.claim(step) for step in steps[1:]]
    assert [c.record.lease_owner for c in claims] == ["worker-1"] * CALLERS


def test_outcomes_of_a_batch_failing_part_way_each_get_their_own_fate(
    store: SqlJobStore, own_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    book, claims = claimed(store)
    # The lined-up batch holds job-1 twice (a duplicate write, as a stale retry
    # would make): its first round is written, then the server stops before the
    # second round (the duplicate), whose caller alone is told.
    gate = Gate(store.advance_each, lambda: None)
    original_then_real = gate.real

    def stop_after_first_round(records: Sequence[JobRecord]) -> Any:
        answers = original_then_real(records)
        if gate.calls == 2:
            own_postgres.stop()
        return answers

    gate.real = stop_after_first_round
    monkeypatch.setattr(store, "advance_each", gate)
    duplicate = claims[1].record.evolve(updated=utcnow() + timedelta(seconds=1))
    calls: list[Callable[[], Any]] = [
        lambda c=c: book.record_outcome(c, Outcome(True, result=c.record.id)) for c in claims
    ]
    calls.append(lambda: book.outcomes.submit(duplicate))
    futures = line_up(book.outcomes, gate, calls)

    for future in futures[: CALLERS + 1]:  # first rounds: written, each told so
        recorded = future.result()
        assert recorded is not None and recorded.record.status is Status.COMPLETED
    assert isinstance(futures[-1].exception(), StoreError)  # the round after the stop
    assert gate.calls == 3

    own_postgres.start()
    for claim in claims:
        final = store.get(claim.record.id)
        assert final is not None and final.status is Status.COMPLETED
        assert final.state["results"] == {"0.0": claim.record.id}
        assert final.version == claim.record.version + 1


def test_outcomes_of_a_batch_the_server_fails_raise_outcome_not_recorded(
    store: SqlJobStore, own_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    book, claims = claimed(store)
    gate = Gate(store.advance_each, lambda: own_postgres.stop())
    monkeypatch.setattr(store, "advance_each", gate)
    futures = line_up(
        book.outcomes,
        gate,
        [lambda c=c: book.record_outcome(c, Outcome(True, result=1)) for c in claims],
    )
    assert futures[0].result() is not None
    for future in futures[1:]:
        error = future.exception()
        assert isinstance(error, OutcomeNotRecorded)  # the per-thread rule of today
        assert error.decision.action.value == "complete"

    own_postgres.start()
    for claim in claims[1:]:
        assert store.get(claim.record.id) == claim.record  # as claimed: recovery's to redo
    assert all(book.record_outcome(c, Outcome(True, result=1)) for c in claims[1:])
