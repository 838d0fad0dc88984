"""``on_final_failure`` hooks: called once per (job, task), also when a worker dies.

The write that records a task's final failure also marks its hook due
(``state["hooks"]``, see :mod:`~pypepper_dramatiq.records.state`), held by the worker
that wrote it for ``lease_seconds``. That worker calls the hook right after
the write (before it sends the job's next step), renews its hold while the
hook runs, then moves the entry to ``state["hooks_done"]`` with a
compare-and-set (:class:`HookRunner`). A worker that dies in between leaves
the entry due; once its hold has lapsed, the recovery sweep
(:class:`HookSweep`) takes the hook over by compare-and-set (``running``, held
by the sweeping process, renewed the same way) and calls it.

When the job goes on (an optional task's hook), the same write claims the
job's next step for that worker, under a lease renewed with the hold: the
step waits for the hook, and yet, if the worker dies, its lease lapses after
``lease_seconds`` like any claimed step's and the recovery sweep sends it
(the recovered hook and the next step may then overlap).

So a hook runs exactly once when no process dies, and when its worker dies
after recording the failure and before calling the hook. A process that dies
*while* its hook runs (or before it marks it done) leaves it to run again:
at least once, as for task attempts (``context.idempotency_key`` is the same).

Hooks are found where they run, with the task's executor in the executor
registry (``Task.from_dict``), so a worker that lacks the code logs it and
leaves the hook due for a worker that has it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import StoreError, UnknownExecutorError, describe, retry_may_cure
from ..limits.storable import storable_text
from ..model.context import (
    CANCEL_EVENT_KEY,
    JOB_ID_KEY,
    PARENT_RESULTS_KEY,
    POSITION_KEY,
    RESULTS_KEY,
    Context,
)
from ..model.executor import FinalFailureHook, run_awaitable
from ..model.task import Task
from ..ops.isolation import RowGuard
from ..ops.logs import get_logger
from ..records.record import JobRecord, utcnow
from ..records.spec import TaskSpec
from ..records.state import HOOK_RUNNING, JobState
from ..rules.steps import Position
from ..stores.base import IJobStore

logger = get_logger(__name__)

#: Tries of a compare-and-set on a hook's entry while other writers move the row on.
WRITE_ATTEMPTS = 10
#: Recovered hooks one process runs at once (each on a thread of its own).
MAX_RECOVERED_AT_ONCE = 4
#: Longest error text of a hook that raised kept in ``hooks_done``, in characters.
ERROR_LIMIT = 1_000
#: Unknown hooks a sweep remembers having logged.
UNKNOWN_LOGGED_MAX = 10_000


@dataclass(frozen=True)
class Found:
    """A due hook, found here: what to call, and with what."""

    hook: FinalFailureHook
    task: Task
    context: Context
    error: str


def stored_tasks(record: JobRecord) -> list[list[dict[str, Any]]]:
    """The stored tasks of ``record``, per workflow."""
    workflows = (record.payload or {}).get("workflows", [])
    return [list(workflow.get("tasks", [])) for workflow in workflows]


def context_for(record: JobRecord, position: Position) -> Context:
    """What a hook of the task at ``position`` sees, as an attempt of it would:
    the job id, its position, the results of the job's finished tasks by name
    and its parents' results. Its cancel event is its own (hooks are not cancelled)."""
    results = record.state.get("results") or {}
    named: dict[str, Any] = {}
    for w, workflow in enumerate(stored_tasks(record)):
        for t, task in enumerate(workflow):
            if f"{w}.{t}" in results:
                named[TaskSpec.from_dict(task).name] = results[f"{w}.{t}"]
    return Context(
        {
            CANCEL_EVENT_KEY: threading.Event(),
            JOB_ID_KEY: record.id,
            RESULTS_KEY: named,
            POSITION_KEY: position.to_list(),
            PARENT_RESULTS_KEY: record.state.get(PARENT_RESULTS_KEY) or {},
        }
    )


def find(record: JobRecord, position: Position, error: str) -> Found | None:
    """The hook of the task at ``position`` of ``record``, found through the
    executor registry; None if this process does not know it."""
    try:
        task = Task.from_dict(stored_tasks(record)[position.workflow][position.task])
    except (UnknownExecutorError, IndexError):
        return None
    if task.on_final_failure is None:
        return None
    context = context_for(record, position)
    task.context = context
    return Found(task.on_final_failure, task, context, error)


def position_of(record: JobRecord, key: str) -> Position:
    """The position of the hook's task: the cursor if it is there (the failing
    attempt, for a job that failed), else its first attempt."""
    workflow, task = (int(part) for part in key.split("."))
    cursor = record.state.get("cursor")
    if cursor and list(cursor[:2]) == [workflow, task]:
        return Position.from_list(cursor)
    return Position(workflow, task)


class HookRunner:
    """Calls the hooks this process holds, keeps them held meanwhile, marks them done.

    Args:
        store: returns the job store (read at each call).
    """

    def __init__(self, store: Callable[[], IJobStore]) -> None:
        self._store = store

    def run(
        self,
        record: JobRecord,
        key: str,
        found: Found,
        owner: str,
        lease_seconds: float | None,
        *,
        step_lease: bool = False,
    ) -> JobRecord | None:
        """Call the hook of task ``key`` (held by ``owner``), then mark it done.

        ``lease_seconds`` is how long each renewal of the hold lasts (None: the
        hold has no expiry to renew). With ``step_lease``, ``owner`` also holds
        the row's next step meanwhile (the worker that recorded the failure):
        its lease is renewed with the hold, so that it lapses, and recovery
        sends the step, only once ``owner`` stops renewing (dies). Returns the
        row as the done mark wrote it, or None when it was not written (the
        hold then lapses, and the hook runs again: at least once).
        """
        with self._held(record.id, key, owner, lease_seconds, step_lease=step_lease):
            error = self.call(record.id, key, found)
        return self._done(record.id, key, owner, error)

    def call(self, job_id: str, key: str, found: Found) -> str | None:
        """Call the hook (no bookkeeping); what it raised, as stored (None: it returned):
        storable (``storable.storable_text``), at most :data:`ERROR_LIMIT` characters."""
        try:
            # An async hook runs to its end here, as an async task does.
            run_awaitable(found.hook(found.task, found.context, found.error), None, found.context)
        except Exception as exc:
            logger.exception(
                "job %s: the on_final_failure hook of task %s raised; the job's outcome stands",
                job_id,
                found.task.name,
                extra={"action": "hook_failed", "job_id": job_id, "task": key},
            )
            return storable_text(describe(exc))[:ERROR_LIMIT]
        logger.info(
            "job %s: on_final_failure hook of task %s ran",
            job_id,
            found.task.name,
            extra={"action": "hook_ran", "job_id": job_id, "task": key},
        )
        return None

    def _done(self, job_id: str, key: str, owner: str, error: str | None) -> JobRecord | None:
        def mark(state: JobState) -> bool:
            if key not in state.hooks:
                return False  # marked done by another holder already
            state.hook_done(key, owner, utcnow(), error)
            return True

        row, _ = self.update(job_id, mark)
        if row is None:
            logger.warning(
                "job %s: the on_final_failure hook of task %s ran but could not be marked "
                "done; it runs again once its hold lapses",
                job_id,
                key,
                extra={"action": "hook_not_marked", "job_id": job_id, "task": key},
            )
        return row

    @contextmanager
    def _held(
        self,
        job_id: str,
        key: str,
        owner: str,
        lease_seconds: float | None,
        *,
        step_lease: bool = False,
    ) -> Iterator[None]:
        """Renew ``owner``'s hold on the hook every third of ``lease_seconds`` while
        the block runs, so that recovery does not take over a hook still running;
        with ``step_lease``, also the lease ``owner`` holds on the row's step (a
        statement of its own, after the hold's write: that write puts back the
        lease expiry it read)."""
        if lease_seconds is None:
            yield
            return
        stop = threading.Event()

        def extend(state: JobState) -> bool:
            entry = state.hooks.get(key)
            if entry is None or entry.get("owner") != owner:
                return False  # done, or taken over (its hold had lapsed)
            entry["until"] = (utcnow() + timedelta(seconds=lease_seconds)).isoformat()
            return True

        def renew() -> None:
            while not stop.wait(max(0.1, lease_seconds / 3)):
                try:
                    self.update(job_id, extend)
                    if step_lease:  # only while the row's lease is still owner's
                        until = utcnow() + timedelta(seconds=lease_seconds)
                        self._store().renew_leases(owner, [job_id], until)
                except Exception:  # the next renewal tries again
                    logger.exception("job %s: renewing the hold on hook %s failed", job_id, key)

        renewer = threading.Thread(target=renew, name="pypepper-hook-hold", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()

    def update(
        self, job_id: str, change: Callable[[JobState], bool]
    ) -> tuple[JobRecord | None, bool]:
        """Apply ``change`` to the row's state with compare-and-set, on the row as
        it is now (other writers' changes kept), retried while the row moves on.

        ``change`` returns False when there is nothing to write. Returns the row
        (as written, or as read when nothing was written; None when it could not
        be read or written) and whether it was written.
        """
        delay = 0.05
        for _ in range(WRITE_ATTEMPTS):
            try:
                row = self._store().get(job_id)
                if row is None:
                    return None, False
                state = JobState.from_dict(row.state)
                if not change(state):
                    return row, False
                changed = row.evolve(state=state.to_dict(), updated=utcnow())
                if self._store().advance(changed):
                    return changed.evolve(version=changed.version + 1), True
            except StoreError as exc:
                if not retry_may_cure(exc):  # the row's content refused: so it would be again
                    logger.error("job %s: hook bookkeeping refused by the store (%s)", job_id, exc)
                    return None, False
                logger.warning("job %s: hook bookkeeping failed (%s); retrying", job_id, exc)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        return None, False


class HookSweep:
    """The recovery sweep's part: call the hooks whose holder's hold lapsed.

    Looks at the rows with due hooks (``IJobStore.pending_hooks``, batch after
    batch across passes) at most every ``interval`` seconds. Each hook it can
    find here is taken over by compare-and-set and called on a thread of its
    own, held (and renewed) by ``owner`` as a worker holds its own. A row that
    cannot be read, or whose hook cannot be started, is skipped (``guard``:
    logged once, counted under ``duty``); the others' hooks start.
    """

    def __init__(
        self,
        store: Callable[[], IJobStore],
        owner: str,
        lease_seconds: float,
        interval: float,
        batch: int = 100,
        guard: RowGuard | None = None,
        duty: str = "lapsed_hooks",
    ) -> None:
        self._store = store
        self.guard = guard if guard is not None else RowGuard(logger)
        self.duty = duty
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.batch = batch
        self.runner = HookRunner(store)
        self._running: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        #: Where the next look starts (created, id); None: the oldest row.
        self._after: tuple[datetime, str] | None = None
        self._next_look = 0.0
        #: Hooks this process could not find, logged once each.
        self._unknown: set[tuple[str, str]] = set()

    def sweep(self, now: datetime) -> int:
        """Take over and start the lapsed hooks of one batch; returns how many started."""
        if time.monotonic() < self._next_look:
            return 0
        self._next_look = time.monotonic() + self.interval
        rows = self._store().pending_hooks(self.batch, after=self._after)
        self._after = (rows[-1].created, rows[-1].id) if len(rows) >= self.batch else None
        started = 0
        for row in self.guard.readable(self.duty, rows):
            with self.guard.row(self.duty, row.id):  # one bad row must not stop the others
                for key in JobState.from_dict(row.state).free_hooks(now):
                    with self._lock:
                        if len(self._running) >= MAX_RECOVERED_AT_ONCE:
                            return started
                        if (row.id, key) in self._running:
                            continue
                    started += self._start(row, key, now)
        return started

    def running(self) -> int:
        """Recovered hooks running now in this process."""
        with self._lock:
            return len(self._running)

    def _start(self, row: JobRecord, key: str, now: datetime) -> bool:
        position = position_of(row, key)
        error = str((row.state.get("errors") or {}).get(key) or "")
        found = find(row, position, error)
        if found is None:
            if (row.id, key) not in self._unknown:
                if len(self._unknown) >= UNKNOWN_LOGGED_MAX:
                    self._unknown.clear()  # logged again, rather than remembered forever
                self._unknown.add((row.id, key))
                logger.warning(
                    "job %s: the on_final_failure hook of task %s is due but not known in this "
                    "process; left due for a worker that has its code",
                    row.id,
                    key,
                    extra={"action": "hook_unknown", "job_id": row.id, "task": key},
                )
            return False
        until = now + timedelta(seconds=self.lease_seconds)

        def take(state: JobState) -> bool:
            if key not in state.free_hooks(utcnow()):
                return False  # its holder renewed it, or another sweep took it
            state.hold_hook(key, HOOK_RUNNING, self.owner, utcnow(), until)
            return True

        taken, written = self.runner.update(row.id, take)
        if not written or taken is None:
            return False
        logger.warning(
            "job %s: the on_final_failure hook of task %s was left due by %s; running it here",
            row.id,
            key,
            (row.state.get("hooks") or {}).get(key, {}).get("owner"),
            extra={"action": "hook_recovered", "job_id": row.id, "task": key},
        )
        with self._lock:
            self._running.add((row.id, key))

        def call() -> None:
            try:
                self.runner.run(taken, key, found, self.owner, self.lease_seconds)
            except Exception:
                logger.exception("job %s: recovered hook %s failed to run", row.id, key)
            finally:
                with self._lock:
                    self._running.discard((row.id, key))

        threading.Thread(target=call, name="pypepper-hook", daemon=True).start()
        return True
