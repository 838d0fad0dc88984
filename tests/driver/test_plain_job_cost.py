"""A plain job (no scheduling option) costs the store calls it cost before keys and waits.

Counted on the Dramatiq driver with a store that records every call: one write
at ``scheduled()``, and for a one-task job one claim and one record. On PostgreSQL
that write is one statement, the insert of a first write (the one Redis call of
``scheduled()`` is counted in ``tests/transport/test_schedule_many_redis.py``).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from process_state import redis_channel_setup

from pypepper_dramatiq import Context, Job, Status, Task, Workflow, set_job_store, workflow_task
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.sql import SqlJobStore

from .drivers import DramatiqDriver, make_job


class CountingStore(MemoryJobStore):
    """A memory store that counts the calls the engine makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._inside = threading.local()

    def _count(self, name: str) -> None:
        if getattr(self._inside, "claim", False):
            return  # the memory store's claim is read-check-advance; SQL's one statement
        with self._count_lock:
            self.calls[name] += 1

    def put(self, record: Any) -> bool:
        self._count("put")
        return super().put(record)

    def advance(self, record: Any) -> bool:
        self._count("advance")
        return super().advance(record)

    def get(self, job_id: str) -> Any:
        self._count("get")
        return super().get(job_id)

    def get_many(self, job_ids: Any) -> Any:
        self._count("get_many")
        return super().get_many(job_ids)

    def claim_step(self, *args: Any, **kwargs: Any) -> Any:
        self._count("claim_step")
        self._inside.claim = True
        try:
            return MemoryJobStore.claim_step(self, *args, **kwargs)
        finally:
            self._inside.claim = False


@workflow_task(name="plain-cost.noop")
def noop(task: Task, context: Context) -> int:
    return 1


def test_a_plain_job_makes_one_store_write_to_schedule_and_two_to_run(
    stub_broker: StubBroker, start_worker: Any
) -> None:
    store = CountingStore()
    set_job_store(store)
    job = make_job([noop.task(name="noop")])
    job.scheduled()
    assert store.calls == Counter({"put": 1})

    store.calls.clear()
    driver = DramatiqDriver(stub_broker, start_worker)
    driver.start()
    worker: dramatiq.Worker | None = driver.worker
    assert worker is not None
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    # The driver's own polling reads rows with get(); the engine claims and records.
    assert store.calls["claim_step"] == 1
    assert store.calls["advance"] == 1
    assert store.calls["put"] == 0 and store.calls["get_many"] == 0


@pytest.mark.redis
@pytest.mark.postgres
def test_a_plain_scheduled_sends_postgresql_one_insert(
    redis_url: str, pg_store: SqlJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with redis_channel_setup(redis_url, "plain-cost"):
        set_job_store(pg_store)
        first = Job(channel_id="plain-cost")
        first.workflows.append(Workflow([noop.task(name="noop")]))
        first.scheduled()  # the pool's connection opened, the statement prepared
        sent: list[str] = []
        execute = psycopg.Cursor.execute

        def counting(cursor: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(" ".join(str(query).split()))
            return execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", counting)
        job = Job(channel_id="plain-cost")
        job.workflows.append(Workflow([noop.task(name="noop")]))
        job.scheduled()
        monkeypatch.undo()

        # One statement (a purge that commits while it waits on its row is refused by
        # the table's trigger, in the server: no round trip of its own).
        [statement] = sent
        assert statement.startswith("INSERT INTO scheduler_jobs")
        # A first write: no update that no stored row could pass.
        assert statement.endswith("ON CONFLICT (id) DO NOTHING RETURNING true AS inserted")
        stored = pg_store.get(job.id)
        assert stored is not None and stored.status is Status.SCHEDULED and stored.version == 1
