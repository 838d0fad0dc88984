"""An outcome's write that lost to a writer which moved only the row's hooks.

Between a step's claim and its outcome, the recovery sweep may run (or take
over) the ``on_final_failure`` hook of an earlier task of the same job: that
write moves the row's version, so the outcome's compare-and-set fails. The
outcome is then decided again on the fresher row (``StepIO.record_outcome``
over :func:`~pypepper_dramatiq.engine.outcomes.outcome_write`) and written over it,
keeping the sweep's hook bookkeeping; anything else having moved, it is lost.
On the memory store and on PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pypepper_dramatiq import IJobStore, JobRecord, Status
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import Claim, Outcome, StepIO
from pypepper_dramatiq.records.state import HOOK_PENDING, JobState
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.base import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> IJobStore:
    if request.param == "memory":
        return MemoryJobStore()
    pg: IJobStore = request.getfixturevalue("pg_store")
    return pg


def task(name: str) -> dict[str, Any]:
    return {"name": name, "executor_id": "hooks_moved.unused", "params": {}}


def claimed(store: IJobStore) -> tuple[StepIO, Claim]:
    """A three-task job whose first task is done, claimed at its second by worker-a."""
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id="hooks-moved",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [task("a"), task("b"), task("c")]}]},
    )
    assert store.put(record)
    book = StepIO(lambda: store, "worker-a", 30.0)
    assert book.record(book.claim(StepMessage(record.id, Position())), Outcome(True, "a-done"))
    return book, book.claim(StepMessage(record.id, Position(0, 1)))


def row_of(store: IJobStore, job_id: str) -> JobRecord:
    row = store.get(job_id)
    assert row is not None
    return row


def sweep_moves_hooks(store: IJobStore, job_id: str) -> JobRecord:
    """What the recovery sweep writes for an earlier task's hook: one ran, one taken."""
    row = row_of(store, job_id)
    state = JobState.from_dict(row.state)
    state.hook_done("9.0", "sweeper", utcnow())
    state.hold_hook("9.1", HOOK_PENDING, "sweeper", utcnow(), None)
    assert store.advance(row.evolve(state=state.to_dict(), updated=utcnow()))
    return row_of(store, job_id)


def test_the_outcome_is_written_over_a_row_whose_hooks_alone_moved(store: IJobStore) -> None:
    book, claim = claimed(store)
    moved = sweep_moves_hooks(store, claim.record.id)
    assert moved.version == claim.record.version + 1

    recorded = book.record_outcome(claim, Outcome(True, "b-done"))

    assert recorded is not None
    row = row_of(store, claim.record.id)
    assert recorded.record == row and row.version == moved.version + 1
    state = JobState.from_dict(row.state)
    # Ours: the attempt, its result, the next step.
    assert state.results == {"0.0": "a-done", "0.1": "b-done"}
    assert state.attempts == {"0.0": 1, "0.1": 1} and len(state.history["0.1"]) == 1
    assert state.cursor == Position(0, 2) and row.lease_owner is None
    # Theirs: the hook that ran and the one taken over.
    assert state.hooks_done["9.0"]["owner"] == "sweeper"
    assert state.hooks["9.1"]["owner"] == "sweeper"


@pytest.mark.parametrize(
    "change",
    [{"error": "E: moved"}, {"lease_owner": "worker-b"}],
    ids=["error", "lease owner"],
)
def test_the_outcome_is_lost_when_more_than_the_hooks_moved(
    store: IJobStore, change: dict[str, Any]
) -> None:
    book, claim = claimed(store)
    moved = sweep_moves_hooks(store, claim.record.id)
    assert store.advance(moved.evolve(**change))
    before = row_of(store, claim.record.id)

    assert book.record_outcome(claim, Outcome(True, "b-done")) is None

    assert row_of(store, claim.record.id) == before
