"""A task that cancels its own job, and ``on_final_failure`` hooks, on both drivers.

A task raising ``JobCancellationError`` ends its job Cancelled through the
shared engine (``StepIO.record_outcome``): no retry, no further task, the
attempt recorded as cancelled, and the job's error naming the task and the
message.

A task's ``on_final_failure(task, context, error)`` hook runs once when the
task has failed for good (required or optional), never on a cancel; a hook
that raises is logged and changes nothing. The recovery part (a hook left due
by a dead worker) runs here on the memory store through ``HookSweep``; with
real killed workers in ``tests/integration/test_hooks_kill.py``.

The tasks are ``@workflow_task`` functions that count their calls (and the
hooks theirs) in module-level tables under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    JobCancellationError,
    JobRecord,
    NonRetriableError,
    Status,
    StoreUnavailableError,
    Task,
    executor_registry,
    get_job_store,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.engine import hooks, step_io
from pypepper_dramatiq.engine.functions import FunctionExecutor
from pypepper_dramatiq.engine.running import running_here
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.state import JobState
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .drivers import JOB_TIMEOUT, DramatiqDriver, Driver, InProcessDriver, make_job, run

_lock = threading.Lock()
#: Calls per key.
CALLS: dict[str, int] = defaultdict(int)
#: Hook calls per task key param: (task name, job id, error, results seen), in order.
HOOK_CALLS: dict[str, list[tuple[str, str | None, str, dict[str, Any]]]] = defaultdict(list)


def _call(key: str) -> int:
    with _lock:
        CALLS[key] += 1
        return CALLS[key]


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix for this test's call keys; its accounting is dropped afterwards."""
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for table in (CALLS, HOOK_CALLS):
            for key in [k for k in table if k.startswith(value)]:
                del table[key]


def hook_calls(key: str) -> list[tuple[str, str | None, str, dict[str, Any]]]:
    with _lock:
        return list(HOOK_CALLS[key])


def note_hook(task: Task, context: Context, error: str) -> None:
    """An ``on_final_failure`` hook: notes what it was called with, by the task's key."""
    with _lock:
        HOOK_CALLS[task.params["key"]].append(
            (task.name, context.job_id, error, dict(context.results))
        )


def raising_hook(task: Task, context: Context, error: str) -> None:
    note_hook(task, context, error)
    raise ValueError("the pager is down")


# -- the tasks ------------------------------------------------------------------------------


@workflow_task(name="self-cancel.quit", on_final_failure=note_hook)
def quit_job(task: Task, context: Context, key: str) -> None:
    """Asks to cancel its job."""
    _call(key)
    raise JobCancellationError(f"{key}: nothing to do today")


@workflow_task(name="self-cancel.work")
def work(task: Task, context: Context, key: str) -> str:
    _call(key)
    return "done"


@workflow_task(name="hooks.fail", on_final_failure=note_hook)
def fail(task: Task, context: Context, key: str, fail_first: int = -1) -> str:
    """Fails its first ``fail_first`` calls (every call when negative); has a hook."""
    call = _call(key)
    if fail_first < 0 or call <= fail_first:
        raise RuntimeError(f"{key}: planned failure {call}")
    return "recovered"


@workflow_task(name="hooks.hopeless", on_final_failure=note_hook)
def hopeless(task: Task, context: Context, key: str) -> str:
    _call(key)
    raise NonRetriableError(f"{key}: the input is malformed")


#: The slow hook's signals: it sets "started", then waits for "release".
SLOW_HOOK = {"started": threading.Event(), "release": threading.Event()}


def slow_hook(task: Task, context: Context, error: str) -> None:
    SLOW_HOOK["started"].set()
    SLOW_HOOK["release"].wait(JOB_TIMEOUT)
    note_hook(task, context, error)


@workflow_task(name="hooks.fail-slow-hook", on_final_failure=slow_hook)
def fail_slow_hook(task: Task, context: Context, key: str) -> str:
    _call(key)
    raise RuntimeError(f"{key}: planned failure")


@workflow_task(name="hooks.fail-loudly", on_final_failure=raising_hook)
def fail_loudly(task: Task, context: Context, key: str) -> str:
    _call(key)
    raise RuntimeError(f"{key}: planned failure")


# -- self-cancel ----------------------------------------------------------------------------


def test_a_task_raising_job_cancellation_error_ends_its_job_cancelled(
    driver: Driver, prefix: str
) -> None:
    job = make_job(
        [
            work.task(name="first", key=f"{prefix}first"),
            # Retries and rounds left, and optional: none of it applies to a cancel.
            quit_job.options(retry_count=2, round_times=2, optional=True).task(
                name="quit", key=f"{prefix}quit"
            ),
            work.task(name="after", key=f"{prefix}after"),
        ],
        [work.task(name="next-workflow", key=f"{prefix}next-workflow")],
    )

    [record] = run(driver, job)

    assert record.status is Status.CANCELLED
    assert calls(f"{prefix}first") == 1
    assert calls(f"{prefix}quit") == 1  # no retry, no second round
    assert calls(f"{prefix}after") == 0 and calls(f"{prefix}next-workflow") == 0
    assert record.error is not None
    assert record.error.startswith("task quit cancelled the job: JobCancellationError")
    assert f"{prefix}quit: nothing to do today" in record.error
    [entry] = record.state["history"]["0.1"]
    assert entry["outcome"] == "cancelled"
    assert entry["error_type"] == "JobCancellationError"
    assert record.state["skipped"] == []  # cancelled, not skipped as an optional failure
    assert record.result("first") == "done"  # the progress before it is kept
    assert record.lease_owner is None and record.lease_expires is None  # like other ends
    assert hook_calls(f"{prefix}quit") == []  # a cancel is not a failure
    assert "hooks" not in record.state and "hooks_done" not in record.state


def test_a_self_cancel_sets_the_cancel_event_of_the_job_running_here() -> None:
    # As Job.cancel() does: whoever waits on the job's cancel event in this
    # process (a retry delay, the lease keeper's view) hears it.
    job = make_job([quit_job.task(name="quit", key="unit:quit")])
    job.scheduled()
    store = get_job_store()
    book = step_io.StepIO(lambda: store, "unit-owner", 30.0)
    record = store.get(job.id)
    assert record is not None
    tasks = [[task.spec().to_dict() for task in w.get_tasks()] for w in job.workflows]
    started = record.evolve(status=Status.IN_PROGRESS, lease_owner="unit-owner")
    assert store.advance(started)
    claim = step_io.Claim(started.evolve(version=started.version + 1), Position(), tasks)
    running = running_here.start(job.id)
    try:
        recorded = book.record_outcome(claim, step_io.Outcome.failure(JobCancellationError("stop")))
        assert running.cancel_event.is_set()
    finally:
        running_here.remove(job.id)
    assert recorded is not None and recorded.decision.action.value == "cancel"
    stored = store.get(job.id)
    assert stored is not None and stored.status is Status.CANCELLED


# -- on_final_failure hooks -----------------------------------------------------------------


def test_a_required_task_failing_for_good_calls_its_hook_once(driver: Driver, prefix: str) -> None:
    key = f"{prefix}t"
    job = make_job(
        [
            work.task(name="before", key=f"{prefix}before"),
            fail.options(retry_count=2).task(name="t", key=key),
            work.task(name="after", key=f"{prefix}after"),
        ]
    )

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert calls(key) == 3  # three attempts, one hook call
    [(name, job_id, error, results)] = hook_calls(key)
    assert (name, job_id) == ("t", job.id)
    assert error == f"RuntimeError: {key}: planned failure 3"  # the last error, as stored
    assert error == record.state["errors"]["0.1"]
    assert results == {"before": "done"}  # the context of the task's attempts
    assert calls(f"{prefix}after") == 0
    assert "hooks" not in record.state  # nothing left due
    done = record.state["hooks_done"]["0.1"]
    assert "error" not in done and done["owner"]
    assert record.lease_owner is None and record.lease_expires is None


def test_an_optional_task_failing_for_good_calls_its_hook_and_the_job_completes(
    driver: Driver, prefix: str
) -> None:
    key = f"{prefix}opt"
    job = make_job(
        [
            fail.options(optional=True, retry_count=1, round_times=2).task(name="opt", key=key),
            work.task(name="after", key=f"{prefix}after"),
        ]
    )

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert calls(key) == 4
    assert len(hook_calls(key)) == 1
    assert calls(f"{prefix}after") == 1
    assert record.state["skipped"] == ["0.0"]
    assert "hooks" not in record.state and "0.0" in record.state["hooks_done"]


def test_a_task_that_recovers_calls_no_hook(driver: Driver, prefix: str) -> None:
    key = f"{prefix}t"
    job = make_job([fail.options(retry_count=2).task(name="t", key=key, fail_first=2)])

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert calls(key) == 3 and hook_calls(key) == []
    assert "hooks_done" not in record.state


def test_a_non_retriable_error_calls_the_hook_once(driver: Driver, prefix: str) -> None:
    key = f"{prefix}bad"
    job = make_job([hopeless.options(retry_count=3, round_times=2).task(name="bad", key=key)])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert calls(key) == 1
    [(_, _, error, _)] = hook_calls(key)
    assert error.startswith("NonRetriableError: ")


def test_a_hook_that_raises_is_logged_with_the_job_id_and_changes_nothing(
    driver: Driver, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"{prefix}loud"
    job = make_job(
        [
            fail_loudly.options(optional=True).task(name="loud", key=key),
            work.task(name="after", key=f"{prefix}after"),
        ],
    )
    required = make_job([fail_loudly.task(name="loud", key=f"{prefix}required")])

    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        records = run(driver, job, required)

    assert [r.status for r in records] == [Status.COMPLETED, Status.FAILED]
    assert len(hook_calls(key)) == 1 and len(hook_calls(f"{prefix}required")) == 1
    assert calls(f"{prefix}after") == 1  # the optional task's hook did not stop the job
    assert records[1].error == f"task loud failed: RuntimeError: {prefix}required: planned failure"
    for record, the_job in zip(records, (job, required), strict=True):
        assert record.state["hooks_done"]["0.0"]["error"] == "ValueError: the pager is down"
        [logged] = [
            r
            for r in caplog.records
            if getattr(r, "action", None) == "hook_failed" and r.job_id == the_job.id
        ]
        assert logged.levelno == logging.ERROR and logged.exc_info is not None
        assert the_job.id in logged.getMessage()


def test_a_cancelled_job_calls_no_hook(driver: Driver, prefix: str) -> None:
    key = f"{prefix}t"
    job = make_job([fail.options(retry_count=3, retry_delay=1.5).task(name="t", key=key)])
    job.scheduled()
    driver.start()
    deadline = time.monotonic() + JOB_TIMEOUT
    while calls(key) < 1:
        assert time.monotonic() < deadline, "the first attempt never ran"
        time.sleep(0.01)

    job.cancel()  # while the task waits for its retry
    [record] = driver.wait(job)

    assert record.status is Status.CANCELLED
    assert calls(key) == 1
    assert hook_calls(key) == []
    assert "hooks" not in record.state and "hooks_done" not in record.state


def test_a_hook_this_worker_does_not_know_is_left_due(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], prefix: str
) -> None:
    # The task was built with a hook where it was scheduled, but the executor
    # the worker finds under its id has none (this worker lacks the code).
    executor_registry.register(f"{prefix}no-hook", FunctionExecutor(fail.fn))
    key = f"{prefix}t"
    task = Task(
        "c", "", "", "t", None, "", [], None,
        executor_id=f"{prefix}no-hook", params={"key": key}, on_final_failure=note_hook,
    )  # fmt: skip
    job = make_job([task])

    [record] = run(DramatiqDriver(stub_broker, start_worker), job)

    assert record.status is Status.FAILED
    assert hook_calls(key) == []
    entry = record.state["hooks"]["0.0"]
    assert entry["status"] == "pending" and entry["until"] is not None


# -- a hook left due by a dead worker: the recovery sweep's part --------------------------------


def _failed_with_hook_due(
    key: str, holder: str, until_seconds: float, task: Any = fail
) -> JobRecord:
    """A job whose task failed for good, its hook marked due by ``holder`` (who then died)."""
    job = make_job([task.task(name="t", key=key)])
    job.scheduled()
    store = get_job_store()
    record = store.get(job.id)
    assert record is not None
    now = utcnow()
    state = JobState.from_dict(record.state)
    state.errors["0.0"] = f"RuntimeError: {key}: planned failure 1"
    state.hold_hook("0.0", "pending", holder, now, now + timedelta(seconds=until_seconds))
    failed = record.evolve(
        status=Status.FAILED, state={**state.to_dict(), "cursor": [0, 0, 0, 0]}, updated=now
    )
    assert store.put(failed)
    stored = store.get(job.id)
    assert stored is not None
    return stored


def _wait_hooks_done(job_id: str) -> JobRecord:
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        record = get_job_store().get(job_id)
        assert record is not None
        if "hooks" not in record.state:
            return record
        assert time.monotonic() < deadline, record.state
        time.sleep(0.01)


def test_the_recovery_sweep_runs_a_hook_whose_holder_died_once(prefix: str) -> None:
    key = f"{prefix}t"
    lapsed = _failed_with_hook_due(key, "dead-worker", until_seconds=-1)
    held = _failed_with_hook_due(f"{prefix}held", "live-worker", until_seconds=60)
    sweep = hooks.HookSweep(get_job_store, "sweeper", lease_seconds=5, interval=0)

    assert sweep.sweep(utcnow()) == 1  # the live worker's hold is left alone
    record = _wait_hooks_done(lapsed.id)

    [(name, job_id, error, _)] = hook_calls(key)
    assert (name, job_id, error) == ("t", lapsed.id, f"RuntimeError: {key}: planned failure 1")
    assert record.state["hooks_done"]["0.0"]["owner"] == "sweeper"
    assert record.status is Status.FAILED  # the outcome is untouched
    # Done is done: later sweeps (this one or another process's) do not run it again.
    assert sweep.sweep(utcnow()) == 0
    assert hooks.HookSweep(get_job_store, "other", 5, 0).sweep(utcnow()) == 0
    assert len(hook_calls(key)) == 1
    assert hook_calls(f"{prefix}held") == []
    still = get_job_store().get(held.id)
    assert still is not None and still.state["hooks"]["0.0"]["owner"] == "live-worker"


def test_the_hook_sweep_skips_a_damaged_row_and_a_bad_one_and_runs_the_others(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"{prefix}t"
    lapsed = _failed_with_hook_due(key, "dead-worker", until_seconds=-1)
    store = get_job_store()
    real = store.pending_hooks
    damaged = lapsed.evolve(id=f"{prefix}damaged", damaged="column 'state': not JSON")
    bad = lapsed.evolve(id=f"{prefix}bad", state={"hooks": {"0.0": "not a hook's entry"}})

    def pending(*args: Any, **kwargs: Any) -> list[JobRecord]:
        return [damaged, bad, *real(*args, **kwargs)]

    store.pending_hooks = pending  # type: ignore[method-assign]
    sweep = hooks.HookSweep(get_job_store, "sweeper", lease_seconds=5, interval=0)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.engine.hooks"):
        assert sweep.sweep(utcnow()) == 1
        _wait_hooks_done(lapsed.id)
        assert sweep.sweep(utcnow()) == 0  # the skipped ones again: not logged again
    assert len(hook_calls(key)) == 1
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2
    assert f"job {prefix}damaged skipped: its row cannot be read" in skipped[0]
    assert f"job {prefix}bad skipped, the rest goes on" in skipped[1]


def test_a_hook_taken_over_by_one_sweep_is_not_taken_by_another(prefix: str) -> None:
    key = f"{prefix}t"
    lapsed = _failed_with_hook_due(key, "dead-worker", until_seconds=-1, task=fail_slow_hook)
    first = hooks.HookSweep(get_job_store, "sweeper-1", lease_seconds=30, interval=0)
    second = hooks.HookSweep(get_job_store, "sweeper-2", lease_seconds=30, interval=0)
    SLOW_HOOK["started"].clear()
    SLOW_HOOK["release"].clear()
    try:
        assert first.sweep(utcnow()) == 1
        assert SLOW_HOOK["started"].wait(JOB_TIMEOUT)
        taken_by_second = second.sweep(utcnow())  # the first holds it while it runs
        SLOW_HOOK["release"].set()
        record = _wait_hooks_done(lapsed.id)
    finally:
        SLOW_HOOK["release"].set()

    assert taken_by_second == 0
    assert len(hook_calls(key)) == 1
    assert record.state["hooks_done"]["0.0"]["owner"] == "sweeper-1"


def test_a_step_recorded_while_a_recovered_hook_moves_the_row_is_not_lost(prefix: str) -> None:
    # A sweep marks an earlier task's hook done on the row of a job that moved
    # on; the worker holding the current step then records its outcome over it
    # (compare-and-set on a row whose version moved): its write must land, and
    # keep the sweep's change.
    job = make_job(
        [
            work.task(name="a", key=f"{prefix}a"),
            work.task(name="b", key=f"{prefix}b"),
        ]
    )
    job.scheduled()
    store = get_job_store()
    tasks = [[task.spec().to_dict() for task in w.get_tasks()] for w in job.workflows]
    scheduled = store.get(job.id)
    assert scheduled is not None
    now = utcnow()
    state = JobState.from_dict(scheduled.state)
    state.hold_hook("0.0", "running", "sweeper", now, now + timedelta(seconds=30))
    running = scheduled.evolve(
        status=Status.IN_PROGRESS,
        state={**state.to_dict(), "cursor": [0, 1, 0, 0]},
        lease_owner="worker",
        lease_expires=now + timedelta(seconds=30),
    )
    assert store.advance(running)
    claimed = store.get(job.id)
    assert claimed is not None
    claim = step_io.Claim(claimed, Position(0, 1), tasks)

    def mark_done(state: JobState) -> bool:
        state.hook_done("0.0", "sweeper", utcnow())
        return True

    _, written = hooks.HookRunner(get_job_store).update(job.id, mark_done)
    assert written  # the row's version moved under the claim

    recorded = step_io.StepIO(get_job_store, "worker", 30.0).record_outcome(
        claim, step_io.Outcome(True, "b-result")
    )

    assert recorded is not None and recorded.decision.action.value == "complete"
    stored = store.get(job.id)
    assert stored is not None and stored.status is Status.COMPLETED
    assert stored.state["results"]["0.1"] == "b-result"
    assert stored.state["hooks_done"]["0.0"]["owner"] == "sweeper"  # the sweep's change kept
    assert "hooks" not in stored.state
    assert stored.version == recorded.record.version


def test_a_step_whose_row_moved_otherwise_is_still_lost(prefix: str) -> None:
    # Only a change of the hooks is written over: a cancel still wins.
    job = make_job([work.task(name="a", key=f"{prefix}a")])
    job.scheduled()
    store = get_job_store()
    tasks = [[task.spec().to_dict() for task in w.get_tasks()] for w in job.workflows]
    scheduled = store.get(job.id)
    assert scheduled is not None
    running = scheduled.evolve(
        status=Status.IN_PROGRESS, state={"cursor": [0, 0, 0, 0]}, lease_owner="worker"
    )
    assert store.advance(running)
    claimed = store.get(job.id)
    assert claimed is not None
    assert store.advance(claimed.evolve(status=Status.CANCELLED, lease_owner=None))

    recorded = step_io.StepIO(get_job_store, "worker", 30.0).record_outcome(
        step_io.Claim(claimed, Position(), tasks), step_io.Outcome(True, "late")
    )

    assert recorded is None
    stored = store.get(job.id)
    assert stored is not None and stored.status is Status.CANCELLED
    assert not stored.state.get("results")  # the late result is not kept...
    [attempt] = stored.state["history"]["0.0"]  # ...but the attempt is, as cancelled
    assert attempt["outcome"] == "cancelled" and attempt["worker"] == "worker"


class DownWhileAHookIsMarked(MemoryJobStore):
    """A memory store that fails (store down) the writes marking a hook due, ``times`` times."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    def advance(self, record: JobRecord) -> bool:
        marking = any(e.get("status") == "pending" for e in record.state.get("hooks", {}).values())
        if marking and self.times > 0:
            self.times -= 1
            raise StoreUnavailableError("the database is down")
        return super().advance(record)


@pytest.mark.parametrize("optional", [False, True], ids=["required", "optional"])
def test_in_process_a_hook_is_called_once_when_the_write_of_the_failure_fails(
    stub_broker: StubBroker, prefix: str, optional: bool
) -> None:
    # The in-process worker never re-runs a step whose write failed: it carries
    # the row to its next write (or its final snapshot). The hook is called
    # once, and that write says it ran.
    store = DownWhileAHookIsMarked(times=5)  # every try of the engine's write
    set_job_store(store)
    key = f"{prefix}t"
    job = make_job(
        [
            fail.options(optional=optional).task(name="t", key=key),
            work.task(name="after", key=f"{prefix}after"),
        ]
    )

    [record] = run(InProcessDriver(), job)

    assert store.times == 0
    assert record.status is (Status.COMPLETED if optional else Status.FAILED)
    assert calls(key) == 1 and len(hook_calls(key)) == 1
    assert "hooks" not in record.state and "0.0" in record.state["hooks_done"]
