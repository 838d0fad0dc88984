"""Concurrency limits on both drivers (the ``driver`` fixture runs each test on the
in-process Worker, on a ``dramatiq.Worker`` over the stub broker, and over RabbitMQ
with PostgreSQL counting the slots).

A step over its channel's ``max_running`` or its key's limit is held until a slot
frees, not failed: no attempt is counted while it waits, and every job completes.
Each step gives its slot back once its outcome is recorded, whatever the outcome
(a success, a failure, a retry, a cancel), so nothing is left held at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    get_job_store,
    manager,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import get_transport
from pypepper_dramatiq.engine import concurrency
from pypepper_dramatiq.engine.concurrency import held_here
from pypepper_dramatiq.limits.concurrency import key_concurrency
from pypepper_dramatiq.transport.base import channel_slot_key

from .drivers import CHANNEL, JOB_TIMEOUT, Driver, InProcessDriver, make_job

_lock = threading.Lock()
#: Each call's key, in call order.
CALLS: list[str] = []
#: How many calls run now, by key group ("" for all), and the most seen at once.
RUNNING: Counter[str] = Counter()
PEAK: Counter[str] = Counter()


@workflow_task(name="driver-concurrency.step")
def step(task: Task, context: Context, key: str, group: str = "", pause: float = 0.05) -> str:
    with _lock:
        CALLS.append(key)
        for name in {"", group}:
            RUNNING[name] += 1
            PEAK[name] = max(PEAK[name], RUNNING[name])
    time.sleep(pause)
    with _lock:
        for name in {"", group}:
            RUNNING[name] -= 1
    return key


@workflow_task(name="driver-concurrency.fails")
def fails(task: Task, context: Context) -> None:
    raise RuntimeError("always")


@pytest.fixture(autouse=True)
def clean_calls() -> Iterator[None]:
    CALLS.clear()
    RUNNING.clear()
    PEAK.clear()
    yield
    CALLS.clear()


@pytest.fixture
def holds(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The workers' log lines of every level: a held start says so ("concurrency_hold")."""
    caplog.set_level(logging.DEBUG, logger="pypepper_dramatiq")
    return caplog


def held_ids(caplog: pytest.LogCaptureFixture) -> set[str]:
    return {
        str(getattr(r, "job_id", ""))
        for r in list(caplog.records)
        if getattr(r, "action", None) == "concurrency_hold"
    }


def attempts(job: Job) -> Counter[str]:
    record = get_job_store().get(job.id)
    assert record is not None
    return Counter({key: len(entries) for key, entries in record.state.get("history", {}).items()})


def status_of(job: Job) -> Status | None:
    record = get_job_store().get(job.id)
    return None if record is None else record.status


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"not within {JOB_TIMEOUT}s: {what}"
        time.sleep(0.02)


def free_slots(*keys: str) -> None:
    """Give back what an earlier test left held under ``keys`` (RabbitMQ's runs share
    PostgreSQL's slots table)."""
    transport = get_transport()
    for key in keys:
        for holder in transport.slots_held(key):
            transport.release_slots([key], holder)


def test_a_start_over_the_channel_limit_waits_for_a_slot_with_no_attempt_burnt(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # Another worker holds the channel's one slot: the job is held (logged), nothing of
    # it runs and no attempt is counted; once the slot is given back, it runs once.
    manager.new(CHANNEL, max_running=1)
    key = channel_slot_key(CHANNEL)
    free_slots(key)
    transport = get_transport()
    assert transport.acquire_slots([(key, 1)], "another-worker", 60.0)
    job = make_job([step.options(retry_count=0).task(name="w", key="held")])
    job.scheduled()
    driver.start()
    eventually(lambda: job.id in held_ids(holds), "the job is held")
    assert CALLS == []
    assert attempts(job) == Counter()
    transport.release_slots([key], "another-worker")
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    assert CALLS == ["held"]
    assert attempts(job) == Counter({"0.0": 1})
    assert transport.slots_held(key) == []


def test_running_steps_never_exceed_the_channel_limit_and_every_step_takes_a_slot(
    driver: Driver,
) -> None:
    # Six jobs of two steps under max_running=2: never more than two steps at once
    # (one at a time on the in-process Worker, which runs one job at a time), all
    # complete with one attempt per step, and no slot is left held.
    manager.new(CHANNEL, max_running=2)
    free_slots(channel_slot_key(CHANNEL))
    jobs = [
        make_job([step.options(retry_count=0).task(name=f"s{n}", key=f"j{j}s{n}") for n in (0, 1)])
        for j in range(6)
    ]
    for job in jobs:
        job.scheduled()
    driver.start()
    records = driver.wait(*jobs)
    assert [r.status for r in records] == [Status.COMPLETED] * 6
    assert all(attempts(job) == Counter({"0.0": 1, "0.1": 1}) for job in jobs)
    assert sorted(CALLS) == sorted(f"j{j}s{n}" for j in range(6) for n in (0, 1))
    assert 1 <= PEAK[""] <= 2
    assert get_transport().slots_held(channel_slot_key(CHANNEL)) == []
    assert held_here.holders() == []


def test_a_keys_limit_bounds_its_jobs_only_and_each_key_counts_apart(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # "tenant-*" at 1: the jobs of tenant-a never run two at once, nor tenant-b's;
    # jobs without a key (on a channel without a limit) are never held.
    key_concurrency.configure({"tenant-*": 1})
    free_slots("key:tenant-a", "key:tenant-b")
    keyed = [
        make_job([step.options(retry_count=0).task(name="w", key=f"{t}{n}", group=t)])
        for t in ("a", "b")
        for n in range(3)
    ]
    free = [make_job([step.options(retry_count=0).task(name="w", key=f"f{n}")]) for n in range(3)]
    for job in keyed:
        job.scheduled(concurrency_key=f"tenant-{job.workflows[0].get_tasks()[0].params['group']}")
    for job in free:
        job.scheduled()
    driver.start()
    records = driver.wait(*keyed, *free)
    assert [r.status for r in records] == [Status.COMPLETED] * 9
    assert all(attempts(job) == Counter({"0.0": 1}) for job in [*keyed, *free])
    assert PEAK["a"] == PEAK["b"] == 1
    assert not held_ids(holds) & {job.id for job in free}
    stored = get_job_store().get(keyed[0].id)
    assert stored is not None and stored.payload is not None
    assert stored.payload["concurrency_key"] == "tenant-a"
    assert get_transport().slots_held("key:tenant-a") == []


def test_failed_retried_and_cancelled_steps_give_their_slots_back(driver: Driver) -> None:
    # A task that fails through its retries, and a job cancelled before it ran: each
    # end gives its slot back (the one slot of the channel serves every attempt), and
    # a plain job after them runs.
    manager.new(CHANNEL, max_running=1)
    free_slots(channel_slot_key(CHANNEL))
    failing = make_job([fails.options(retry_count=2, retry_delay=0.0).task(name="f")])
    cancelled = make_job([step.task(name="c", key="never")])
    after = make_job([step.task(name="a", key="after")])
    failing.scheduled()
    cancelled.scheduled()
    Job.cancel_saved(cancelled.id)
    after.scheduled()
    driver.start()
    records = driver.wait(failing, cancelled, after)
    assert [r.status for r in records] == [Status.FAILED, Status.CANCELLED, Status.COMPLETED]
    assert attempts(failing) == Counter({"0.0": 3})
    assert CALLS == ["after"]
    assert get_transport().slots_held(channel_slot_key(CHANNEL)) == []
    assert held_here.holders() == []


def test_a_start_held_by_its_keys_limit_does_not_stall_the_other_jobs(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # Another worker holds tenant-a's one slot. A job of tenant-a taken first is held;
    # the jobs behind it (an unlimited one, one of tenant-b) run meanwhile: on the
    # in-process Worker too, where the held job yields its place instead of keeping
    # the worker. Once the slot is given back, the held job runs once.
    key_concurrency.configure({"tenant-*": 1})
    free_slots("key:tenant-a", "key:tenant-b")
    transport = get_transport()
    assert transport.acquire_slots([("key:tenant-a", 1)], "another-worker", 60.0)
    held = make_job([step.options(retry_count=0).task(name="w", key="held")])
    free = make_job([step.options(retry_count=0).task(name="w", key="free")])
    other = make_job([step.options(retry_count=0).task(name="w", key="other")])
    held.scheduled(concurrency_key="tenant-a")
    free.scheduled()
    other.scheduled(concurrency_key="tenant-b")
    driver.start()
    eventually(
        lambda: all(status_of(job) is Status.COMPLETED for job in (free, other)),
        "the jobs behind the held one complete",
    )
    assert held.id in held_ids(holds)
    assert "held" not in CALLS and attempts(held) == Counter()
    transport.release_slots(["key:tenant-a"], "another-worker")
    records = driver.wait(held, free, other)
    assert [r.status for r in records] == [Status.COMPLETED] * 3
    assert sorted(CALLS) == ["free", "held", "other"]
    assert transport.slots_held("key:tenant-a") == []


def test_held_starts_start_as_slots_free_by_priority_then_submit_order(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # max_running=1, its slot held by another worker: five jobs are held in submit
    # order (priorities 0, 5, 0, 9, 5). Once the slot is given back, each release wakes
    # the first in line, whose slot is kept for it: they run one at a time, highest
    # priority first, then in submit order, none overtaken by a delayed copy asking.
    manager.new(CHANNEL, max_running=1)
    key = channel_slot_key(CHANNEL)
    free_slots(key)
    transport = get_transport()
    assert transport.acquire_slots([(key, 1)], "another-worker", 60.0)
    jobs = [
        make_job([step.options(retry_count=0).task(name="w", key=f"j{n}-p{priority}")])
        for n, priority in enumerate((0, 5, 0, 9, 5))
    ]
    for job, priority in zip(jobs, (0, 5, 0, 9, 5), strict=True):
        job.priority = priority
    if isinstance(driver, InProcessDriver):
        # Scheduled before it runs (its channel then refuses jobs): it takes them by
        # priority, then submit order, and holds each in that order.
        for job in jobs:
            job.scheduled()
        driver.start()
    else:
        driver.start()
        for job in jobs:  # each held before the next is submitted: one order
            job.scheduled()
            eventually(lambda job=job: job.id in held_ids(holds), "the job is held")  # type: ignore[misc]
    eventually(lambda: all(job.id in held_ids(holds) for job in jobs), "every job is held")
    assert CALLS == []
    concurrency.give_back(transport, [key], "another-worker")
    records = driver.wait(*jobs)
    assert [r.status for r in records] == [Status.COMPLETED] * 5
    assert CALLS == ["j3-p9", "j1-p5", "j4-p5", "j0-p0", "j2-p0"]
    assert PEAK[""] == 1
    assert all(attempts(job) == Counter({"0.0": 1}) for job in jobs)
    assert transport.slots_held(key) == []


def test_a_held_start_is_woken_by_the_release_not_by_asking_again(
    driver: Driver, holds: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A held start asks again only in an hour here: it starts once the slot is given
    # back, because the release sends it again at once. Given back without waking
    # (a plain release_slots, a worker of before), it would wait for its hour.
    monkeypatch.setattr(concurrency, "hold_seconds", lambda holds: 3600.0)
    key_concurrency.configure({"tenant-*": 1})
    free_slots("key:tenant-w")
    transport = get_transport()
    assert transport.acquire_slots([("key:tenant-w", 1)], "another-worker", 60.0)
    job = make_job([step.options(retry_count=0).task(name="w", key="woken")])
    job.scheduled(concurrency_key="tenant-w")
    driver.start()
    eventually(lambda: job.id in held_ids(holds), "the job is held")
    assert CALLS == []
    [woken] = concurrency.give_back(transport, ["key:tenant-w"], "another-worker")
    assert woken.job_id == job.id
    eventually(lambda: status_of(job) is Status.COMPLETED, "the woken job completes")
    assert CALLS == ["woken"]
    assert attempts(job) == Counter({"0.0": 1})
    eventually(lambda: transport.slots_held("key:tenant-w") == [], "its slot is given back")


def test_a_held_start_whose_wake_was_never_sent_starts_by_its_own_copy(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # The releasing worker took the held start out of the line and kept the slot for
    # it, then died before sending it again (its process SIGKILLed). Nothing is lost:
    # the start's own delayed copy asks again, takes over the slot kept for its job,
    # and runs once.
    key_concurrency.configure({"tenant-*": 1})
    free_slots("key:tenant-k")
    transport = get_transport()
    assert transport.acquire_slots([("key:tenant-k", 1)], "dying-worker", 60.0)
    job = make_job([step.options(retry_count=0).task(name="w", key="kept")])
    job.scheduled(concurrency_key="tenant-k")
    driver.start()
    eventually(lambda: job.id in held_ids(holds), "the job is held")
    [woken] = transport.release_slots(["key:tenant-k"], "dying-worker", 60.0)  # never sent
    assert woken.job_id == job.id
    assert transport.slots_held("key:tenant-k") == [f"held:{job.id}"]
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    assert CALLS == ["kept"] and attempts(job) == Counter({"0.0": 1})
    assert transport.slots_held("key:tenant-k") == []
