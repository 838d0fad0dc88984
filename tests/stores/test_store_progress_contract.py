"""``write_progress``: a running task's progress written without moving the row's version.

Run on every store (memory, a store with only the abstract methods, PostgreSQL,
MariaDB): a progress write must never make a concurrent step or cancel lose its
compare-and-set, so it leaves version and status alone; it writes only to an
InProgress row, merges by task key and keeps the rest of the state.
"""

from __future__ import annotations

from datetime import timedelta

from pypepper_dramatiq.records.progress import entry
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import T0, MinimalStore, job, store, stored

__all__ = ["store"]


def running(store: IJobStore) -> None:
    assert store.put(
        job(status=Status.IN_PROGRESS, state={"cursor": [0, 1, 0, 0], "results": {"0.0": 1}})
    )


def test_progress_is_merged_by_task_key_without_moving_version_or_status(
    store: IJobStore,
) -> None:
    running(store)
    before = stored(store)
    first = entry("fetch", 3, 10, note="rows")
    written = store.write_progress("job-1", "0.1", first)
    if isinstance(store, MinimalStore):
        assert written is False  # the default stores nothing until the outcome write
        assert stored(store) == before
        return
    assert written is True
    assert store.write_progress("job-1", "0.2", entry("load", 1, None)) is True
    second = entry("fetch", 7, 10, note=None)
    assert store.write_progress("job-1", "0.1", second) is True
    after = stored(store)
    assert (after.version, after.status) == (before.version, Status.IN_PROGRESS)
    assert after.state["cursor"] == [0, 1, 0, 0] and after.state["results"] == {"0.0": 1}
    assert after.progress["0.1"]["done"] == 7 and after.progress["0.1"]["note"] is None
    assert after.progress["0.2"]["task"] == "load"
    # A step's compare-and-set on the version it read still wins.
    assert store.advance(before.evolve(status=Status.COMPLETED, updated=T0 + timedelta(1)))


def test_progress_is_not_written_to_a_row_that_does_not_run(store: IJobStore) -> None:
    for status in (Status.SCHEDULED, Status.COMPLETED, Status.CANCELLED):
        store.delete("job-1")
        assert store.put(job(status=status))
        assert store.write_progress("job-1", "0.0", entry("t", 1)) is False
        assert "progress" not in stored(store).state
    assert store.write_progress("nobody", "0.0", entry("t", 1)) is False
