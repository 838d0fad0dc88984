"""WorkflowMiddleware's hooks: they fail closed, and leave plain actors to Dramatiq."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CallableExecutor,
    Context,
    Job,
    JobRecord,
    Status,
    StoreUnavailableError,
    Task,
    Workflow,
    executor_registry,
    get_job_store,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import OPTION_KEY, STEP_ACTOR, StepMessage
from pypepper_dramatiq.rules.events import INIT, SCHEDULE
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import CHANNEL, workflow_middleware

TIMEOUT = 20.0
EPSILON = 0.01

_lock = threading.Lock()
CALLS: dict[str, int] = defaultdict(int)


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


@workflow_task(name="driver-middleware.count")
def count(task: Task, context: Context, key: str, fail: bool = False) -> str:
    """Counts its calls; fails every one when ``fail``."""
    with _lock:
        CALLS[key] += 1
    if fail:
        raise RuntimeError(f"{key}: planned failure")
    return "counted"


class BreakableStore(MemoryJobStore):
    """A memory store whose reads or writes can be made to raise."""

    def __init__(self) -> None:
        super().__init__()
        self.get_error: Exception | None = None
        self.put_error: Exception | None = None
        #: When each failed read happened (monotonic).
        self.failed_gets: list[float] = []

    def get(self, job_id: str) -> JobRecord | None:
        error = self.get_error
        if error is not None:
            self.failed_gets.append(time.monotonic())
            raise error
        return super().get(job_id)

    def put(self, record: JobRecord) -> bool:
        error = self.put_error
        if error is not None:
            raise error
        return super().put(record)

    def advance(self, record: JobRecord) -> bool:
        error = self.put_error
        if error is not None:
            raise error
        return super().advance(record)


@pytest.fixture
def store(stub_broker: StubBroker) -> BreakableStore:
    installed = set_job_store(BreakableStore())
    assert isinstance(installed, BreakableStore)
    return installed


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def drain(broker: StubBroker, worker: dramatiq.Worker) -> None:
    """Wait until every message was processed (dead letters allowed)."""
    broker.join(CHANNEL, timeout=int(TIMEOUT * 1000), fail_fast=False)
    worker.join()


def status_of(job: Job) -> Status | None:
    record = get_job_store().get(job.id)
    return None if record is None else record.status


def counting_job(key: str, **params: Any) -> Job:
    job = Job(category="middleware", channel_id=CHANNEL)
    job.workflows.append(Workflow([count.task(name="count", key=key, **params)]))
    return job


@pytest.fixture
def key() -> str:
    return f"{uuid.uuid4().hex[:8]}:count"


# -- failing closed -------------------------------------------------------------------------


def test_unreachable_store_defers_the_step_without_running_it(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    store: BreakableStore,
    key: str,
) -> None:
    defer = 0.3
    workflow_middleware(stub_broker).defer_seconds = defer
    job = counting_job(key)
    job.scheduled()
    store.get_error = StoreUnavailableError("the database is down")

    start_worker()
    wait_for(lambda: len(store.failed_gets) >= 3, "three deferred claims")

    assert calls(key) == 0
    gaps = [b - a for a, b in itertools.pairwise(store.failed_gets)]
    assert all(gap >= defer - EPSILON for gap in gaps), gaps
    assert stub_broker.dead_letters == []

    store.get_error = None
    wait_for(lambda: status_of(job) is Status.COMPLETED, "the job to complete")
    drain(stub_broker, start_worker())
    assert calls(key) == 1
    assert stub_broker.dead_letters == []


def test_unexpected_claim_error_dead_letters_without_running(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    store: BreakableStore,
    key: str,
) -> None:
    job = counting_job(key)
    job.scheduled()
    store.put_error = RuntimeError("a bug in the store")

    drain(stub_broker, start_worker())

    assert calls(key) == 0
    [dead] = stub_broker.dead_letters
    assert dead.actor_name == STEP_ACTOR
    assert dead.options[OPTION_KEY]["job"] == job.id
    store.put_error = None
    assert status_of(job) is Status.SCHEDULED


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="no-step-data"),
        pytest.param({OPTION_KEY: "garbage"}, id="not-a-dict"),
        pytest.param({OPTION_KEY: {"pos": [0, 0, 0, 0]}}, id="no-job-id"),
        pytest.param({OPTION_KEY: {"job": "JOB", "pos": ["x"]}}, id="bad-position"),
        pytest.param({OPTION_KEY: {"job": "JOB", "record": {"no": "id"}}}, id="bad-record"),
    ],
)
def test_undecodable_step_message_is_dead_lettered(
    stub_broker: StubBroker,
    stub_worker: dramatiq.Worker,
    key: str,
    options: dict[str, Any],
) -> None:
    # A stored, startable job the garbage points at: it must not be run.
    job = counting_job(key)
    job.apply_event(INIT)
    job.apply_event(SCHEDULE)
    assert job.save()
    data = options.get(OPTION_KEY)
    if isinstance(data, dict) and data.get("job") == "JOB":
        options = {OPTION_KEY: {**data, "job": job.id}}
    garbage = dramatiq.Message(
        queue_name=CHANNEL, actor_name=STEP_ACTOR, args=(), kwargs={}, options=options
    )

    stub_broker.enqueue(garbage)
    drain(stub_broker, stub_worker)

    assert calls(key) == 0
    assert [m.message_id for m in stub_broker.dead_letters] == [garbage.message_id]
    assert status_of(job) is Status.SCHEDULED


# -- Dramatiq's own retries -----------------------------------------------------------------


def test_plain_actors_keep_dramatiqs_retries(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker
) -> None:
    attempts: list[float] = []

    def always_fails() -> None:
        attempts.append(time.monotonic())
        raise ValueError("plain actor failure")

    plain = dramatiq.actor(
        always_fails,
        broker=stub_broker,
        actor_name=f"plain_{uuid.uuid4().hex[:8]}",
        queue_name=CHANNEL,
        max_retries=2,
        min_backoff=10,
        max_backoff=50,
    )
    plain.send()
    drain(stub_broker, stub_worker)

    assert len(attempts) == 3
    [dead] = stub_broker.dead_letters
    assert dead.actor_name == plain.actor_name
    assert dead.options["retries"] == 3


def test_failing_step_is_not_retried_by_dramatiq(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker, key: str
) -> None:
    job = counting_job(key, fail=True)
    job.scheduled()

    wait_for(lambda: status_of(job) is Status.FAILED, "the job to fail")
    drain(stub_broker, stub_worker)

    assert calls(key) == 1
    assert stub_broker.dead_letters == []


def test_a_task_whose_executor_the_worker_does_not_know_fails_the_job_naming_it(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker, key: str
) -> None:
    # A producer deployed with a task the workers were not (yet) given; no grace.
    workflow_middleware(stub_broker).unknown_task_grace = 0
    missing = f"tests.never-registered.{key}"
    job = Job(category="middleware", channel_id=CHANNEL)
    job.workflows.append(
        Workflow(
            [
                Task(
                    CHANNEL,
                    "d",
                    "f",
                    "ghost",
                    "t",
                    "",
                    [],
                    None,
                    executor_id=missing,
                    retry_count=1,
                ),
                count.task(name="count", key=key),
            ]
        )
    )
    job.scheduled()

    wait_for(lambda: status_of(job) is Status.FAILED, "the job to fail")
    drain(stub_broker, stub_worker)

    record = get_job_store().get(job.id)
    assert record is not None and record.error is not None
    assert "UnknownExecutorError" in record.error and missing in record.error
    assert record.state["attempts"] == {"0.0": 1}  # no retry burned: it cannot help
    assert calls(key) == 0  # the rest of the workflow does not run
    assert stub_broker.dead_letters == []  # failed through the rules, no message dropped


# -- duplicates -----------------------------------------------------------------------------


@pytest.mark.parametrize("with_record", [False, True], ids=["bare", "with-record"])
def test_duplicate_of_a_finished_step_is_acknowledged_unrun(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker, key: str, with_record: bool
) -> None:
    job = counting_job(key)
    job.scheduled()
    wait_for(lambda: status_of(job) is Status.COMPLETED, "the job to complete")
    drain(stub_broker, stub_worker)
    finished = get_job_store().get(job.id)
    assert finished is not None and calls(key) == 1

    duplicate = StepMessage(job.id, Position(), job.to_record() if with_record else None)
    stub_broker.enqueue(duplicate.to_message(CHANNEL))
    drain(stub_broker, stub_worker)

    assert calls(key) == 1
    assert stub_broker.dead_letters == []
    assert get_job_store().get(job.id) == finished


def _job_with_unknown_task(key: str, executor_id: str) -> Job:
    job = Job(category="middleware", channel_id=CHANNEL)
    job.workflows.append(
        Workflow(
            [
                Task(CHANNEL, "d", "f", "new-task", "t", "", [], None, executor_id=executor_id),
                count.task(name="count", key=key),
            ]
        )
    )
    return job


def test_an_unknown_task_waits_for_a_worker_that_knows_it_without_burning_attempts(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker, key: str
) -> None:
    # Rolling deploy: new code submitted the job before the workers were upgraded.
    workflow_middleware(stub_broker).unknown_task_grace = 30
    executor_id = f"tests.deployed-later.{key}"
    job = _job_with_unknown_task(key, executor_id)
    job.scheduled()
    time.sleep(1.5)  # handed back at least once meanwhile
    record = get_job_store().get(job.id)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.state.get("attempts", {}) == {}  # no attempt counted while waiting

    executor_registry.register(executor_id, CallableExecutor(lambda task, context: "new"))
    try:
        wait_for(lambda: status_of(job) is Status.COMPLETED, "the job to complete")
    finally:
        executor_registry.unregister(executor_id)
    drain(stub_broker, stub_worker)
    record = get_job_store().get(job.id)
    assert record is not None
    assert record.state["attempts"] == {"0.0": 1, "0.1": 1}
    assert record.state["results"]["0.0"] == "new"
    assert calls(key) == 1


def test_an_unknown_task_fails_after_the_grace_naming_the_id(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker, key: str
) -> None:
    grace = 1.0
    workflow_middleware(stub_broker).unknown_task_grace = grace
    executor_id = f"tests.never-deployed.{key}"
    job = _job_with_unknown_task(key, executor_id)
    started = time.monotonic()
    job.scheduled()

    wait_for(lambda: status_of(job) is Status.FAILED, "the job to fail")
    failed_after = time.monotonic() - started
    drain(stub_broker, stub_worker)

    record = get_job_store().get(job.id)
    assert record is not None and record.error is not None
    assert "UnknownExecutorError" in record.error and executor_id in record.error
    assert failed_after >= grace  # not before the grace ran out
    assert record.state["attempts"] == {"0.0": 1}
    assert calls(key) == 0
