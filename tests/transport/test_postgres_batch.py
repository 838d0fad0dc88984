"""Slot releases and job-end notices of many threads share PostgreSQL statements
(``transport/postgres/batch.py``): each still takes effect, and each notice is heard."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from pypepper_dramatiq.stores.sql.store import SqlJobStore
from pypepper_dramatiq.transport import Notice, Subscribed, Subscription, Topic
from pypepper_dramatiq.transport.postgres import PostgresTransport
from pypepper_dramatiq.transport.postgres.batch import StatementBatcher, batcher_of
from pypepper_dramatiq.transport.postgres.notices import CHANNELS

pytestmark = pytest.mark.postgres


def heard(subscription: Subscription, count: int, timeout: float = 10.0) -> list[str]:
    texts: list[str] = []
    deadline = time.monotonic() + timeout
    while len(texts) < count and time.monotonic() < deadline:
        event = subscription.poll(0.2)
        if isinstance(event, Notice):
            texts.append(event.text)
    return texts


def subscribed(transport: PostgresTransport) -> Subscription:
    subscription = transport.subscribe([Topic.ENDED])
    assert isinstance(subscription.poll(1), Subscribed)
    return subscription


def test_releases_of_two_channels_and_notices_go_in_one_statement(pg_store: SqlJobStore) -> None:
    transport = PostgresTransport(pg_store.engine)
    one, two = (transport.gate(f"batch-{uuid.uuid4().hex[:6]}", 5) for _ in range(2))
    for gate in (one, two):
        assert gate.admit("a") == "ok" and gate.admit("b") == "ok"
    subscription = subscribed(transport)
    try:
        StatementBatcher(pg_store.engine).run_together(
            [
                ("release", one.channel_id, "a"),
                ("notify", CHANNELS[Topic.ENDED], "a"),
                ("release", two.channel_id, "b"),
                ("notify", CHANNELS[Topic.ENDED], "b"),
                ("release", two.channel_id, "not-there"),
            ]
        )
        assert one.waiting_ids(0, 10) == (0, ["b"])
        assert two.waiting_ids(0, 10) == (0, ["a"])
        assert sorted(heard(subscription, 2)) == ["a", "b"]
    finally:
        subscription.close()


def test_every_release_and_end_of_many_threads_takes_effect(pg_store: SqlJobStore) -> None:
    transport = PostgresTransport(pg_store.engine)
    gate = transport.gate(f"batch-{uuid.uuid4().hex[:6]}", 0)
    jobs = [f"job-{n}" for n in range(200)]
    assert gate.admit_released(jobs) == [True] * len(jobs)
    subscription = subscribed(transport)
    before = batcher_of(pg_store.engine).combiner.stats.calls

    def end(job_id: str) -> None:
        gate.release(job_id)
        transport.publish(Topic.ENDED, job_id)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(end, jobs))
        assert gate.waiting() == 0
        assert sorted(heard(subscription, len(jobs))) == sorted(jobs)
        stats = batcher_of(pg_store.engine).combiner.stats
        assert stats.calls - before == 2 * len(jobs)
    finally:
        subscription.close()
