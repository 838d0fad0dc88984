"""One contract for every transport: two transport objects stand for two processes
(each with its own connections), on Redis and on PostgreSQL; the in-process one
where the semantics apply (one process: both "processes" share its gate).

Admission (the bound under concurrent admits of both, the stop flag, resizes,
paging the waiting ids, releases), notices (published by one, heard by the
other; a lost connection confirms the subscription again), the sweep leader's
lock, and what an outage of the server looks like to the engine.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import restartable_redis
from services import PostgresServer
from sqlalchemy import create_engine, text

from pypepper_dramatiq.errors import BrokerUnavailableError, StoreError
from pypepper_dramatiq.limits.rates import Rate
from pypepper_dramatiq.ops.outage import broker_unreachable, is_outage
from pypepper_dramatiq.stores.sql.store import SqlJobStore
from pypepper_dramatiq.transport import (
    Gate,
    LocalTransport,
    Notice,
    Subscribed,
    Subscription,
    Topic,
    Transport,
)
from pypepper_dramatiq.transport.base import HeldStart, channel_rate_key
from pypepper_dramatiq.transport.postgres import PostgresTransport
from pypepper_dramatiq.transport.redis import RedisTransport
from pypepper_dramatiq.transport.redis.layout import LEADER_KEY


@dataclass
class Processes:
    """Two transports standing for two processes."""

    kind: str
    one: Transport
    other: Transport
    #: Ends the connection a subscription listens on, as a server restart would.
    drop_subscription: Callable[[Subscription], None] | None = None
    #: Ends the connection the leader lock of ``one`` is held on.
    drop_leader: Callable[[Transport], None] | None = None

    def gates(self, maxsize: int | None = None) -> tuple[Gate, Gate]:
        name = f"contract-{uuid.uuid4().hex[:8]}"
        one = self.one.gate(name, maxsize)
        other = one if self.kind == "local" else self.other.gate(name)
        return one, other


@pytest.fixture
def redis_processes(redis_url: str) -> Iterator[Processes]:
    clients = [redis.Redis.from_url(redis_url) for _ in range(2)]
    clients[0].delete(LEADER_KEY)

    def drop_subscription(subscription: Subscription) -> None:
        clients[1].client_kill_filter(_type="pubsub")

    yield Processes("redis", *(RedisTransport(c) for c in clients), drop_subscription)
    clients[0].delete(LEADER_KEY)
    for client in clients:
        client.close()


@pytest.fixture
def postgres_processes(pg_store: SqlJobStore, postgres_uri: str) -> Iterator[Processes]:
    second = create_engine(postgres_uri, isolation_level="AUTOCOMMIT")
    one, other = PostgresTransport(pg_store.engine), PostgresTransport(second)

    def terminate(pid: int | None) -> None:
        assert pid is not None
        with second.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    def drop_subscription(subscription: Subscription) -> None:
        terminate(subscription.backend_pid)  # type: ignore[attr-defined]

    def drop_leader(transport: Transport) -> None:
        terminate(transport.leader_backend_pid)  # type: ignore[attr-defined]

    yield Processes("postgres", one, other, drop_subscription, drop_leader)
    one.close()
    other.close()
    second.dispose()


@pytest.fixture(
    params=[
        "local",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def processes(request: pytest.FixtureRequest) -> Processes:
    if request.param == "local":
        transport = LocalTransport()
        return Processes("local", transport, transport)
    fixture: Processes = request.getfixturevalue(f"{request.param}_processes")
    return fixture


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def shared(request: pytest.FixtureRequest) -> Processes:
    """The transports whose state other processes share."""
    fixture: Processes = request.getfixturevalue(f"{request.param}_processes")
    return fixture


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


# -- admission ---------------------------------------------------------------------------


def test_concurrent_admits_of_both_processes_never_pass_the_bound(processes: Processes) -> None:
    one, other = processes.gates(maxsize=5)
    one.connect()
    barrier = threading.Barrier(8)

    def admit(n: int) -> list[str]:
        gate = one if n % 2 else other
        barrier.wait()
        return [gate.admit(f"job-{n}-{i}") for i in range(6)]

    with ThreadPoolExecutor(8) as pool:
        answers = [a for batch in pool.map(admit, range(8)) for a in batch]
    assert answers.count("ok") == 5
    assert answers.count("full") == 8 * 6 - 5
    assert one.waiting() == other.waiting() == 5
    assert other.admit("one-more") == "full" and one.check() == "full"


def test_a_job_admitted_again_is_counted_once(processes: Processes) -> None:
    one, other = processes.gates(maxsize=2)
    assert one.admit("a") == "ok"
    assert other.admit("a") == "ok"
    assert one.waiting() == 1
    assert other.admit("b") == "ok"
    assert one.admit("a") == "ok"  # already counted: re-admitting a full channel's job is ok
    assert one.admit("c") == "full"


def test_a_stop_is_seen_by_the_other_process(processes: Processes) -> None:
    one, other = processes.gates(maxsize=0)
    assert other.admit("before") == "ok"
    one.request_stop()
    assert other.stopped and other.check() == "stopped"
    assert other.admit("new") == "stopped"
    # Jobs accepted before the stop are still admitted when released.
    assert other.admit_released(["held"]) == [True]
    other.resume()
    assert not one.stopped and one.admit("new") == "ok"


def test_resize_answers_the_old_bound_and_the_other_process_obeys_it(
    processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    one, other = processes.gates(maxsize=3)
    one.connect()
    for job in ("a", "b", "c"):
        assert other.admit(job) == "ok"
    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq.channels.admission"):
        assert other.resize(1) == 3
    assert any("bound 3 -> 1" in r.getMessage() for r in caplog.records)
    assert one.maxsize == 1
    assert one.waiting() == 3  # the jobs waiting stay beyond the smaller bound
    one.release("a")
    one.release("b")
    assert one.admit("d") == "full"
    one.release("c")
    assert one.admit("d") == "ok"
    assert other.resize(0) == 1
    assert other.admit("e") == "ok"


def test_a_release_frees_a_slot_for_the_other_process(processes: Processes) -> None:
    one, other = processes.gates(maxsize=1)
    assert one.admit("a") == "ok"
    assert other.admit("b") == "full"
    other.release("a")
    other.release("a")  # twice: nothing more happens
    assert one.waiting() == 0
    assert one.admit("b") == "ok"


def test_released_jobs_are_admitted_in_one_call_up_to_the_bound(processes: Processes) -> None:
    one, other = processes.gates(maxsize=3)
    assert one.admit("a") == "ok"
    assert other.admit_released(["a", "b", "c", "d", "b"]) == [True, True, True, False, True]
    assert one.waiting() == 3
    assert other.admit_released([]) == []


def test_waiting_ids_page_through_every_waiting_job(processes: Processes) -> None:
    one, other = processes.gates(maxsize=0)
    jobs = {f"job-{n:02d}" for n in range(25)}
    for job in sorted(jobs):
        assert one.admit(job) == "ok"
    seen: list[str] = []
    cursor, pages = 0, 0
    while True:
        cursor, ids = other.waiting_ids(cursor, 7)
        seen += ids
        pages += 1
        if cursor == 0:
            break
    assert set(seen) == jobs
    assert pages > 1 or processes.kind == "redis"  # Redis answers a small set whole


def test_the_channels_states_name_each_channel(shared: Processes) -> None:
    one, other = shared.gates(maxsize=4)
    one.admit("a")
    other.request_stop()
    states = {state.name: state for state in shared.other.channel_states() or []}
    state = states[one.channel_id]
    assert (state.waiting, state.maxsize, state.stopped) == (1, 4, True)
    assert state.rate_limit is None  # no start asked under a limit yet
    assert other.known()


def test_the_channels_states_show_the_rate_limit_last_applied(shared: Processes) -> None:
    one, _ = shared.gates()
    one.admit("a")
    shared.one.ask_start(channel_rate_key(one.channel_id), Rate(50, 1.0))
    states = {state.name: state for state in shared.other.channel_states() or []}
    assert states[one.channel_id].rate_limit == "50/s"


# -- notices -----------------------------------------------------------------------------


# -- rate limits -------------------------------------------------------------------------


def test_of_many_starts_asking_at_once_the_limit_is_granted_and_the_rest_told_apart(
    processes: Processes,
) -> None:
    # 20 starts ask at once from both "processes" under 6 a minute: 6 are granted
    # (0.0; a process counting alone would grant 6 of its own); each other one is told
    # a retry time of its own, once the window frees, 10 s (60 s / 6) apart.
    key = f"channel:contract-{uuid.uuid4().hex[:8]}"
    transports = [processes.one, processes.other] * 10
    begun = time.monotonic()

    def ask(transport: Transport) -> float:
        wait = transport.ask_start(key, Rate(6, 60.0))
        return wait and wait + time.monotonic() - begun

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = sorted(pool.map(ask, transports))
    assert answers[:6] == [0.0] * 6
    assert [round((a - 60.0) / 10.0) for a in answers[6:]] == list(range(14))


def test_a_start_asking_again_at_its_time_is_granted(processes: Processes) -> None:
    key = f"channel:contract-{uuid.uuid4().hex[:8]}"
    assert processes.one.ask_start(key, Rate(1, 1.0)) == 0.0
    wait = processes.other.ask_start(key, Rate(1, 1.0))
    assert wait > 0.0  # refused: nothing counted
    time.sleep(wait)
    assert processes.other.ask_start(key, Rate(1, 1.0)) == 0.0
    assert processes.one.ask_start(key, Rate(2, 60.0)) == 0.0  # room for one more
    assert processes.one.ask_start(key, Rate(2, 60.0)) > 0.0


def test_a_start_told_a_time_and_refused_again_keeps_its_place_in_line(
    processes: Processes,
) -> None:
    # Under 2 a minute: two granted, two fresh starts told 60 s and 90 s (one spacing
    # apart). A start that was told a time already and came back at it a moment too
    # early (a start of the period before was granted late) is told when the window
    # frees, before the line, which does not move: the next fresh start is told 120 s.
    # Pushed behind the line instead, each such start leaves its turn unused.
    key = f"channel:contract-{uuid.uuid4().hex[:8]}"
    rate = Rate(2, 60.0)
    assert processes.one.ask_start(key, rate) == processes.other.ask_start(key, rate) == 0.0
    fresh = [processes.one.ask_start(key, rate), processes.other.ask_start(key, rate)]
    assert [round(wait / 10.0) for wait in fresh] == [6, 9]
    again = processes.other.ask_start(key, rate, told=True)
    assert round(again / 10.0) == 6
    assert round(processes.one.ask_start(key, rate) / 10.0) == 12


def test_rate_limit_keys_count_apart(processes: Processes) -> None:
    name = uuid.uuid4().hex[:8]
    assert processes.one.ask_start(f"channel:a-{name}", Rate(1, 60.0)) == 0.0
    assert processes.other.ask_start(f"channel:b-{name}", Rate(1, 60.0)) == 0.0
    assert processes.other.ask_start(f"channel:a-{name}", Rate(1, 60.0)) > 50.0


def test_rate_limit_keys_unused_for_long_are_forgotten(processes: Processes) -> None:
    # Each key kept while in use; forgotten once idle past the given time (Redis
    # expires its keys itself: it forgets nothing when asked, and its keys have a TTL).
    name = uuid.uuid4().hex[:8]
    keys = [f"key:idle-{name}-{n}" for n in range(3)]
    for key in keys:
        assert processes.one.ask_start(key, Rate(1, 3600.0)) == 0.0
    assert processes.other.prune_rate_keys() == 0 or processes.kind == "postgres"
    told = f"key:told-{name}"  # refused: told to come back in an hour, in use till then
    assert processes.one.ask_start(told, Rate(1, 3600.0)) == 0.0
    assert processes.one.ask_start(told, Rate(1, 3600.0)) > 0.0
    if processes.kind == "redis":
        client = processes.one.connection
        assert all(client.pttl(f"pypepper:rate:{key}") > 0 for key in [*keys, told])
        assert processes.other.prune_rate_keys(idle_seconds=-1.0) == 0
        return
    if processes.kind == "local":
        assert processes.other.prune_rate_keys(idle_seconds=-1.0, limit=1) == 1
    assert processes.other.prune_rate_keys(idle_seconds=-1.0, limit=10**6) >= 2
    # Forgotten: each asked afresh is granted and counted again; the told one is kept.
    assert all(processes.one.ask_start(key, Rate(1, 3600.0)) == 0.0 for key in keys)
    assert all(processes.one.ask_start(key, Rate(1, 3600.0)) > 0.0 for key in keys)
    assert processes.other.ask_start(told, Rate(1, 3600.0)) > 0.0


# -- concurrency limits ------------------------------------------------------------------


def slot_key() -> str:
    return f"key:contract-{uuid.uuid4().hex[:8]}"


def test_of_many_holders_asking_at_once_only_the_limit_take_a_slot(processes: Processes) -> None:
    # 20 holders ask at once from both "processes" under a limit of 3: 3 take a slot
    # (a process counting alone would let 3 of its own in), the others nothing.
    key = slot_key()
    transports = [processes.one, processes.other] * 10

    def ask(n: int) -> bool:
        return transports[n].acquire_slots([(key, 3)], f"holder-{n}", 60.0)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(20)))
    assert answers.count(True) == 3
    granted = sorted(f"holder-{n}" for n, ok in enumerate(answers) if ok)
    assert processes.one.slots_held(key) == granted
    assert processes.other.slots_held(key) == granted


def test_a_concurrency_slot_given_back_goes_to_the_other_process(processes: Processes) -> None:
    key = slot_key()
    assert processes.one.acquire_slots([(key, 1)], "a", 60.0)
    assert not processes.other.acquire_slots([(key, 1)], "b", 60.0)
    processes.one.release_slots([key], "a")
    assert processes.other.acquire_slots([(key, 1)], "b", 60.0)
    assert processes.one.slots_held(key) == ["b"]
    processes.one.release_slots([key], "a")  # a slot not held: nothing
    assert processes.other.slots_held(key) == ["b"]


def test_a_holder_asking_again_keeps_its_one_slot(processes: Processes) -> None:
    key = slot_key()
    assert processes.one.acquire_slots([(key, 1)], "a", 60.0)
    assert processes.other.acquire_slots([(key, 1)], "a", 60.0)
    assert processes.one.slots_held(key) == ["a"]


def test_slots_are_taken_all_or_none(processes: Processes) -> None:
    # The channel's limit has room, the key's is full: nothing is taken, not even
    # the channel's slot; once the key frees, both are.
    channel, key = slot_key(), slot_key()
    assert processes.one.acquire_slots([(key, 1)], "holder", 60.0)
    assert not processes.other.acquire_slots([(channel, 5), (key, 1)], "other", 60.0)
    assert processes.one.slots_held(channel) == []
    processes.one.release_slots([key], "holder")
    assert processes.other.acquire_slots([(channel, 5), (key, 1)], "other", 60.0)
    assert processes.one.slots_held(channel) == processes.one.slots_held(key) == ["other"]


def test_a_release_wakes_the_held_starts_by_priority_then_first_held(
    processes: Processes,
) -> None:
    # A limit of 1 held by "a". Four starts refused, in this order: j1 (priority 0),
    # j2 (5), j3 (0), j4 (5); j1 asks again, refused, and keeps its place (its newer
    # message replaces the older). Each release keeps the slot for the first in line
    # (a newcomer is refused meanwhile) and answers it, with its message, to be sent
    # again: j2, j4, j1, j3. A release with nothing kept wakes nobody.
    key = slot_key()
    one, other = processes.one, processes.other
    assert one.acquire_slots([(key, 1)], "a", 60.0)
    for job, priority in (("j1", 0), ("j2", 5), ("j3", 0), ("j4", 5)):
        start = HeldStart(job, priority, f"message of {job}")
        assert not other.acquire_slots([(key, 1)], f"h-{job}", 60.0, start)
    assert not one.acquire_slots([(key, 1)], "h-j1", 60.0, HeldStart("j1", 0, "newer"))
    holder, order = "a", []
    for expected in ("j2", "j4", "j1", "j3"):
        [woken] = (one if len(order) % 2 else other).release_slots([key], holder, 30.0)
        assert woken.job_id == expected and woken.priority in (0, 5)
        order.append(woken)
        assert one.slots_held(key) == [f"held:{expected}"]
        assert not one.acquire_slots([(key, 1)], "newcomer", 60.0, HeldStart("late"))
        holder = f"h-{expected}"
        assert other.acquire_slots([(key, 1)], holder, 60.0, HeldStart(expected, 0, "x"))
        assert one.slots_held(key) == [holder]
    assert [(w.priority, w.data) for w in order] == [
        (5, "message of j2"),
        (5, "message of j4"),
        (0, "newer"),
        (0, "message of j3"),
    ]
    assert [w.job_id for w in one.release_slots([key], holder, 30.0)] == ["late"]
    assert one.acquire_slots([(key, 1)], "h-late", 60.0, HeldStart("late"))
    assert one.release_slots([key], "h-late") == []  # nothing kept: nobody woken
    assert one.release_slots([key], "h-late", 30.0) == []  # not held: nothing given back
    assert one.slots_held(key) == []


def test_a_slot_not_renewed_lapses_and_a_renewed_one_stays(processes: Processes) -> None:
    # Two holders of a limit of 2 with a lease of a second; only "kept" is renewed (as a
    # live worker's keeper does): "dead" lapses, its slot goes to a newcomer, and
    # renewing it late does not take it back.
    key = slot_key()
    assert processes.one.acquire_slots([(key, 2)], "dead", 1.0)
    assert processes.other.acquire_slots([(key, 2)], "kept", 1.0)
    assert not processes.one.acquire_slots([(key, 2)], "newcomer", 1.0)

    def lapsed() -> bool:
        processes.other.renew_slots([(key, "kept")], 1.0)
        return processes.one.slots_held(key) == ["kept"]

    eventually(lapsed, "the slot not renewed lapses")
    assert processes.one.acquire_slots([(key, 2)], "newcomer", 60.0)
    processes.one.renew_slots([(key, "dead")], 60.0)
    assert processes.other.slots_held(key) == ["kept", "newcomer"]


def next_event(subscription: Subscription, kind: type, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = subscription.poll(0.2)
        if isinstance(event, kind):
            return event
    raise AssertionError(f"no {kind.__name__} within {timeout}s")


def confirmed(subscription: Subscription, count: int, timeout: float = 10.0) -> None:
    """Wait for the subscription to be confirmed for ``count`` topics (Redis confirms
    each topic apart, counting up; PostgreSQL all at once). A poll that finds the
    connection lost may raise once: the next one connects again."""
    deadline = time.monotonic() + timeout
    lost = 0
    while time.monotonic() < deadline:
        try:
            event = subscription.poll(0.2)
        except Exception as exc:
            lost += 1
            assert lost == 1 and broker_unreachable(exc), exc
            continue
        if isinstance(event, Subscribed) and event.count == count:
            return
    raise AssertionError(f"not confirmed for {count} topics within {timeout}s")


def test_a_notice_one_process_publishes_is_heard_by_the_other(shared: Processes) -> None:
    subscription = shared.other.subscribe([Topic.CANCEL, Topic.ENDED])
    try:
        confirmed(subscription, 2)
        shared.one.publish(Topic.ENDED, "job-1")
        shared.one.publish(Topic.LISTENING, "1")  # not subscribed: not heard
        shared.one.publish(Topic.CANCEL, "job-2")
        assert next_event(subscription, Notice) == Notice(Topic.ENDED, "job-1")
        assert next_event(subscription, Notice) == Notice(Topic.CANCEL, "job-2")
        subscription.add([Topic.LISTENING])
        confirmed(subscription, 3)
        shared.one.publish(Topic.LISTENING, "1")
        assert next_event(subscription, Notice) == Notice(Topic.LISTENING, "1")
    finally:
        subscription.close()


def test_a_lost_connection_confirms_the_subscription_again(shared: Processes) -> None:
    assert shared.drop_subscription is not None
    subscription = shared.other.subscribe([Topic.ENDED])
    try:
        confirmed(subscription, 1)
        shared.drop_subscription(subscription)
        # A poll finds the connection gone and listens again: notices sent
        # meanwhile may be lost, which the Subscribed says.
        confirmed(subscription, 1)
        shared.one.publish(Topic.ENDED, "after")
        assert next_event(subscription, Notice) == Notice(Topic.ENDED, "after")
    finally:
        subscription.close()


@pytest.mark.postgres
def test_a_notice_postgresql_cannot_carry_is_refused_naming_the_topic(
    postgres_processes: Processes,
) -> None:
    with pytest.raises(ValueError, match="ended notice is 8000 bytes"):
        postgres_processes.one.publish(Topic.ENDED, "x" * 8000)
    with pytest.raises(ValueError, match="cancel notice holds U"):
        postgres_processes.one.publish(Topic.CANCEL, "a\x00b")
    assert postgres_processes.one.publish(Topic.ENDED, "x" * 7999) is None


@pytest.mark.postgres
def test_admission_refuses_to_run_where_its_count_could_be_stale(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    # At REPEATABLE READ the count after the lock would read the snapshot taken
    # before it, and racing admissions could pass the bound: refused instead.
    engine = create_engine(
        postgres_uri,
        isolation_level="AUTOCOMMIT",
        connect_args={"options": "-c default_transaction_isolation=repeatable\\ read"},
    )
    try:
        gate = PostgresTransport(engine).gate(f"rr-{uuid.uuid4().hex[:6]}", 2)
        with pytest.raises(StoreError, match="needs READ COMMITTED, not repeatable read"):
            gate.admit("job")
        with pytest.raises(StoreError, match="needs READ COMMITTED"):
            gate.admit_released(["job"])
    finally:
        engine.dispose()


# -- the sweep leader's lock -------------------------------------------------------------


def test_the_leader_lock_is_held_by_one_process(shared: Processes) -> None:
    assert shared.one.lead("one", 30)
    assert not shared.other.lead("other", 30)
    assert shared.one.lead("one", 30)  # renewed
    assert not shared.other.lead("other", 30)


def test_a_hung_leaders_lock_lapses_after_its_ttl(shared: Processes) -> None:
    assert shared.one.lead("one", 0.5)
    # "one" renews no more (hung): the lock lapses, and the other process takes it.
    eventually(lambda: shared.other.lead("other", 30), "the other process leads")
    assert not shared.one.lead("one", 30)


@pytest.mark.postgres
def test_a_dead_leaders_lock_is_taken_over_at_once(postgres_processes: Processes) -> None:
    one, other = postgres_processes.one, postgres_processes.other
    assert one.lead("one", 3600)
    assert not other.lead("other", 3600)
    assert postgres_processes.drop_leader is not None
    postgres_processes.drop_leader(one)  # its connection dies, as with a SIGKILL
    eventually(lambda: other.lead("other", 3600), "the other process leads")
    assert not one.lead("one", 3600)  # it finds its session gone, and the lock taken


# -- the server down ---------------------------------------------------------------------


def outage_errors(transport: Transport) -> dict[str, BaseException]:
    """What each kind of call raises while the server is down."""
    gate = transport.gate(f"down-{uuid.uuid4().hex[:6]}", 3)
    calls: dict[str, Callable[[], object]] = {
        "admit": lambda: gate.admit("job"),
        "release": lambda: gate.release("job"),
        "waiting": gate.waiting,
        "resize": lambda: gate.resize(4),
        "publish": lambda: transport.publish(Topic.CANCEL, "job"),
        "lead": lambda: transport.lead("me", 10),
        "acquire_slots": lambda: transport.acquire_slots([("key:down", 1)], "me", 10),
        "subscribe": lambda: transport.subscribe([Topic.ENDED]).poll(0.1),
    }
    raised: dict[str, BaseException] = {}
    for name, call in calls.items():
        with pytest.raises(Exception) as info:
            call()
        raised[name] = info.value
    return raised


def gate_and_notice_errors_agree(raised: dict[str, BaseException]) -> None:
    for name in ("admit", "release", "waiting", "resize", "acquire_slots"):
        assert isinstance(raised[name], BrokerUnavailableError), name
    for name, exc in raised.items():
        assert is_outage(exc) and broker_unreachable(exc), (name, exc)


@pytest.mark.redis
def test_redis_down_is_an_outage_of_the_broker(tmp_path: Path) -> None:
    server = restartable_redis(tmp_path)
    server.start()
    client = redis.Redis.from_url(server.url, socket_connect_timeout=2)
    try:
        RedisTransport(client).gate("warm").connect()
        server.stop()
        gate_and_notice_errors_agree(outage_errors(RedisTransport(client)))
    finally:
        client.close()
        server.stop()


@pytest.mark.postgres
def test_postgresql_down_is_the_same_outage_of_the_broker(own_postgres: PostgresServer) -> None:
    store = SqlJobStore(own_postgres.uri, migrate=True)
    transport = PostgresTransport(store.engine)
    try:
        transport.gate("warm").connect()  # a pooled connection the stop makes stale
        own_postgres.stop()
        gate_and_notice_errors_agree(outage_errors(transport))
    finally:
        transport.close()
        store.close()
