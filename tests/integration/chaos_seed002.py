"""The seed-002 capabilities in the chaos test (issue 22), and their invariants.

While ``test_chaos`` SIGKILLs workers and restarts Redis and PostgreSQL, each of
its waves also submits, through the public API as a user would:

* **hooks**: a job whose task (with an ``on_final_failure`` hook writing one line
  with the job id to a file) fails for good, one whose hooked task is optional
  and fails, one whose hooked task is cancelled (queued or running), and one
  whose hooked task cancels its job (``JobCancellationError``);
* **waits**: a parent that completes, a parent that fails, and children
  ``scheduled(after=[...])`` of them with each ``on_parent_failure`` policy, plus
  a child of an older job of the run (perhaps purged already: then
  ``UnknownJobError``, and the child is not stored);
* **unique keys**: :data:`RACERS` threads released together, each scheduling
  :data:`CALLS` jobs with the same unique key (``on_conflict="skip"``);
* **transactional enqueue**: a job scheduled with ``scheduled(connection=session)``
  in a SQLAlchemy Session that also inserts a row into a table of ours
  (:data:`ORDERS`), one committed and one rolled back.

Two recurring schedules run all along, in ``Europe/Paris`` (fired by the
workers' sweep): every second (``catch_up="all"``) and every 2 seconds
(``catch_up="latest"``). Their expression names the current Paris hour and the
next, so a sweep that read it in UTC would fire nothing. The workers purge
ended jobs after :data:`RETENTION_SECONDS`, so the purge runs during the chaos.

Submissions of this module happen only while both servers are up (a wave due
during an outage waits for its end): what is checked is what the workers do
through the faults, not what a producer gets told while a server is down (the
original waves of ``test_chaos`` cover that).

**Retention versus the checks.** A :class:`Harvester` thread reads the row of
every job of the run every :data:`HARVEST_INTERVAL` seconds and keeps the first
ended row it sees; the checks read a row still stored, else that copy, so a
purge never hides an outcome. Retention (10 s) is far longer than the longest
gap between two harvests while PostgreSQL is up (the purge needs it too).
Recurring firings are found by the job id their task pushes to a Redis list
(and by listing the store), so a purged firing is still counted.

Invariants checked at the end (besides those of ``test_chaos``, which every job
here goes through too: expected status and results, no finished task rerun,
nothing stuck):

1. **recurring**: each slot has at most one firing (one job id, the slot's), no
   firing outside the schedule's slots, and every slot from the first after
   registration to the end of the chaos fired. With ``catch_up="all"`` no slot
   may be missing. With ``catch_up="latest"`` a slot may be missing only if it
   lies in a downtime window (a server down, or no worker ready, and
   :data:`RECOVERY_SECONDS` after) and fewer than 3 sweeps ran while it was on
   time (``cron.ON_TIME_SECONDS``): each sweep that fired the per-second
   schedule is known by its firings (its ``now`` lies between the newest slot
   it fired and when it stored it), and would have fired the slot.
2. **unique keys**: never two active (Scheduled or InProgress) jobs of one key,
   sampled by one SQL statement per harvest, and afterwards: every execution of
   a key's job started after the end of each job of that key created before it;
   the losers of a race got the holder's id and were never stored nor run.
3. **waits**: no child started before all its parents ended (row end times);
   with a failed parent, ``propagate`` ends the child Failed and ``cancel`` ends
   it Cancelled (the error names the parent, the child never runs), ``ignore``
   runs it; a child of an older parent ends as its parent's outcome says (a
   purge of a parent a child waits for would make it fail).
4. **hooks**: the hook ran at least once for each job whose hooked task failed
   for good (Failed, or skipped when optional), never for a cancelled one.
5. **transactional**: each committed job ended (Completed) and its order row
   exists; a rolled-back one has no row, no order row, and never ran.
6. **retention**: some ended jobs were purged during the run, none before it had
   ended :data:`RETENTION_SECONDS` ago, and none while Scheduled or InProgress.
7. **purged jobs stay purged**: a job's first message that comes back after
   retention deleted the job (the message of a first step whose worker was
   SIGKILLed, which Dramatiq requeues) is dropped by the purge's tombstone: no
   task of a job starts after retention deleted it (``resurrected_after_purge``
   must be empty; ``tests/driver/test_purged_job_messages.py``). The drops the
   workers logged are counted (``purged_messages_dropped``).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import redis
from sqlalchemy import create_engine, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from pypepper_dramatiq import (
    Job,
    Status,
    Task,
    Workflow,
    get_job_store,
    recurring,
    remove_recurring,
)
from pypepper_dramatiq.errors import BrokerUnavailableError, StoreError, UnknownJobError
from pypepper_dramatiq.rules.cron import ON_TIME_SECONDS, firing_id
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.schema import jobs as jobs_table
from pypepper_dramatiq.stores.sql import SqlJobStore

from .chaos_plan import Planned
from .harness import READY_LINE, Cluster, WorkerProcess, raw
from .worker_app import CHANNEL, hooked_probe, probe

#: How long ended jobs are kept (every final status): short, so the purge runs in the chaos.
RETENTION_SECONDS = 10.0
RETENTION = dict.fromkeys(("Completed", "Failed", "Cancelled"), f"{RETENTION_SECONDS:g}s")
#: Seconds between two reads of the harvester.
HARVEST_INTERVAL = 0.25
#: How long after a fault a sweep may still not fire (reconnects, a new leader, a boot).
RECOVERY_SECONDS = 10.0
ZONE = "Europe/Paris"
#: The unique keys raced on (a wave races on one, in turn).
KEYS = ("chaos-key-0", "chaos-key-1")
RACERS = 3
CALLS = 2
#: A keyed job's task runs this long: jobs of one key that overlapped would show it.
KEYED_SLEEP = 1.0
#: What a worker logs when it heals a row from a message (``PYPEPPER_IT_LOG_HEALS``).
HEAL_LINE = re.compile(r"job ([\w-]+): its row was not stored yet")
#: What a worker logs when it drops a message of a job retention deleted.
DROP_LINE = re.compile(r"job ([\w-]+) was deleted by retention; its returning message is dropped")
#: The table our transactional producer writes in the same transaction as its jobs.
ORDERS = "chaos_orders"


@dataclass(frozen=True)
class Schedule:
    name: str
    #: Seconds between two slots.
    every: int
    catch_up: str

    def cron(self, paris_hour: int) -> str:
        """Every ``every`` seconds, in the given Paris hour and the next."""
        seconds = "*" if self.every == 1 else f"*/{self.every}"
        return f"{seconds} * {paris_hour},{(paris_hour + 1) % 24} * * *"

    @property
    def log_key(self) -> str:
        """The Redis list each firing's task pushes its job id to."""
        return f"fired:{self.name}"

    @property
    def category(self) -> str:
        return f"rec-{self.name}"


SCHEDULES = (Schedule("chaos-every-second", 1, "all"), Schedule("chaos-every-2s", 2, "latest"))


def slot_of(job_id: str) -> datetime:
    """The slot a firing id names (``rec-<digest>-<YYYYmmddTHHMMSSZ>``)."""
    stamp = re.search(r"-(\d{8}T\d{6}Z)", job_id)
    assert stamp is not None, f"not a firing id: {job_id}"
    return datetime.strptime(stamp[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


class ChaosRun(Protocol):
    """What this module uses of ``test_chaos.Chaos``."""

    cluster: Cluster
    accepted: list[Planned]
    refused: list[Planned]
    unexpected: list[str]
    outages: dict[str, tuple[float, float]]

    def live(self) -> list[WorkerProcess]: ...

    def submit_planned(
        self, planned: Planned, tolerate: tuple[type[Exception], ...] = (), **options: Any
    ) -> bool: ...

    def cancels_due(self) -> None: ...


#: What a server being down (or restarting) raises in a harvest: try again next round.
OUTAGE_ERRORS = (StoreError, redis.RedisError, sa_exc.DBAPIError)


class Harvester:
    """Reads, from a thread of its own, the rows of the run's jobs before retention deletes them.

    Args:
        watched: the ids to read (called each round).
        redis_url: where the firings' job ids are pushed.
    """

    def __init__(self, watched: Callable[[], Iterable[str]], redis_url: str) -> None:
        self._watched = watched
        self._redis = redis.Redis.from_url(redis_url)
        #: The first ended row seen of each job.
        self.records: dict[str, JobRecord] = {}
        #: When each job was last seen not ended.
        self.active_seen: dict[str, float] = {}
        #: When an ended job was first seen gone (no earlier than it was deleted).
        self.vanished: dict[str, float] = {}
        #: Jobs gone while never seen ended (a purge of an active job, or a loss).
        self.active_vanished: dict[str, float] = {}
        #: Each schedule's firings (job ids, in the order found).
        self.fired: dict[str, list[str]] = {s.log_key: [] for s in SCHEDULES}
        self._pushed: dict[str, int] = dict.fromkeys(self.fired, 0)
        self.key_overlaps: list[str] = []
        self.key_samples = 0
        self.rounds = 0
        #: Errors that are not a server being down (a bug here: fails the test).
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-harvester", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (before the checks read what it gathered)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the harvester did not stop"
        self._redis.close()

    def all_fired(self) -> set[str]:
        return {i for ids in self.fired.values() for i in ids}

    def _run(self) -> None:
        while not self._stop.is_set():
            for step in (self._discover, self._read, self._sample_keys):
                try:
                    step()
                except OUTAGE_ERRORS:
                    pass
                except Exception as exc:
                    self.failures.append(f"harvester {step.__name__}: {exc!r}")
            self.rounds += 1
            self._stop.wait(HARVEST_INTERVAL)

    def _found(self, log_key: str, job_id: str) -> None:
        if job_id not in self.fired[log_key]:
            self.fired[log_key].append(job_id)

    def _discover(self) -> None:
        """New firings: pushed by their task, or stored and not run yet."""
        for schedule in SCHEDULES:
            key = schedule.log_key
            pushed = self._redis.lrange(key, self._pushed[key], -1)
            self._pushed[key] += len(pushed)
            for pushed_id in pushed:
                self._found(key, pushed_id.decode() if isinstance(pushed_id, bytes) else pushed_id)
            for status in (Status.SCHEDULED, Status.IN_PROGRESS):
                for record in get_job_store().list(category=schedule.category, status=status):
                    self._found(key, record.id)

    def _read(self) -> None:
        store = get_job_store()
        pending = [i for i in {*self._watched(), *self.all_fired()} if i not in self.records]
        rows = {r.id: r for r in store.get_many(pending)} if pending else {}
        now = time.time()
        for job_id in pending:
            record = rows.get(job_id)
            if record is None:
                if job_id in self.active_seen and job_id not in self.active_vanished:
                    self.active_vanished[job_id] = now
            elif record.damaged is not None:
                self.failures.append(f"job {job_id}: damaged row {record.damaged}")
            elif record.status.is_terminal:
                self.records[job_id] = record
            else:
                self.active_seen[job_id] = now
        ended = [i for i in self.records if i not in self.vanished]
        present = {r.id for r in store.get_many(ended)} if ended else set()
        now = time.time()
        for job_id in ended:
            if job_id not in present:
                self.vanished[job_id] = now

    def _sample_keys(self) -> None:
        """Read the active jobs of each raced key in one statement (one snapshot)."""
        store = get_job_store()
        assert isinstance(store, SqlJobStore)
        query = select(jobs_table.c.unique_key, jobs_table.c.id).where(
            jobs_table.c.unique_key.in_(KEYS),
            jobs_table.c.status.in_([Status.SCHEDULED.value, Status.IN_PROGRESS.value]),
        )
        with store.engine.connect() as connection:
            rows = list(connection.execute(query))
        self.key_samples += 1
        active: dict[str, list[str]] = {}
        for key, job_id in rows:
            active.setdefault(key, []).append(job_id)
        for key, ids in active.items():
            if len(ids) > 1:
                self.key_overlaps.append(f"{time.time():.2f}: key {key} held by {sorted(ids)}")


def _job(category: str, *tasks: Task) -> Job:
    job = Job(category=category, channel_id=CHANNEL)
    job.workflows.append(Workflow(list(tasks)))
    return job


def _planned(kind: str, *tasks: Task, **spec: Any) -> Planned:
    return Planned(kind, _job("chaos", *tasks), tuple(t.name for t in tasks), **spec)


def _merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


@dataclass
class Seed002:
    """The seed-002 scenario of one chaos run: what it submitted, and its checks."""

    cluster: Cluster
    rng: random.Random
    hook_file: Path
    harvester: Harvester = field(init=False)
    #: Job id -> whether its hook must run (True) or never (False).
    hooks_expected: dict[str, bool] = field(default_factory=dict)
    #: Child job id -> (the child, its parents' ids, its on_parent_failure).
    parents: dict[str, tuple[Planned, list[str], str]] = field(default_factory=dict)
    #: Children of an older job: their expected end is their parent's outcome.
    derived: list[Planned] = field(default_factory=list)
    #: Jobs that must never have been stored nor run (a child of a purged parent, a
    #: rolled-back transaction, a failed commit that did not commit...).
    nothing: list[Planned] = field(default_factory=list)
    #: The winners of the races, by key, and the losers with the id they were given.
    keyed: dict[str, list[Planned]] = field(default_factory=lambda: {k: [] for k in KEYS})
    lost: list[tuple[str, Planned, str]] = field(default_factory=list)
    committed: list[Planned] = field(default_factory=list)
    rolled_back: list[Planned] = field(default_factory=list)
    #: Jobs whose ``scheduled()`` or commit raised a store error: stored or not.
    uncertain: list[Planned] = field(default_factory=list)
    #: (start, end) of each moment when no worker was ready.
    no_worker: list[tuple[float, float]] = field(default_factory=list)
    #: Each schedule's name -> when its ``recurring()`` call began and returned.
    registered: dict[str, tuple[float, float]] = field(default_factory=dict)
    end_mark: float = 0.0
    #: What the transactions that raised raised.
    tx_errors: list[str] = field(default_factory=list)
    waves_due: int = 0
    waves_done: int = 0
    _count: int = 0
    _no_worker_since: float | None = None
    _engine: Any = None

    # -- set-up and tear-down

    def start(self, chaos: ChaosRun) -> None:
        """Create our orders table, store the schedules, start the harvester."""
        raw(
            self.cluster.store_uri, f"CREATE TABLE IF NOT EXISTS {ORDERS} (job_id text PRIMARY KEY)"
        )
        # As an application's engine would be: a connection PostgreSQL's restart cut is
        # replaced, not handed to the next transaction.
        self._engine = create_engine(self.cluster.store_uri, pool_pre_ping=True)
        self.harvester = Harvester(lambda: self._watched(chaos), self.cluster.redis_url)
        paris_hour = datetime.now(ZoneInfo(ZONE)).hour
        for schedule in SCHEDULES:
            began = time.time()
            template = _job(
                schedule.category,
                probe.task(
                    name="tick", value=schedule.every, patient=True, log_key=schedule.log_key
                ),
            )
            recurring(
                schedule.name,
                schedule.cron(paris_hour),
                template,
                timezone=ZONE,
                overlap="allow",
                catch_up=schedule.catch_up,
            )
            self.registered[schedule.name] = (began, time.time())
        self.harvester.start()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        if hasattr(self, "harvester"):
            self.harvester.stop()

    def _watched(self, chaos: ChaosRun) -> list[str]:
        return [p.job.id for p in [*chaos.accepted, *self.uncertain]]

    # -- during the chaos

    def tick(self, chaos: ChaosRun, servers_up: bool) -> None:
        """Note when no worker is ready; run a wave that is due once both servers are up."""
        now = time.time()
        ready = any(w.proc.poll() is None and READY_LINE in w.log() for w in chaos.live())
        if not ready and self._no_worker_since is None:
            self._no_worker_since = now
        elif ready and self._no_worker_since is not None:
            self.no_worker.append((self._no_worker_since, now))
            self._no_worker_since = None
        while self.waves_due and servers_up:
            self.waves_due -= 1
            self.wave(chaos)

    def wave(self, chaos: ChaosRun) -> None:
        self.waves_done += 1
        self._hooks(chaos)
        self._waits(chaos)
        self._race(chaos, KEYS[self.waves_done % len(KEYS)])
        self._transactional(chaos, commit=True)
        self._transactional(chaos, commit=False)

    def _next(self) -> int:
        self._count += 1
        return 100_000 + self._count

    def _nap(self) -> float:
        return round(self.rng.uniform(0.1, 0.8), 2)

    def _hooks(self, chaos: ChaosRun) -> None:
        hooked = dict(hook_file=str(self.hook_file), patient=True)
        never = probe.task(name="never", patient=True)
        i = self._next()
        fail = _planned(
            "hook_fail",
            probe.task(name="pre", value=i, sleep=self._nap(), patient=True),
            hooked_probe.options(retry_count=1).task(name="hooked", fail_times=1000, **hooked),
            never,
            expected=Status.FAILED,
            results={"0.0": i},
            never=("never",),
        )
        optional = _planned(
            "hook_optional",
            hooked_probe.options(optional=True, retry_count=1).task(
                name="hooked", fail_times=1000, **hooked
            ),
            probe.task(name="after", value=i, sleep=self._nap(), patient=True),
            expected=Status.COMPLETED,
            results={"0.1": i},
            skipped=("0.0",),
        )
        how = "queued" if self.waves_done % 2 else "running"
        cancelled = _planned(
            f"hook_cancel_{how}",
            hooked_probe.task(name="poll", sleep=30, poll_cancel=True, **hooked),
            never,
            expected=Status.CANCELLED,
            results=None,
            never=("never",),
            cancel=how,
        )
        itself = _planned(
            "hook_cancel_itself",
            hooked_probe.task(name="hooked", cancel_job=True, **hooked),
            never,
            expected=Status.CANCELLED,
            results={},
            never=("never",),
        )
        cases = ((fail, True), (optional, True), (cancelled, False), (itself, False))
        for planned, runs in cases:
            if chaos.submit_planned(planned):
                self.hooks_expected[planned.job.id] = runs

    def _waits(self, chaos: ChaosRun) -> None:
        i = self._next()
        ok = _planned(
            "parent_ok",
            probe.task(name="p", value=i, sleep=self._nap(), patient=True),
            expected=Status.COMPLETED,
            results={"0.0": i},
        )
        bad = _planned(
            "parent_bad",
            probe.options(retry_count=0).task(name="p", fail_times=1000, patient=True),
            expected=Status.FAILED,
            results={},
        )
        # An older parent (its end time is its row's: not one whose hook updates it later).
        older = [
            p
            for p in chaos.accepted
            if p.submitted_at < time.time() - 3 and not p.kind.startswith(("hook", "recurring"))
        ]
        if not (chaos.submit_planned(ok) and chaos.submit_planned(bad)):
            return

        def child(kind: str, **spec: Any) -> Planned:
            task = probe.task(name="child", value=i, sleep=self._nap(), patient=True)
            return _planned(kind, task, **spec)

        ran = dict(expected=Status.COMPLETED, results={"0.0": i})
        stopped = dict(results={}, never=("child",))
        children = [
            (child("child_ok", **ran), [ok], "propagate"),
            (child("child_propagate", expected=Status.FAILED, **stopped), [ok, bad], "propagate"),
            (child("child_cancel", expected=Status.CANCELLED, **stopped), [bad], "cancel"),
            (child("child_ignore", **ran), [bad, ok], "ignore"),
        ]
        for planned, of, policy in children:
            parent_ids = [p.job.id for p in of]
            if chaos.submit_planned(planned, after=parent_ids, on_parent_failure=policy):
                self.parents[planned.job.id] = (planned, parent_ids, policy)
        if older:
            parent = self.rng.choice(older)
            planned = child("child_of_older", **ran)  # expected: resolved from the parent's end
            try:
                accepted = chaos.submit_planned(
                    planned, tolerate=(UnknownJobError,), after=[parent.job.id]
                )
            except UnknownJobError:  # purged (or not healed yet): nothing is stored
                self.nothing.append(planned)
                return
            if accepted:
                self.parents[planned.job.id] = (planned, [parent.job.id], "propagate")
                self.derived.append(planned)

    def _race(self, chaos: ChaosRun, key: str) -> None:
        barrier = threading.Barrier(RACERS)
        lock = threading.Lock()
        outcomes: list[tuple[Planned, str | Exception]] = []

        def racer(jobs: list[Planned]) -> None:
            barrier.wait(timeout=60)
            for planned in jobs:
                planned.submitted_at = time.time()
                try:
                    got: str | Exception = planned.job.scheduled(unique_key=key)
                except Exception as exc:
                    got = exc
                with lock:
                    outcomes.append((planned, got))

        batches = []
        for _ in range(RACERS):
            batch = []
            for _ in range(CALLS):
                i = self._next()
                batch.append(
                    _planned(
                        "keyed",
                        probe.task(name="keyed", value=i, sleep=KEYED_SLEEP, patient=True),
                        expected=Status.COMPLETED,
                        results={"0.0": i},
                    )
                )
            batches.append(batch)
        threads = [threading.Thread(target=racer, args=(b,), daemon=True) for b in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for planned, got in outcomes:
            if got == planned.job.id:
                chaos.accepted.append(planned)
                self.keyed[key].append(planned)
            elif isinstance(got, str):
                self.lost.append((key, planned, got))
            elif isinstance(got, BrokerUnavailableError):
                chaos.refused.append(planned)
            elif isinstance(got, StoreError):
                self.uncertain.append(planned)
            else:
                chaos.unexpected.append(f"keyed job {planned.job.id}: scheduled() raised {got!r}")

    def _transactional(self, chaos: ChaosRun, commit: bool) -> None:
        i = self._next()
        planned = _planned(
            "tx_commit" if commit else "tx_rollback",
            probe.task(name="tx", value=i, sleep=self._nap(), patient=True),
            expected=Status.COMPLETED,
            results={"0.0": i},
        )
        planned.submitted_at = time.time()
        committing = False
        try:
            with Session(self._engine) as session:
                session.execute(
                    text(f"INSERT INTO {ORDERS} (job_id) VALUES (:id)"), {"id": planned.job.id}
                )
                planned.job.scheduled(connection=session)
                if not commit:
                    session.rollback()
                else:
                    committing = True
                    session.commit()
        except (*OUTAGE_ERRORS, BrokerUnavailableError) as exc:
            self.tx_errors.append(f"{planned.kind}: {type(exc).__name__}")
            if committing:
                self.uncertain.append(planned)  # the commit may or may not have happened
            else:
                self.nothing.append(planned)  # rolled back
            return
        if commit:
            chaos.accepted.append(planned)
            self.committed.append(planned)
        else:
            self.rolled_back.append(planned)
            if planned.job.status is not Status.SCHEDULED:
                chaos.unexpected.append(
                    f"rolled-back job {planned.job.id} says {planned.job.status.value}"
                )

    # -- after the chaos

    def finish(self, chaos: ChaosRun) -> list[str]:
        """Wait for a firing after the chaos, remove the schedules, settle the uncertain
        jobs; the firings become planned jobs of the run. Returns problems."""
        problems: list[str] = []
        self.tick(chaos, servers_up=True)
        self.end_mark = time.time()
        mark = datetime.fromtimestamp(self.end_mark, timezone.utc)
        deadline = time.monotonic() + 60
        for schedule in SCHEDULES:
            while not any(slot_of(i) >= mark for i in self.harvester.fired[schedule.log_key]):
                if time.monotonic() > deadline:
                    problems.append(f"{schedule.name}: nothing fired after the chaos (60 s)")
                    break
                chaos.cancels_due()
                self.tick(chaos, servers_up=True)  # also ends a span with no worker ready
                time.sleep(0.2)
        for schedule in SCHEDULES:
            if not remove_recurring(schedule.name):
                problems.append(f"{schedule.name}: was not stored any more")
        # One more race on each key once it is free: a second job of each key for sure.
        for key in KEYS:
            deadline = time.monotonic() + 60
            while get_job_store().key_holder(key) is not None and time.monotonic() < deadline:
                chaos.cancels_due()
                time.sleep(0.2)
            self._race(chaos, key)
        for schedule in SCHEDULES:
            for job_id in list(self.harvester.fired[schedule.log_key]):
                chaos.accepted.append(
                    Planned(
                        f"recurring {schedule.name}",
                        Job(channel_id=CHANNEL, id=job_id),
                        ("tick",),
                        expected=Status.COMPLETED,
                        results={"0.0": schedule.every},
                        submitted_at=slot_of(job_id).timestamp(),
                    )
                )
        for planned in self.uncertain:
            job_id = planned.job.id
            stored = job_id in self.harvester.records or job_id in self.harvester.active_seen
            if stored or Job.get_saved(job_id) is not None:
                chaos.accepted.append(planned)
                if planned.kind == "tx_commit":
                    self.committed.append(planned)
            else:
                self.nothing.append(planned)
        return problems

    def resolve(self, records: dict[str, JobRecord]) -> None:
        """Set the expected end of each child of an older job from its parent's end."""
        for planned in self.derived:
            [parent_id] = self.parents[planned.job.id][1]
            parent = records.get(parent_id)
            if parent is not None and parent.status is not Status.COMPLETED:
                planned.expected, planned.results, planned.never = Status.FAILED, {}, ("child",)

    def resurrected(self, chaos: ChaosRun) -> dict[str, float]:
        """The jobs run again after retention deleted them (issue 22: a stale first
        message of a purged job healed its row), with when they were deleted: a task
        of theirs started after their purge. Must be none (invariant 7).

        A start is compared with the purge, not with the job's end: a job cancelled
        as soon as it is scheduled (``cancel_queued``) may be taken by a worker faster
        than its producer, which heals the row and starts the task while the cancel is
        being written; that one start is stamped after the Cancelled row's ``updated``,
        yet it is no run again (seed 997046 on RabbitMQ, issue 25). The purge's time is
        its tombstone's ``purged_at``, or when the harvester first saw the row gone if
        that is earlier (an id purged twice has the later tombstone).

        Call it after reading the traces a check judges: a rerun's start is traced
        after its heal is logged."""
        tombstones = {
            job_id: when.timestamp()
            for job_id, when in raw(
                self.cluster.store_uri, "SELECT job_id, purged_at FROM scheduler_purged"
            )
        }
        vanished = self.harvester.vanished
        found: dict[str, float] = {}
        for planned in chaos.accepted:
            job_id = planned.job.id
            seen = [t for t in (tombstones.get(job_id), vanished.get(job_id)) if t is not None]
            if not seen:
                continue
            purged_at = min(seen)
            for name in planned.names:
                if any(s > purged_at for s in self.cluster.times("starts", planned.job, name)):
                    found[job_id] = purged_at
        return found

    def dropped_after_purge(self, chaos: ChaosRun) -> int:
        """How many messages of purged jobs the workers dropped (their INFO lines)."""
        return sum(len(DROP_LINE.findall(w.log())) for w in chaos.cluster.workers)

    # -- the invariants

    def check(
        self, chaos: ChaosRun, records: dict[str, JobRecord], windows: list[tuple[float, float]]
    ) -> tuple[list[str], dict[str, object]]:
        """Problems, and figures to print. ``windows``: when a server was down."""
        self.harvester.stop()
        problems = [*self.harvester.failures]
        figures: dict[str, object] = {}
        checks = (
            self._check_recurring(records, windows),
            self._check_keys(records),
            self._check_waits(records),
            self._check_hooks(records),
            self._check_transactional(),
            self._check_nothing(),
            self._check_retention(records),
        )
        for found, shown in checks:
            problems += found
            figures.update(shown)
        return problems, figures

    def downtime(self, outages: list[tuple[float, float]]) -> list[tuple[float, float]]:
        """When no sweep could run: a server down (and recovering), or no worker ready."""
        spans = [(down - 1.0, up + RECOVERY_SECONDS) for down, up in outages]
        spans += [(lo, hi + RECOVERY_SECONDS) for lo, hi in self.no_worker]
        if self._no_worker_since is not None:  # still none ready when the chaos ended
            spans.append((self._no_worker_since, time.time() + RECOVERY_SECONDS))
        return _merged(spans)

    def _sweeps(self, records: dict[str, JobRecord]) -> list[tuple[float, float]]:
        """The sweeps that fired the per-second schedule, as what is known of their ``now``:
        at or after the newest slot they fired, at or before they stored their first firing."""
        fired = sorted(
            (records[i].created.timestamp(), slot_of(i).timestamp())
            for i in self.harvester.fired[SCHEDULES[0].log_key]
            if i in records
        )
        sweeps: list[tuple[float, float, float]] = []  # (newest slot, first stored, last stored)
        for created, slot in fired:
            if sweeps and created - sweeps[-1][2] < 0.2:  # the same sweep (ms apart)
                newest, first, _ = sweeps[-1]
                sweeps[-1] = (max(newest, slot), first, created)
            else:
                sweeps.append((slot, created, created))
        return [(newest, first) for newest, first, _ in sweeps]

    def _check_recurring(
        self, records: dict[str, JobRecord], outages: list[tuple[float, float]]
    ) -> tuple[list[str], dict[str, object]]:
        problems: list[str] = []
        down = self.downtime(outages)
        sweeps = self._sweeps(records)

        def on_time_sweeps(slot: float) -> int:
            """How many sweeps ran while ``slot`` was on time (each would have fired it)."""
            return sum(1 for lo, hi in sweeps if lo >= slot and hi <= slot + ON_TIME_SECONDS - 0.5)

        def in_downtime(slot: float) -> bool:
            return any(lo <= slot <= hi for lo, hi in down)

        figures: dict[str, object] = {
            "downtime_s": [
                (round(lo - self.registered[SCHEDULES[0].name][0]), round(hi - lo))
                for lo, hi in down
            ],
            "no_worker_spans": len(self.no_worker),
        }
        for schedule in SCHEDULES:
            began, registered = self.registered[schedule.name]
            by_slot: dict[datetime, list[str]] = {}
            for job_id in self.harvester.fired[schedule.log_key]:
                by_slot.setdefault(slot_of(job_id), []).append(job_id)
            for slot, ids in sorted(by_slot.items()):
                where = f"{schedule.name} slot {slot:%H:%M:%S}"
                if ids != [firing_id(schedule.name, slot)]:
                    problems.append(f"{where}: fired as {ids}")
                if slot.timestamp() <= began or slot.second % schedule.every:
                    problems.append(f"{where}: not a slot of the schedule ({ids})")
            expected = [
                datetime.fromtimestamp(s, timezone.utc)
                for s in range(int(registered) + 1, int(self.end_mark) + 1)
                if s % schedule.every == 0
            ]
            excused = 0
            for slot in (s for s in expected if s not in by_slot):
                at = slot.timestamp()
                swept = on_time_sweeps(at)
                if schedule.catch_up != "all" and in_downtime(at) and swept < 3:
                    excused += 1  # a fault kept the sweeps away while it was on time
                    continue
                problems.append(
                    f"{schedule.name} slot {slot:%H:%M:%S} never fired (catch_up="
                    f"{schedule.catch_up}, {swept} sweeps ran while it was on time, "
                    f"{'in' if in_downtime(at) else 'outside'} downtime)"
                )
            if len(expected) < 10 // schedule.every:
                problems.append(f"{schedule.name}: only {len(expected)} slots checked")
            late = [
                (records[i].created - slot).total_seconds()
                for slot, ids in by_slot.items()
                for i in ids
                if i in records
            ]
            figures[f"{schedule.name}_slots"] = len(expected)
            figures[f"{schedule.name}_missed_in_downtime"] = excused
            figures[f"{schedule.name}_max_fire_lateness_s"] = f"{max(late, default=0):.1f}"
        return problems, figures

    def _starts(self, planned: Planned, name: str, record: JobRecord | None) -> list[float]:
        """When each execution of ``name`` started: its traces, and the row's history."""
        starts = self.cluster.times("starts", planned.job, name)
        if record is not None:
            key = f"0.{planned.names.index(name)}"
            history = (record.state.get("history") or {}).get(key, [])
            starts += [datetime.fromisoformat(e["started"]).timestamp() for e in history]
        return starts

    def _check_keys(self, records: dict[str, JobRecord]) -> tuple[list[str], dict[str, object]]:
        problems = list(self.harvester.key_overlaps)
        if not self.harvester.key_samples:
            problems.append("unique keys: never sampled")
        pairs = 0
        for key, winners in self.keyed.items():
            ended = [(p, records[p.job.id]) for p in winners if p.job.id in records]
            for a, a_record in ended:
                for b, b_record in ended:
                    if a is b or b_record.created < a_record.created:
                        continue
                    pairs += 1
                    early = [
                        s
                        for s in self._starts(b, "keyed", b_record)
                        if s < a_record.updated.timestamp()
                    ]
                    if early:
                        problems.append(
                            f"key {key}: job {b.job.id} ran at {early} before job {a.job.id} "
                            f"(created before it) ended at {a_record.updated.timestamp()}"
                        )
        winners_ids = {key: {p.job.id for p in ps} for key, ps in self.keyed.items()}
        for key, planned, got in self.lost:
            if got not in winners_ids[key]:
                problems.append(f"key {key}: job {planned.job.id} was told {got} holds it")
        if not pairs:
            problems.append("unique keys: no key had two jobs: the check saw nothing")
        return problems, {
            "keyed_jobs": sum(map(len, self.keyed.values())),
            "keyed_skipped": len(self.lost),
            "key_samples": self.harvester.key_samples,
        }

    def _check_waits(self, records: dict[str, JobRecord]) -> tuple[list[str], dict[str, object]]:
        problems: list[str] = []
        ran_after = failed_by_parent = 0
        for child_id, (child, parent_ids, policy) in self.parents.items():
            record = records.get(child_id)
            if record is None:
                continue  # stuck: test_chaos says so
            ends = {}
            for parent_id in parent_ids:
                parent = records.get(parent_id)
                if parent is None:
                    problems.append(f"child {child_id}: parent {parent_id} has no ended row")
                    continue
                ends[parent_id] = parent
            starts = self._starts(child, "child", record)
            for parent_id, parent in ends.items():
                early = [s for s in starts if s < parent.updated.timestamp()]
                if early:
                    problems.append(
                        f"{child.kind} {child_id}: started at {early} before its parent "
                        f"{parent_id} ended at {parent.updated.timestamp()}"
                    )
            if starts and ends:
                ran_after += 1
            failed = [i for i, p in ends.items() if p.status is not Status.COMPLETED]
            if failed and policy in ("propagate", "cancel"):
                failed_by_parent += 1
                if not record.error or not any(i in record.error for i in failed):
                    problems.append(
                        f"{child.kind} {child_id}: error {record.error!r} names none of {failed}"
                    )
        if not ran_after or not failed_by_parent:
            problems.append(
                f"waits: {ran_after} children ran, {failed_by_parent} ended by a failed "
                "parent: the check saw too little"
            )
        return problems, {"children_ran": ran_after, "children_of_failed": failed_by_parent}

    def hook_lines(self) -> dict[str, list[str]]:
        lines: dict[str, list[str]] = {}
        if self.hook_file.exists():
            for line in self.hook_file.read_text().splitlines():
                lines.setdefault(line.split(" ", 1)[0], []).append(line)
        return lines

    def _check_hooks(self, records: dict[str, JobRecord]) -> tuple[list[str], dict[str, object]]:
        problems: list[str] = []
        lines = self.hook_lines()
        ran = never = 0
        for job_id, must_run in self.hooks_expected.items():
            record = records.get(job_id)
            calls = lines.get(job_id, [])
            if must_run:
                if not calls:
                    problems.append(f"hook of job {job_id} never ran ({record and record.status})")
                elif not all("planned failure" in c for c in calls):
                    problems.append(f"hook of job {job_id}: wrong error in {calls}")
                else:
                    ran += 1
            elif calls:
                problems.append(f"hook of cancelled job {job_id} ran: {calls}")
            elif record is not None and record.status is Status.CANCELLED:
                never += 1
        strays = set(lines) - set(self.hooks_expected)
        if strays:
            problems.append(f"hooks ran for jobs without a hooked task: {sorted(strays)}")
        if not ran or not never:
            problems.append(f"hooks: {ran} ran, {never} cancelled: the check saw too little")
        total = sum(len(lines.get(i, [])) for i in self.hooks_expected)
        return problems, {"hooks_due": ran, "hook_calls": total, "hooks_cancelled": never}

    def _orders(self) -> set[str]:
        return {row[0] for row in raw(self.cluster.store_uri, f"SELECT job_id FROM {ORDERS}")}

    def _check_transactional(self) -> tuple[list[str], dict[str, object]]:
        problems: list[str] = []
        orders = self._orders()
        for planned in self.committed:
            if planned.job.id not in orders:
                problems.append(f"committed job {planned.job.id}: its order row is missing")
        for planned in self.rolled_back:
            if planned.job.id in orders:
                problems.append(f"rolled-back job {planned.job.id}: its order row is stored")
        if not self.committed or not self.rolled_back:
            problems.append("transactional: nothing committed or nothing rolled back")
        return problems, {
            "tx_committed": len(self.committed),
            "tx_rolled_back": len(self.rolled_back),
            "tx_errors": self.tx_errors,
        }

    def _check_nothing(self) -> tuple[list[str], dict[str, object]]:
        """Rolled back, or never stored: no row, no run, no order row."""
        problems: list[str] = []
        orders = self._orders()
        for planned in [*self.rolled_back, *self.nothing]:
            job_id = planned.job.id
            ran = {n: self.cluster.runs(planned.job, n) for n in planned.names}
            if any(ran.values()):
                problems.append(f"{planned.kind} job {job_id} (never stored) ran: {ran}")
            seen = job_id in self.harvester.active_seen or job_id in self.harvester.records
            if seen or Job.get_saved(job_id) is not None:
                problems.append(f"{planned.kind} job {job_id} (never stored) has a row")
            if job_id in orders and planned.kind.startswith("tx"):
                problems.append(f"{planned.kind} job {job_id} (never committed) has an order row")
        for key, planned, _ in self.lost:
            if any(self.cluster.runs(planned.job, n) for n in planned.names):
                problems.append(f"key {key}: skipped job {planned.job.id} ran")
            if Job.get_saved(planned.job.id) is not None:
                problems.append(f"key {key}: skipped job {planned.job.id} is stored")
        return problems, {"never_stored": len(self.nothing)}

    def _check_retention(
        self, records: dict[str, JobRecord]
    ) -> tuple[list[str], dict[str, object]]:
        problems: list[str] = []
        harvested = self.harvester
        for job_id, gone in harvested.vanished.items():
            ended = harvested.records[job_id].updated.timestamp()
            if gone < ended + RETENTION_SECONDS:
                problems.append(
                    f"job {job_id} purged {gone - ended:.1f} s after it ended "
                    f"(retention {RETENTION_SECONDS:g} s)"
                )
        for job_id, gone in harvested.active_vanished.items():
            problems.append(
                f"job {job_id} gone at {gone:.1f} while not seen ended "
                f"(last seen active at {harvested.active_seen[job_id]:.1f})"
            )
        if not harvested.vanished:
            problems.append("retention purged nothing: the check saw nothing")
        return problems, {"purged": len(harvested.vanished), "harvest_rounds": harvested.rounds}


def wait_for_a_purge(harvester: Harvester, timeout: float) -> None:
    """Wait (bounded) until the harvester saw at least one ended job purged."""
    deadline = time.monotonic() + timeout
    while not harvester.vanished and time.monotonic() < deadline:
        time.sleep(0.2)
