"""Channels do no Redis I/O when created: a process starts while Redis is down.

A :class:`RedisGate` applies the bound it was given on its first call (or
``connect()``); while Redis is down that call raises
:class:`BrokerUnavailableError` and the next one tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.connection
from conftest import restartable_redis, started  # tests/conftest.py
from services import RedisServer, free_port

from pypepper_dramatiq import (
    BrokerUnavailableError,
    CallableExecutor,
    ChannelEnqueueError,
    Job,
    Status,
    Task,
    Workflow,
    manager,
    setup,
)
from pypepper_dramatiq.channels.broker import get_broker
from pypepper_dramatiq.channels.channel import ChannelConnector, ChannelManager
from pypepper_dramatiq.transport.redis import RedisGate
from pypepper_dramatiq.transport.redis.layout import CHANNEL_KEY_PREFIX

#: Where the gates' bound changes are logged.
GATES_LOGGER = "pypepper_dramatiq.channels.admission"


def make_job(channel_id: str) -> Job:
    job = Job(category="t", channel_id=channel_id)
    job.workflows.append(
        Workflow([Task(channel_id, "d", "f", "t", "t", "", [], CallableExecutor(lambda t, c: 1))])
    )
    return job


def bound_changes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == GATES_LOGGER and "bound" in r.getMessage()
    ]


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every connection redis-py opens from now on, as (host, port)."""
    opened: list[tuple[str, int]] = []
    connect = redis.connection.AbstractConnection.connect

    def spy(self: Any) -> None:
        opened.append((getattr(self, "host", "?"), getattr(self, "port", 0)))
        connect(self)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", spy)
    return opened


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A Redis URL nothing listens on; closes the broker ``setup()`` installed after."""
    yield f"redis://127.0.0.1:{free_port()}/0"
    get_broker().close()


@pytest.fixture
def redis_later(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis on a known port that is not running yet: start it with ``started(...)``."""
    server = restartable_redis(tmp_path / "redis-later")
    yield server
    get_broker().close()
    server.stop(kill=True)


def client_of(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url)


# -- no I/O until the first call --------------------------------------------------------------


def test_setup_with_redis_down_returns_without_touching_redis(
    closed_url: str, connections: list[tuple[str, int]]
) -> None:
    setup(broker_url=closed_url, channels={"a": 5, "b": 0})
    setup(broker_url=closed_url, channels=["a", "c"])  # again, as a reloaded module would

    assert manager.ids() == ["a", "c"]
    channel = manager.get("a")
    assert channel is not None and isinstance(channel.gate, RedisGate)
    assert not channel.gate.connected
    assert repr(channel) == "Channel('a', maxsize=?)"  # a repr makes no first call either
    assert connections == []


def test_the_first_admit_while_redis_is_down_is_a_typed_error_and_nothing_is_kept(
    closed_url: str,
) -> None:
    setup(broker_url=closed_url, channels={"a": 5})
    job = make_job("a")

    with pytest.raises(BrokerUnavailableError, match="channel a") as raised:
        job.scheduled()

    assert isinstance(raised.value, ChannelEnqueueError)
    assert job.status is Status.UNKNOWN  # rolled back: scheduled() may be retried
    assert Job.get_saved(job.id) is None
    with pytest.raises(BrokerUnavailableError):
        manager.available("a").connect()
    assert not manager.available("a").gate.connected  # the next call tries again


# -- the bound is applied once Redis answers --------------------------------------------------


@pytest.mark.redis
def test_a_given_bound_is_applied_by_the_first_call_after_redis_comes_up(
    redis_later: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    setup(broker_url=redis_later.url, channels={"a": 5})
    manager.new("kept")  # no bound given
    job = make_job("a")
    with pytest.raises(BrokerUnavailableError):
        job.scheduled()

    started(redis_later, "Redis")
    client = client_of(redis_later)
    try:
        # Before this process reached Redis, others bounded both channels.
        RedisGate(client, "a", 2).connect()
        RedisGate(client, "kept", 3).connect()
        with caplog.at_level(logging.INFO, logger=GATES_LOGGER):
            job.scheduled()  # the retry: the first call that reaches Redis applies 5
            channel = manager.available("a")
            results = [channel.offer(make_job("a")) for _ in range(5)]
        assert job.status is Status.SCHEDULED
        assert results == ["ok"] * 4 + ["full"]
        assert bound_changes(caplog) == ["channel a: bound 2 -> 5"]  # once, not per call
        assert manager.available("kept").maxsize == 3  # no bound given: the stored one
    finally:
        client.close()


@pytest.mark.redis
def test_a_resize_before_the_first_call_replaces_the_pending_bound(
    redis_later: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    setup(broker_url=redis_later.url, channels={"a": 5})
    channel = manager.available("a")
    with pytest.raises(BrokerUnavailableError):
        channel.resize(7)  # failed: 5 is still the bound to apply

    started(redis_later, "Redis")
    client = client_of(redis_later)
    try:
        RedisGate(client, "a", 2).connect()
        other = ChannelManager().new("a", maxsize=5)
        with caplog.at_level(logging.INFO, logger=GATES_LOGGER):
            assert other.resize(9) == 2  # the bound it replaced is the stored one...
        assert bound_changes(caplog) == ["channel a: bound 2 -> 9"]  # ...5 was never written
        assert channel.maxsize == 5  # the failed resize left 5 to apply, and it was
    finally:
        client.close()


@pytest.mark.redis
def test_concurrent_first_calls_apply_the_bound_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(redis_url)
    channel_id = f"lazy-{time.monotonic_ns()}"
    RedisGate(client, channel_id, 1).connect()
    gate = RedisGate(client, channel_id, 3)
    barrier = threading.Barrier(8)
    results: list[str] = []

    def admit(n: int) -> None:
        barrier.wait(timeout=10)
        results.append(gate.admit(f"job-{n}"))

    try:
        with caplog.at_level(logging.INFO, logger=GATES_LOGGER):
            threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert sorted(results) == ["full"] * 5 + ["ok"] * 3  # the bound held for every call
        assert bound_changes(caplog) == [f"channel {channel_id}: bound 1 -> 3"]
    finally:
        gate.reset()
        client.close()


@pytest.mark.redis
def test_reset_forgets_a_bound_not_applied_yet(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    channel_id = f"lazy-{time.monotonic_ns()}"
    gate = RedisGate(client, channel_id, 1)
    try:
        gate.reset()
        assert {gate.admit(f"job-{n}") for n in range(3)} == {"ok"}  # unbounded, as reset
    finally:
        gate.reset()
        client.close()


# -- a worker connects its channels in the background -----------------------------------------


@pytest.mark.redis
def test_the_connector_applies_bounds_once_redis_answers_and_ends_quietly(
    redis_later: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    setup(broker_url=redis_later.url, channels={"a": 5})
    manager.new("b")  # no bound given
    connector = ChannelConnector(manager, interval=0.05)
    with caplog.at_level(logging.DEBUG, logger="pypepper_dramatiq"):
        connector.start()
        time.sleep(0.3)  # a few tries while Redis is down
        assert connector.is_alive()
        assert manager.connect_pending() == ["a", "b"]

        started(redis_later, "Redis")
        connector.join(10)

    assert not connector.is_alive()
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG]  # quiet while down
    client = client_of(redis_later)
    try:
        # Applied by the connector, before any job: what another process now sees.
        assert client.hget(f"{CHANNEL_KEY_PREFIX}a", "maxsize") == b"5"
        assert client.hget(f"{CHANNEL_KEY_PREFIX}b", "maxsize") == b"0"
    finally:
        client.close()
    assert manager.connect_pending() == []


def test_the_connector_stops_when_told(closed_url: str) -> None:
    setup(broker_url=closed_url, channels={"a": 5})
    connector = ChannelConnector(manager, interval=30)
    connector.start()
    connector.stop()
    connector.join(5)
    assert not connector.is_alive()


def test_channels_without_redis_are_always_connected() -> None:
    setup(channels={"a": 5})  # the stub broker: process-local gates
    assert manager.connect_pending() == []
    assert repr(manager.get("a")) == "Channel('a', maxsize=5)"
