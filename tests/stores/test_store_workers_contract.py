"""The worker rows (``beat_worker``, ``forget_worker``, ``workers``, ``prune_workers``) and
the steps workers hold (``held_by``), on every store.

Run on memory, a store with only the abstract methods (``IJobStore``'s defaults:
it keeps no worker rows, so it lists none), PostgreSQL and MariaDB. A heartbeat is
one statement on the SQL stores, whether it inserts or refreshes the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event

from pypepper_dramatiq.records.workers import (
    FORGET_AFTER_SECONDS,
    GONE,
    LIVE,
    DutyFailure,
    SweepHealth,
    WorkerInfo,
    running_step,
    steps_by_owner,
)
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.sql import SqlJobStore

from .test_store_contract import T0, MinimalStore, job, store

__all__ = ["store"]

#: Later than any row a test (or a real worker of another test) wrote.
FAR_FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def no_worker_rows(store: IJobStore) -> Iterator[None]:
    """Start every test without worker rows (the SQL tables outlive a test)."""
    store.prune_workers(FAR_FUTURE)
    yield
    store.prune_workers(FAR_FUTURE)


def worker(owner: str = "host-a:100:aa", seen: float = 0, **fields: Any) -> WorkerInfo:
    """A worker row last seen ``seen`` seconds after :data:`T0` (started at T0)."""
    host, pid, _ = owner.split(":")
    fields.setdefault("host", host)
    fields.setdefault("pid", int(pid))
    fields.setdefault("started", T0)
    fields.setdefault("last_seen", T0 + timedelta(seconds=seen))
    return WorkerInfo(owner=owner, **fields)


def keeps_no_workers(store: IJobStore) -> bool:
    return isinstance(store, MinimalStore)


def test_a_beat_inserts_the_row_then_refreshes_it_keeping_started(store: IJobStore) -> None:
    first = worker(heartbeat=5.0, channels=("etl", "mail"), dramatiq_version="2.2.1")
    store.beat_worker(first)
    if keeps_no_workers(store):
        assert store.workers(T0) == []  # the default keeps nothing, and lists nothing
        return
    assert store.workers(T0 + timedelta(seconds=1)) == [first]
    later = worker(
        seen=5.5,
        started=T0 + timedelta(seconds=5),  # a keeper restarted: the first start stays
        heartbeat=7.5,
        channels=("etl",),
        dramatiq_version="2.3.0",
    )
    store.beat_worker(later)
    [listed] = store.workers(T0 + timedelta(seconds=6))
    assert listed == WorkerInfo(
        owner="host-a:100:aa",
        host="host-a",
        pid=100,
        started=T0,
        last_seen=T0 + timedelta(seconds=5.5),
        heartbeat=7.5,
        channels=("etl",),
        dramatiq_version="2.3.0",
    )


def test_the_sweep_health_is_written_with_the_beat_and_read_back(store: IJobStore) -> None:
    if keeps_no_workers(store):
        pytest.skip("keeps no worker rows")
    health = SweepHealth(
        leading=True,
        last_full_pass=T0 + timedelta(seconds=4, microseconds=250),
        failing=(
            DutyFailure("purge", "OverflowError: date value out of range\x1b[2J", T0, 7),
            DutyFailure("fire_schedules", "schedule nightly: ConfigError: croniter", T0, 1),
        ),
    )
    store.beat_worker(worker(seen=5, sweep=health))
    [listed] = store.workers(T0 + timedelta(seconds=6))
    assert listed.sweep == health
    assert [f.duty for f in listed.sweep.failing] == ["fire_schedules", "purge"]
    store.beat_worker(worker(seen=10, sweep=SweepHealth(leading=False)))  # all well again
    [listed] = store.workers(T0 + timedelta(seconds=11))
    assert listed.sweep == SweepHealth(leading=False)
    store.beat_worker(worker(seen=15))  # a worker that writes none
    [listed] = store.workers(T0 + timedelta(seconds=16))
    assert listed.sweep is None


def test_times_keep_microseconds_and_come_back_in_utc(store: IJobStore) -> None:
    if keeps_no_workers(store):
        pytest.skip("keeps no worker rows")
    paris = timezone(timedelta(hours=1))
    seen = datetime(2024, 1, 1, 13, 0, 0, 123456, tzinfo=paris)
    store.beat_worker(worker(started=seen, last_seen=seen))
    [listed] = store.workers(seen)
    assert listed.last_seen == seen and listed.last_seen.tzinfo == timezone.utc
    assert listed.started == seen and listed.last_seen.microsecond == 123456


def test_workers_are_listed_by_host_then_pid_and_rows_older_than_an_hour_are_not(
    store: IJobStore,
) -> None:
    if keeps_no_workers(store):
        pytest.skip("keeps no worker rows")
    now = T0 + timedelta(seconds=FORGET_AFTER_SECONDS)
    store.beat_worker(worker("host-b:7:bb", seen=10))
    store.beat_worker(worker("host-a:20:cc", seen=10))
    store.beat_worker(worker("host-a:3:dd", seen=10))
    store.beat_worker(worker("host-a:4:ee", seen=0))  # exactly an hour ago: still listed
    store.beat_worker(worker("host-c:5:ff", seen=-1))  # older: not listed
    owners = [w.owner for w in store.workers(now)]
    assert owners == ["host-a:3:dd", "host-a:4:ee", "host-a:20:cc", "host-b:7:bb"]


def test_a_worker_is_gone_after_three_missed_heartbeats(store: IJobStore) -> None:
    if keeps_no_workers(store):
        pytest.skip("keeps no worker rows")
    store.beat_worker(worker(seen=0, heartbeat=5.0))
    [listed] = store.workers(T0)
    assert listed.state(T0 + timedelta(seconds=15)) == LIVE
    assert listed.state(T0 + timedelta(seconds=15.001)) == GONE
    assert listed.gone(T0 + timedelta(minutes=5))


def test_forget_worker_deletes_that_row_only(store: IJobStore) -> None:
    store.beat_worker(worker("host-a:1:aa"))
    store.beat_worker(worker("host-a:2:bb"))
    if keeps_no_workers(store):
        assert store.forget_worker("host-a:1:aa") is False
        return
    assert store.forget_worker("host-a:1:aa") is True
    assert store.forget_worker("host-a:1:aa") is False
    assert [w.owner for w in store.workers(T0)] == ["host-a:2:bb"]


def test_prune_deletes_the_rows_seen_before_the_cutoff(store: IJobStore) -> None:
    store.beat_worker(worker("host-a:1:aa", seen=0))
    store.beat_worker(worker("host-a:2:bb", seen=10))
    store.beat_worker(worker("host-a:3:cc", seen=20))
    if keeps_no_workers(store):
        assert store.prune_workers(T0 + timedelta(seconds=15)) == 0
        return
    assert store.prune_workers(T0 + timedelta(seconds=10)) == 1  # strictly before
    assert [w.owner for w in store.workers(T0)] == ["host-a:2:bb", "host-a:3:cc"]
    assert store.prune_workers(T0 + timedelta(seconds=15)) == 1
    assert [w.owner for w in store.workers(T0)] == ["host-a:3:cc"]


def test_a_long_owner_and_a_unicode_host_are_kept(store: IJobStore) -> None:
    if keeps_no_workers(store):
        pytest.skip("keeps no worker rows")
    owner = "h" * 100 + ":4194304:" + "f" * 19
    assert len(owner) == 128
    store.beat_worker(WorkerInfo(owner, "höst-ü", 4194304, T0, T0, channels=("ç",)))
    [listed] = store.workers(T0)
    assert (listed.owner, listed.host, listed.channels) == (owner, "höst-ü", ("ç",))


def test_held_by_lists_the_inprogress_jobs_leased_to_those_owners(store: IJobStore) -> None:
    payload = {"workflows": [{"tasks": [{"name": "fetch"}, {"name": "load"}]}]}
    running = {"status": Status.IN_PROGRESS, "payload": payload}
    until = T0 + timedelta(seconds=30)
    at_load = {"cursor": [0, 1, 2, 1]}
    assert store.put(job("b-run", lease_owner="w1", lease_expires=until, state=at_load, **running))
    assert store.put(job("a-run", lease_owner="w1", state={"cursor": [0, 0, 0, 0]}, **running))
    assert store.put(job("c-run", lease_owner="w2", state={"cursor": [0, 0, 0, 0]}, **running))
    assert store.put(job("d-free", state={"cursor": [0, 0, 0, 0]}, **running))  # dispatched
    assert store.put(job("e-done", status=Status.COMPLETED, lease_owner="w1"))
    assert store.put(job("f-sched", status=Status.SCHEDULED, lease_owner="w1"))

    assert [r.id for r in store.held_by(["w1"])] == ["a-run", "b-run"]
    assert [r.id for r in store.held_by({"w1", "w2", "nobody"})] == ["a-run", "b-run", "c-run"]
    assert store.held_by([]) == []

    steps = steps_by_owner(store.held_by(["w1", "w2"]))
    assert sorted(steps) == ["w1", "w2"]
    load = steps["w1"][1]
    assert (load.job_id, load.key, load.task, load.round, load.attempt) == (
        "b-run",
        "0.1",
        "load",
        2,
        1,
    )
    assert load.lease_expires == until and load.since == T0
    assert running_step(store.held_by(["w2"])[0]).task == "fetch"


@pytest.mark.parametrize("twice", [False, True], ids=["insert", "refresh"])
def test_a_heartbeat_is_one_statement_on_the_sql_stores(store: IJobStore, twice: bool) -> None:
    if not isinstance(store, SqlJobStore):
        pytest.skip("counts SQL statements")
    if twice:
        store.beat_worker(worker())
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        store.beat_worker(worker(seen=5))
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert [w.last_seen for w in store.workers(T0)] == [T0 + timedelta(seconds=5)]
