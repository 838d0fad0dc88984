"""The store contract of retention (``IJobStore.purge``), run against each store.

Reuses the stores of :mod:`.test_store_contract`: memory, the defaults of
``IJobStore`` through ``MinimalStore`` (list + delete, as a third-party store
inherits them), PostgreSQL and MariaDB.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq.errors import UnknownJobError
from pypepper_dramatiq.rules.status import TERMINAL, Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.stores.sql.engine import transaction
from pypepper_dramatiq.stores.sql.links import lock_parents

from .test_store_contract import SQL_FIXTURES, T0, MinimalStore, job, store, stored

__all__ = ["store"]  # the fixture: every store of the contract

#: Jobs that ended at T0 are "old"; the purge's cutoff is a day later.
CUTOFF = T0 + timedelta(days=1)
RECENT = CUTOFF + timedelta(seconds=1)
NOT_ENDED = [s for s in Status if s not in TERMINAL]
ENDED = sorted(TERMINAL)
#: A hook due and not run yet, as the engine writes it (``state["hooks"]``).
HOOK_DUE = {
    "status": "pending",
    "owner": "w-1",
    "since": T0.isoformat(),
    "until": (T0 + timedelta(seconds=30)).isoformat(),
}


def put(store: IJobStore, job_id: str, status: Status, **fields: Any) -> JobRecord:
    assert store.put(job(job_id, status=status, **fields))
    return stored(store, job_id)


def ids(store: IJobStore) -> set[str]:
    return {row.id for row in store.list()}


def test_it_deletes_only_rows_of_the_status_that_ended_before_the_cutoff(
    store: IJobStore,
) -> None:
    put(store, "old-1", Status.COMPLETED)
    put(store, "old-2", Status.COMPLETED, created=T0 - timedelta(days=3))
    put(store, "recent", Status.COMPLETED, updated=RECENT)
    put(store, "at-cutoff", Status.COMPLETED, updated=CUTOFF)  # not before it
    put(store, "old-failed", Status.FAILED)
    put(store, "old-cancelled", Status.CANCELLED)

    assert sorted(store.purge(Status.COMPLETED, CUTOFF, 100)) == ["old-1", "old-2"]
    assert ids(store) == {"recent", "at-cutoff", "old-failed", "old-cancelled"}
    assert store.purge("Failed", CUTOFF, 100) == ["old-failed"]
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == []
    assert ids(store) == {"recent", "at-cutoff", "old-cancelled"}


@pytest.mark.parametrize("status", NOT_ENDED, ids=str)
def test_a_job_not_ended_is_never_deleted_however_old(store: IJobStore, status: Status) -> None:
    put(store, "old", status, created=T0 - timedelta(days=30), updated=T0 - timedelta(days=30))
    for ended in ENDED:
        assert store.purge(ended, CUTOFF, 100) == []
    with pytest.raises(ValueError, match=f"must be one of Cancelled, Completed, Failed.*{status}"):
        store.purge(status, CUTOFF, 100)
    assert ids(store) == {"old"}


def test_only_exact_final_status_names_are_accepted(store: IJobStore) -> None:
    put(store, "old", Status.COMPLETED)
    for wrong in ("completed", "COMPLETED", "Complete", ""):
        with pytest.raises(ValueError, match=repr(wrong)):
            store.purge(wrong, CUTOFF, 100)
    assert ids(store) == {"old"}


def test_the_jobs_a_waiting_job_waits_for_are_kept_until_its_wait_ends(store: IJobStore) -> None:
    put(store, "parent", Status.COMPLETED)
    put(store, "failed-parent", Status.FAILED)
    put(store, "holder", Status.CANCELLED)
    put(store, "unrelated", Status.COMPLETED)
    waits = {"parents": ["parent", "failed-parent"], "key": "k", "holder": "holder"}
    child = put(store, "child", Status.SCHEDULED, waits=waits, updated=RECENT)

    for status in ENDED:
        store.purge(status, CUTOFF, 100)
    assert ids(store) == {"parent", "failed-parent", "holder", "child"}

    # The wait ended (the sweep settled it): the parents may go now.
    assert store.advance(child.evolve(waits=None))
    assert sorted(store.purge(Status.COMPLETED, CUTOFF, 100)) == ["parent"]
    assert store.purge(Status.FAILED, CUTOFF, 100) == ["failed-parent"]
    assert store.purge(Status.CANCELLED, CUTOFF, 100) == ["holder"]
    assert ids(store) == {"child"}


def test_a_job_whose_final_failure_hook_has_not_run_is_kept(store: IJobStore) -> None:
    put(store, "pending", Status.FAILED, state={"hooks": {"0.0": HOOK_DUE}})
    running = dict(HOOK_DUE, status="running")
    put(store, "running", Status.FAILED, state={"hooks": {"0.0": running}})
    done = {"hooks_done": {"0.0": {"ended": T0.isoformat(), "owner": "w-1"}}}
    put(store, "ran", Status.FAILED, state=done)
    put(store, "no-hook", Status.FAILED, state={"results": {"0.0": 1}})

    assert sorted(store.purge(Status.FAILED, CUTOFF, 100)) == ["no-hook", "ran"]
    assert ids(store) == {"pending", "running"}

    row = stored(store, "pending")
    assert store.advance(row.evolve(state={"hooks_done": done["hooks_done"]}))
    assert store.purge(Status.FAILED, CUTOFF, 100) == ["pending"]


def test_the_limit_is_respected_oldest_created_first(store: IJobStore) -> None:
    for i in range(5):
        put(store, f"job-{i}", Status.COMPLETED, created=T0 + timedelta(seconds=i))
    assert store.purge(Status.COMPLETED, CUTOFF, 0) == []
    assert store.purge(Status.COMPLETED, CUTOFF, 2) == ["job-0", "job-1"]
    assert ids(store) == {"job-2", "job-3", "job-4"}
    assert store.purge(Status.COMPLETED, CUTOFF, 10) == ["job-2", "job-3", "job-4"]


def test_rows_still_needed_at_the_head_do_not_stall_the_purge(store: IJobStore) -> None:
    # The oldest rows are parents of a waiting job: the purge goes on past them.
    parents = [f"parent-{i}" for i in range(3)]
    for i, job_id in enumerate(parents):
        put(store, job_id, Status.COMPLETED, created=T0 - timedelta(hours=3 - i))
    for i in range(3):
        put(store, f"job-{i}", Status.COMPLETED, created=T0 + timedelta(seconds=i))
    put(store, "child", Status.SCHEDULED, waits={"parents": parents}, updated=RECENT)

    assert store.purge(Status.COMPLETED, CUTOFF, 2) == ["job-0", "job-1"]
    assert store.purge(Status.COMPLETED, CUTOFF, 2) == ["job-2"]
    assert ids(store) == {*parents, "child"}


def test_a_dry_run_answers_the_same_and_deletes_nothing(store: IJobStore) -> None:
    for i in range(4):
        put(store, f"job-{i}", Status.CANCELLED, created=T0 + timedelta(seconds=i))
    put(store, "recent", Status.CANCELLED, updated=RECENT)
    put(store, "hooked", Status.CANCELLED, state={"hooks": {"0.0": HOOK_DUE}})
    before = ids(store)

    would = store.purge(Status.CANCELLED, CUTOFF, 3, dry_run=True)
    assert would == ["job-0", "job-1", "job-2"]
    assert store.purge(Status.CANCELLED, CUTOFF, 3, dry_run=True) == would
    assert ids(store) == before
    assert store.purge(Status.CANCELLED, CUTOFF, 3) == would
    assert ids(store) == before - set(would)


@pytest.mark.parametrize("backend", ["postgres", pytest.param("mysql", marks=pytest.mark.mysql)])
@pytest.mark.postgres
def test_the_sql_delete_checks_version_status_and_time_again(
    request: pytest.FixtureRequest, backend: str
) -> None:
    # What purge read may change before its DELETE runs: a row written meanwhile
    # (another version, or a later end) stays.
    sql: SqlJobStore = request.getfixturevalue(SQL_FIXTURES[backend])
    seen = put(sql, "changed", Status.COMPLETED)
    put(sql, "later", Status.COMPLETED)
    put(sql, "same", Status.COMPLETED)
    assert sql.advance(seen.evolve(error="written meanwhile"))
    later = stored(sql, "later")
    assert sql.advance(later.evolve(updated=RECENT))
    chosen = [("changed", seen.version), ("later", later.version + 1), ("same", 1)]
    deleted = sql._delete_purgeable(Status.COMPLETED, CUTOFF, chosen)
    assert deleted == ["same"]
    assert ids(sql) == {"changed", "later"}


@pytest.mark.parametrize("backend", ["postgres", pytest.param("mysql", marks=pytest.mark.mysql)])
@pytest.mark.postgres
def test_a_row_another_transaction_holds_is_left_for_the_next_purge(
    request: pytest.FixtureRequest, backend: str
) -> None:
    # A child's scheduling share-locks its parents until it commits (lock_parents):
    # the purge goes on without the held row instead of waiting for that commit.
    sql: SqlJobStore = request.getfixturevalue(SQL_FIXTURES[backend])
    put(sql, "held", Status.COMPLETED, created=T0 - timedelta(hours=1))
    put(sql, "free", Status.COMPLETED)
    answers: list[list[str]] = []
    with transaction(sql._engine) as conn:
        lock_parents(conn, ["held"])
        purge = threading.Thread(target=lambda: answers.append(sql.purge("Completed", CUTOFF, 10)))
        purge.start()
        purge.join(timeout=60)
        assert not purge.is_alive(), "the purge waited for the transaction holding a row"
    assert answers == [["free"]]
    assert sql.purge(Status.COMPLETED, CUTOFF, 10) == ["held"]
    assert ids(sql) == set()


# -- a purge racing children scheduled after= the rows it deletes -------------------------------

WAIT_FOR = {"on_parent_failure": "propagate"}


def test_a_waiting_job_is_stored_only_while_its_parents_are(store: IJobStore) -> None:
    put(store, "parent", Status.COMPLETED)
    waits = dict(WAIT_FOR, parents=["parent", "gone"])
    with pytest.raises(UnknownJobError, match="gone"):
        store.put(job("child", status=Status.SCHEDULED, waits=waits))
    assert ids(store) == {"parent"}
    # A retry's origin may be gone: only what a waiting job waits for is required.
    assert store.put(job("retry", status=Status.SCHEDULED, payload={"retry_of": "gone"}))


#: Old parents the purge may delete, and the children two threads schedule after them.
RACE_PARENTS = 1000


#: How often the race's threads may be switched (seconds): Python's default (5 ms)
#: lets a whole purge batch run between two switches, which hides the race.
RACE_SWITCH_INTERVAL = 1e-6


@pytest.fixture
def fine_thread_switches() -> Iterator[None]:
    """Threads switched every :data:`RACE_SWITCH_INTERVAL` during the test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(RACE_SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fine_thread_switches")
def test_the_purge_never_deletes_a_parent_a_child_was_stored_waiting_for(
    store: IJobStore,
) -> None:
    # Two threads insert children, each waiting for one old Completed parent, while a
    # third purges Completed rows in small batches. Each child is either stored with its
    # parent kept, or refused (UnknownJobError) because the purge took the parent first.
    for i in range(RACE_PARENTS):
        put(store, f"p{i}", Status.COMPLETED)
    stored_children: dict[str, str] = {}
    refused: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(3)

    def schedule_children(offset: int) -> None:
        start.wait()
        for i in range(offset, RACE_PARENTS, 2):
            child, parent = f"c{i}", f"p{i}"
            record = job(child, status=Status.SCHEDULED, waits=dict(WAIT_FOR, parents=[parent]))
            try:
                assert store.put(record)
            except UnknownJobError:
                with lock:
                    refused.append(child)
                continue
            with lock:
                stored_children[child] = parent

    def purge() -> None:
        start.wait()
        while store.purge(Status.COMPLETED, CUTOFF, 7):
            pass

    threads = [threading.Thread(target=schedule_children, args=(k,)) for k in (0, 1)]
    threads.append(threading.Thread(target=purge))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert len(stored_children) + len(refused) == RACE_PARENTS
    left = ids(store)
    missing = {child: parent for child, parent in stored_children.items() if parent not in left}
    assert missing == {}, "a stored waiting child lost its parent to the purge"
    # Nothing more to keep: the purge takes every parent no child waits for.
    store.purge(Status.COMPLETED, CUTOFF, RACE_PARENTS)
    assert {f"p{i}" for i in range(RACE_PARENTS)} & ids(store) == set(stored_children.values())


class ChildStoredBeforeEachDelete(MinimalStore):
    """A store with only the abstract methods where, just before each delete, a child
    is stored waiting for the row: what a scheduling thread may do between the
    default purge's read of the waiting jobs and its delete."""

    def delete(self, job_id: str) -> bool:
        waits = dict(WAIT_FOR, parents=[job_id])
        assert self.put(job(f"child-of-{job_id}", status=Status.SCHEDULED, waits=waits))
        return super().delete(job_id)


def test_the_default_purge_puts_back_a_parent_a_child_was_stored_waiting_for_meanwhile() -> None:
    store = ChildStoredBeforeEachDelete()
    parent = put(store, "parent", Status.COMPLETED, state={"results": {"0.0": 1}})

    assert store.purge(Status.COMPLETED, CUTOFF, 10) == []
    assert stored(store, "parent") == parent  # as it was, at its version
    assert stored(store, "child-of-parent").waits is not None
