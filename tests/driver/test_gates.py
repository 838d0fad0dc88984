"""Channel admission: LocalGate and RedisGate keep one contract; channels share it over Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from pypepper_dramatiq import ChannelFullError, ChannelManager, Job, Status, get_job_store, manager
from pypepper_dramatiq import broker as broker_module
from pypepper_dramatiq.gates import Gate, LocalGate, RedisGate

THREADS = 8


def unique_channel() -> str:
    return f"gate-test-{uuid.uuid4().hex[:10]}"


class LocalGates:
    """Gates of one process: every "view" of a channel is the same object."""

    def new(self, maxsize: int = 0) -> Gate:
        return LocalGate(maxsize)

    def peer(self, gate: Gate, maxsize: int = 0) -> Gate:
        return gate

    def close(self) -> None:
        pass


class RedisGates:
    """Gates in Redis: each peer has its own client, as another process would."""

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
        self._channels[id(gate)] = channel_id
        return gate

    def peer(self, gate: Gate, maxsize: int = 0) -> Gate:
        channel_id = self._channels[id(gate)]
        other = RedisGate(self.client(), channel_id, maxsize)
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
    assert gate.maxsize == 2  # type: ignore[attr-defined]


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
def test_maxsize_is_fixed_by_the_first_creator(redis_url: str) -> None:
    gates = RedisGates(redis_url)
    try:
        first = gates.new(maxsize=2)
        later = gates.peer(first, maxsize=5)
        unbounded_later = gates.peer(first, maxsize=0)

        assert later.maxsize == 2  # type: ignore[attr-defined]
        assert unbounded_later.maxsize == 2  # type: ignore[attr-defined]
        assert [later.admit(j) for j in ("a", "b", "c")] == ["ok", "ok", "full"]
        assert first.admit("d") == "full"
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
    ours = manager.new(channel_id, maxsize=5)  # too late: the first creator fixed 2
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
