"""Claims ahead (``claim_fetched``) on the stub broker: the consumer thread claims the
step messages before a worker thread takes them, and the steps of a batch the
store failed are deferred by their threads, none lost, none run twice.

Real processes on Redis (fetches of many messages, a SIGKILL, a cancel) are in
``tests/integration/test_claims_ahead_processes.py``.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    Job,
    JobRecord,
    Status,
    StoreUnavailableError,
    Task,
    Workflow,
    get_job_store,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.drivers.dramatiq.fetch_claims import PREFETCH_ENV
from pypepper_dramatiq.stores.base import StepClaim
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import CHANNEL, workflow_middleware

JOBS = 6
TIMEOUT_MS = 20_000

_lock = threading.Lock()
RUNS: Counter[str] = Counter()


@workflow_task(name="driver-ahead.count")
def count(task: Task, context: Context, key: str) -> None:
    with _lock:
        RUNS[key] += 1


@pytest.fixture
def setup_options() -> dict[str, Any]:
    return {"claim_fetched": True}


class FailingBatchStore(MemoryJobStore):
    """A memory store whose first ``failures`` batch claims raise, as an outage would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def claim_steps(self, requests: Sequence[StepClaim]) -> list[JobRecord | None]:
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailableError("the database went away mid-batch")
        return super().claim_steps(requests)


def run_jobs(broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]) -> list[str]:
    """Schedule :data:`JOBS` counting jobs, run them all; their keys."""
    keys = [uuid.uuid4().hex for _ in range(JOBS)]
    jobs = []
    for key in keys:
        job = Job(category="ahead", channel_id=CHANNEL)
        job.workflows.append(Workflow([count.task(name="count", key=key)]))
        job.scheduled()
        jobs.append(job)
    worker = start_worker()
    broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)
    worker.join()
    rows = [get_job_store().get(job.id) for job in jobs]
    assert [row.status if row else None for row in rows] == [Status.COMPLETED] * JOBS
    return keys


def test_the_worker_threads_find_their_claims_taken_ahead(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]
) -> None:
    keys = run_jobs(stub_broker, start_worker)

    assert [RUNS[key] for key in keys] == [1] * JOBS
    # No worker thread claimed a step itself: each claim was ready when it came.
    assert workflow_middleware(stub_broker).book.claims.stats.calls == 0


def test_a_batch_claim_the_store_fails_defers_its_steps_none_lost_none_run_twice(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]
) -> None:
    store = set_job_store(FailingBatchStore(failures=2))
    assert isinstance(store, FailingBatchStore)
    workflow_middleware(stub_broker).defer_seconds = 0.1

    keys = run_jobs(stub_broker, start_worker)

    assert store.failures == 0
    assert [RUNS[key] for key in keys] == [1] * JOBS
    assert stub_broker.dead_letters == []
    # Told of the outage by its batch, a thread deferred its message without asking
    # the store again; the copy was claimed ahead once the store answered.
    assert workflow_middleware(stub_broker).book.claims.stats.calls == 0


def test_a_worker_with_claims_ahead_prefetches_six_messages_per_thread(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], monkeypatch: Any
) -> None:
    monkeypatch.delenv(PREFETCH_ENV, raising=False)
    worker = start_worker()

    # Dramatiq's default is 2 per thread; its consumers were made with the larger one.
    assert worker.queue_prefetch == 6 * worker.worker_threads
    assert {c.prefetch for c in worker.consumers.values() if not c.queue_name.endswith(".DQ")} == {
        6 * worker.worker_threads
    }


def test_a_prefetch_its_user_set_is_kept(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], monkeypatch: Any
) -> None:
    monkeypatch.setenv(PREFETCH_ENV, "5")
    worker = dramatiq.Worker(stub_broker, worker_timeout=100, worker_threads=2)
    worker.queue_prefetch = 3  # as Dramatiq's QUEUE_PREFETCH would have, read at import
    worker.start()
    try:
        assert worker.queue_prefetch == 3
    finally:
        worker.stop()

    monkeypatch.delenv(PREFETCH_ENV)
    worker = dramatiq.Worker(stub_broker, worker_timeout=100, worker_threads=2)
    worker.queue_prefetch = 7  # set by its user, not Dramatiq's default
    worker.start()
    try:
        assert worker.queue_prefetch == 7
    finally:
        worker.stop()


@pytest.mark.rabbitmq
def test_a_rabbitmq_worker_keeps_the_per_message_path(
    rabbitmq_broker: dramatiq.Broker,
    start_rabbitmq_worker: Callable[[], dramatiq.Worker],
    monkeypatch: Any,
) -> None:
    monkeypatch.delenv(PREFETCH_ENV, raising=False)
    worker = start_rabbitmq_worker()
    middleware = workflow_middleware(rabbitmq_broker)

    # Asked for, yet its consumer hands out one message at a time: nothing to batch,
    # so its threads claim and record their steps, with Dramatiq's prefetch.
    assert middleware.settings.claim_fetched
    assert middleware.fetch_claims is None and middleware.completions is None
    assert worker.queue_prefetch == 2 * worker.worker_threads
    assert not hasattr(rabbitmq_broker.consume, "claims_ahead")
