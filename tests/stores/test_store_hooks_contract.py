"""The store contract of ``pending_hooks``: the rows whose state holds hooks not run yet.

Run against each store of :mod:`.test_store_contract` (memory, the ``IJobStore``
default through ``MinimalStore``, PostgreSQL, MariaDB): the recovery sweep finds
the ``on_final_failure`` hooks a dead worker left due with it.
"""

from __future__ import annotations

from datetime import timedelta

from pypepper_dramatiq.records.state import JobState
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import T0, job, store, stored

__all__ = ["store"]  # the fixture: every store of the contract


def state_of(*, due: bool, done: bool) -> dict[str, object]:
    """The state of a row with a hook due and/or one done."""
    state = JobState(errors={"0.0": "RuntimeError: boom"})
    if due:
        state.hold_hook("0.0", "pending", "worker-1", T0, T0 + timedelta(seconds=30))
    if done:
        state.hook_done("0.1", "worker-1", T0)
    return state.to_dict()


def test_pending_hooks_finds_the_rows_with_a_hook_due_oldest_first(store: IJobStore) -> None:
    rows = {
        "b-due-failed": (True, False, 2, Status.FAILED),
        "a-due-running": (True, True, 1, Status.IN_PROGRESS),
        "c-only-done": (False, True, 0, Status.FAILED),
        "d-none": (False, False, 0, Status.COMPLETED),
        "e-due-completed": (True, False, 3, Status.COMPLETED),
    }
    for job_id, (due, done, minutes, status) in rows.items():
        created = T0 + timedelta(minutes=minutes)
        assert store.put(
            job(job_id, status=status, created=created, state=state_of(due=due, done=done))
        )

    found = store.pending_hooks(10)

    assert [r.id for r in found] == ["a-due-running", "b-due-failed", "e-due-completed"]
    assert found[1].state["hooks"]["0.0"]["owner"] == "worker-1"
    # Batch after batch by (created, id).
    first = store.pending_hooks(2)
    assert [r.id for r in first] == ["a-due-running", "b-due-failed"]
    rest = store.pending_hooks(2, after=(first[-1].created, first[-1].id))
    assert [r.id for r in rest] == ["e-due-completed"]


def test_a_row_whose_hooks_are_all_done_is_no_longer_pending(store: IJobStore) -> None:
    assert store.put(job("j", status=Status.FAILED, state=state_of(due=True, done=False)))
    row = stored(store, "j")
    state = JobState.from_dict(row.state)
    state.hook_done("0.0", "worker-1", T0 + timedelta(seconds=1))
    assert store.advance(row.evolve(state=state.to_dict()))

    assert store.pending_hooks(10) == []
    assert stored(store, "j").state["hooks_done"]["0.0"]["owner"] == "worker-1"
