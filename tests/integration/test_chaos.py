"""Chaos (issue 9): random SIGKILLs of workers and one restart of each server, under load.

Jobs of several kinds (one task, chains passing results, tasks that fail then
succeed, a task that fails for good, an optional task that fails, jobs
cancelled while running or queued) are submitted in waves while, at seeded
random moments, a worker's process group is SIGKILLed (and replaced), the broker
is stopped and started again, and PostgreSQL is stopped ("fast") and started
again. Then every accepted job must end with its expected status and results, no
task whose success was recorded may have run again, nothing may be left
Scheduled or InProgress, and the channel's waiting jobs must drain (the slots a
worker logged it could not give back, the coordination server being unreachable
as it took the job, included: the recovery sweep's ``reclaim_slots`` duty gives
them back; they are reported as ``slots_given_back_by_sweep``).

It runs on each broker (issue 25), the same scenario and checks:

* ``[redis]``: Redis is the broker, the coordination server and the store of the
  probes' traces; it is stopped with SIGTERM (its append-only file is flushed).
  The channel's waiting jobs are a Redis set.
* ``[rabbitmq]``: a RabbitMQ node of the test's own is the broker, stopped with
  ``rabbitmqctl stop`` (durable queues, persistent messages); coordination (channel
  slots, cancel and end notices, the sweep leader) is PostgreSQL's, so its restart
  also cuts those. The channel's waiting jobs are its ``scheduler_channel_slots``
  rows. The traces go to the session's Redis, never restarted. What differs by
  design: a job submitted while PostgreSQL is down is refused with
  ``BrokerUnavailableError`` (admission is a PostgreSQL statement), where Redis
  queues it rowless; one submitted while RabbitMQ is down is refused on both
  (its slot given back, no row). Every seed-002 part runs on RabbitMQ too: they
  live in the store and the sweep, which do not change with the broker; only
  their coordination does (the sweep leader's advisory lock, the slots of
  released jobs, the end notices).

The same run exercises the seed-002 capabilities (issue 22: recurring schedules,
racing unique keys, ``after=`` children, ``on_final_failure`` hooks,
transactional enqueue, retention), whose scenario and invariants are in
``chaos_seed002``; their jobs go through the checks above as well.

The default size is what ``.ci/run`` runs (about a minute); ``PYPEPPER_CHAOS_LONG=1``
runs the long one (a few minutes). ``PYPEPPER_CHAOS_SEED=<n>`` replays a seed
(the seed is printed; the fault timing still depends on the machine).
"""

from __future__ import annotations

import functools
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from services import PostgresServer, RabbitMQServer, RedisServer

from pypepper_dramatiq import Job, Status, Task, Workflow, get_job_store
from pypepper_dramatiq.errors import (
    BrokerUnavailableError,
    InvalidTransitionError,
    StoreError,
    UnknownJobError,
)
from pypepper_dramatiq.stores.base import JobRecord

from .chaos_plan import Planned, report
from .chaos_seed002 import HEAL_LINE, RETENTION, RETENTION_SECONDS, Seed002, wait_for_a_purge
from .conftest import BOTH_BROKERS, flush_redis
from .harness import READY_LINE, Cluster, WorkerProcess, raw
from .worker_app import CHANNEL, ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

LONG = os.environ.get("PYPEPPER_CHAOS_LONG") == "1"
#: ``PYPEPPER_CHAOS_DEBUG_STEPS=1``: the workers log every step's bookkeeping (claims,
#: records, heals), to read a failure's path; by default only their heals.
DEBUG_STEPS = os.environ.get("PYPEPPER_CHAOS_DEBUG_STEPS") == "1"


@dataclass(frozen=True)
class Size:
    jobs: int
    waves: int
    kills: int
    #: Worker CLIs kept running (each ``--processes 1``).
    workers: int
    threads: int
    #: Seconds over which waves, kills and the two outages are spread.
    chaos_seconds: float
    #: Seconds each server stays down.
    outage_seconds: float = 2.0


DEFAULT_SIZE = Size(jobs=60, waves=6, kills=4, workers=2, threads=3, chaos_seconds=20)
LONG_SIZE = Size(jobs=900, waves=60, kills=60, workers=3, threads=4, chaos_seconds=200)
SIZE = LONG_SIZE if LONG else DEFAULT_SIZE

LEASE = 3.0
SWEEP = 0.5
#: How long a step message may wait in a queue before recovery sends it again.
DISPATCH = 5.0
#: Messages prefetched by a killed worker come back after this.
HEARTBEAT_MS = 5_000
#: An execution that ended this long before a fault may not have been recorded yet.
MARGIN_BEFORE = 1.0
#: ... nor one that ended this long after a server came back (reconnects, retries).
MARGIN_AFTER = 3.0
#: When a job to cancel "while running" is cancelled anyway if it has not started.
CANCEL_AFTER_S = 8.0

#: Jobs submitted in the middle of each outage.
OUTAGE_WAVE = 3

#: The Redis set of the jobs admitted to the channel and not yet taken by a worker.
WAITING_KEY = f"pypepper:channel:{CHANNEL}:waiting"
#: The same on RabbitMQ: the channel's slot rows in PostgreSQL (read as psql would).
WAITING_ROWS = "SELECT job_id FROM scheduler_channel_slots WHERE channel = :channel"

#: The broker server a run restarts.
BrokerServer = RedisServer | RabbitMQServer


def build(kind: str, i: int, rng: random.Random) -> tuple[list[Task], dict[str, Any]]:
    """The tasks of a job of ``kind`` and the :class:`Planned` fields describing its end."""

    def nap() -> float:
        return round(rng.uniform(0.1, 1.0), 2)

    p = dict(patient=True)  # trace writes wait out the Redis restart
    if kind == "one":
        return [probe.task(name="only", value=i, sleep=nap(), **p)], dict(
            expected=Status.COMPLETED, results={"0.0": i}
        )
    if kind == "chain":
        return [
            probe.task(name="a", value=i, sleep=nap(), **p),
            probe.task(name="b", value=10, add_to="a", sleep=nap(), **p),
            probe.task(name="c", value=100, add_to="b", sleep=nap(), **p),
        ], dict(expected=Status.COMPLETED, results={"0.0": i, "0.1": i + 10, "0.2": i + 110})
    if kind == "flaky":
        return [
            probe.options(retry_count=3, retry_delay=0.3).task(
                name="flaky", fail_times=2, value=i, sleep=nap() / 2, **p
            ),
            probe.task(name="after", value=1, add_to="flaky", **p),
        ], dict(expected=Status.COMPLETED, results={"0.0": i, "0.1": i + 1})
    if kind == "doomed":
        return [
            probe.task(name="pre", value=i, sleep=nap(), **p),
            probe.options(retry_count=1).task(name="doomed", fail_times=1000, **p),
            probe.task(name="never", **p),
        ], dict(expected=Status.FAILED, results={"0.0": i}, never=("never",))
    if kind == "optional":
        return [
            probe.options(optional=True, retry_count=1).task(name="opt", fail_times=1000, **p),
            probe.task(name="after", value=i, sleep=nap(), **p),
        ], dict(expected=Status.COMPLETED, results={"0.1": i}, skipped=("0.0",))
    if kind in ("cancel_running", "cancel_queued"):
        return [
            probe.task(name="poll", sleep=30, poll_cancel=True, **p),
            probe.task(name="never", **p),
        ], dict(
            expected=Status.CANCELLED,
            results=None,
            never=("never",),
            cancel=kind.removeprefix("cancel_"),
        )
    raise AssertionError(kind)


KINDS = {
    "one": 20,
    "chain": 25,
    "flaky": 15,
    "doomed": 10,
    "optional": 10,
    "cancel_running": 10,
    "cancel_queued": 10,
}


@dataclass
class Chaos:
    """What the test did, and when (wall-clock ``time.time()``)."""

    cluster: Cluster
    rng: random.Random
    #: "redis" or "rabbitmq": the broker restarted, and the name of its outage.
    broker_kind: str = "redis"
    accepted: list[Planned] = field(default_factory=list)
    #: Jobs whose ``scheduled()`` raised BrokerUnavailableError: they must never run.
    refused: list[Planned] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    #: (start, end) of each SIGKILL and of each outage, by kind.
    kills: list[tuple[float, float]] = field(default_factory=list)
    outages: dict[str, tuple[float, float]] = field(default_factory=dict)
    killed: list[WorkerProcess] = field(default_factory=list)
    #: Workers whose boot failed because PostgreSQL went down under it (setup() opens
    #: the store at import): replaced like killed ones.
    failed_boots: list[WorkerProcess] = field(default_factory=list)
    replacements_due: int = 0
    submitted: int = 0
    seed002: Seed002 | None = None

    def worker(self) -> WorkerProcess:
        return self.cluster.start_worker(
            processes=1,
            threads=SIZE.threads,
            lease_seconds=LEASE,
            sweep_interval=SWEEP,
            dispatch_seconds=DISPATCH,
            heartbeat_timeout_ms=HEARTBEAT_MS,
            shutdown_grace=0,
            retention=RETENTION,
            extra_env={ENV["debug_steps" if DEBUG_STEPS else "log_heals"]: "1"},
            wait=False,
        )

    def live(self) -> list[WorkerProcess]:
        return [
            w for w in self.cluster.workers if w not in self.killed and w not in self.failed_boots
        ]

    # -- submissions and cancels

    def submit(self, count: int) -> None:
        for _ in range(count):
            i = self.submitted
            self.submitted += 1
            kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            tasks, spec = build(kind, i, self.rng)
            job = Job(category="chaos", channel_id=CHANNEL)
            job.workflows.append(Workflow(tasks))
            self.submit_planned(Planned(kind, job, tuple(t.name for t in tasks), **spec))

    def submit_planned(
        self, planned: Planned, tolerate: tuple[type[Exception], ...] = (), **options: Any
    ) -> bool:
        """``planned.job.scheduled(**options)``; whether it was accepted. An exception
        of ``tolerate`` is raised to the caller; any other than a refusal is noted."""
        planned.submitted_at = time.time()
        try:
            planned.job.scheduled(**options)
        except BrokerUnavailableError:
            self.refused.append(planned)
            return False
        except tolerate:
            raise
        except Exception as exc:
            self.unexpected.append(
                f"job {planned.job.id} ({planned.kind}): scheduled() raised {exc!r}"
            )
            return False
        self.accepted.append(planned)
        if planned.cancel == "queued":
            self.try_cancel(planned)
        return True

    def try_cancel(self, planned: Planned) -> None:
        """Cancel ``planned`` now if its row can take it; else a later call tries again."""
        try:
            done = Job.cancel_saved(planned.job.id)
        except (UnknownJobError, StoreError):
            return  # not healed yet (PostgreSQL was down at submission), or PostgreSQL is down
        except InvalidTransitionError as exc:
            self.unexpected.append(f"{planned.kind} job {planned.job.id}: cancel refused: {exc}")
            planned.cancelled_at = time.time()  # do not try again
            return
        if done:
            planned.cancelled_at = time.time()

    def cancels_due(self) -> None:
        now = time.time()
        for planned in self.accepted:
            if planned.cancel is None or planned.cancelled_at is not None:
                continue
            if planned.cancel == "running" and now - planned.submitted_at < CANCEL_AFTER_S:
                try:
                    if self.cluster.stamp("running", planned.job, "poll") is None:
                        continue
                except Exception:  # the traces' Redis is down: look again later
                    continue
            self.try_cancel(planned)

    # -- faults

    def kill_one(self) -> None:
        live = self.live()
        if not live:
            return
        victim = self.rng.choice(live)
        started = time.time()
        victim.kill()
        self.kills.append((started, time.time()))
        self.killed.append(victim)
        self.replacements_due += 1

    def replace(self, postgres_up: bool) -> None:
        for worker in self.live():
            if (
                worker.proc.poll() is not None
                and READY_LINE not in worker.log()
                and ("job store unavailable" in worker.log())
            ):
                self.failed_boots.append(worker)
                self.replacements_due += 1
        # A worker's setup() migrates its database at import: start it once PostgreSQL is up.
        while self.replacements_due and postgres_up:
            self.worker()
            self.replacements_due -= 1

    # -- traces

    def windows(self, planned: Planned) -> list[tuple[float, float]]:
        """Periods in which an execution may have ended without its outcome being recorded."""
        spans = [(start - MARGIN_BEFORE, end) for start, end in self.kills]
        spans += [(down - MARGIN_BEFORE, up + MARGIN_AFTER) for down, up in self.outages.values()]
        if planned.cancelled_at is not None:
            spans.append((planned.cancelled_at - MARGIN_BEFORE, float("inf")))
        return spans


def _timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def plan_faults(rng: random.Random) -> list[tuple[float, str]]:
    """(seconds from the start, action) for waves, kills and the two outages, in order."""
    events = [(w * SIZE.chaos_seconds / SIZE.waves, "wave") for w in range(SIZE.waves)]
    events += [(rng.uniform(1.0, SIZE.chaos_seconds), "kill") for _ in range(SIZE.kills)]
    # The two outages at random moments that do not overlap (easier to read a failure).
    span = SIZE.chaos_seconds - SIZE.outage_seconds - 1.0
    while True:
        broker_at, postgres_at = rng.uniform(1.0, span), rng.uniform(1.0, span)
        if abs(broker_at - postgres_at) > SIZE.outage_seconds + 2.0:
            break
    for at, server in ((broker_at, "broker"), (postgres_at, "postgres")):
        events += [(at, f"{server}_down"), (at + SIZE.outage_seconds, f"{server}_up")]
        # A few submissions while the server is down: refused, or queued rowless (on
        # Redis, with PostgreSQL down).
        events.append((at + SIZE.outage_seconds / 2, "outage_wave"))
    return sorted(events)


def restarted_broker(request: pytest.FixtureRequest, broker_kind: str) -> tuple[BrokerServer, str]:
    """The broker server of the run's own, and the URL of the Redis the probes trace
    to: on Redis that same server; on RabbitMQ the session's Redis, emptied."""
    if broker_kind == "redis":
        own_redis: RedisServer = request.getfixturevalue("own_redis")
        return own_redis, own_redis.url
    own_rabbitmq: RabbitMQServer = request.getfixturevalue("own_rabbitmq")
    redis_url = str(request.getfixturevalue("redis_url"))
    flush_redis(redis_url)
    return own_rabbitmq, redis_url


@pytest.mark.timeout(1800 if LONG else 400)
@pytest.mark.parametrize("broker_kind", BOTH_BROKERS)
def test_chaos_every_job_ends_as_expected_and_no_finished_task_reruns(
    broker_kind: str, own_postgres: PostgresServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("PYPEPPER_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(
        f"\n[chaos] broker={broker_kind} seed={seed} (replay: PYPEPPER_CHAOS_SEED={seed}"
        f"{' PYPEPPER_CHAOS_LONG=1' if LONG else ''}), size={SIZE}"
    )
    rng = random.Random(seed)
    began = time.time()
    broker, traces_url = restarted_broker(request, broker_kind)
    cluster = Cluster(traces_url, own_postgres.uri, tmp_path, broker.url)
    chaos = Chaos(cluster, rng, broker_kind)
    chaos.seed002 = Seed002(cluster, random.Random(seed + 2), tmp_path / "hook-calls.txt")
    try:
        chaos.seed002.start(chaos)
        run_chaos(chaos, broker, own_postgres)
        check_outcomes(chaos, seed, began)
    finally:
        chaos.seed002.close()
        cluster.close()


def run_chaos(chaos: Chaos, broker: BrokerServer, own_postgres: PostgresServer) -> None:
    cluster = chaos.cluster
    for _ in range(SIZE.workers):
        chaos.worker()
    for worker in cluster.workers:
        worker.wait_ready()
    per_wave = [SIZE.jobs // SIZE.waves + (w < SIZE.jobs % SIZE.waves) for w in range(SIZE.waves)]
    events = plan_faults(chaos.rng)
    up = {"broker": True, "postgres": True}
    assert chaos.seed002 is not None
    seed002 = chaos.seed002

    def idle() -> None:
        """What goes on between two events: cancels due, replacements, waves due."""
        chaos.cancels_due()
        chaos.replace(up["postgres"])
        seed002.tick(chaos, servers_up=all(up.values()))
        time.sleep(0.1)

    def meanwhile(call: Callable[[], object]) -> None:
        """``call()`` (a server stopping or starting) in a thread while :func:`idle` goes
        on: a RabbitMQ node takes seconds to stop or boot (50 s seen on a busy machine),
        longer than a job to cancel while running runs by itself."""
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(call)
            while not done.done():
                idle()
            done.result()

    down_at: dict[str, float] = {}
    start, wall_start = time.monotonic(), time.time()
    for at, action in events:
        if action.endswith("_up"):  # a late "down" (a slow step before it) still lasts
            server = action.removesuffix("_up")
            at = max(at, down_at[server] - wall_start + SIZE.outage_seconds)
        while time.monotonic() - start < at:
            idle()
        if action == "wave":
            chaos.submit(per_wave.pop(0))
            chaos.seed002.waves_due += 1  # run by tick() once both servers are up
        elif action == "outage_wave":
            chaos.submit(OUTAGE_WAVE)
        elif action == "kill":
            chaos.kill_one()
        elif action == "broker_down":
            down_at["broker"] = time.time()
            up["broker"] = False
            if isinstance(broker, RedisServer):
                cluster.redis.close()
            # SIGTERM: Redis flushes its append-only file and exits; RabbitMQ's
            # `rabbitmqctl stop` keeps its durable queues' persistent messages.
            meanwhile(broker.stop)
        elif action == "broker_up":
            meanwhile(broker.start)
            up["broker"] = True
            chaos.outages[chaos.broker_kind] = (down_at["broker"], time.time())
        elif action == "postgres_down":
            down_at["postgres"] = time.time()
            up["postgres"] = False
            # "fast" cuts every connection but keeps what was committed.
            meanwhile(functools.partial(own_postgres.stop, mode="fast"))
        elif action == "postgres_up":
            meanwhile(own_postgres.start)
            up["postgres"] = True
            chaos.outages["postgres"] = (down_at["postgres"], time.time())
        chaos.replace(up["postgres"])
        seed002.tick(chaos, servers_up=all(up.values()))
    chaos.replace(up["postgres"])
    assert not per_wave and len(chaos.outages) == 2


#: What a worker logs when it could not give a job's channel slot back (the coordination
#: server unreachable: Redis, or PostgreSQL on RabbitMQ).
NOT_GIVEN_BACK = re.compile(r"slot of job ([\w-]+) not given back")
#: What a worker logs when a job's next step could not be sent (the broker unreachable):
#: its row is marked due, and the recovery sweep sends it.
NOT_ENQUEUED = re.compile(r"job ([\w-]+): next step \S+ not enqueued")


def jobs_logged(cluster: Cluster, line: re.Pattern[str]) -> set[str]:
    """The jobs a worker named in a ``line`` of its log (how a fault's path is seen taken)."""
    return {m[1] for w in cluster.workers for m in line.finditer(w.log())}


def waiting_jobs(chaos: Chaos) -> set[str]:
    """The jobs admitted to the channel and not yet taken: Redis's set, or (RabbitMQ)
    the channel's slot rows in PostgreSQL."""
    if chaos.broker_kind == "redis":
        members = chaos.cluster.redis.smembers(WAITING_KEY)
        return {m.decode() if isinstance(m, bytes) else m for m in members}
    return {row[0] for row in raw(chaos.cluster.store_uri, WAITING_ROWS, channel=CHANNEL)}


def wait_for_ends(chaos: Chaos, timeout: float) -> dict[str, JobRecord]:
    """Every accepted job's terminal row (cancels still due are sent meanwhile): as
    stored now, or as the harvester saw it before retention deleted it."""
    assert chaos.seed002 is not None
    harvested = chaos.seed002.harvester.records
    deadline = time.monotonic() + timeout
    while True:
        chaos.cancels_due()
        chaos.replace(postgres_up=True)
        ended = [p.job.id for p in chaos.accepted if p.job.id in harvested]
        if len(ended) == len(chaos.accepted) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    records = {job_id: harvested[job_id] for job_id in ended}
    while True:
        try:
            stored = get_job_store().get_many(ended)
            break
        except StoreError:
            if time.monotonic() > deadline + 30:
                raise
            time.sleep(0.3)
    records.update({r.id: r for r in stored if r.damaged is None and r.status.is_terminal})
    return records


def resurrection_story(chaos: Chaos, job_id: str, purged_at: float) -> str:
    """What the run knows of a job run again after its purge: when it ended and was
    purged, its tasks' starts and ends, and every worker line naming it (to read
    which path ran it)."""
    planned = next(p for p in chaos.accepted if p.job.id == job_id)
    cluster = chaos.cluster
    assert chaos.seed002 is not None
    ended = chaos.seed002.harvester.records.get(job_id)
    traces = {
        name: (cluster.times("starts", planned.job, name), cluster.times("ends", planned.job, name))
        for name in planned.names
    }
    lines = [
        f"{w.log_path.name}: {line}"
        for w in cluster.workers
        for line in w.log().splitlines()
        if job_id in line
    ]
    return (
        f"{planned.kind} job {job_id}: submitted at {planned.submitted_at}, ended at "
        f"{None if ended is None else ended.updated.timestamp()}, purged at {purged_at}; "
        f"(starts, ends) by task {traces}; worker lines:\n" + "\n".join(lines)
    )


def check_outcomes(chaos: Chaos, seed: int, began: float) -> None:
    cluster = chaos.cluster
    assert chaos.seed002 is not None
    chaos_ended = time.time()
    problems: list[str] = chaos.seed002.finish(chaos)
    bound = LEASE + SWEEP + DISPATCH + HEARTBEAT_MS / 1000 + 30 + 0.1 * SIZE.jobs
    records = wait_for_ends(chaos, bound)
    all_ended = time.time()
    wait_for_a_purge(chaos.seed002.harvester, RETENTION_SECONDS + 30)
    chaos.seed002.resolve(records)
    problems += chaos.unexpected

    # 3. nothing stuck
    for planned in chaos.accepted:
        if planned.job.id not in records:
            record = Job.get_saved(planned.job.id)
            problems.append(
                f"stuck {planned.kind} job {planned.job.id}: "
                f"{(record.status.value, record.state.get('cursor'), record.lease_owner, record.lease_expires) if record else 'no row'}"  # noqa: E501
            )

    # 4. every job left the channel's waiting jobs (a cancelled job's first message may
    # still be queued when its row is already Cancelled: give the workers a moment)
    waiting: set[str] = set()
    deadline = time.monotonic() + LEASE + DISPATCH + HEARTBEAT_MS / 1000 + 10
    while time.monotonic() < deadline:
        # A worker that could not reach the coordination server as it took a job logs that
        # the job's slot was not given back: the sweep's reclaim_slots duty gives it back.
        waiting = waiting_jobs(chaos)
        if not waiting:
            break
        time.sleep(0.3)
    if waiting:
        by_id = {p.job.id: p for p in chaos.accepted}
        left = {
            w: (
                by_id[w].kind if w in by_id else "not a job of the run",
                records[w].status.value if w in records else None,
            )
            for w in waiting
        }
        problems.append(f"channel waiting jobs not drained: {left}")
    reclaimed_slots = sorted(jobs_logged(cluster, NOT_GIVEN_BACK))

    # 1. expected status and results
    statuses: dict[str, int] = {}
    for planned in chaos.accepted:
        record = records.get(planned.job.id)
        if record is None:
            continue
        statuses[record.status.value] = statuses.get(record.status.value, 0) + 1
        where = f"{planned.kind} job {planned.job.id}"
        if record.status is not planned.expected:
            problems.append(
                f"{where}: {record.status.value}, expected "
                f"{planned.expected.value} (error {record.error!r})"
            )
            continue
        results = record.state.get("results") or {}
        if planned.results is not None and results != planned.results:
            problems.append(f"{where}: results {results}, expected {planned.results}")
        skipped = tuple(record.state.get("skipped") or ())
        if skipped != planned.skipped:
            problems.append(f"{where}: skipped {skipped}, expected {planned.skipped}")

    # 2. no finished task ran again; reruns only of attempts in flight at a fault
    reruns = {"killed": 0, "at_fault": 0, "cancelled": 0}
    longest_pause = 0.0
    successes_checked = 0
    for planned in chaos.accepted:
        record = records.get(planned.job.id)
        if record is None:
            continue
        attempts = record.state.get("attempts") or {}
        history = record.state.get("history") or {}
        windows = chaos.windows(planned)
        previous_ends: list[float] = []
        for t, name in enumerate(planned.names):
            key = f"0.{t}"
            where = f"{planned.kind} job {planned.job.id} task {name}"
            starts = cluster.times("starts", planned.job, name)
            ends = cluster.times("ends", planned.job, name)
            if name in planned.never and starts:
                problems.append(f"{where}: ran {len(starts)} time(s), must never run")
            recorded = int(attempts.get(key, 0))
            extra = len(starts) - recorded
            unended = len(starts) - len(ends)
            at_fault = sum(any(lo <= e <= hi for lo, hi in windows) for e in ends)
            if extra < 0:
                problems.append(f"{where}: {recorded} attempts recorded, {len(starts)} ran")
            elif extra > unended + at_fault:
                problems.append(
                    f"{where}: ran {len(starts)} times for {recorded} recorded attempts; only "
                    f"{unended} killed mid-run and {at_fault} ended at a fault "
                    f"(starts {starts}, ends {ends})"
                )
            if extra > 0:
                reruns["killed"] += min(extra, unended)
                cause = "cancelled" if planned.cancelled_at is not None else "at_fault"
                reruns[cause] += max(0, extra - unended)
            for entry in history.get(key, []):
                if entry.get("outcome") != "succeeded":
                    continue
                finished = _timestamp(entry["ended"])
                successes_checked += 1
                later = [s for s in starts if s > finished]
                if later:
                    problems.append(
                        f"{where}: succeeded (ended {finished}) but started again at {later}"
                    )
            if starts and previous_ends:
                first = min(starts)
                before = [e for e in previous_ends if e <= first]
                if before:
                    longest_pause = max(longest_pause, first - max(before))
            previous_ends = ends

    if statuses.get(Status.COMPLETED.value) and not successes_checked:
        problems.append("no succeeded attempt found in any row's history: the check saw nothing")

    # A job refused with BrokerUnavailableError never runs and has no row.
    for planned in chaos.refused:
        ran = {n: cluster.runs(planned.job, n) for n in planned.names}
        if any(ran.values()):
            problems.append(f"refused {planned.kind} job {planned.job.id} ran: {ran}")
        if Job.get_saved(planned.job.id) is not None:
            problems.append(f"refused {planned.kind} job {planned.job.id} has a row")

    # Workers not killed by the test are still up (none died with a server).
    for worker in chaos.live():
        if worker.proc.poll() is not None:
            problems.append(f"worker {worker.log_path.name} exited {worker.proc.returncode}")

    # 5. the seed-002 invariants (chaos_seed002's docstring)
    found, figures = chaos.seed002.check(chaos, records, list(chaos.outages.values()))
    problems += found

    # No job runs again after retention deleted it (issue 22): read after every trace.
    resurrected = chaos.seed002.resurrected(chaos)
    if resurrected:
        problems.append(f"jobs run again after retention deleted them: {sorted(resurrected)}")
        problems += [resurrection_story(chaos, j, at) for j, at in resurrected.items()]
    figures["resurrected_after_purge"] = sorted(resurrected)
    figures["purged_messages_dropped"] = chaos.seed002.dropped_after_purge(chaos)
    figures["rows_healed"] = len(jobs_logged(cluster, HEAL_LINE))
    figures["slots_given_back_by_sweep"] = reclaimed_slots
    figures["next_steps_sent_by_sweep"] = len(jobs_logged(cluster, NOT_ENQUEUED))

    outages = {k: f"{up - down:.1f}s" for k, (down, up) in chaos.outages.items()}
    report("chaos seed-002", **figures)
    report(
        "chaos",
        broker=chaos.broker_kind,
        seed=seed,
        jobs_accepted=len(chaos.accepted),
        jobs_refused=len(chaos.refused),
        refused_kinds=dict(Counter(p.kind for p in chaos.refused)),
        statuses=statuses,
        kills=len(chaos.kills),
        restarts=outages,
        reruns_killed_mid_run=reruns["killed"],
        reruns_ended_at_fault=reruns["at_fault"],
        unrecorded_by_cancel=reruns["cancelled"],
        longest_pause_between_steps_s=f"{longest_pause:.1f}",
        boots_failed_in_outage=len(chaos.failed_boots),
        chaos_s=f"{chaos_ended - began:.0f}",
        all_ended_after_s=f"{all_ended - chaos_ended:.0f}",
        successes_checked=successes_checked,
        problems=len(problems),
    )
    assert not problems, (
        f"chaos on {chaos.broker_kind}, seed {seed} (PYPEPPER_CHAOS_SEED={seed}): "
        f"{len(problems)} problem(s):\n"
        + "\n".join(problems[:40])
        + f"\nkills at {[round(k[0] - began, 1) for k in chaos.kills]} s, outages "
        + f"{ {k: (round(d - began, 1), round(u - began, 1)) for k, (d, u) in chaos.outages.items()} }"  # noqa: E501
        + f"\n{cluster.logs()}"
    )
