"""The recovery sweep's duties fail alone, each row fails alone, and both are counted,
logged once per cause and reported for the workers page.

Against a real Redis broker and the real stores (memory and PostgreSQL). A duty is
made to fail by a store (or broker) whose one method raises, as a bug or a row the
store cannot handle would; the other duties are shown to do their work all the same.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from process_state import redis_channel_setup
from prometheus_client import CollectorRegistry

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    Workflow,
    manager,
    recurring,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import transport_of
from pypepper_dramatiq.channels.messages import DISPATCH_KEY, StepMessage
from pypepper_dramatiq.drivers.dramatiq.recovery import DUTIES, RecoverySweeper
from pypepper_dramatiq.metrics.prometheus import install_metrics, uninstall_metrics
from pypepper_dramatiq.ops import observers
from pypepper_dramatiq.records.activity import minute_of, percentile
from pypepper_dramatiq.records.record import JobRecord, utcnow
from pypepper_dramatiq.rules.cron import firing_id
from pypepper_dramatiq.rules.waits import Waits
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.memory import MemoryJobStore

pytestmark = pytest.mark.redis

CHANNEL = "sweep-duties"
SCHEDULE = "sweep-duties-every-minute"
LONG_AGO = timedelta(days=2)
#: How long ago the job the activity rollup reads ended (it reads a minute behind).
ROLLED_AGO = timedelta(minutes=5)


def now_minute(ago: timedelta = timedelta(0)) -> datetime:
    return minute_of(utcnow() - ago)


@workflow_task(name="sweep-duties.noop")
def noop(task: Task, context: Context) -> None:
    return None


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, redis_url: str) -> Iterator[IJobStore]:
    """``setup()`` on Redis with one channel, and the store of the test installed."""
    with redis_channel_setup(redis_url, CHANNEL):
        made = (
            MemoryJobStore() if request.param == "memory" else request.getfixturevalue("pg_store")
        )
        set_job_store(made)
        yield made


@pytest.fixture
def broker(store: IJobStore) -> RedisBroker:
    from pypepper_dramatiq.channels.broker import get_broker

    found = get_broker()
    assert isinstance(found, RedisBroker)
    return found


class DepthListener(observers.Observer):
    def __init__(self) -> None:
        self.reports: list[dict[str, int]] = []

    def channel_depths(self, depths: Any) -> None:
        self.reports.append(dict(depths))


@pytest.fixture
def depths() -> Iterator[DepthListener]:
    listener = DepthListener()
    observers.install(listener)
    yield listener
    observers.remove(listener)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    made = CollectorRegistry()
    metrics = install_metrics(made)
    yield made
    uninstall_metrics(metrics)


def failures(registry: CollectorRegistry, duty: str) -> float | None:
    return registry.get_sample_value("pypepper_sweep_failures_total", {"duty": duty})


def template() -> Job:
    job = Job(channel_id=CHANNEL)
    job.workflows.append(Workflow([noop.task(name="noop")]))
    return job


def row(job_id: str, **fields: Any) -> JobRecord:
    fields.setdefault("status", Status.SCHEDULED)
    return JobRecord(id=job_id, channel_id=CHANNEL, **fields)


def due_schedule(store: IJobStore, name: str, now: datetime, cron: str = "* * * * *") -> datetime:
    """A schedule stored through the API, then made due at the minute of ``now`` (its slot)."""
    stored = recurring(name, "* * * * *", template())
    slot = now.replace(second=0, microsecond=0)
    store.save_recurring(stored.evolve(name=name, cron=cron, next_slot=slot))
    return slot


@dataclass
class World:
    """One row for each duty's work, and how to see that it was done."""

    store: IJobStore
    broker: RedisBroker
    slot: datetime
    calls: dict[str, int] = field(default_factory=dict)

    def done(self, duty: str, depths: DepthListener) -> bool:
        store = self.store
        if duty == "requeue_prefetch":
            return self.calls.get("get_declared_queues", 0) > 0
        if duty == "recover_leases":
            lapsed = store.get("lapsed")
            return lapsed is not None and lapsed.lease_owner is None
        if duty == "fire_schedules":
            schedule = store.get_recurring(SCHEDULE)
            fired = schedule.last_job_id if schedule is not None else None
            return fired is not None and store.get(fired) is not None
        if duty == "settle_waits":
            child = store.get("child")
            return child is not None and child.waits is None
        if duty == "release_held":
            held = store.get("held")
            return held is not None and held.release_at is None and DISPATCH_KEY in held.state
        if duty == "cancel_overdue":
            overdue = store.get("overdue")
            return overdue is not None and overdue.status is Status.CANCELLED
        if duty == "resend_first_steps":
            lost = store.get("lost")
            return lost is not None and lost.state[DISPATCH_KEY]["message_id"] != "gone"
        if duty == "purge":
            return store.get("old") is None
        if duty == "lapsed_hooks":
            return self.calls.get("pending_hooks", 0) > 0
        if duty == "depth_reports":
            return bool(depths.reports)
        if duty == "count_ends":
            uncounted = store.get("uncounted")
            return uncounted is not None and uncounted.state.get("counted") is True
        if duty == "roll_up_activity":
            rolled = store.activity(now_minute(ROLLED_AGO * 2), now_minute(), 60)
            return sum(a.count(Status.FAILED) for a in rolled.values()) == 1
        if duty == "prune_rate_keys":  # Redis expires its keys: only the call is seen
            return self.calls.get("prune_rate_keys", 0) > 0
        if duty == "reclaim_slots":
            _, waiting = manager.gate_of(CHANNEL).waiting_ids(0, 1000)
            return "leaked" not in waiting and "admitted" in waiting
        raise AssertionError(f"no check for duty {duty}")


def counting(world: World, target: Any, method: str) -> None:
    """Count the calls of ``target.method`` (still calling it)."""
    original = getattr(target, method)

    def counted(*args: Any, **kwargs: Any) -> Any:
        world.calls[method] = world.calls.get(method, 0) + 1
        return original(*args, **kwargs)

    setattr(target, method, counted)


@pytest.fixture
def world(store: IJobStore, broker: RedisBroker) -> World:
    now = utcnow()
    old = now - LONG_AGO
    assert store.put(row("lapsed", status=Status.IN_PROGRESS, lease_owner="dead:1:x",
                         lease_expires=now - timedelta(minutes=1)))  # fmt: skip
    assert store.put(row("parent", status=Status.COMPLETED))
    waits = Waits(parents=("parent",), held=True)
    assert store.put(row("child", waits=waits.to_dict(), waiting_since=now))
    assert store.put(row("held", not_before=now, release_at=now))
    assert store.put(row("overdue", start_deadline=now - timedelta(seconds=5)))
    lost = {"queue": CHANNEL, "message_id": "gone"}
    assert store.put(row("lost", created=old, updated=old, state={DISPATCH_KEY: lost}))
    assert store.put(row("old", status=Status.COMPLETED, created=old, updated=old))
    assert store.put(row("uncounted", status=Status.CANCELLED))  # by a process without metrics
    rolled = now - ROLLED_AGO  # ended before the rollup's lag: read by it
    assert store.put(row("rolled", status=Status.FAILED, created=rolled, updated=rolled))
    # A slot a worker could not give back (Redis unreachable as it took the job).
    assert store.put(row("leaked", status=Status.COMPLETED))
    assert manager.gate_of(CHANNEL).admit("leaked") == "ok"
    assert manager.gate_of(CHANNEL).admit("admitted") == "ok"  # its row not inserted yet
    slot = due_schedule(store, SCHEDULE, now)
    made = World(store, broker, slot)
    counting(made, broker, "get_declared_queues")
    counting(made, store, "pending_hooks")
    counting(made, transport_of(broker), "prune_rate_keys")
    return made


def sweeper(broker: RedisBroker) -> RecoverySweeper:
    return RecoverySweeper(
        broker, "sweep-test", lease_seconds=30, interval=1, dispatch_seconds=60,
        retention={Status.COMPLETED: 3600.0},
    )  # fmt: skip


#: The store (or broker) method each duty reads first: made to raise, the duty fails.
BREAKS = {
    "requeue_prefetch": ("broker", "get_declared_queues"),
    "recover_leases": ("store", "recover_expired"),
    "fire_schedules": ("store", "due_recurring"),
    "settle_waits": ("store", "waiting"),
    "release_held": ("store", "due_releases"),
    "cancel_overdue": ("store", "overdue"),
    "resend_first_steps": ("store", "list"),
    "purge": ("store", "purge"),
    "lapsed_hooks": ("store", "pending_hooks"),
    "count_ends": ("store", "ended_since"),
    "reclaim_slots": ("transport", "channel_states"),
    "roll_up_activity": ("store", "activity_mark"),
    "prune_rate_keys": ("transport", "prune_rate_keys"),
}


def test_every_duty_but_the_depth_reports_can_be_broken_here() -> None:
    # The depth reports catch their own errors (a figure for a graph): nothing to break.
    assert set(BREAKS) == {duty.name for duty in DUTIES} - {"depth_reports"}


def breaking(target: Any, method: str, error: Exception) -> None:
    """Make ``target.method`` raise ``error``: the memory store's own listings also call
    ``list``, so only the sweep's kind of call to it (a page by status) raises."""
    original = getattr(target, method)

    def broken(*args: Any, **kwargs: Any) -> Any:
        if method == "list" and not {"status", "limit"} <= set(kwargs):
            return original(*args, **kwargs)
        if method == "ended_since" and "limit" in kwargs:  # the rollup's reads, not count_ends'
            return original(*args, **kwargs)
        raise error

    setattr(target, method, broken)


@pytest.mark.parametrize("duty", sorted(BREAKS))
def test_a_failing_duty_leaves_the_others_to_do_their_work(
    duty: str,
    world: World,
    depths: DepthListener,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    where, method = BREAKS[duty]
    targets = {
        "store": world.store,
        "broker": world.broker,
        "transport": transport_of(world.broker),
    }
    target = targets[where]
    breaking(target, method, RuntimeError(f"{method} is broken"))
    sweep = sweeper(world.broker)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        sweep.sweep(full=True)
    others = [d.name for d in DUTIES if d.name != duty]
    assert [d for d in others if not world.done(d, depths)] == []
    assert not world.done(duty, depths)
    assert failures(registry, duty) == 1
    assert all(not failures(registry, d) for d in others)
    # One line with the traceback: the duty's, or the one row's (the purge's status).
    [line] = [r for r in caplog.records if duty in r.getMessage()]
    assert line.getMessage().endswith(f": {method} is broken")
    assert line.exc_info is not None
    health = sweep.health()
    [failing] = health.failing
    assert failing.duty == duty and failing.error.endswith(f"RuntimeError: {method} is broken")
    assert health.last_full_pass is not None


def test_the_counter_has_a_series_for_every_duty_from_the_start(
    store: IJobStore, broker: RedisBroker, registry: CollectorRegistry
) -> None:
    sweep = sweeper(broker)
    assert failures(registry, "purge") is None
    sweep.stop()
    sweep.run()  # stopped before its first tick: only its start
    assert {d.name: failures(registry, d.name) for d in DUTIES} == {d.name: 0 for d in DUTIES}


def test_a_failing_duty_is_logged_once_per_cause_reminded_then_said_back(
    store: IJobStore, broker: RedisBroker, caplog: pytest.LogCaptureFixture
) -> None:
    sweep = sweeper(broker)
    real = store.overdue
    name = "pypepper_dramatiq.drivers.dramatiq.recovery"

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "cancel_overdue" in r.getMessage()]

    with caplog.at_level(logging.INFO, logger=name):
        breaking(store, "overdue", ValueError("bad row 1"))
        for _ in range(3):
            sweep.sweep(full=False)
        assert len(lines()) == 1  # the same cause (type and place) whatever the message
        breaking(store, "overdue", KeyError("another cause"))
        sweep.sweep(full=False)
        assert len(lines()) == 2 and lines()[-1].exc_info is not None
        sweep._duty_logs["cancel_overdue"].reminder_seconds = 0.0
        sweep.sweep(full=False)
        assert "cancel_overdue still failing after" in lines()[-1].getMessage()
        assert "(5 failed calls)" in lines()[-1].getMessage()
        assert sweep.health().failing[0].failures == 5
        store.overdue = real  # type: ignore[method-assign]
        sweep.sweep(full=False)
        sweep.sweep(full=False)
    assert lines()[-1].levelno == logging.INFO
    assert "recovery sweep duty cancel_overdue is back after" in lines()[-1].getMessage()
    assert len(lines()) == 4
    assert sweep.health().failing == ()


def test_an_outage_ends_the_pass_and_is_logged_once_not_once_per_duty(
    store: IJobStore, broker: RedisBroker, caplog: pytest.LogCaptureFixture
) -> None:
    from pypepper_dramatiq import StoreUnavailableError

    sweep = sweeper(broker)
    methods = ("recover_expired", "due_recurring", "waiting", "due_releases", "overdue")
    for method in methods:
        breaking(store, method, StoreUnavailableError("connection refused"))
    with caplog.at_level(logging.INFO):
        sweep.run_once(full=True)
        sweep.run_once(full=True)
        assert sweep.health().failing == ()  # an outage is not one duty's failure
        for method in methods:
            delattr(store, method)  # the instance's breakage: the class's methods again
        sweep.run_once(full=True)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "job store" in r.getMessage()]
    assert lines[0] == (logging.WARNING, "job store unreachable: connection refused")
    assert len(lines) == 2 and lines[1][1].startswith("job store is back after")
    assert sweep.health().failing == ()


# -- one row at a time ---------------------------------------------------------------------------


def test_one_schedule_that_cannot_be_evaluated_leaves_the_others_to_fire(
    store: IJobStore, broker: RedisBroker, registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    now = utcnow()
    slots = {name: due_schedule(store, name, now) for name in ("a-good", "c-good")}
    due_schedule(store, "b-bad", now, cron="61 * * * *")  # read whole, not evaluable
    before = store.get_recurring("b-bad")
    sweep = sweeper(broker)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        assert sweep.fire_recurring(now) == 2
        assert sweep.fire_recurring(now) == 0  # the good ones moved on; the bad one stays
    assert all(store.get(firing_id(name, slot)) is not None for name, slot in slots.items())
    assert store.get_recurring("b-bad") == before  # it keeps its state: due again
    [line] = [r for r in caplog.records if "b-bad" in r.getMessage()]
    assert line.getMessage().startswith("recovery sweep (fire_schedules): schedule b-bad skipped")
    assert failures(registry, "fire_schedules") == 2  # once per pass it was skipped in
    sweep.sweep(full=False)
    [failing] = sweep.health().failing
    assert failing.duty == "fire_schedules" and "schedule b-bad" in failing.error


def test_fire_due_alone_isolates_schedules_and_logs_each_cause_once(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    from pypepper_dramatiq.schedules.firing import fire_due

    now = utcnow()
    bad = f"bad-{uuid.uuid4().hex[:8]}"  # the process remembers what it logged
    slot = due_schedule(store, "good", now)
    due_schedule(store, bad, now, cron="61 * * * *")
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.schedules.firing"):
        assert fire_due(now) == [firing_id("good", slot)]
        assert fire_due(now) == []
    [line] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert line.getMessage().startswith(f"recurring {bad} cannot be fired")
    assert line.exc_info is not None


def test_damaged_rows_are_skipped_logged_once_each_and_counted(
    store: IJobStore, broker: RedisBroker, registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    now = utcnow()
    assert store.put(row("late", start_deadline=now - timedelta(seconds=5)))
    real = store.overdue
    placeholder = row("unreadable\x1b[31m", damaged="column 'state': not JSON")

    def with_a_damaged_row(*args: Any, **kwargs: Any) -> list[JobRecord]:
        return [placeholder, *real(*args, **kwargs)]

    store.overdue = with_a_damaged_row  # type: ignore[method-assign]
    sweep = sweeper(broker)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        sweep.sweep(full=False)
        sweep.sweep(full=False)
    late = store.get("late")
    assert late is not None and late.status is Status.CANCELLED
    [line] = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert line.getMessage() == (
        "recovery sweep (cancel_overdue): job unreadable\\x1b[31m skipped: "
        "its row cannot be read: column 'state': not JSON"
    )
    assert failures(registry, "cancel_overdue") == 2
    [failing] = sweep.health().failing
    assert failing.duty == "cancel_overdue" and "cannot be read" in failing.error


def test_one_job_that_cannot_be_released_stays_held_and_the_batch_goes_out(
    store: IJobStore, broker: RedisBroker
) -> None:
    now = utcnow()
    for job_id in ("r1", "r2-bad", "r3"):
        assert store.put(row(job_id, not_before=now, release_at=now))
    real = broker.enqueue

    def enqueue(message: Any, *, delay: int | None = None) -> Any:
        if StepMessage.from_message(message).job_id == "r2-bad":
            raise ValueError("this message cannot be encoded")
        return real(message, delay=delay)

    broker.enqueue = enqueue  # type: ignore[method-assign]
    sweep = sweeper(broker)
    assert sweep.release_due(now) == 2
    released = {job_id: store.get(job_id) for job_id in ("r1", "r2-bad", "r3")}
    assert {k: v is not None and v.release_at is None for k, v in released.items()} == {
        "r1": True,
        "r2-bad": False,
        "r3": True,
    }
    ids = broker.client.lrange(f"{broker.namespace}:{CHANNEL}", 0, -1)
    data = broker.client.hmget(f"{broker.namespace}:{CHANNEL}.msgs", ids) if ids else []
    sent = [StepMessage.from_message(Message.decode(raw)).job_id for raw in data]
    assert sorted(sent) == ["r1", "r3"]  # one message each: r1 is not sent again


def test_one_end_that_cannot_be_counted_leaves_the_others_counted(
    store: IJobStore, broker: RedisBroker, registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    for job_id in ("e1", "e2-bad", "e3"):
        assert store.put(row(job_id, status=Status.CANCELLED))  # by a process without metrics
    real = store.advance

    def advance(record: JobRecord) -> bool:
        if record.id == "e2-bad":
            raise ValueError("this row cannot be written")
        return real(record)

    store.advance = advance  # type: ignore[method-assign]
    sweep = sweeper(broker)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        sweep.sweep(full=True)
    marked = {job_id: stored.state.get("counted") for job_id in ("e1", "e2-bad", "e3")
              if (stored := store.get(job_id)) is not None}  # fmt: skip
    assert marked == {"e1": True, "e2-bad": None, "e3": True}
    ended = {"status": "Cancelled", "channel": CHANNEL, "category": ""}
    assert registry.get_sample_value("pypepper_jobs_ended_total", ended) == 2
    assert failures(registry, "count_ends") == 1
    [line] = [r for r in caplog.records if "e2-bad" in r.getMessage()]
    assert line.getMessage().startswith("recovery sweep (count_ends): job e2-bad skipped")
    [failing] = sweep.health().failing
    assert failing.duty == "count_ends" and "job e2-bad" in failing.error


def test_a_retention_that_cannot_be_applied_leaves_the_other_statuses_purged(
    store: IJobStore, broker: RedisBroker, registry: CollectorRegistry
) -> None:
    old = utcnow() - LONG_AGO
    assert store.put(row("done", status=Status.COMPLETED, created=old, updated=old))
    assert store.put(row("failed", status=Status.FAILED, created=old, updated=old))
    sweep = RecoverySweeper(
        broker, "sweep-test", lease_seconds=30, interval=1,
        retention={Status.COMPLETED: 999_999 * 86_400.0, Status.FAILED: 3600.0},
    )  # fmt: skip
    sweep.sweep(full=True)
    assert store.get("failed") is None
    assert store.get("done") is not None
    assert failures(registry, "purge") == 1
    [failing] = sweep.health().failing
    assert failing.duty == "purge" and "retention of status Completed" in failing.error
    assert "OverflowError" in failing.error


# -- croniter missing -----------------------------------------------------------------------------


def test_a_worker_without_croniter_says_so_once_at_boot(
    store: IJobStore,
    broker: RedisBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = utcnow()
    due_schedule(store, "nightly", now)
    monkeypatch.setattr("pypepper_dramatiq.rules.cron._croniter", None)  # as if not importable
    sweep = sweeper(broker)
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        sweep.stop()
        sweep.run()  # its start, then stopped before the first tick
        boot = [r.getMessage() for r in caplog.records]
        for _ in range(3):
            sweep.sweep(full=False)
    [warning] = boot
    assert "1 recurring schedule(s) are stored" in warning
    assert "croniter cannot be imported" in warning and "pip install croniter" in warning
    assert "a dependency of pypepper-dramatiq" in warning
    ticks = [r.getMessage() for r in caplog.records[len(boot) :]]
    assert len(ticks) == 1 and "schedule nightly skipped" in ticks[0]  # not at every tick
    [failing] = sweep.health().failing
    assert failing.duty == "fire_schedules" and "croniter" in failing.error


def test_no_boot_warning_without_schedules_or_with_croniter(
    store: IJobStore,
    broker: RedisBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
        due_schedule(store, "nightly", utcnow())
        assert sweeper(broker).check_cron()
        store.delete_recurring("nightly")
        monkeypatch.setattr("pypepper_dramatiq.rules.cron._croniter", None)
        assert not sweeper(broker).check_cron()
    assert caplog.records == []


# -- the health, as the heartbeat writes it -----------------------------------------------------


def test_the_heartbeat_writes_the_sweep_health_for_the_workers_page(
    store: IJobStore, broker: RedisBroker
) -> None:
    from pypepper_dramatiq.drivers.dramatiq.leases import LeaseKeeper
    from pypepper_dramatiq.engine.running import InFlight

    sweep = sweeper(broker)
    breaking(store, "overdue", RuntimeError("overdue is broken"))
    sweep.run_once(full=True)
    keeper = LeaseKeeper(InFlight(), "sweep-test", 30, 5, sweep_health=sweep.health)
    keeper.beat()
    [written] = [w for w in store.workers(utcnow()) if w.owner == "sweep-test"]
    assert written.sweep is not None and written.sweep.leading
    assert written.sweep.last_full_pass is not None
    assert [(f.duty, f.error) for f in written.sweep.failing] == [
        ("cancel_overdue", "RuntimeError: overdue is broken")
    ]
    store.forget_worker("sweep-test")


def test_the_rollup_adds_each_end_once_and_the_channel_depth_each_pass(
    store: IJobStore, broker: RedisBroker
) -> None:
    now = utcnow()
    ended = now - timedelta(minutes=3)
    started = ended - timedelta(seconds=2)  # ran 2 s, after waiting 40 s
    history = {"history": {"w.t": [{"started": started.isoformat(), "outcome": "succeeded"}]}}
    created = started - timedelta(seconds=40)
    for i in range(3):
        assert store.put(row(f"done-{i}", status=Status.COMPLETED, created=created,
                             updated=ended, state=history))  # fmt: skip
    assert store.put(row("too-recent", status=Status.CANCELLED, updated=now))  # within the lag
    assert manager.gate_of(CHANNEL).admit("waiting") == "ok"  # one job waits in the channel
    assert store.put(row("waiting"))
    sweep = sweeper(broker)
    sweep.sweep(full=True)
    sweep.sweep(full=True)  # the mark moved: the same ends are not added again
    RecoverySweeper(broker, "another-leader", 30, 1).sweep(full=True)  # nor by a new leader
    found = store.activity(
        now_minute(timedelta(hours=1)), now_minute() + timedelta(minutes=1), 7200
    )
    [(key, activity)] = list(found.items())
    assert key == (0, CHANNEL)
    assert activity.ended == (3, 0, 0)
    assert percentile(activity.waits, 0.5) == 60  # 40 s: the bucket up to a minute
    assert percentile(activity.runs, 0.95) == 2.5
    assert activity.depth == 1
    mark = store.activity_mark()
    assert mark is not None and mark.next_minute == minute_of(utcnow() - timedelta(minutes=1))


def test_a_store_that_keeps_no_rollup_is_left_alone(broker: RedisBroker) -> None:
    class NoRollup(MemoryJobStore):
        keeps_activity = False

        def activity_mark(self) -> Any:
            raise AssertionError("a store that keeps no rollup was asked for its mark")

    set_job_store(NoRollup())
    assert sweeper(broker).roll_up_activity(utcnow()) == 0
