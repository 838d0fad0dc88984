"""The sweep gives back what a dead worker held in any queue, not only its own broker's.

Against a real Redis, without worker processes: a dead worker is a heartbeat older
than the broker's timeout and its ack sets, written as Dramatiq's Redis broker
writes them (``transport.redis.layout``), for queues the sweeper's broker never declared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.transport.redis.layout import (
    ack_sets_prefix,
    heartbeats_key,
    messages_key,
    queue_key,
    queues_held_by_dead_workers,
)

pytestmark = pytest.mark.redis

HEARTBEAT_MS = 1_000
#: The only channel the sweeper's process serves.
OWN = "b"


def namespaced(redis_url: str, namespace: str) -> Iterator[RedisBroker]:
    """A Redis broker in ``namespace``, declaring the channel ``b`` only; its keys are
    deleted after the test."""
    made = RedisBroker(url=redis_url, namespace=namespace, heartbeat_timeout=HEARTBEAT_MS)
    made.declare_queue(OWN)
    yield made
    client = redis.Redis.from_url(redis_url)
    try:
        for key in list(client.scan_iter(count=1000)):
            if key.decode().startswith(namespace + ":"):
                client.delete(key)
    finally:
        client.close()
        made.close()


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    yield from namespaced(redis_url, f"dead-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def globbed(redis_url: str) -> Iterator[RedisBroker]:
    """A namespace with glob characters (Dramatiq's own maintenance does not match
    them literally, but the scan of ack sets does)."""
    yield from namespaced(redis_url, f"dead-{uuid.uuid4().hex[:8]}[*]?")


def sweeper(broker: RedisBroker) -> RecoverySweeper:
    return RecoverySweeper(broker, "dead-test", lease_seconds=30, interval=1)


def hold(broker: RedisBroker, worker: str, queue: str, *message_ids: str) -> None:
    """``worker`` fetched ``message_ids`` from ``queue`` and has not acknowledged them."""
    client = broker.client
    for message_id in message_ids:
        client.hset(messages_key(broker, queue), message_id, b"{}")
        client.sadd(f"{ack_sets_prefix(broker)}{worker}.{queue}", message_id)


def beat(broker: RedisBroker, worker: str, ago_ms: int) -> None:
    broker.client.zadd(heartbeats_key(broker), {worker: current_millis() - ago_ms})


def queued(broker: RedisBroker, queue: str) -> list[str]:
    return [i.decode() for i in broker.client.lrange(queue_key(broker, queue), 0, -1)]


def test_a_dead_workers_messages_come_back_in_queues_the_sweeper_never_declared(
    broker: RedisBroker,
) -> None:
    dead = str(uuid.uuid4())
    beat(broker, dead, ago_ms=60_000)
    hold(broker, dead, "a.DQ", "d1", "d2")
    hold(broker, dead, "a", "m1")
    dotted = "host.7"  # not a Dramatiq UUID: its ack sets are found all the same
    beat(broker, dotted, ago_ms=60_000)
    hold(broker, dotted, "c", "c1")
    assert queues_held_by_dead_workers(broker) == {"a.DQ", "a", "c"}

    assert sweeper(broker).requeue_dead_prefetch(utcnow()) == 0

    assert sorted(queued(broker, "a.DQ")) == ["d1", "d2"]
    assert queued(broker, "a") == ["m1"]
    assert queued(broker, "c") == ["c1"]
    client = broker.client
    assert not list(client.scan_iter(match=f"*{dead}*"))  # its ack sets are gone
    assert client.zscore(heartbeats_key(broker), dead) is None  # and so is the dead worker
    assert client.zscore(heartbeats_key(broker), dotted) is None
    assert queues_held_by_dead_workers(broker) == set()


def test_what_a_live_worker_holds_stays_with_it(broker: RedisBroker) -> None:
    live = str(uuid.uuid4())
    beat(broker, live, ago_ms=0)
    hold(broker, live, "a.DQ", "d1")
    assert queues_held_by_dead_workers(broker) == set()

    sweeper(broker).requeue_dead_prefetch(utcnow())

    assert queued(broker, "a.DQ") == []
    assert broker.client.smembers(f"{ack_sets_prefix(broker)}{live}.a.DQ") == {b"d1"}


def test_a_queue_whose_maintenance_fails_leaves_the_others_to_come_back(
    broker: RedisBroker,
) -> None:
    dead = str(uuid.uuid4())
    beat(broker, dead, ago_ms=60_000)
    hold(broker, dead, "0-broken", "x1")  # sorted first: the queues after it still run
    broker.client.set(queue_key(broker, "0-broken"), b"not a list")  # RPUSH: WRONGTYPE
    hold(broker, dead, "a.DQ", "d1")
    swept = sweeper(broker)

    swept.requeue_dead_prefetch(utcnow())

    assert queued(broker, "a.DQ") == ["d1"]
    problems = swept.rows.take("requeue_prefetch")
    assert problems is not None
    assert problems[0] == 1
    assert problems[1].startswith("queue 0-broken:")
    assert "WRONGTYPE" in problems[1]


def test_the_ack_sets_are_matched_literally_in_the_namespace(globbed: RedisBroker) -> None:
    dead = str(uuid.uuid4())
    beat(globbed, dead, ago_ms=60_000)
    hold(globbed, dead, "a.DQ", "d1")
    assert queues_held_by_dead_workers(globbed) == {"a.DQ"}


def test_what_a_dead_worker_held_in_the_sweepers_own_queues_comes_back_first(
    broker: RedisBroker,
) -> None:
    dead = str(uuid.uuid4())
    beat(broker, dead, ago_ms=60_000)
    hold(broker, dead, f"{OWN}.DQ", "d1")
    idle = str(uuid.uuid4())  # a producer that sent nothing lately: no ack set
    beat(broker, idle, ago_ms=60_000)

    sweeper(broker).requeue_dead_prefetch(utcnow())

    assert queued(broker, f"{OWN}.DQ") == ["d1"]
    # Both are dropped from the heartbeats: the next pass has nothing to look up.
    assert broker.client.zscore(heartbeats_key(broker), dead) is None
    assert broker.client.zscore(heartbeats_key(broker), idle) is None
