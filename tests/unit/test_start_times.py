"""scheduled(delay=, eta=, max_start_delay=): checked first, then kept with the job."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pypepper_dramatiq import CallableExecutor, Job, Status, Task, Worker, Workflow, manager
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.rules.start_times import (
    StartTimes,
    check_start_options,
    is_retry,
    late_retry,
)

CHANNEL = "timed"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def start_times(now: datetime, **options: Any) -> StartTimes:
    """The start times ``scheduled(**options)`` asks for at ``now``: the options
    checked, then read as times."""
    return check_start_options(now, **options).times(now)


def test_delay_and_eta_give_the_planned_start_and_the_deadline_counts_from_it() -> None:
    assert start_times(NOW) == start_times(NOW, delay=0)
    assert start_times(NOW).not_before is None and start_times(NOW).deadline is None
    in_a_minute = start_times(NOW, delay=timedelta(minutes=1), max_start_delay=30)
    assert in_a_minute.not_before == NOW + timedelta(minutes=1)
    assert in_a_minute.deadline == NOW + timedelta(minutes=1, seconds=30)
    berlin = timezone(timedelta(hours=1))
    at = start_times(NOW, eta=datetime(2026, 11, 30, 14, 0, tzinfo=berlin), max_start_delay=0)
    assert at.not_before == NOW + timedelta(hours=1) == at.deadline
    # An eta already past starts at once, but its deadline still counts from it.
    late = start_times(NOW, eta=NOW - timedelta(seconds=10), max_start_delay=5)
    assert late.not_before is None and late.deadline == NOW - timedelta(seconds=5)
    assert start_times(NOW, max_start_delay=2).deadline == NOW + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"delay": 1, "eta": NOW}, ValueError, "delay and eta"),
        ({"eta": datetime(2026, 12, 1, 9, 0)}, ValueError, "eta must be timezone-aware"),
        ({"delay": -1}, ValueError, "delay"),
        ({"delay": float("inf")}, ValueError, "delay"),
        ({"max_start_delay": -0.5}, ValueError, "max_start_delay"),
        ({"delay": "10"}, TypeError, "delay"),
        ({"eta": "tomorrow"}, TypeError, "eta"),
        ({"max_start_delay": True}, TypeError, "max_start_delay"),
        (
            {"max_start_delay": 0.0005},
            ValueError,
            "max_start_delay must be a whole number of milliseconds",
        ),
        (
            {"max_start_delay": timedelta(microseconds=1500)},
            ValueError,
            "max_start_delay must be a whole number of milliseconds",
        ),
    ],
    ids=[
        "both",
        "naive-eta",
        "negative",
        "infinite",
        "negative-deadline",
        "str-delay",
        "str-eta",
        "bool",
        "half-a-millisecond",
        "sub-millisecond-timedelta",
    ],
)
def test_bad_options_are_refused_naming_them_and_nothing_is_queued_or_stored(
    options: dict[str, Any], error: type[Exception], names: str
) -> None:
    job = _job([])
    with pytest.raises(error, match=names):
        job.scheduled(**options)
    assert job.status is Status.UNKNOWN
    assert Job.get_saved(job.id) is None
    assert manager.available(CHANNEL).length() == 0


def _job(calls: list[float]) -> Job:
    job = Job(category="timed", channel_id=CHANNEL)
    job.workflows.append(
        Workflow(
            [
                Task(
                    CHANNEL,
                    "d",
                    "f",
                    "t",
                    None,
                    "",
                    [],
                    CallableExecutor(lambda task, context: calls.append(time.monotonic())),
                ),
            ]
        )
    )
    return job


def test_scheduled_returns_the_job_id_and_keeps_the_times_in_the_row() -> None:
    job = _job([])
    before = utcnow()
    assert job.scheduled(delay=30, max_start_delay=5) == job.id
    row = Job.get_saved(job.id)
    assert row is not None and row.not_before is not None and row.start_deadline is not None
    assert before + timedelta(seconds=30) <= row.not_before <= utcnow() + timedelta(seconds=30)
    assert row.start_deadline == row.not_before + timedelta(seconds=5)
    assert row.release_at is None  # held in the store only on Redis


def test_the_in_process_worker_does_not_run_a_delayed_job_early() -> None:
    calls: list[float] = []
    job = _job(calls)
    scheduled_at = time.monotonic()
    job.scheduled(delay=0.6)
    ran = asyncio.run(Worker(manager.available(CHANNEL)).run_once())
    assert ran is job and job.status is Status.COMPLETED
    assert len(calls) == 1 and calls[0] - scheduled_at >= 0.6


def test_the_in_process_worker_cancels_a_job_past_its_start_deadline_unrun() -> None:
    calls: list[float] = []
    job = _job(calls)
    job.scheduled(max_start_delay=0.1)
    time.sleep(0.3)  # nobody picked it up in time
    asyncio.run(Worker(manager.available(CHANNEL)).run_once())
    assert calls == []
    row = Job.get_saved(job.id)
    assert row is not None and row.status is Status.CANCELLED
    assert row.error is not None and "start deadline passed" in row.error


def test_a_start_deadline_is_given_in_whole_milliseconds() -> None:
    for seconds in (1.001, 0.25, timedelta(milliseconds=7), 0):
        deadline = start_times(NOW, max_start_delay=seconds).deadline
        assert deadline is not None
        assert (deadline - NOW) % timedelta(milliseconds=1) == timedelta(0)
    assert start_times(NOW, max_start_delay=1.001).deadline == NOW + timedelta(milliseconds=1001)


def test_a_retry_is_a_later_attempt_or_round_and_late_only_after_the_deadline() -> None:
    assert not is_retry([0, 0, 0, 0]) and not is_retry([1, 3, 0, 0]) and not is_retry(None)
    assert is_retry([0, 0, 0, 1]) and is_retry([0, 2, 1, 0])
    passed, later = NOW - timedelta(milliseconds=1), NOW + timedelta(milliseconds=1)
    assert late_retry(passed, [0, 0, 0, 1], NOW)
    assert not late_retry(NOW, [0, 0, 0, 1], NOW)  # at the deadline: in time
    assert not late_retry(later, [0, 0, 1, 0], NOW)
    assert not late_retry(passed, [0, 1, 0, 0], NOW)  # the next task's first attempt
    assert not late_retry(None, [0, 0, 0, 1], NOW)
