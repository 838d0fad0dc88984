"""``Workflow.run()`` for real: executor call counts, delays, timeouts and cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from pypepper_dramatiq import (
    CANCEL_EVENT_KEY,
    CallableExecutor,
    Context,
    Job,
    Status,
    Task,
    Worker,
    Workflow,
    manager,
)
from pypepper_dramatiq.model.context import RESULTS_KEY
from pypepper_dramatiq.model.workflow import TIMEOUT_POOL_SIZE

#: Tolerance for timer granularity when asserting a lower bound on a wait.
EPSILON = 0.002


class Recorder:
    """A task function that fails its first ``failures`` calls and records each call."""

    def __init__(self, failures: int = 0, result: Any = "done", sleep: float = 0.0) -> None:
        self.failures = failures
        self.result = result
        self.sleep = sleep
        self.calls = 0
        self.starts: list[float] = []
        self.active = 0
        self.max_active = 0
        self.finished = 0
        self._lock = threading.Lock()

    def __call__(self, task: Task, context: Context) -> Any:
        with self._lock:
            self.calls += 1
            call = self.calls
            self.starts.append(time.monotonic())
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.sleep:
                time.sleep(self.sleep)
            if call <= self.failures:
                raise RuntimeError(f"failure {call}")
            return self.result
        finally:
            with self._lock:
                self.active -= 1
                self.finished += 1

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]


ALWAYS = 10**9

#: A round_timeout within which an attempt is sure to start, on a busy machine too: the
#: timeout counts from the submit to the pool (an attempt still queued when it expires
#: is cancelled unstarted), so the tests that need the attempt to run use this one.
STARTS_WITHIN = 0.5


def make_task(name: str, func: Any, **kwargs: Any) -> Task:
    return Task(
        channel_id="wf-channel",
        dag_id="dag",
        fingerprint=f"fp-{name}",
        name=name,
        category="test",
        description=f"task {name}",
        tags=["t"],
        executor=CallableExecutor(func),
        **kwargs,
    )


def run_one(func: Any, **kwargs: Any) -> Any:
    return Workflow([make_task("only", func, **kwargs)]).run()


# -- the retry table as executor calls --------------------------------------------------------


def test_add_task_and_add_tasks_chain_and_keep_order() -> None:
    a, b, c = (make_task(n, lambda task, context: None) for n in "abc")
    workflow = Workflow().add_task(a).add_tasks([b, c])
    assert [t.name for t in workflow.get_tasks()] == ["a", "b", "c"]
    workflow.get_tasks().clear()  # a copy: the workflow keeps its tasks
    assert len(workflow.get_tasks()) == 3


def test_success_first_time_calls_once() -> None:
    rec = Recorder(result={"v": 1})
    result = run_one(rec, retry_count=3, round_times=2)
    assert rec.calls == 1
    assert result.ok
    assert bool(result)
    assert result.outcomes[0].attempts == 1
    assert result.results == {"only": {"v": 1}}


@pytest.mark.parametrize("retry_count", [0, 1, 3])
def test_retry_count_gives_count_plus_one_attempts(retry_count: int) -> None:
    rec = Recorder(failures=ALWAYS)
    result = run_one(rec, retry_count=retry_count)
    assert rec.calls == retry_count + 1
    assert not result.ok
    assert not result.cancelled
    outcome = result.outcomes[0]
    assert not outcome.succeeded
    assert outcome.attempts == retry_count + 1
    assert outcome.error is not None and "RuntimeError" in outcome.error
    assert result.error is not None and "only" in result.error


def test_retry_count_stops_at_first_success() -> None:
    rec = Recorder(failures=2, result=42)
    result = run_one(rec, retry_count=5)
    assert rec.calls == 3
    assert result.ok
    assert result.outcomes[0].result == 42
    assert result.outcomes[0].error is None


def test_until_with_zero_count_retries_until_success() -> None:
    rec = Recorder(failures=25)
    result = run_one(rec, retry_until_completed=True)
    assert rec.calls == 26
    assert result.ok


def test_until_with_zero_count_is_capped_by_retry_until_max() -> None:
    rec = Recorder(failures=ALWAYS)
    result = run_one(rec, retry_until_completed=True, retry_until_max=4)
    assert rec.calls == 4
    assert not result.ok


def test_until_with_zero_count_default_cap_is_1000() -> None:
    rec = Recorder(failures=ALWAYS)
    result = run_one(rec, retry_until_completed=True)
    assert rec.calls == 1000
    assert not result.ok


def test_until_with_positive_count_ignores_retry_until_max() -> None:
    rec = Recorder(failures=ALWAYS)
    run_one(rec, retry_count=2, retry_until_completed=True, retry_until_max=50)
    assert rec.calls == 3
    rec_low = Recorder(failures=ALWAYS)
    run_one(rec_low, retry_count=2, retry_until_completed=True, retry_until_max=1)
    assert rec_low.calls == 3


def test_retry_until_max_applies_per_round() -> None:
    rec = Recorder(failures=ALWAYS)
    result = run_one(rec, retry_until_completed=True, retry_until_max=3, round_times=2)
    assert rec.calls == 6
    assert result.outcomes[0].attempts == 6


def test_round_times_gives_a_fresh_budget_per_round() -> None:
    rec = Recorder(failures=ALWAYS)
    result = run_one(rec, retry_count=1, round_times=3)
    assert rec.calls == 6
    assert not result.ok


def test_success_returns_early_and_later_rounds_never_run() -> None:
    rec = Recorder(failures=3)
    result = run_one(rec, retry_count=1, round_times=5)
    assert rec.calls == 4
    assert result.ok


# -- delays -----------------------------------------------------------------------------------


def test_retry_delay_is_waited_between_failures() -> None:
    rec = Recorder(failures=ALWAYS)
    run_one(rec, retry_count=2, retry_delay=0.05)
    assert rec.calls == 3
    assert all(gap >= 0.05 - EPSILON for gap in rec.gaps())


def test_retry_delay_is_not_waited_between_rounds() -> None:
    rec = Recorder(failures=ALWAYS)
    started = time.monotonic()
    run_one(rec, retry_count=0, retry_delay=5, round_times=3)
    assert rec.calls == 3
    assert time.monotonic() - started < 2.5


def test_retry_delay_inside_rounds_but_not_across() -> None:
    rec = Recorder(failures=ALWAYS)
    run_one(rec, retry_count=1, retry_delay=0.3, round_times=2)
    inside_first, across, inside_second = rec.gaps()
    assert inside_first >= 0.3 - EPSILON
    assert inside_second >= 0.3 - EPSILON
    assert across < 0.2


def test_no_delay_after_success_nor_before_the_next_task() -> None:
    first, second = Recorder(), Recorder()
    started = time.monotonic()
    result = Workflow(
        [
            make_task("a", first, retry_count=3, retry_delay=5),
            make_task("b", second, retry_count=3, retry_delay=5),
        ]
    ).run()
    assert result.ok
    assert (first.calls, second.calls) == (1, 1)
    assert time.monotonic() - started < 2.5


# -- optional and required tasks --------------------------------------------------------------


def test_optional_task_failure_continues_to_the_next_task() -> None:
    bad, good = Recorder(failures=ALWAYS), Recorder(result="after")
    result = Workflow(
        [make_task("bad", bad, retry_count=1, optional=True), make_task("good", good)]
    ).run()
    assert bad.calls == 2
    assert good.calls == 1
    assert result.ok
    assert [o.succeeded for o in result.outcomes] == [False, True]
    assert result.results == {"good": "after"}


def test_required_task_failure_aborts_the_rest() -> None:
    first, bad, later = Recorder(), Recorder(failures=ALWAYS), Recorder()
    result = Workflow(
        [make_task("first", first), make_task("bad", bad, retry_count=1), make_task("later", later)]
    ).run()
    assert (first.calls, bad.calls, later.calls) == (1, 2, 0)
    assert not result.ok
    assert [o.name for o in result.outcomes] == ["first", "bad"]
    assert result.error is not None and "bad" in result.error


# -- results shared through the context -------------------------------------------------------


def test_later_tasks_see_earlier_results_after_share_cancel_event() -> None:
    seen: dict[str, Any] = {}

    def producer(task: Task, context: Context) -> Any:
        return {"rows": 3}

    def consumer(task: Task, context: Context) -> Any:
        seen["results"] = dict(context.results)
        seen["raw"] = dict(context.context[RESULTS_KEY])
        return "consumed"

    workflow = Workflow([make_task("producer", producer), make_task("consumer", consumer)])
    job = Job(category="test", channel_id="wf-channel")
    job.workflows.append(workflow)
    job.share_cancel_event()
    assert workflow.run().ok
    assert seen["results"] == {"producer": {"rows": 3}}
    assert seen["raw"] == {"producer": {"rows": 3}}
    assert job.context.results == {"producer": {"rows": 3}, "consumer": "consumed"}


def test_a_failed_attempt_result_is_not_shared() -> None:
    seen: dict[str, Any] = {}

    def consumer(task: Task, context: Context) -> Any:
        seen.update(context.results)

    workflow = Workflow(
        [make_task("flaky", Recorder(failures=ALWAYS), optional=True), make_task("c", consumer)]
    )
    job = Job()
    job.workflows.append(workflow)
    job.share_cancel_event()
    assert workflow.run().ok
    assert "flaky" not in seen


def test_results_flow_across_workflows_of_a_job_run_by_a_worker() -> None:
    seen: dict[str, Any] = {}

    def reader(task: Task, context: Context) -> Any:
        seen.update(context.results)

    job = Job(channel_id="wf-channel")
    job.workflows.append(Workflow([make_task("first", lambda task, context: "one")]))
    job.workflows.append(Workflow([make_task("second", reader)]))
    job.scheduled()
    asyncio.run(Worker(manager.available("wf-channel")).run_once())
    assert job.status is Status.COMPLETED
    assert seen == {"first": "one"}


def test_a_required_failure_fails_the_job_and_skips_later_workflows() -> None:
    later = Recorder()
    job = Job(channel_id="wf-channel")
    job.workflows.append(Workflow([make_task("bad", Recorder(failures=ALWAYS), retry_count=1)]))
    job.workflows.append(Workflow([make_task("later", later)]))
    job.scheduled()
    asyncio.run(Worker(manager.available("wf-channel")).run_once())
    assert later.calls == 0
    assert job.status is Status.FAILED
    saved = Job.get_saved(job.id)
    assert saved is not None
    assert saved.status == "Failed"
    assert saved.error is not None and "bad" in saved.error


# -- round_timeout ----------------------------------------------------------------------------


def test_a_slow_attempt_counts_as_failed_and_is_retried() -> None:
    calls = Recorder()

    def slow_then_fast(task: Task, context: Context) -> Any:
        calls(task, context)
        if calls.calls == 1:
            time.sleep(STARTS_WITHIN + 0.3)
        return "fast"

    result = run_one(
        slow_then_fast, retry_count=1, round_timeout=STARTS_WITHIN, round_timeout_join=5
    )
    assert calls.calls == 2
    assert result.ok
    assert result.outcomes[0].attempts == 2
    assert result.outcomes[0].result == "fast"


def test_a_timed_out_attempt_reports_task_timeout_error() -> None:
    rec = Recorder(sleep=STARTS_WITHIN + 0.3)
    result = run_one(rec, round_timeout=STARTS_WITHIN, round_timeout_join=5)
    assert not result.ok
    assert rec.calls == 1
    error = result.outcomes[0].error
    assert error is not None and error.startswith("TaskTimeoutError")


def test_an_error_within_the_round_timeout_is_a_failed_attempt_like_any_other() -> None:
    rec = Recorder(failures=1)
    result = run_one(rec, retry_count=1, round_timeout=5)
    assert rec.calls == 2 and result.ok
    rec = Recorder(failures=5)
    result = run_one(rec, retry_count=1, round_timeout=5)
    assert not result.ok and rec.calls == 2
    error = result.outcomes[0].error
    assert error is not None and "RuntimeError" in error and "failure 2" in error


def test_attempts_of_a_task_never_overlap_even_when_they_time_out() -> None:
    rec = Recorder(sleep=STARTS_WITHIN + 0.2)
    result = run_one(rec, retry_count=2, round_timeout=STARTS_WITHIN, round_timeout_join=5)
    assert rec.calls == 3
    assert rec.max_active == 1
    assert not result.ok
    assert all(gap >= STARTS_WITHIN + 0.2 - EPSILON for gap in rec.gaps())


def test_run_joins_a_started_attempt_before_returning_when_join_is_forever() -> None:
    rec = Recorder(sleep=STARTS_WITHIN + 0.3)
    started = time.monotonic()
    result = run_one(rec, round_timeout=STARTS_WITHIN, round_timeout_join=0)
    assert time.monotonic() - started >= STARTS_WITHIN + 0.3 - EPSILON
    assert rec.finished == 1
    assert not result.ok


def test_round_timeout_join_bounds_the_wait_and_blocks_overlapping_submits() -> None:
    release = threading.Event()
    done = threading.Event()
    calls = Recorder()

    def hung(task: Task, context: Context) -> Any:
        calls(task, context)
        release.wait(10)
        done.set()
        return "late"

    try:
        started = time.monotonic()
        result = run_one(hung, retry_count=2, round_timeout=STARTS_WITHIN, round_timeout_join=0.1)
        elapsed = time.monotonic() - started
        assert elapsed < 3 * (STARTS_WITHIN + 0.1) + 3
        assert not done.is_set()
        assert calls.calls == 1  # the still-running attempt blocked the next submits
        assert not result.ok
        assert result.outcomes[0].attempts == 3
        assert result.outcomes[0].error is not None
        assert "TaskTimeoutError" in result.outcomes[0].error
    finally:
        release.set()
        assert done.wait(5)


def test_next_attempt_runs_once_the_orphaned_previous_one_finished() -> None:
    rec = Recorder()

    def slow_first(task: Task, context: Context) -> Any:
        rec(task, context)
        if rec.calls == 1:
            time.sleep(STARTS_WITHIN + 0.2)
            return "too late"
        return "in time"

    result = run_one(
        slow_first,
        retry_count=1,
        retry_delay=0.4,
        round_timeout=STARTS_WITHIN,
        round_timeout_join=0.05,
    )
    assert rec.calls == 2
    assert rec.max_active == 1
    assert result.ok
    assert result.outcomes[0].result == "in time"


def test_shared_pool_caps_timeout_executes_and_cancels_queued_work() -> None:
    release = threading.Event()
    lock = threading.Lock()
    state = {"started": 0, "active": 0, "max_active": 0, "finished": 0}
    all_started = threading.Event()

    def hung(task: Task, context: Context) -> Any:
        with lock:
            state["started"] += 1
            state["active"] += 1
            state["max_active"] = max(state["max_active"], state["active"])
            if state["started"] >= TIMEOUT_POOL_SIZE:
                all_started.set()
        release.wait(10)
        with lock:
            state["active"] -= 1
            state["finished"] += 1

    queued = Recorder()
    hogs = [
        threading.Thread(
            target=run_one, args=(hung,), kwargs={"round_timeout": 1.0, "round_timeout_join": 0.05}
        )
        for _ in range(TIMEOUT_POOL_SIZE)
    ]
    try:
        for thread in hogs:
            thread.start()
        assert all_started.wait(5)
        result = run_one(queued, round_timeout=0.1, round_timeout_join=0.05)
        assert not result.ok
        assert "TaskTimeoutError" in (result.outcomes[0].error or "")
    finally:
        release.set()
        for thread in hogs:
            thread.join(5)
    deadline = time.monotonic() + 5
    while state["finished"] < state["started"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a wrongly queued attempt would now get a free pool thread
    assert state["max_active"] == TIMEOUT_POOL_SIZE
    assert queued.calls == 0  # it timed out before it started, so it was cancelled


# -- cancellation -----------------------------------------------------------------------------


def test_cancel_mid_workflow_stops_before_the_next_task() -> None:
    job = Job()
    later = Recorder()

    def cancels(task: Task, context: Context) -> Any:
        event = context.context[CANCEL_EVENT_KEY]
        event.set()
        return "cancelled it"

    workflow = Workflow([make_task("cancels", cancels), make_task("later", later)])
    job.workflows.append(workflow)
    job.share_cancel_event()
    result = workflow.run()
    assert later.calls == 0
    assert result.cancelled
    assert not result.ok


def test_cancel_before_run_runs_nothing() -> None:
    job = Job()
    rec = Recorder()
    workflow = Workflow([make_task("t", rec)])
    job.workflows.append(workflow)
    job.share_cancel_event()
    job.cancel_event.set()
    result = workflow.run()
    assert rec.calls == 0
    assert result.cancelled


def test_cancel_wakes_a_retry_delay_wait() -> None:
    job = Job()
    first_failure = threading.Event()
    calls = Recorder(failures=ALWAYS)

    def fails(task: Task, context: Context) -> Any:
        try:
            return calls(task, context)
        finally:
            first_failure.set()

    workflow = Workflow([make_task("t", fails, retry_count=1, retry_delay=10)])
    job.workflows.append(workflow)
    job.share_cancel_event()
    box: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: box.setdefault("result", workflow.run()))
    runner.start()
    assert first_failure.wait(5)
    time.sleep(0.05)  # let run() enter the 10 s wait
    cancelled_at = time.monotonic()
    job.cancel_event.set()
    runner.join(5)
    assert not runner.is_alive()
    assert time.monotonic() - cancelled_at < 1.0
    assert calls.calls == 1
    assert box["result"].cancelled


def test_without_shared_event_a_workflow_is_not_cancellable_by_the_job() -> None:
    job = Job()
    job.cancel_event.set()
    rec = Recorder()
    workflow = Workflow([make_task("t", rec)])
    job.workflows.append(workflow)
    # No share_cancel_event(): the seed requires calling it before Workflow.run().
    assert workflow.run().ok
    assert rec.calls == 1


# -- Task constructor -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"round_timeout": -1},
        {"round_timeout_join": -0.5},
        {"retry_count": -1},
        {"retry_delay": -1},
        {"retry_until_max": 0},
        {"round_times": 0},
    ],
)
def test_task_rejects_out_of_range_bounds(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make_task("bad", Recorder(), **kwargs)


@pytest.mark.parametrize("field", ["round_timeout", "round_timeout_join", "retry_delay"])
def test_task_rejects_nan_bounds(field: str) -> None:
    with pytest.raises(ValueError):
        make_task("bad", Recorder(), **{field: float("nan")})


def test_task_needs_an_executor_or_an_executor_id() -> None:
    with pytest.raises(ValueError):
        Task("c", "d", "f", "n", None, "", [], None)
    task = Task("c", "d", "f", "n", None, "", [], None, executor_id="some.id")
    assert task.executor_id == "some.id"


def test_task_exposes_its_retry_table() -> None:
    task = make_task(
        "t",
        Recorder(),
        retry_count=2,
        retry_delay=0.5,
        retry_until_completed=True,
        retry_until_max=7,
        round_times=3,
        round_timeout=1.5,
        round_timeout_join=2,
        optional=True,
    )
    assert (task.retry_count, task.retry_delay, task.retry_until_completed) == (2, 0.5, True)
    assert (task.retry_until_max, task.round_times, task.optional) == (7, 3, True)
    assert (task.round_timeout, task.round_timeout_join) == (1.5, 2.0)
    defaults = make_task("d", Recorder())
    assert (defaults.retry_until_max, defaults.round_times, defaults.round_timeout) == (1000, 1, 0)


# -- the log line of a failed attempt ---------------------------------------------------------


def test_a_failed_attempt_is_logged_counted_from_1_with_its_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(failures=3)
    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        result = run_one(recorder, retry_count=1, round_times=2)
    assert result.ok and recorder.calls == 4
    failed = [
        r.getMessage() for r in caplog.records if getattr(r, "action", "") == "attempt_failed"
    ]
    assert [m.partition(": ")[2] for m in failed] == [
        "task only failed (attempt 1 of 2, round 1 of 2): RuntimeError: failure 1",
        "task only failed (attempt 2 of 2, round 1 of 2): RuntimeError: failure 2",
        "task only failed (attempt 1 of 2, round 2 of 2): RuntimeError: failure 3",
    ]
