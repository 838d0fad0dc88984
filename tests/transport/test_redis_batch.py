"""Job-end Redis commands of many threads, coalesced into pipelines (real Redis).

A worker removes each started job from its channel's waiting set and publishes
each job's end; :mod:`pypepper_dramatiq.transport.redis.batch` sends what several threads
ask for at once in one pipeline, and gives each caller its own reply or error.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from pypepper_dramatiq.channels.end_notices import publish_ended
from pypepper_dramatiq.errors import BrokerUnavailableError
from pypepper_dramatiq.transport.redis import RedisGate, RedisTransport
from pypepper_dramatiq.transport.redis.batch import CommandBatcher, batcher_of, send
from pypepper_dramatiq.transport.redis.layout import ENDED_CHANNEL

pytestmark = pytest.mark.redis


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    redis_client.flushdb()
    return redis_client


def test_a_lone_command_is_sent_at_once_and_answers(client: redis.Redis) -> None:
    client.sadd("s", "a", "b")
    assert send(client, "SREM", "s", "a") == 1
    assert send(client, "SREM", "s", "a") == 0
    assert client.smembers("s") == {b"b"}


def test_commands_sent_together_each_get_their_own_reply_or_error(client: redis.Redis) -> None:
    client.sadd("s", "a")
    client.set("text", "not a set")
    replies = CommandBatcher(client).run_together(
        [("SREM", "s", "a"), ("SREM", "text", "a"), ("SREM", "s", "missing"), ("SADD", "t", "x")]
    )
    assert replies[0] == 1
    assert isinstance(replies[1], redis.ResponseError)  # this caller's error alone
    assert "WRONGTYPE" in str(replies[1])
    assert replies[2] == 0
    assert replies[3] == 1 and client.smembers("t") == {b"x"}


def test_a_refused_lone_command_raises_to_its_caller(client: redis.Redis) -> None:
    client.set("text", "not a set")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        send(client, "SREM", "text", "a")


def test_concurrent_callers_share_pipelines_and_lose_nothing(client: redis.Redis) -> None:
    members = [f"job-{n}" for n in range(400)]
    client.sadd("waiting", *members)
    batcher = CommandBatcher(client)
    replies: dict[str, Any] = {}
    start = threading.Barrier(8)

    def release(mine: list[str]) -> None:
        start.wait()
        for member in mine:
            replies[member] = batcher.send("SREM", "waiting", member)

    threads = [threading.Thread(target=release, args=(members[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert client.scard("waiting") == 0
    assert replies == {member: 1 for member in members}  # each caller its own reply
    stats = batcher.combiner.stats
    assert stats.calls == 400
    assert stats.batches < stats.calls  # some pipelines held several commands


def test_one_batcher_per_client() -> None:
    one, other = redis.Redis(), redis.Redis()
    assert batcher_of(one) is batcher_of(one)
    assert batcher_of(one) is not batcher_of(other)


def test_a_release_goes_through_the_batcher_and_reports_redis_down(client: redis.Redis) -> None:
    gate = RedisGate(client, "batched", maxsize=2)
    assert gate.admit("j1") == "ok"
    assert gate.waiting() == 1
    gate.release("j1")
    assert gate.waiting() == 0
    assert batcher_of(client).combiner.stats.calls >= 1  # the SREM took the batcher

    down = redis.Redis(port=1, socket_connect_timeout=0.2)
    unreachable = RedisGate(down, "down")
    with pytest.raises(BrokerUnavailableError):
        unreachable.release("j1")


def test_an_end_notice_is_published_through_the_batcher(client: redis.Redis) -> None:
    pubsub = client.pubsub()
    pubsub.subscribe(ENDED_CHANNEL)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    before = batcher_of(client).combiner.stats.calls
    assert publish_ended("job-9", RedisTransport(client)) is True
    message = pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"job-9"
    assert batcher_of(client).combiner.stats.calls == before + 1
    pubsub.close()
    # Redis down: never raises, says it was not published (waiters poll the row).
    assert (
        publish_ended("job-9", RedisTransport(redis.Redis(port=1, socket_connect_timeout=0.2)))
        is False
    )
