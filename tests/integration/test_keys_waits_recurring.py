"""Unique keys, waits on other jobs and recurring schedules with real ``dramatiq``
workers, Redis and PostgreSQL.

* a per-second recurring schedule keeps firing every slot, once, while the
  worker holding the sweep lock is SIGKILLed (the survivor catches up); and
  fires every slot once with two workers on each broker;
* producer processes racing on one unique key leave one job;
* children after a failed and a succeeded parent, with each failure policy, and a chain;
* ``on_conflict="after"``: the second job starts once the key's holder ended.

Figures are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select

from pypepper_dramatiq import (
    Job,
    Status,
    Workflow,
    chain,
    get_job_store,
    recurring,
    remove_recurring,
)
from pypepper_dramatiq.rules.cron import firing_id
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.schema import jobs as jobs_table
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.transport.redis.layout import LEADER_KEY

from .conftest import BOTH_BROKERS
from .harness import APP_DIR, Cluster, WorkerProcess, wait_for
from .worker_app import CHANNEL, ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The set of the jobs admitted to the test channel and not ended.
WAITING = f"pypepper:channel:{CHANNEL}:waiting"


def report(title: str, **figures: object) -> None:
    """Print one line of figures (visible with ``pytest -s``)."""
    print(f"\n[{title}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def ref(job_id: str) -> Job:
    """A job known by its id only (what ``Cluster.runs``, ``times``, ``wait_status`` read)."""
    return Job(channel_id=CHANNEL, id=job_id)


def slot_of(job_id: str) -> datetime:
    """The slot a firing id names (``rec-<digest>-<YYYYmmddTHHMMSSZ>``)."""
    stamp = job_id.rsplit("-", 1)[1]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


# -- recurring --------------------------------------------------------------------------------

SCHEDULE = "it-every-second"
REC_CATEGORY = "rec-it"
#: The sweep runs every second; the leader lock lives twice that (2 s) after its holder dies.
REC_SWEEP = 1.0


def firings() -> list[JobRecord]:
    return list(get_job_store().list(category=REC_CATEGORY))


def leader_worker(cluster: Cluster) -> tuple[WorkerProcess, str]:
    """The worker whose process holds the sweep lock, and the lock's owner id."""

    def holder() -> tuple[WorkerProcess, str] | None:
        value = cluster.redis.get(LEADER_KEY)
        if value is None:
            return None
        owner = value.decode()
        pid = int(owner.split(":")[1])
        for worker in cluster.workers:
            if pid in worker.group_pids():
                return worker, owner
        return None

    found: tuple[WorkerProcess, str] = wait_for(holder, 10, "a worker to hold the sweep lock")
    return found


def test_a_per_second_schedule_fires_every_slot_once_across_a_leader_kill(
    cluster: Cluster,
) -> None:
    for _ in range(2):
        cluster.start_worker(sweep_interval=REC_SWEEP, heartbeat_timeout_ms=5_000, wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    template = Job(category=REC_CATEGORY, channel_id=CHANNEL)
    template.workflows.append(Workflow([probe.task(name="tick", value=1)]))
    registered_at = datetime.now(timezone.utc)
    try:
        schedule = recurring(SCHEDULE, "* * * * * *", template, overlap="allow", catch_up="all")
        first_due = schedule.next_slot
        wait_for(lambda: len(firings()) >= 6, 20, "six firings before the kill")

        leader, owner = leader_worker(cluster)
        survivor = next(w for w in cluster.workers if w is not leader)

        # Kill just after the newest firing completed: no probe runs on the leader
        # then (a kill mid-run would legitimately run that firing twice).
        def newest_just_completed() -> bool:
            newest = max(firings(), key=lambda r: r.id)
            ends = cluster.times("ends", ref(newest.id), "tick")
            return newest.status is Status.COMPLETED and bool(ends) and time.time() - ends[0] < 0.2

        wait_for(newest_just_completed, 10, "a quiet moment to kill the leader", interval=0.02)
        killed_at = datetime.now(timezone.utc)
        lock_left = cluster.redis.pttl(LEADER_KEY) / 1000
        leader.kill()

        wait_for(
            lambda: any(slot_of(r.id) > killed_at + timedelta(seconds=5) for r in firings()),
            20,
            "the survivor to fire slots after the kill",
        )
        new_owner = cluster.redis.get(LEADER_KEY)
        assert new_owner is not None and new_owner.decode() != owner
        assert int(new_owner.decode().split(":")[1]) in survivor.group_pids()
    finally:
        removed = remove_recurring(SCHEDULE)
        removed_at = datetime.now(timezone.utc)
    assert removed
    time.sleep(REC_SWEEP * 1.5)  # a sweep that read the schedule before its removal

    rows = firings()
    records = cluster.wait_status([ref(r.id) for r in rows], timeout=30)
    slots = sorted(slot_of(r.id) for r in rows)
    by_id = {r.id: r for r in rows}
    runs = {r.id: cluster.runs(ref(r.id), "tick") for r in rows}
    after_kill = sorted((r for r in rows if r.created > killed_at), key=lambda r: slot_of(r.id))
    takeover_gap = (after_kill[0].created - killed_at).total_seconds()
    caught_up = sum(1 for r in after_kill if slot_of(r.id) <= after_kill[0].created)
    lateness = max((by_id[i].created - slot_of(i)).total_seconds() for i in by_id)
    report(
        "recurring",
        slots=len(slots),
        first=f"{slots[0]:%H:%M:%S}",
        last=f"{slots[-1]:%H:%M:%S}",
        per_slot_max=max(runs.values()),
        takeover_gap_s=f"{takeover_gap:.2f}",
        lock_left_at_kill_s=f"{lock_left:.2f}",
        caught_up_at_takeover=caught_up,
        max_fire_lateness_s=f"{lateness:.2f}",
    )

    for row in rows:
        assert row.id == firing_id(SCHEDULE, slot_of(row.id)), row.id
        assert row.channel_id == CHANNEL and row.category == REC_CATEGORY
    assert len(set(slots)) == len(slots)
    expected = [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    missing = sorted(set(expected) - set(slots))
    assert slots == expected, f"slots missing: {[f'{s:%H:%M:%S}' for s in missing]}"
    assert slots[0] == first_due, (slots[0], first_due, registered_at)
    assert slots[-1] <= removed_at
    assert len(slots) >= 10
    assert runs == dict.fromkeys(runs, 1), {i: n for i, n in runs.items() if n != 1}
    assert all(r.status is Status.COMPLETED for r in records.values())
    # The survivor's first sweep fired the slots missed while the lock lapsed.
    assert caught_up >= 2, caught_up
    assert not cluster.redis.smembers(WAITING), "admission slots left behind"
    # The survivor ran what was fired after the kill.
    survivor_pids = survivor.group_pids()
    for row in after_kill:
        assert set(cluster.run_pids(ref(row.id), "tick")) <= survivor_pids


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_two_workers_fire_each_slot_of_a_per_second_schedule_once(cluster: Cluster) -> None:
    for _ in range(2):
        cluster.start_worker(sweep_interval=REC_SWEEP, wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    template = Job(category=REC_CATEGORY, channel_id=CHANNEL)
    template.workflows.append(Workflow([probe.task(name="tick", value=1)]))
    try:
        recurring(SCHEDULE, "* * * * * *", template, overlap="allow", catch_up="all")
        wait_for(lambda: len(firings()) >= 6, 30, "six firings")
    finally:
        assert remove_recurring(SCHEDULE)
        removed_at = datetime.now(timezone.utc)
    time.sleep(REC_SWEEP * 1.5)  # a sweep that read the schedule before its removal

    rows = firings()
    records = cluster.wait_status([ref(r.id) for r in rows], timeout=30)
    slots = sorted(slot_of(r.id) for r in rows)
    runs = {r.id: cluster.runs(ref(r.id), "tick") for r in rows}
    report("recurring-two-workers", slots=len(slots), per_slot_max=max(runs.values()))

    assert len(set(slots)) == len(slots)
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    assert slots[-1] <= removed_at
    assert runs == dict.fromkeys(runs, 1), {i: n for i, n in runs.items() if n != 1}
    assert all(r.status is Status.COMPLETED for r in records.values())


# -- racing producers -------------------------------------------------------------------------

RACE_KEY = "race-key"


def producers(cluster: Cluster, count: int, on_conflict: str, n: int) -> list[dict[str, Any]]:
    """Run ``n`` ``race_producer.py`` processes, released together once all are set up."""
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    args = [cluster.redis_url, cluster.store_uri, str(count), RACE_KEY, on_conflict]
    procs = [
        subprocess.Popen(
            [sys.executable, "race_producer.py", *args],
            cwd=APP_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until it is set up
            assert line.strip() == "ready", (line, proc.stderr and proc.stderr.read()[-3000:])
        start_at = repr(time.time() + 0.3)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(start_at + "\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(o["late"] == 0 for o in outputs), "a producer missed the barrier"
    return outputs


def keyed_rows() -> list[Any]:
    """``(id, status, active_key)`` of every row with the race's unique key."""
    store = get_job_store()
    assert isinstance(store, SqlJobStore)
    with store.engine.connect() as connection:
        return list(
            connection.execute(
                select(jobs_table.c.id, jobs_table.c.status, jobs_table.c.active_key).where(
                    jobs_table.c.unique_key == RACE_KEY
                )
            )
        )


def test_producers_racing_on_one_unique_key_store_one_job(cluster: Cluster) -> None:
    per_process = 20
    outputs = producers(cluster, per_process, "skip", n=2)

    rows = keyed_rows()
    assert len(rows) == 1, rows
    holder, status, active_key = rows[0]
    assert (status, active_key) == (Status.SCHEDULED.value, RACE_KEY)
    returned = [i for o in outputs for i in o["returned"]]
    assert len(returned) == 2 * per_process
    assert set(returned) == {holder}, "a producer was told another job is in charge"
    created = [i for o in outputs for i in o["created"]]
    assert holder in created
    stored = {r.id for r in get_job_store().list()}
    assert stored == {holder}, f"rows stored for losers: {stored - {holder}}"
    first_calls = [o["returned"][0] for o in outputs]
    (a0, a1), (b0, b1) = (o["first_call"] for o in outputs)
    overlap = min(a1, b1) - max(a0, b0)
    # Nothing leaked for the losers: one admission slot, one message.
    assert cluster.redis.smembers(WAITING) == {holder.encode()}
    assert cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs") == 1

    raised = producers(cluster, 3, "raise", n=1)[0]
    assert raised["returned"] == [None, None, None]
    assert raised["errors"] == [{"unique_key": RACE_KEY, "existing_id": holder}] * 3
    assert {r.id for r in get_job_store().list()} == {holder}
    assert [r[:2] for r in keyed_rows()] == [(holder, Status.SCHEDULED.value)]
    report(
        "race",
        producers=2,
        calls=2 * per_process,
        rows=len(rows),
        first_calls_agree=len(set(first_calls)) == 1,
        first_calls_overlap_ms=f"{overlap * 1000:.1f}",
        holder_from=next(n for n, o in enumerate(outputs) if holder in o["created"]),
    )


# -- waits on parents -------------------------------------------------------------------------


def one_task_job(task: Any) -> Job:
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([task]))
    return job


def test_children_after_a_failed_and_a_completed_parent_follow_their_policy(
    cluster: Cluster,
) -> None:
    cluster.start_worker(threads=4, sweep_interval=0.5)
    failing = one_task_job(probe.options(retry_count=0).task(name="boom", fail_times=99))
    passing = one_task_job(probe.task(name="ok", value=42, sleep=1.5))
    failing.scheduled()
    passing.scheduled()
    children = {}
    for policy in ("propagate", "cancel", "ignore"):
        child = one_task_job(probe.task(name="child", value=policy))
        assert child.scheduled(after=[failing, passing.id], on_parent_failure=policy) == child.id
        children[policy] = child
    links = [one_task_job(probe.task(name="link", value=i, sleep=0.2)) for i in range(3)]
    assert chain(*links) == [j.id for j in links]

    waiting = cluster.saved(children["ignore"])
    assert waiting.status is Status.SCHEDULED and waiting.waits is not None
    assert waiting.waits["parents"] == [failing.id, passing.id]
    assert cluster.runs(children["ignore"], "child") == 0
    assert not cluster.times("ends", passing, "ok"), "the children were scheduled too late"

    parents = cluster.wait_status([failing, passing], 30, (Status.FAILED, Status.COMPLETED))
    assert parents[failing.id].status is Status.FAILED
    assert parents[passing.id].status is Status.COMPLETED
    ended = cluster.wait_status(
        children.values(), 30, (Status.FAILED, Status.CANCELLED, Status.COMPLETED)
    )
    cluster.wait_status(links, 30)

    propagated = ended[children["propagate"].id]
    assert propagated.status is Status.FAILED
    assert propagated.error is not None and failing.id in propagated.error
    cancelled = ended[children["cancel"].id]
    assert cancelled.status is Status.CANCELLED
    assert cancelled.error is not None and failing.id in cancelled.error
    ignored = ended[children["ignore"].id]
    assert ignored.status is Status.COMPLETED, ignored.error
    assert cluster.runs(children["propagate"], "child") == 0
    assert cluster.runs(children["cancel"], "child") == 0
    assert cluster.runs(children["ignore"], "child") == 1

    last_parent_end = max(
        cluster.times("ends", failing, "boom")[-1], cluster.times("ends", passing, "ok")[-1]
    )
    child_start = cluster.times("starts", children["ignore"], "child")[0]
    # What the worker handed the task as context.parent_results.
    parent_results = ignored.state.get("parent_results")
    assert parent_results == {failing.id: {}, passing.id: {"ok": 42}}

    assert not cluster.redis.smembers(WAITING), "admission slots left behind"
    starts = [cluster.times("starts", j, "link") for j in links]
    ends = [cluster.times("ends", j, "link") for j in links]
    assert all(len(s) == 1 for s in starts), starts
    report(
        "fan-in",
        child_start_after_last_parent_end_s=f"{child_start - last_parent_end:.2f}",
        chain_gaps_s=[f"{starts[i + 1][0] - ends[i][0]:.2f}" for i in range(2)],
    )
    assert child_start >= last_parent_end
    for i in range(2):
        assert starts[i + 1][0] >= ends[i][0], f"link {i + 1} started before link {i} ended"


# -- on_conflict="after" ----------------------------------------------------------------------


def test_a_job_after_the_key_holder_starts_once_it_ended_and_takes_the_key(
    cluster: Cluster,
) -> None:
    key = "after-key"
    cluster.start_worker(threads=2, sweep_interval=0.5)
    holder = one_task_job(probe.task(name="hold", sleep=1.5, value="first"))
    assert holder.scheduled(unique_key=key) == holder.id
    second = one_task_job(probe.task(name="next", value="second"))
    assert second.scheduled(unique_key=key, on_conflict="after") == second.id

    stored = cluster.saved(second)
    assert stored.status is Status.SCHEDULED
    assert stored.waits is not None and stored.waits["holder"] == holder.id
    assert stored.unique_key is None  # taken when the wait ends
    assert cluster.saved(holder).unique_key == key

    holders: list[str] = []

    def both_done() -> bool:
        current = get_job_store().key_holder(key)
        if current is not None and (not holders or holders[-1] != current.id):
            holders.append(current.id)
        return all(cluster.saved(j).status.is_terminal for j in (holder, second))

    wait_for(both_done, 30, "both keyed jobs to end", interval=0.05)
    records = cluster.wait_status([holder, second], 1)
    holder_end = cluster.times("ends", holder, "hold")[0]
    second_start = cluster.times("starts", second, "next")[0]
    report(
        "after",
        start_after_holder_end_s=f"{second_start - holder_end:.2f}",
        key_holders_seen=len(holders),
    )
    assert not cluster.redis.smembers(WAITING), "admission slots left behind"
    assert second_start >= holder_end
    assert records[second.id].unique_key == key
    assert records[second.id].waits is None
    # The key went from the holder to the second job (which may hold it too briefly to be seen).
    assert holders in ([holder.id], [holder.id, second.id])
    assert cluster.runs(second, "next") == 1 and cluster.runs(holder, "hold") == 1
