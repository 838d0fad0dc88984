"""Continuation of zero-delay steps on the Dramatiq driver (stub broker).

A step to run at once is claimed by the write that records the step before it
and run in the same worker thread, without a message, within the bound of
``continue_steps`` / ``continue_seconds``. These tests count the step messages the
middleware sends, and check that a continued attempt keeps what a message's
attempt has: its ``round_timeout``, cancellation, the hand-back on shutdown.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CallableExecutor,
    ConfigError,
    Context,
    Job,
    JobRecord,
    Status,
    Task,
    Workflow,
    executor_registry,
    get_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import STEP_ACTOR, StepMessage
from pypepper_dramatiq.rules import steps as rules
from pypepper_dramatiq.rules.steps import Action, Position
from pypepper_dramatiq.settings import Settings

from .conftest import CHANNEL, workflow_middleware

TIMEOUT = 20.0

_lock = threading.Lock()
CALLS: dict[str, int] = defaultdict(int)
#: Set by a task when it starts, per key.
STARTED: dict[str, threading.Event] = defaultdict(threading.Event)


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


@workflow_task(name="driver-continuation.step")
def step(
    task: Task,
    context: Context,
    key: str,
    *,
    spin: float = 0.0,
    spin_first: bool = False,
    poll_cancel: bool = False,
    fail_first: int = 0,
    progress: bool = False,
) -> int:
    """Counts its calls; busy in Python for ``spin`` seconds (only on its first call
    with ``spin_first``), returning early on a cancel when ``poll_cancel``; its first
    ``fail_first`` calls raise; with ``progress``, it reports some first."""
    with _lock:
        CALLS[key] += 1
        number = CALLS[key]
    if progress:
        context.progress(1, 2, note="half")
    STARTED[key].set()
    if number <= fail_first:
        raise RuntimeError(f"{key}: planned failure {number}")
    if spin and (number == 1 or not spin_first):
        until = time.monotonic() + spin
        while time.monotonic() < until:
            if poll_cancel and context.cancelled:
                with _lock:
                    CALLS[f"{key}:saw-cancel"] += 1
                return number
            time.sleep(0.005)
    return number


@pytest.fixture
def prefix() -> str:
    return f"{uuid.uuid4().hex[:8]}:"


class Sent:
    """The step messages the middleware enqueues (the producer's first ones included;
    a delayed message moved to its queue by the worker is counted once)."""

    def __init__(self, broker: StubBroker) -> None:
        self.messages: list[StepMessage] = []
        self._ids: set[str] = set()
        original = broker.enqueue

        def enqueue(message: Any, *, delay: int | None = None) -> Any:
            if message.actor_name == STEP_ACTOR:
                with _lock:
                    if message.message_id not in self._ids:
                        self._ids.add(message.message_id)
                        self.messages.append(StepMessage.from_message(message))
            return original(message, delay=delay)

        broker.enqueue = enqueue  # type: ignore[method-assign]

    def of(self, job: Job) -> list[StepMessage]:
        with _lock:
            return [m for m in self.messages if m.job_id == job.id]


@pytest.fixture
def sent(stub_broker: StubBroker) -> Iterator[Sent]:
    yield Sent(stub_broker)


def bound(broker: StubBroker, **changes: Any) -> None:
    """Change the continuation settings of the broker's middleware."""
    middleware = workflow_middleware(broker)
    middleware.settings = replace(middleware.settings, **changes)


def job_of(*tasks: Task) -> Job:
    job = Job(category="continuation", channel_id=CHANNEL)
    job.workflows.append(Workflow(list(tasks)))
    return job


def chain(prefix: str, length: int) -> Job:
    return job_of(*(step.task(name=f"t{i}", key=f"{prefix}t{i}") for i in range(length)))


def stored(job: Job) -> JobRecord:
    record = get_job_store().get(job.id)
    assert record is not None
    return record


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def finish(broker: StubBroker, worker: dramatiq.Worker, job: Job) -> JobRecord:
    wait_for(lambda: stored(job).status.is_terminal, f"job {job.id} to end")
    broker.join(CHANNEL, timeout=int(TIMEOUT * 1000), fail_fast=True)
    worker.join()
    return stored(job)


# -- the decision -----------------------------------------------------------------------------


def test_may_continue_only_a_step_to_run_now_within_the_bound() -> None:
    now = rules.Step(Action.RUN, Position(0, 1))

    def may(step: rules.Step = now, **given: Any) -> bool:
        args: dict[str, Any] = {
            "continued": 0,
            "elapsed": 0.0,
            "max_steps": 5,
            "max_seconds": 1.0,
            "stopping": False,
        }
        return rules.may_continue(step, **{**args, **given})

    assert may()
    assert not may(rules.Step(Action.RUN, Position(0, 0, 0, 1), delay=0.5))  # a delayed retry
    assert may(rules.Step(Action.RUN, Position(0, 0, 1, 0)))  # a new round: no delay
    assert not may(rules.COMPLETE_STEP)
    assert not may(rules.Step(Action.FAIL, Position()))
    assert not may(continued=5)
    assert may(continued=4)
    assert not may(elapsed=1.0)
    assert not may(stopping=True)
    assert not may(max_steps=0)  # off
    assert not may(max_seconds=0)  # off


def test_the_bound_is_a_setting_checked_when_given() -> None:
    assert (Settings().continue_steps, Settings().continue_seconds) == (50, 1.0)
    settings = Settings.of({"continueSteps": 0, "continueSeconds": 2.5})
    assert (settings.continue_steps, settings.continue_seconds) == (0, 2.5)
    with pytest.raises(ConfigError, match=r"scheduler\.continueSteps"):
        Settings.of({"continueSteps": 1.5})
    with pytest.raises(ConfigError, match="continue_steps"):
        Settings(continue_steps=-1)
    with pytest.raises(ConfigError, match="continue_seconds"):
        Settings(continue_seconds=-1.0)


# -- fewer messages ---------------------------------------------------------------------------


def test_a_zero_delay_chain_runs_in_one_message(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    bound(stub_broker, continue_steps=50, continue_seconds=60.0)
    job = chain(prefix, 10)
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED
    assert [calls(f"{prefix}t{i}") for i in range(10)] == [1] * 10
    assert len(sent.of(job)) == 1  # the producer's; none from the worker
    # Each continued step was claimed by this worker, as a message's step would be.
    history = record.state["history"]
    assert {history[f"0.{i}"][0]["worker"] for i in range(10)} == {
        workflow_middleware(stub_broker).owner
    }


@pytest.mark.parametrize(
    ("steps", "seconds", "worker_messages"),
    [
        (3, 60.0, 2),  # 4 steps a message: 4 + 4 + 2
        (0, 60.0, 9),  # off: a message per step
        (50, 0.0, 9),  # off
    ],
)
def test_the_bound_sends_a_message_after_n_continued_steps(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    sent: Sent,
    prefix: str,
    steps: int,
    seconds: float,
    worker_messages: int,
) -> None:
    bound(stub_broker, continue_steps=steps, continue_seconds=seconds)
    job = chain(prefix, 10)
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED
    assert [calls(f"{prefix}t{i}") for i in range(10)] == [1] * 10
    messages = sent.of(job)[1:]
    assert len(messages) == worker_messages
    if steps == 3:
        assert [m.position.task for m in messages] == [4, 8]


def test_the_time_bound_sends_the_next_step_as_a_message(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    bound(stub_broker, continue_steps=50, continue_seconds=0.3)
    job = job_of(
        step.task(name="slow", key=f"{prefix}slow", spin=0.4),
        step.task(name="next", key=f"{prefix}next"),
    )
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED
    assert [m.position.task for m in sent.of(job)[1:]] == [1]


def test_an_immediate_retry_continues_and_a_delayed_one_is_a_message(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    bound(stub_broker, continue_seconds=60.0)
    job = job_of(
        step.options(retry_count=1).task(name="now", key=f"{prefix}now", fail_first=1),
        step.options(retry_count=1, retry_delay=0.2).task(
            name="later", key=f"{prefix}later", fail_first=1
        ),
    )
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED
    assert calls(f"{prefix}now") == calls(f"{prefix}later") == 2
    # "now" (both attempts) and the first attempt of "later" ran on the first
    # message; the delayed retry is a delayed message, holding no thread.
    assert [m.position.to_list() for m in sent.of(job)[1:]] == [[0, 1, 0, 1]]


# -- the guarantees of a continued attempt --------------------------------------------------


def test_round_timeout_interrupts_a_continued_attempt(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    """The busy task runs after a first one, in the same message: Dramatiq's TimeLimit
    does not cover it; its deadline is enforced by the lease keeper."""
    bound(stub_broker, continue_seconds=60.0)
    job = job_of(
        step.task(name="first", key=f"{prefix}first"),
        step.options(round_timeout=0.5, retry_count=1).task(
            name="busy", key=f"{prefix}busy", spin=15, spin_first=True
        ),
        step.task(name="after", key=f"{prefix}after"),
    )
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED
    assert calls(f"{prefix}busy") == 2
    entries = record.state["history"]["0.1"]
    assert [e["outcome"] for e in entries] == ["timed_out", "succeeded"]
    assert "round_timeout=0.5" in entries[0]["message"]
    assert len(sent.of(job)) == 1  # all continued


def test_round_timeout_of_continued_attempts_fails_the_job_per_its_policy(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], prefix: str
) -> None:
    bound(stub_broker, continue_seconds=60.0)
    job = job_of(
        step.task(name="first", key=f"{prefix}first"),
        step.options(round_timeout=0.5, retry_count=1).task(
            name="busy", key=f"{prefix}busy", spin=15
        ),
        step.task(name="never", key=f"{prefix}never"),
    )
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.FAILED
    assert record.error is not None and "TaskTimeoutError" in record.error
    assert calls(f"{prefix}busy") == 2
    assert calls(f"{prefix}never") == 0


def test_the_first_messages_time_limit_does_not_cut_a_continued_attempt(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    bound(stub_broker, continue_seconds=60.0)
    job = job_of(
        step.options(round_timeout=1).task(name="limited", key=f"{prefix}limited"),
        step.task(name="long", key=f"{prefix}long", spin=2.5),
    )
    job.scheduled()

    record = finish(stub_broker, start_worker(), job)

    assert record.status is Status.COMPLETED, record.error
    assert calls(f"{prefix}long") == 1
    assert len(sent.of(job)) == 1


def test_a_cancel_reaches_a_continued_attempt_and_no_later_task_starts(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    bound(stub_broker, continue_seconds=60.0)
    job = job_of(
        step.task(name="first", key=f"{prefix}first"),
        step.task(name="polls", key=f"{prefix}polls", spin=15, poll_cancel=True),
        step.task(name="never", key=f"{prefix}never"),
    )
    job.scheduled()
    worker = start_worker()
    assert STARTED[f"{prefix}polls"].wait(TIMEOUT)

    assert Job.cancel_saved(job.id)
    record = finish(stub_broker, worker, job)

    assert record.status is Status.CANCELLED
    assert calls(f"{prefix}polls:saw-cancel") == 1
    assert calls(f"{prefix}never") == 0
    assert len(sent.of(job)) == 1  # "polls" was continued, not a message of its own


@pytest.mark.parametrize("progress", [False, True], ids=["quiet", "reporting-progress"])
def test_shutdown_during_a_continued_attempt_hands_the_step_back(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    sent: Sent,
    prefix: str,
    progress: bool,
) -> None:
    bound(stub_broker, continue_seconds=60.0)
    middleware = workflow_middleware(stub_broker)
    middleware.shutdown_grace = 0.2
    job = job_of(
        step.task(name="first", key=f"{prefix}first"),
        step.task(name="busy", key=f"{prefix}busy", spin=30, progress=progress),
        step.task(name="after", key=f"{prefix}after"),
    )
    job.scheduled()
    worker = start_worker()
    assert STARTED[f"{prefix}busy"].wait(TIMEOUT)

    worker.stop()  # before_worker_shutdown: the grace, then Shutdown in the thread

    record = stored(job)
    assert record.status is Status.IN_PROGRESS
    assert record.state["cursor"] == [0, 1, 0, 0]
    assert record.lease_owner is None  # released for another worker
    assert "0.1" not in record.state.get("attempts", {})  # the attempt is not counted
    assert calls(f"{prefix}after") == 0
    handed_back = sent.of(job)[1:]
    assert [m.position.to_list() for m in handed_back] == [[0, 1, 0, 0]]


def test_a_continued_step_whose_task_is_unknown_here_is_handed_back_uncounted(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], sent: Sent, prefix: str
) -> None:
    """A rolling deploy: the second task's executor is not registered here yet."""
    bound(stub_broker, continue_seconds=60.0)
    workflow_middleware(stub_broker).unknown_task_grace = 30
    executor_id = f"tests.continuation-later.{prefix}"
    job = job_of(
        step.task(name="known", key=f"{prefix}known"),
        Task(CHANNEL, "d", "f", "later", "t", "", [], None, executor_id=executor_id),
    )
    job.scheduled()
    worker = start_worker()
    wait_for(lambda: any(m.unknown_since is not None for m in sent.of(job)), "the hand-back")

    record = stored(job)
    assert record.status is Status.IN_PROGRESS
    assert record.state["attempts"] == {"0.0": 1}  # the unknown one is not counted
    executor_registry.register(executor_id, CallableExecutor(lambda task, context: "new"))
    try:
        record = finish(stub_broker, worker, job)
    finally:
        executor_registry.unregister(executor_id)

    assert record.status is Status.COMPLETED
    assert record.state["results"]["0.1"] == "new"
    assert calls(f"{prefix}known") == 1
