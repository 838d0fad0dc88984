"""One behaviour contract, two drivers: the in-process Worker and the Dramatiq middleware.

Every scenario schedules a job with ``Job.scheduled()`` and lets a driver run
it to the end, then checks how many times each executor was called and the
job's final status in the store. The tasks are ``@workflow_task`` functions
(registered executor ids), so both drivers can rebuild and run them; what they
do is chosen by their params, and they count their calls in module-level
dicts under a lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    Job,
    NonRetriableError,
    Status,
    Task,
    manager,
    workflow_task,
)

from .conftest import CHANNEL, make_driver
from .drivers import (
    JOB_TIMEOUT,
    DramatiqDriver,
    Driver,
    _stored,
    make_job,
    run,
)

#: Timer granularity allowed when asserting that a wait lasted at least its delay.
EPSILON = 0.01

# -- call accounting shared by the tasks ----------------------------------------------------

_lock = threading.Lock()
#: Calls per key.
CALLS: dict[str, int] = defaultdict(int)
#: Start times (monotonic) of each call, per key.
STARTS: dict[str, list[float]] = defaultdict(list)
#: Every call's key, in call order (for ordering across tasks).
LOG: list[str] = []
#: What a task saw (results of earlier tasks, spin end times), per key.
SEEN: dict[str, Any] = {}
#: Signals from tasks to the test (e.g. "started"), per key.
EVENTS: dict[str, threading.Event] = defaultdict(threading.Event)


def _call(key: str) -> int:
    """Count one call of ``key``; returns its number (from 1)."""
    with _lock:
        CALLS[key] += 1
        STARTS[key].append(time.monotonic())
        LOG.append(key)
        return CALLS[key]


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


def order(prefix: str) -> list[str]:
    with _lock:
        return [key[len(prefix) :] for key in LOG if key.startswith(prefix)]


def _event(key: str) -> threading.Event:
    with _lock:
        return EVENTS[key]


# -- the tasks ------------------------------------------------------------------------------


@workflow_task(name="driver-contract.flaky")
def flaky(task: Task, context: Context, key: str, fail_first: int = 0, result: Any = None) -> Any:
    """Fails its first ``fail_first`` calls (every call when negative), then returns ``result``."""
    call = _call(key)
    if fail_first < 0 or call <= fail_first:
        raise RuntimeError(f"{key}: planned failure {call}")
    return result


@workflow_task(name="driver-contract.hopeless")
def hopeless(task: Task, context: Context, key: str) -> Any:
    """Fails in a way no retry can fix."""
    _call(key)
    raise NonRetriableError(f"{key}: the input is malformed")


@workflow_task(name="driver-contract.consume")
def consume(task: Task, context: Context, key: str, source: str) -> Any:
    """Reads the result of the earlier task ``source`` and returns it doubled."""
    _call(key)
    seen = context.results.get(source)
    with _lock:
        SEEN[key] = seen
    return {"n": seen["n"] * 2}


@workflow_task(name="driver-contract.spin")
def spin(task: Task, context: Context, key: str, seconds: float, spin_calls: int = 1) -> str:
    """Busy for ``seconds`` (short sleeps) on its first ``spin_calls`` calls; quick after."""
    call = _call(key)
    if call > spin_calls:
        return "quick"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    # Reached only when nothing interrupted the spin.
    _call(f"{key}:spun")
    with _lock:
        SEEN[f"{key}:spun-until"] = time.monotonic()
    return "spun"


@workflow_task(name="driver-contract.wait-for-cancel")
def wait_for_cancel(task: Task, context: Context, key: str, limit: float = 20.0) -> str:
    """Polls ``context.cancelled`` until the job is cancelled (fails after ``limit`` s)."""
    _call(key)
    _event(f"{key}:started").set()
    deadline = time.monotonic() + limit
    while not context.cancelled:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key}: never saw the cancel")
        time.sleep(0.01)
    _call(f"{key}:saw-cancel")
    return "stopped"


@pytest.fixture(
    params=[
        "inprocess",
        "dramatiq",
        "per-message",
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def driver(request: pytest.FixtureRequest) -> Driver:
    """The drivers of ``conftest.py``, and the Dramatiq driver with each message
    claimed and recorded by its worker thread (``claim_fetched`` off; ``dramatiq``
    claims each fetch ahead, the default)."""
    return make_driver(request)


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix for this test's call keys; its accounting is dropped afterwards."""
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for table in (CALLS, STARTS, SEEN, EVENTS):
            for key in [k for k in table if k.startswith(value)]:
                del table[key]
        LOG[:] = [k for k in LOG if not k.startswith(value)]


# -- the retry table ------------------------------------------------------------------------

#: (policy, calls that fail (-1: all), expected calls, expected status)
RETRY_TABLE = {
    "no-retries-one-attempt": ({}, -1, 1, Status.FAILED),
    "count-gives-count-plus-one-attempts": ({"retry_count": 2}, -1, 3, Status.FAILED),
    "last-attempt-succeeds": ({"retry_count": 2}, 2, 3, Status.COMPLETED),
    "success-returns-early": ({"retry_count": 5}, 1, 2, Status.COMPLETED),
    "until-with-count-0-bounded-by-until-max": (
        {"retry_until_completed": True, "retry_until_max": 4},
        -1,
        4,
        Status.FAILED,
    ),
    "until-with-count-0-retries-until-success": (
        {"retry_until_completed": True},
        5,
        6,
        Status.COMPLETED,
    ),
    "until-with-count-caps-and-ignores-until-max": (
        {"retry_until_completed": True, "retry_count": 2, "retry_until_max": 10},
        -1,
        3,
        Status.FAILED,
    ),
    "rounds-each-get-a-fresh-budget": ({"retry_count": 1, "round_times": 3}, -1, 6, Status.FAILED),
    "until-max-is-per-round": (
        {"retry_until_completed": True, "retry_until_max": 2, "round_times": 3},
        -1,
        6,
        Status.FAILED,
    ),
    "success-in-a-later-round-ends-the-rounds": (
        {"retry_count": 1, "round_times": 3},
        3,
        4,
        Status.COMPLETED,
    ),
}


@pytest.mark.parametrize(
    ("policy", "fail_first", "expected_calls", "expected_status"),
    list(RETRY_TABLE.values()),
    ids=list(RETRY_TABLE),
)
def test_retry_table(
    driver: Driver,
    prefix: str,
    policy: dict[str, Any],
    fail_first: int,
    expected_calls: int,
    expected_status: Status,
) -> None:
    key = f"{prefix}t"
    job = make_job([flaky.options(**policy).task(name="t", key=key, fail_first=fail_first)])

    [record] = run(driver, job)

    assert calls(key) == expected_calls
    assert record.status is expected_status
    if expected_status is Status.FAILED:
        assert record.error is not None and "task t failed" in record.error


def test_failed_optional_task_lets_the_workflow_continue(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            flaky.options(optional=True, retry_count=1, round_times=2).task(
                name="optional", key=f"{prefix}optional", fail_first=-1
            ),
            flaky.task(name="after", key=f"{prefix}after", result="ok"),
        ]
    )

    [record] = run(driver, job)

    assert calls(f"{prefix}optional") == 4
    assert calls(f"{prefix}after") == 1
    assert record.status is Status.COMPLETED


def test_failed_required_task_aborts_the_rest_of_the_job(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            flaky.task(name="first", key=f"{prefix}first"),
            flaky.options(retry_count=1).task(name="broken", key=f"{prefix}broken", fail_first=-1),
            flaky.task(name="later", key=f"{prefix}later"),
        ],
        [flaky.task(name="next-workflow", key=f"{prefix}next-workflow")],
    )

    [record] = run(driver, job)

    assert calls(f"{prefix}first") == 1
    assert calls(f"{prefix}broken") == 2
    assert calls(f"{prefix}later") == 0
    assert calls(f"{prefix}next-workflow") == 0
    assert record.status is Status.FAILED
    assert record.error is not None and "task broken failed" in record.error


# -- delays and timeouts --------------------------------------------------------------------


def test_retry_delay_waits_between_attempts(driver: Driver, prefix: str) -> None:
    delay = 0.4
    key = f"{prefix}slow-retries"
    job = make_job(
        [flaky.options(retry_count=2, retry_delay=delay).task(name="t", key=key, fail_first=-1)]
    )

    [record] = run(driver, job)

    assert calls(key) == 3
    assert record.status is Status.FAILED
    starts = STARTS[key]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert all(gap >= delay - EPSILON for gap in gaps), gaps


def test_round_timeout_counts_as_a_failed_attempt(driver: Driver, prefix: str) -> None:
    """The first attempt runs past round_timeout=1 s; the retry is quick and succeeds.

    Dramatiq's TimeLimit looks once a second, so it interrupts the busy
    thread 1 to 2 s in: that driver's spin is long enough never to end by itself.
    """
    key = f"{prefix}busy"
    seconds = 8.0 if driver.interrupts_busy_tasks else 1.6
    job = make_job(
        [spin.options(round_timeout=1, retry_count=1).task(name="busy", key=key, seconds=seconds)]
    )

    [record] = run(driver, job)

    assert calls(key) == 2
    assert record.status is Status.COMPLETED
    if driver.interrupts_busy_tasks:
        assert calls(f"{key}:spun") == 0  # interrupted, not left to finish
    else:
        # Left running, then joined before the retry: the attempts never overlap.
        assert calls(f"{key}:spun") == 1
        assert STARTS[key][1] >= SEEN[f"{key}:spun-until"]


def test_round_timeout_fails_the_job_when_no_attempt_is_left(driver: Driver, prefix: str) -> None:
    key = f"{prefix}busy"
    seconds = 8.0 if driver.interrupts_busy_tasks else 1.6
    job = make_job(
        [
            spin.options(round_timeout=1).task(name="busy", key=key, seconds=seconds),
            flaky.task(name="after", key=f"{prefix}after"),
        ]
    )

    [record] = run(driver, job)

    assert calls(key) == 1
    assert calls(f"{prefix}after") == 0
    assert record.status is Status.FAILED
    assert record.error is not None
    assert "TaskTimeoutError" in record.error and "round_timeout" in record.error


# -- results and ordering -------------------------------------------------------------------


def test_jobs_that_ran_give_their_channel_slots_back(driver: Driver, prefix: str) -> None:
    jobs = [make_job([flaky.task(name="t", key=f"{prefix}t{i}")]) for i in range(3)]
    records = run(driver, *jobs)

    assert {record.status for record in records} == {Status.COMPLETED}
    assert manager.available(CHANNEL).length() == 0


def test_later_tasks_see_results_of_earlier_ones(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            flaky.task(name="produce", key=f"{prefix}produce", result={"n": 21}),
            consume.task(name="double", key=f"{prefix}double", source="produce"),
        ],
        [consume.task(name="quadruple", key=f"{prefix}quadruple", source="double")],
    )

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert SEEN[f"{prefix}double"] == {"n": 21}
    assert SEEN[f"{prefix}quadruple"] == {"n": 42}


def test_workflows_of_a_job_run_in_order(driver: Driver, prefix: str) -> None:
    job = make_job(
        [flaky.task(name=n, key=f"{prefix}{n}") for n in ("w1-a", "w1-b")],
        [],
        [flaky.task(name=n, key=f"{prefix}{n}") for n in ("w3-a", "w3-b", "w3-c")],
    )

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert order(prefix) == ["w1-a", "w1-b", "w3-a", "w3-b", "w3-c"]


@pytest.mark.parametrize(
    ("optional", "after_runs", "ends"),
    [(False, 0, Status.FAILED), (True, 1, Status.COMPLETED)],
    ids=["required", "optional"],
)
def test_a_non_retriable_error_uses_up_the_task_at_once(
    driver: Driver, prefix: str, optional: bool, after_runs: int, ends: Status
) -> None:
    bad = hopeless.options(retry_count=3, round_times=2, optional=optional)
    job = make_job(
        [bad.task(name="bad", key=f"{prefix}bad"), flaky.task(name="after", key=f"{prefix}after")]
    )
    job.scheduled()
    driver.start()
    [record] = driver.wait(job)

    assert calls(f"{prefix}bad") == 1
    assert calls(f"{prefix}after") == after_runs
    assert record.status is ends
    if ends is Status.FAILED:
        assert record.error is not None and "NonRetriableError" in record.error


# -- cancellation ---------------------------------------------------------------------------


def test_job_cancelled_before_it_starts_never_runs(driver: Driver, prefix: str) -> None:
    job = make_job([flaky.task(name="t", key=f"{prefix}t")])
    job.scheduled()
    assert job.cancel()

    driver.start()
    [record] = driver.wait(job)

    assert calls(f"{prefix}t") == 0
    assert record.status is Status.CANCELLED
    assert manager.available(CHANNEL).length() == 0  # its channel slot was given back


def test_job_cancelled_by_id_before_it_starts_never_runs(driver: Driver, prefix: str) -> None:
    job = make_job([flaky.task(name="t", key=f"{prefix}t")])
    job.scheduled()
    assert Job.cancel_saved(job.id)  # as another process would, knowing only the id

    driver.start()
    [record] = driver.wait(job)

    assert calls(f"{prefix}t") == 0
    assert record.status is Status.CANCELLED
    assert manager.available(CHANNEL).length() == 0  # its channel slot was given back


@pytest.mark.parametrize("by_id", [False, True], ids=["job.cancel", "Job.cancel_saved"])
def test_cancel_during_a_task_ends_the_job_cancelled(
    driver: Driver, prefix: str, by_id: bool
) -> None:
    key = f"{prefix}long"
    job = make_job(
        [
            wait_for_cancel.task(name="long", key=key),
            flaky.task(name="after", key=f"{prefix}after"),
        ]
    )
    job.scheduled()
    driver.start()
    assert _event(f"{key}:started").wait(JOB_TIMEOUT), "the task never started"

    cancel = (lambda: Job.cancel_saved(job.id)) if by_id else job.cancel
    canceller = threading.Thread(target=cancel, name="canceller")
    canceller.start()
    canceller.join(JOB_TIMEOUT)
    [record] = driver.wait(job)

    assert calls(key) == 1
    assert calls(f"{key}:saw-cancel") == 1
    assert calls(f"{prefix}after") == 0
    assert record.status is Status.CANCELLED
    assert record.lease_owner is None and record.lease_expires is None  # like other ends
    assert record.state["cancelled_by"]["by"] == "api"
    # The attempt the cancel interrupted stays in the history (written after the cancel).
    deadline = time.monotonic() + JOB_TIMEOUT
    while not _stored(job).state.get("history", {}).get("0.0"):
        assert time.monotonic() < deadline, "the interrupted attempt was not recorded"
        time.sleep(0.01)
    [attempt] = _stored(job).state["history"]["0.0"]
    assert attempt["outcome"] == "cancelled" and attempt["worker"]
    assert _stored(job).state["cancelled_by"]["by"] == "api"


def test_cancel_during_a_retry_delay_runs_no_more_attempts(driver: Driver, prefix: str) -> None:
    key = f"{prefix}t"
    job = make_job(
        [flaky.options(retry_count=3, retry_delay=1.5).task(name="t", key=key, fail_first=-1)]
    )
    job.scheduled()
    driver.start()
    deadline = time.monotonic() + JOB_TIMEOUT
    while calls(key) < 1:
        assert time.monotonic() < deadline, "the first attempt never ran"
        time.sleep(0.01)

    job.cancel()
    [record] = driver.wait(job)

    assert calls(key) == 1
    assert record.status is Status.CANCELLED


# -- where the drivers differ ---------------------------------------------------------------


@pytest.mark.parametrize("by_id", [False, True], ids=["job.cancel", "Job.cancel_saved"])
def test_dramatiq_cancel_keeps_the_progress_workers_stored(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    prefix: str,
    by_id: bool,
) -> None:
    """Only the Dramatiq driver keeps progress in the row; a cancel must not erase it.

    ``Job.cancel_saved`` has no Job object nor task code; the worker still sees it.
    """
    driver = DramatiqDriver(stub_broker, start_worker)
    key = f"{prefix}long"
    job = make_job(
        [
            flaky.task(name="first", key=f"{prefix}first", result={"n": 1}),
            wait_for_cancel.task(name="long", key=key),
            flaky.task(name="after", key=f"{prefix}after"),
        ]
    )
    job.scheduled()
    driver.start()
    assert _event(f"{key}:started").wait(JOB_TIMEOUT), "the task never started"
    assert _stored(job).state["results"] == {"0.0": {"n": 1}}

    assert Job.cancel_saved(job.id) if by_id else job.cancel()
    [record] = driver.wait(job)

    assert calls(f"{key}:saw-cancel") == 1
    assert calls(f"{prefix}after") == 0
    assert record.status is Status.CANCELLED
    assert record.state.get("results") == {"0.0": {"n": 1}}
    assert record.state.get("attempts", {}).get("0.0") == 1
    assert record.lease_owner is None and record.lease_expires is None


# -- attempt history ------------------------------------------------------------------------


def test_every_attempt_is_kept_in_the_history_with_its_traceback(
    driver: Driver, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"{prefix}h"
    job = make_job(
        [
            flaky.options(retry_count=2).task(name="a", key=key, fail_first=2, result="ok"),
        ]
    )

    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        (record,) = run(driver, job)

    failed_lines = [
        r.getMessage() for r in caplog.records if getattr(r, "action", None) == "attempt_failed"
    ]
    assert len(failed_lines) == 2 and all(job.id in line for line in failed_lines)

    assert record.status is Status.COMPLETED
    entries = record.state["history"]["0.0"]
    assert [e["outcome"] for e in entries] == ["failed", "failed", "succeeded"]
    assert [e["attempt"] for e in entries] == [0, 1, 2]
    first = entries[0]
    assert first["error_type"] == "RuntimeError"
    assert first["message"] == f"{key}: planned failure 1"
    assert "Traceback" in first["traceback"] and "planned failure" in first["traceback"]
    assert "raise RuntimeError" in first["traceback"]  # the raising line is kept
    for entry in entries:
        assert entry["worker"]
        assert entry["started"] <= entry["ended"]
    assert "error_type" not in entries[2] and "traceback" not in entries[2]


def test_the_history_of_a_task_is_bounded(driver: Driver, prefix: str) -> None:
    key = f"{prefix}b"
    job = make_job([flaky.options(retry_count=14).task(name="a", key=key, fail_first=-1)])

    (record,) = run(driver, job)

    assert record.status is Status.FAILED
    entries = record.state["history"]["0.0"]
    assert len(entries) == 10
    assert [e["attempt"] for e in entries] == [0, *range(6, 15)]  # the first and the latest
    assert record.state["history_dropped"] == {"0.0": 5}


# -- the stored state -----------------------------------------------------------------------


def test_both_drivers_store_the_same_state_for_the_same_job(driver: Driver, prefix: str) -> None:
    # One engine: whoever ran the job, `pypepper-dramatiq show` tells the same story.
    job = make_job(
        [
            flaky.options(retry_count=1).task(
                name="a", key=f"{prefix}a", fail_first=1, result={"n": 1}
            ),
            flaky.options(optional=True).task(name="b", key=f"{prefix}b", fail_first=-1),
        ],
        [consume.task(name="c", key=f"{prefix}c", source="a")],
    )

    (record,) = run(driver, job)

    assert record.status is Status.COMPLETED
    state = dict(record.state)
    history = state.pop("history")
    state.pop("dispatch", None)  # which broker message carried it (Redis only)
    assert state == {
        "cursor": [1, 0, 0, 0],  # the last step run
        "results": {"0.0": {"n": 1}, "1.0": {"n": 2}},
        "errors": {"0.1": f"RuntimeError: {prefix}b: planned failure 1"},
        "attempts": {"0.0": 2, "0.1": 1, "1.0": 1},
        "skipped": ["0.1"],
    }
    assert {key: [e["outcome"] for e in entries] for key, entries in history.items()} == {
        "0.0": ["failed", "succeeded"],
        "0.1": ["failed"],
        "1.0": ["succeeded"],
    }
    assert record.lease_owner is None and record.lease_expires is None


# -- start times ----------------------------------------------------------------------------


def test_a_delayed_job_does_not_start_before_its_planned_time(driver: Driver, prefix: str) -> None:
    key = f"{prefix}later"
    job = make_job([flaky.task(name="later", key=key)])
    scheduled_at = time.monotonic()
    job.scheduled(delay=0.8)
    driver.start()
    [record] = driver.wait(job)

    assert record.status is Status.COMPLETED
    assert calls(key) == 1
    assert STARTS[key][0] - scheduled_at >= 0.8 - EPSILON


def test_a_job_past_its_start_deadline_ends_cancelled_without_running(
    driver: Driver, prefix: str
) -> None:
    key = f"{prefix}late"
    job = make_job([flaky.task(name="late", key=key)])
    job.scheduled(max_start_delay=0.2)
    time.sleep(0.5)  # no worker picked it up in time
    driver.start()
    [record] = driver.wait(job)

    assert calls(key) == 0
    assert record.status is Status.CANCELLED
    assert record.error is not None and "start deadline passed" in record.error
