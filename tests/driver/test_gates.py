"""Channel admission: LocalGate and RedisGate keep one contract; channels share it over Redis."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from pypepper_dramatiq import (
    Channel,
    ChannelFullError,
    ChannelManager,
    ChannelStoppedError,
    Job,
    Status,
    get_job_store,
    manager,
    setup,
)
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.transport import Gate, LocalGate
from pypepper_dramatiq.transport.redis import RedisGate

THREADS = 8


def unique_channel() -> str:
    return f"gate-test-{uuid.uuid4().hex[:10]}"


class LocalGates:
    """Gates of one process: every "view" of a channel is the same object."""

    def new(self, maxsize: int = 0) -> Gate:
        return LocalGate(maxsize)

    def peer(self, gate: Gate, maxsize: int | None = None) -> Gate:
        return gate

    def close(self) -> None:
        pass


class RedisGates:
    """Gates in Redis: each peer has its own client, as another process would.

    A gate is created and then connected, as a process that has started and
    reached Redis: creating a gate alone does no I/O (see test_gates_lazy.py).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: list[redis.Redis] = []
        self._channels: dict[int, str] = {}

    def client(self) -> redis.Redis:
        client = redis.Redis.from_url(self.url)
        self._clients.append(client)
        return client

    def new(self, maxsize: int = 0) -> Gate:
        channel_id = unique_channel()
        gate = RedisGate(self.client(), channel_id, maxsize)
        gate.connect()
        self._channels[id(gate)] = channel_id
        return gate

    def peer(self, gate: Gate, maxsize: int | None = None) -> Gate:
        """Another process's gate of the same channel (``maxsize`` None: no bound given)."""
        channel_id = self._channels[id(gate)]
        other = RedisGate(self.client(), channel_id, maxsize)
        other.connect()
        self._channels[id(other)] = channel_id
        return other

    def close(self) -> None:
        if self._clients:
            for channel_id in set(self._channels.values()):
                RedisGate(self._clients[0], channel_id).reset()
        for client in self._clients:
            client.close()


@pytest.fixture(params=["local", pytest.param("redis", marks=pytest.mark.redis)])
def gates(request: pytest.FixtureRequest) -> Iterator[LocalGates | RedisGates]:
    factory: LocalGates | RedisGates
    if request.param == "local":
        factory = LocalGates()
    else:
        factory = RedisGates(request.getfixturevalue("redis_url"))
    yield factory
    factory.close()


# -- the gate contract ----------------------------------------------------------------------


def test_admit_until_full(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=2)

    assert [gate.admit(j) for j in ("a", "b", "c")] == ["ok", "ok", "full"]
    assert gate.waiting() == 2
    assert gate.maxsize == 2


def test_unbounded_gate_admits_everything(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=0)

    assert {gate.admit(f"job-{i}") for i in range(300)} == {"ok"}
    assert gate.waiting() == 300


def test_stopped_gate_refuses_even_known_ids(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=1)
    assert gate.admit("a") == "ok"
    assert not gate.stopped

    gate.request_stop()

    assert gate.stopped
    assert gate.admit("a") == "stopped"
    assert gate.admit("b") == "stopped"  # stopped wins over full
    assert gate.waiting() == 1  # stop is not a drain


def test_readmitting_the_same_id_is_ok_and_counted_once(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=2)

    assert gate.admit("a") == "ok"
    assert gate.admit("a") == "ok"
    assert gate.waiting() == 1
    assert gate.admit("b") == "ok"
    assert gate.admit("a") == "ok"  # known ids are ok even when the gate is full
    assert gate.admit("c") == "full"


def test_release_frees_a_slot(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=1)
    assert gate.admit("a") == "ok"
    assert gate.admit("b") == "full"

    gate.release("a")
    gate.release("never-admitted")

    assert gate.waiting() == 0
    assert gate.admit("b") == "ok"
    assert gate.admit("a") == "full"


def test_stop_is_seen_by_every_view_of_the_channel(gates: LocalGates | RedisGates) -> None:
    gate = gates.new()
    other = gates.peer(gate)
    assert other.admit("a") == "ok"

    gate.request_stop()

    assert other.stopped
    assert other.admit("b") == "stopped"


def test_resize_changes_the_bound_for_every_view(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=1)
    other = gates.peer(gate)
    assert gate.admit("a") == "ok"
    assert gate.admit("b") == "full"

    assert other.resize(3) == 1  # the bound it replaced

    assert gate.maxsize == other.maxsize == 3
    assert [gate.admit(j) for j in ("b", "c", "d")] == ["ok", "ok", "full"]
    assert other.resize(1) == 3  # below the waiting count: they stay, nothing more gets in
    assert gate.waiting() == 3
    assert gate.admit("d") == "full"
    assert other.resize(0) == 1  # unbounded
    assert gate.admit("d") == "ok"


def test_resume_clears_the_stop_for_every_view(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=2)
    other = gates.peer(gate)
    assert gate.admit("a") == "ok"
    gate.request_stop()
    assert other.admit("b") == "stopped"

    other.resume()

    assert not gate.stopped and not other.stopped
    assert gate.admit("b") == "ok"
    assert gate.admit("c") == "full"  # the bound holds again
    gate.resume()  # resuming an open gate changes nothing
    assert not gate.stopped


def test_concurrent_admissions_never_exceed_maxsize(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=100)
    views = [gates.peer(gate) for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    results: list[list[str]] = [[] for _ in range(THREADS)]

    def admit_all(n: int) -> None:
        barrier.wait(timeout=10)
        results[n] = [views[n].admit(f"t{n}-job{i}") for i in range(50)]

    threads = [threading.Thread(target=admit_all, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    flat = [r for per_thread in results for r in per_thread]
    assert len(flat) == THREADS * 50
    assert flat.count("ok") == 100
    assert flat.count("full") == THREADS * 50 - 100
    assert gate.waiting() == 100


def test_no_admission_succeeds_after_a_stop_returned(gates: LocalGates | RedisGates) -> None:
    gate = gates.new(maxsize=0)
    views = [gates.peer(gate) for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS + 1)
    #: Per thread: (monotonic time the call started, its result).
    results: list[list[tuple[float, str]]] = [[] for _ in range(THREADS)]

    def admit_many(n: int) -> None:
        barrier.wait(timeout=10)
        for i in range(200_000):  # until the stop (the cap only guards against a hang)
            started = time.monotonic()
            result = views[n].admit(f"t{n}-job{i}")
            results[n].append((started, result))
            if result == "stopped":
                break

    threads = [threading.Thread(target=admit_many, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    barrier.wait(timeout=10)
    deadline = time.monotonic() + 20
    while gate.waiting() < 200:  # mid-way: well after the first, well before the last
        assert time.monotonic() < deadline
        time.sleep(0.001)
    gate.request_stop()
    stop_returned = time.monotonic()
    for thread in threads:
        thread.join(30)

    flat = [entry for per_thread in results for entry in per_thread]
    late_oks = [t for t, r in flat if r == "ok" and t > stop_returned]
    assert late_oks == []
    assert {r for _, r in flat} == {"ok", "stopped"}
    assert sum(r == "stopped" for _, r in flat) == THREADS  # every thread saw the stop
    assert gate.waiting() == sum(r == "ok" for _, r in flat)


# -- Redis: one bound for every process -----------------------------------------------------


@pytest.mark.redis
def test_an_explicit_maxsize_replaces_the_stored_bound(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gates = RedisGates(redis_url)
    try:
        first = gates.new(maxsize=2)
        with caplog.at_level(logging.INFO, logger="pypepper_dramatiq.channels.admission"):
            later = gates.peer(first, maxsize=5)  # a restarted process, configured anew
            same = gates.peer(first, maxsize=5)  # the same bound again: no change to log

        assert first.maxsize == later.maxsize == same.maxsize == 5
        channel_id = gates._channels[id(first)]
        changes = [r.getMessage() for r in caplog.records if "bound" in r.getMessage()]
        assert changes == [f"channel {channel_id}: bound 2 -> 5"]
        assert [first.admit(f"j{i}") for i in range(6)] == ["ok"] * 5 + ["full"]

        gates.peer(first, maxsize=0)  # an explicit 0 is a bound too: unbounded
        assert first.admit("j6") == "ok"
    finally:
        gates.close()


@pytest.mark.redis
def test_without_a_maxsize_the_stored_bound_is_kept(redis_url: str) -> None:
    gates = RedisGates(redis_url)
    try:
        first = gates.new(maxsize=2)
        producer = gates.peer(first)  # maxsize not given: a producer reaching the channel

        assert producer.maxsize == 2
        assert [producer.admit(j) for j in ("a", "b", "c")] == ["ok", "ok", "full"]

        fresh = RedisGate(gates.client(), unique_channel())  # nothing stored: unbounded
        gates._channels[id(fresh)] = fresh.channel_id
        assert fresh.maxsize == 0
        assert {fresh.admit(f"j{i}") for i in range(20)} == {"ok"}
        # ... and its hash exists, so that `pypepper-dramatiq channels` lists it.
        assert fresh.client.hget(fresh.meta_key, "maxsize") == b"0"
    finally:
        gates.close()


@pytest.mark.redis
def test_a_stop_outlives_its_process_until_resumed(redis_url: str) -> None:
    gates = RedisGates(redis_url)
    try:
        gate = gates.new(maxsize=3)
        gate.request_stop()
        gate.client.close()  # the process that stopped it is gone

        restarted = gates.peer(gate, maxsize=3)
        assert restarted.stopped
        assert restarted.admit("a") == "stopped"

        restarted.resume()
        assert not gates.peer(gate).stopped
        assert restarted.admit("a") == "ok"
        assert restarted.maxsize == 3  # resuming leaves the bound alone
    finally:
        gates.close()


@pytest.fixture
def redis_broker(redis_url: str) -> Iterator[RedisBroker]:
    """A real Redis broker installed for channels; its channels' keys are removed after."""
    broker = RedisBroker(url=redis_url)
    broker_module.set_broker(broker)
    yield broker
    for channel_id in manager.ids():
        broker.flush(channel_id)
        RedisGate(broker.client, channel_id).reset()
    broker.close()


@pytest.mark.redis
def test_channels_of_two_processes_share_one_bound(redis_broker: RedisBroker) -> None:
    channel_id = unique_channel()
    other_process = ChannelManager()
    theirs = other_process.new(channel_id, maxsize=2)
    theirs.connect()  # that process started: its bound is in Redis
    ours = manager.new(channel_id)  # no bound given: the stored one holds
    assert theirs is not ours
    assert isinstance(ours.gate, RedisGate)
    assert ours.maxsize == 2

    assert theirs.offer(Job(channel_id=channel_id)) == "ok"
    assert ours.offer(Job(channel_id=channel_id)) == "ok"
    assert theirs.offer(Job(channel_id=channel_id)) == "full"
    assert ours.offer(Job(channel_id=channel_id)) == "full"
    assert ours.length() == theirs.length() == 2


@pytest.mark.redis
def test_scheduled_raises_when_the_shared_bound_is_reached(redis_broker: RedisBroker) -> None:
    channel_id = unique_channel()
    other_process = ChannelManager()
    theirs = other_process.new(channel_id, maxsize=2)
    for _ in range(2):
        assert theirs.offer(Job(channel_id=channel_id)) == "ok"
    manager.new(channel_id, maxsize=2)
    job = Job(channel_id=channel_id)

    with pytest.raises(ChannelFullError):
        job.scheduled()

    assert job.status is Status.UNKNOWN  # rolled back: scheduled() may be retried
    assert get_job_store().get(job.id) is None

    # A consumer in the other process takes one job: the slot is free for everyone.
    assert theirs.take() is not None
    job.scheduled()
    assert job.status is Status.SCHEDULED
    assert manager.available(channel_id).length() == 2


@pytest.fixture
def forget_channels(redis_url: str) -> Iterator[list[str]]:
    """Channel ids a test declares through ``setup()``; their Redis keys are removed after."""
    ids: list[str] = []
    yield ids
    client = redis.Redis.from_url(redis_url)
    for channel_id in ids:
        RedisGate(client, channel_id).reset()
    client.close()
    broker_module.get_broker().close()  # the RedisBroker setup() installed


@pytest.mark.redis
def test_setup_with_a_new_bound_changes_the_stored_one(
    redis_url: str, forget_channels: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    small = unique_channel()
    forget_channels.append(small)
    setup(broker_url=redis_url, channels={small: 2})
    assert manager.available(small).maxsize == 2

    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq.channels.admission"):
        setup(broker_url=redis_url, channels={small: 5})  # the issue: this used to admit 2
        channel = manager.available(small)
        # The channel's first call to Redis applies the bound setup() was given.
        assert [channel.offer(Job(channel_id=small)) for _ in range(6)] == ["ok"] * 5 + ["full"]

    assert f"channel {small}: bound 2 -> 5" in caplog.text

    setup(broker_url=redis_url, channels=[small])  # list form: no bound given, 5 is kept
    assert manager.available(small).maxsize == 5
    other_process = ChannelManager()
    assert other_process.available(small).maxsize == 5  # a producer keeps it too


@pytest.mark.redis
def test_yaml_null_bound_keeps_the_stored_one_and_code_may_not_undo_yaml(
    redis_url: str, forget_channels: list[str], tmp_path: Path
) -> None:
    kept, given = unique_channel(), unique_channel()
    forget_channels.extend([kept, given])
    client = redis.Redis.from_url(redis_url)
    RedisGate(client, kept, 4).connect()  # another process bounded it earlier
    client.close()
    config_path = tmp_path / "app.yaml"
    config_path.write_text(
        f"scheduler:\n  broker:\n    url: {redis_url}\n"
        f"  channels:\n    {kept}: null\n    {given}: 7\n"
    )

    setup(config_path=config_path, channels=[given])  # naming it again gives no bound

    assert manager.available(kept).maxsize == 4
    assert manager.available(given).maxsize == 7


@pytest.mark.redis
def test_manager_resize_and_resume_reach_every_process(redis_broker: RedisBroker) -> None:
    channel_id = unique_channel()
    other_process = ChannelManager()
    theirs = other_process.new(channel_id, maxsize=1)
    ours = manager.new(channel_id)
    assert theirs.offer(Job(channel_id=channel_id)) == "ok"
    assert ours.offer(Job(channel_id=channel_id)) == "full"

    assert manager.resize(channel_id, 2) == 1
    assert theirs.maxsize == 2
    assert theirs.offer(Job(channel_id=channel_id)) == "ok"

    theirs.request_stop()
    job = Job(channel_id=channel_id)
    with pytest.raises(ChannelStoppedError):
        job.scheduled()
    manager.resume(channel_id)
    assert not theirs.stop
    manager.resize(channel_id, 0)
    job.scheduled()
    assert job.status is Status.SCHEDULED


@pytest.mark.redis
def test_a_channel_repr_does_not_raise_when_redis_is_gone(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    channel_id = unique_channel()
    channel = Channel(channel_id, gate=RedisGate(client, channel_id, 3))
    # Before its first call the channel's bound is not known, and a repr does
    # not make that call (it would apply the bound as a side effect).
    assert repr(channel) == f"Channel({channel_id!r}, maxsize=?)"
    assert not client.exists(f"pypepper:channel:{channel_id}")
    channel.connect()
    assert repr(channel) == f"Channel({channel_id!r}, maxsize=3)"
    RedisGate(client, channel_id).reset()
    channel.gate.client = redis.Redis(host="127.0.0.1", port=1)  # type: ignore[attr-defined]
    assert repr(channel) == f"Channel({channel_id!r}, maxsize=?)"
    client.close()
