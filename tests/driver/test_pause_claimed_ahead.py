"""A pause reaches a step claimed ahead (``claim_fetched``, the default) while it waits
for a worker thread: claimed with its fetch before the pause, it is held unrun when
its thread takes it, as a step claimed by its thread is, and runs once resumed.

On the stub broker with the memory store, and on Redis (a real fetch) with
PostgreSQL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

import pypepper_dramatiq
from pypepper_dramatiq import (
    Context,
    Job,
    JobRecord,
    Status,
    Task,
    Workflow,
    get_job_store,
    pause_channel,
    pause_task,
    resume_channel,
    resume_task,
    workflow_task,
)
from pypepper_dramatiq.records.pauses import PAUSED_UNTIL

from .conftest import LEASE_SECONDS, SWEEP_INTERVAL, WORKER_TIMEOUT_MS, workflow_middleware

#: Upper bound for any one condition a test waits for (a hang, not a speed check).
WAIT = 20.0

_lock = threading.Lock()
RUNS: Counter[str] = Counter()
#: Set by the blocking task once it runs; it returns once :data:`RELEASE` is set.
STARTED = threading.Event()
RELEASE = threading.Event()


@workflow_task(name="pause-ahead.block")
def block(task: Task, context: Context) -> None:
    STARTED.set()
    assert RELEASE.wait(WAIT), "never released"


@workflow_task(name="pause-ahead.count")
def count(task: Task, context: Context, key: str) -> None:
    with _lock:
        RUNS[key] += 1


@pytest.fixture(
    params=["stub", pytest.param("redis-postgres", marks=[pytest.mark.redis, pytest.mark.postgres])]
)
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[dramatiq.Broker, str]]:
    """A broker wired by ``setup()`` with ``claim_fetched`` left at its default, and the
    channel its jobs go to (its own: Redis is the session's)."""
    STARTED.clear()
    RELEASE.clear()
    channel = f"pause-ahead-{uuid.uuid4().hex[:8]}"
    given: dramatiq.Broker
    store_uri = None
    if request.param == "stub":
        given = StubBroker()
    else:
        request.getfixturevalue("pg_store")  # the tables emptied
        store_uri = request.getfixturevalue("postgres_uri")
        given = RedisBroker(  # type: ignore[no-untyped-call]
            url=request.getfixturevalue("redis_url"), namespace=f"t-{uuid.uuid4().hex[:8]}"
        )
    broker = pypepper_dramatiq.setup(
        store_uri,
        broker=given,
        channels=[channel],
        lease_seconds=LEASE_SECONDS,
        sweep_interval=SWEEP_INTERVAL,
    )
    broker.emit_after("process_boot")
    yield broker, channel
    RELEASE.set()
    workflow_middleware(broker).stop_background()
    if isinstance(broker, RedisBroker):
        keys = broker.client.keys(f"{broker.namespace}:*")
        if keys:
            broker.client.delete(*keys)
    broker.close()


@pytest.fixture
def one_thread(broker: tuple[dramatiq.Broker, str]) -> Iterator[Callable[[], dramatiq.Worker]]:
    """Start a ``dramatiq.Worker`` of one thread (a second message waits for it)."""
    started: list[dramatiq.Worker] = []

    def start() -> dramatiq.Worker:
        worker = dramatiq.Worker(broker[0], worker_timeout=WORKER_TIMEOUT_MS, worker_threads=1)
        worker.start()
        started.append(worker)
        return worker

    yield start
    RELEASE.set()
    for worker in started:
        worker.stop()


def row(job: Job) -> JobRecord:
    record = get_job_store().get(job.id)
    assert record is not None
    return record


def wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("kind", ["channel", "task"])
def test_a_step_claimed_ahead_before_a_pause_is_held_when_its_thread_takes_it(
    broker: tuple[dramatiq.Broker, str], one_thread: Callable[[], dramatiq.Worker], kind: str
) -> None:
    channel = broker[1]
    middleware = workflow_middleware(broker[0])
    first = Job(category="pause-ahead", channel_id=channel)
    first.workflows.append(Workflow([block.options(retry_count=0).task(name="block")]))
    first.scheduled()
    one_thread()
    assert STARTED.wait(WAIT)  # the only thread is busy
    assert middleware.fetch_claims is not None  # the default: claims ahead

    waiting = Job(category="pause-ahead", channel_id=channel)
    waiting.workflows.append(
        Workflow([count.options(retry_count=0).task(name="count", key=waiting.id)])
    )
    waiting.scheduled()
    # Its fetch claimed it ahead: started in the store, this worker's, not run.
    wait_for("claimed ahead", lambda: row(waiting).lease_owner == middleware.owner)
    assert row(waiting).status is Status.IN_PROGRESS

    if kind == "channel":
        assert pause_channel(channel) is True
    else:
        assert pause_task("pause-ahead.count") is True
    RELEASE.set()  # the thread goes on to the step claimed ahead
    wait_for(
        "held or run",
        lambda: row(waiting).lease_expires == PAUSED_UNTIL or row(waiting).status.is_terminal,
    )
    assert RUNS[waiting.id] == 0
    held = row(waiting)
    assert held.status is Status.IN_PROGRESS and held.lease_owner is None
    assert row(first).status is Status.COMPLETED

    if kind == "channel":
        assert resume_channel(channel) is True
    else:
        assert resume_task("pause-ahead.count") is True
    wait_for("resumed and run", lambda: row(waiting).status.is_terminal)
    assert row(waiting).status is Status.COMPLETED
    assert RUNS[waiting.id] == 1
