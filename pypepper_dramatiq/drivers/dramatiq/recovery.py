"""Recovering the steps of dead workers, within a bounded time.

Two ways a step can be stranded when a worker dies:

* it was claimed (InProgress) and its lease lapses: :meth:`RecoverySweeper.sweep`
  hands it back in the store (one caller wins each row) and enqueues a
  fresh message for its cursor;
* its message sat unacknowledged in the dead worker's prefetch: Dramatiq's
  Redis broker returns such messages only in a random maintenance pass, so
  the sweeper runs that pass itself every interval, for each queue it
  declared and each queue a dead worker's ack set names (whatever channels
  the leader serves).

One process at a time sweeps (a Redis lock with a TTL; always this process
on a broker without Redis).

A pass is a list of named duties (:data:`DUTIES`), each of which fails alone:
one that raises is logged once per cause (then a reminder a minute, then a
line when it is back), counted (``observers.sweep_failed``), shown on the
workers page (:meth:`RecoverySweeper.health`, written with the heartbeat), and
the next duty runs. Within a duty each row fails alone (:class:`RowGuard`). An
outage of the store or Redis ends the pass (logged once for the process): the
other duties would fail the same way.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import dq_name

from ...channels.broker import transport_of
from ...channels.channel import manager
from ...channels.messages import DISPATCH_KEY, StepMessage, dispatch_of
from ...engine.hooks import HookSweep
from ...engine.job_io import release_held, send_step
from ...engine.step_io import StepIO, cursor_of
from ...engine.waiting import Settled, settle
from ...errors import StoreError, describe
from ...limits.rates import IDLE_KEEP_SECONDS
from ...ops import observers
from ...ops.display import printable
from ...ops.isolation import RowGuard
from ...ops.logs import get_logger
from ...ops.outage import JOB_STORE, OutageLog, is_outage, shared_outage
from ...records.activity import ENDED, Activity, ActivityMark, activity_of, add_up, minute_of
from ...records.record import JobRecord, utcnow
from ...records.state import MARKED_ENDS, is_counted
from ...records.workers import DutyFailure, SweepHealth
from ...rules import cron
from ...rules.retention import BATCH
from ...rules.status import Status
from ...rules.steps import Position
from ...rules.waits import Waits
from ...schedules.firing import fire_due
from ...stores.registry import get_job_store

logger = get_logger(__name__)


#: How often the time-driven part of the sweep runs (at most; ``interval`` if shorter).
TICK_SECONDS = 1.0
#: Batches of waiting jobs one pass looks at.
WAIT_BATCHES = 20

#: How far ahead of a held job's planned start its message is sent (plus one tick),
#: so that the sweep's period does not make it late.
RELEASE_AHEAD_SECONDS = 1.0

#: How far back a sweep leader that just took the lead looks for ends nobody
#: counted (its predecessor's watermark died with it): a leader change follows
#: a worker's stop within seconds, a fleet's restart within minutes; older ends
#: are left uncounted rather than read at every change of leader.
COUNT_LOOKBACK_SECONDS = 3600.0
#: How far behind the clock the watermark of the counted ends stays once it caught
#: up: an end written by a host whose clock is behind, or committed late, is
#: still read (those read twice were marked counted and are skipped).
COUNT_LAG_SECONDS = 60.0
#: Batches of ended rows one pass reads.
END_BATCHES = 10
#: How far behind the clock the activity rollup reads ends: an end committed late, or
#: written by a host whose clock is behind, is still in its minute when it is read
#: (the charts count the minutes after from the jobs table).
ROLLUP_LAG_SECONDS = 60.0
#: How long the rollup keeps its minutes: the charts' longest range, and a day.
ROLLUP_KEEP = timedelta(days=8)
#: How often the rate limit keys idle for long are pruned (a full pass at most this
#: often): a key is kept for hours past its use, so a scan of their table every few
#: minutes is enough.
RATE_PRUNE_SECONDS = 300.0
#: Rate limit keys one pass forgets at most, by batches of ``batch``.
RATE_PRUNE_BATCHES = 10


class RecoverySweeper(threading.Thread):
    """Every ``interval`` seconds, if leader: recover lapsed steps and requeue dead prefetch."""

    def __init__(
        self,
        broker: Broker,
        owner: str,
        lease_seconds: float,
        interval: float,
        batch: int = 500,
        dispatch_seconds: float | None = None,
        retention: dict[Status, float] | None = None,
    ) -> None:
        super().__init__(name="pypepper-recovery", daemon=True)
        self.broker = broker
        #: Where the leader's lock, the dead workers and the messages are looked up.
        self.transport = transport_of(broker)
        self.owner = owner
        self.lease_seconds = lease_seconds
        #: How long a re-sent step may wait in its queue before it is sent again.
        self.dispatch_seconds = dispatch_seconds if dispatch_seconds is not None else lease_seconds
        self.interval = interval
        self.batch = batch
        self._stop_event = threading.Event()
        self.book = StepIO(get_job_store, owner, lease_seconds)
        #: How long ended jobs are kept, by final status, in seconds (None or {}:
        #: for ever): ``Settings.purge_after``.
        self.retention = retention
        #: Skips (logs once, counts) the rows a duty cannot read or handle.
        self.rows = RowGuard(logger)
        self._hook_sweep = HookSweep(
            get_job_store, owner, lease_seconds, interval, batch, guard=self.rows
        )
        #: Where the next look at Scheduled rows starts (created, id); None: the oldest.
        self._scheduled_after: tuple[datetime, str] | None = None
        #: Where the next look at waiting rows starts (waiting_since, id); None: the oldest.
        self._waiting_after: tuple[datetime, str] | None = None
        #: Where the next look at ended rows starts (updated, id); None: as a new
        #: leader, :data:`COUNT_LOOKBACK_SECONDS` back.
        #: Per status of MARKED_ENDS, the (updated, id) of the last end read.
        self._ends_after: dict[Status, tuple[datetime, str]] = {}
        self._store_outage = shared_outage(JOB_STORE)
        self._broker_outage = shared_outage(self.transport.where)
        #: Each duty's failures, logged as an outage of it is (once per cause).
        self._duty_logs = {
            duty.name: OutageLog(
                logger, f"recovery sweep duty {duty.name}", state="failing", per_cause=True
            )
            for duty in DUTIES
        }
        self._health_lock = threading.Lock()
        self._failing: dict[str, DutyFailure] = {}
        self._leading = False
        self._last_full_pass: datetime | None = None
        #: Where the next look at each channel's waiting set starts (0: its start).
        self._slot_cursors: dict[str, int] = {}
        #: When this process last pruned the rate limit keys (monotonic; None: never).
        self._pruned_at: float | None = None

    def stop(self) -> None:
        self._stop_event.set()

    def health(self) -> SweepHealth:
        """The sweep as this process runs it now (written with its heartbeat)."""
        with self._health_lock:
            return SweepHealth(
                leading=self._leading,
                last_full_pass=self._last_full_pass,
                failing=tuple(self._failing.values()),
            )

    def check_cron(self) -> bool:
        """At boot: warn once if recurring schedules are stored but this process cannot
        read cron expressions (croniter not importable); True if it can."""
        if cron.available():
            return True
        try:
            stored = len(get_job_store().list_recurring())
        except Exception as exc:  # the store's outage is the sweep's to log
            logger.debug("recurring schedules not counted at boot: %s", exc)
            return False
        if stored:
            logger.warning(
                "%d recurring schedule(s) are stored but this worker cannot evaluate cron "
                "expressions: croniter cannot be imported. While it leads the recovery sweep "
                "no schedule fires; %s",
                stored,
                cron.INSTALL_HINT,
                extra={"action": "cron_unavailable", "schedules": stored},
            )
        return False

    def run(self) -> None:
        # The time-driven work (releases, waits, deadlines, recurring firings)
        # runs every tick; the recovery of lapsed leases and lost messages every
        # ``interval``.
        observers.sweep_duties([duty.name for duty in DUTIES])
        self.check_cron()
        tick = min(self.interval, TICK_SECONDS)
        last_full = time.monotonic()
        while not self._stop_event.wait(tick):
            full = time.monotonic() - last_full >= self.interval - tick / 2
            if full:
                last_full = time.monotonic()
            self.run_once(full=full)

    def run_once(self, *, full: bool = True) -> None:
        """One interval's work; an outage is logged once, not at every sweep."""
        try:
            leader = self.lead()
        except Exception as exc:
            self._leading = False
            self._report(exc, self._broker_outage)
            return
        self._leading = leader
        self._broker_outage.ok()
        if not leader:
            self._ends_after = {}  # another leader counts meanwhile
            return
        try:
            self.sweep(full=full)
        except StoreError as exc:
            self._report(exc, self._store_outage)
            return
        except Exception as exc:
            self._report(exc, self._broker_outage)
            return
        self._store_outage.ok()
        self._broker_outage.ok()

    @staticmethod
    def _report(exc: Exception, outage: OutageLog) -> None:
        if is_outage(exc):
            outage.failed(exc)
        else:
            logger.exception("recovery sweep failed; retrying next interval")

    def lead(self) -> bool:
        """Take or keep the sweeper lock; True if this process sweeps now."""
        return self.transport.lead(self.owner, self.interval * 2)

    def sweep(self, *, full: bool = True) -> int:
        """One pass: each of :data:`DUTIES` in turn; returns how many steps were sent (again).

        With ``full`` it also runs the duties of full passes (the recovery of
        lapsed leases, dead workers' prefetch and lost first messages, the
        purge, the depth reports); without, only the time-driven ones. A duty
        that raises is recorded and the next one runs; an outage is raised.
        """
        now = utcnow()
        sent = 0
        for duty in DUTIES:
            if duty.full_only and not full:
                continue
            try:
                count = duty.run(self, now)
            except Exception as exc:
                if is_outage(exc):
                    raise
                self._duty_failed(duty.name, exc, now)
                continue
            self._duty_done(duty.name, now)
            if duty.sends:
                sent += count
        if full:
            with self._health_lock:
                self._last_full_pass = utcnow()
        return sent

    def _duty_failed(self, name: str, exc: Exception, now: datetime) -> None:
        self._duty_logs[name].failed(exc)
        observers.sweep_failed(name)
        skipped, _ = self.rows.take(name) or (0, "")
        self._mark_failing(name, describe(exc), 1 + skipped, now)

    def _duty_done(self, name: str, now: datetime) -> None:
        problems = self.rows.take(name)
        if problems is not None:  # it went on past rows it skipped: failing still
            self._mark_failing(name, problems[1], problems[0], now)
            return
        with self._health_lock:
            self._failing.pop(name, None)
        self._duty_logs[name].ok()

    def _mark_failing(self, name: str, error: str, failures: int, now: datetime) -> None:
        with self._health_lock:
            before = self._failing.get(name)
            self._failing[name] = DutyFailure(
                duty=name,
                error=error,
                since=before.since if before is not None else now,
                failures=failures + (before.failures if before is not None else 0),
            )

    def requeue_dead_prefetch(self, now: datetime) -> int:
        """Put back the messages held in the prefetch of dead workers, queue by queue.

        First the queues this process declared, then every other queue a dead
        worker's ack set still names: the leader may serve other channels than the
        worker that died, and what that worker held is only known from its ack
        sets. Those are looked up only while a dead worker holds messages the
        first queues did not take back (the maintenance drops a dead worker once
        it holds nothing). Each queue fails alone (logged once per cause,
        counted); the others go on.
        """
        declared = {q for name in self.broker.get_declared_queues() for q in (name, dq_name(name))}
        self._requeue(declared)
        self._requeue(self.transport.queues_held_by_dead_workers() - declared)
        return 0

    def _requeue(self, queues: set[str]) -> None:
        """Run the broker's dead-worker maintenance for each of ``queues``, each alone."""
        for queue_name in sorted(queues):
            with self.rows.row("requeue_prefetch", queue_name, what="queue"):
                self.transport.requeue_dead_workers(queue_name)

    def recover_lapsed(self, now: datetime) -> int:
        """Hand back the steps whose lease lapsed and send each again; returns how many
        were sent. A row whose message cannot be sent comes back after
        ``dispatch_seconds``."""
        until = now + timedelta(seconds=self.dispatch_seconds)
        recovered = get_job_store().recover_expired(now, until, self.batch)
        failed: Exception | None = None
        sent = 0
        for record in self.rows.readable("recover_leases", recovered):
            position = cursor_of(record) or Position()
            try:
                step = StepMessage.keyed(record.id, position, record.payload)
                self._send(step, record.channel_id)
            except Exception as exc:
                if is_outage(exc):
                    failed = failed or exc  # the others are tried all the same
                else:
                    self.rows.failed("recover_leases", record.id, exc)
                continue
            sent += 1
            logger.warning(
                "job %s: lease lapsed at %s; step re-enqueued",
                record.id,
                position.key(),
                extra={"action": "recover", "job_id": record.id},
            )
            observers.recovered(record, observers.LEASE_LAPSED)
        if failed is not None:
            raise failed
        return sent

    def run_lapsed_hooks(self, now: datetime) -> int:
        """Call the ``on_final_failure`` hooks whose holder's hold lapsed (a worker
        that died after recording a task's final failure); returns how many started.

        At most every ``interval`` (see :class:`~pypepper_dramatiq.engine.hooks.HookSweep`).
        """
        return self._hook_sweep.sweep(now)

    def fire_recurring(self, now: datetime) -> int:
        """Fire the due slots of the recurring schedules; returns how many jobs fired.

        A schedule that cannot be fired stays due and is skipped (logged once per
        cause, counted); the others fire."""

        def skipped(name: str, exc: Exception) -> None:
            self.rows.failed("fire_schedules", name, exc, what="schedule")

        return len(fire_due(now, self.batch, on_error=skipped))

    def settle_waiting(self, now: datetime) -> int:
        """End the waits of jobs whose parents (or key holder) ended: release,
        fail or cancel each as ``on_parent_failure`` says. Returns how many ended.

        All waiting rows are looked at, batch after batch (up to
        :data:`WAIT_BATCHES` batches a pass; the next pass goes on from there).
        """
        store = get_job_store()
        ended = 0
        for _ in range(WAIT_BATCHES):
            batch = store.waiting(self.batch, after=self._waiting_after)
            self._waiting_after = (
                None
                if len(batch) < self.batch
                else (batch[-1].waiting_since or batch[-1].created, batch[-1].id)
            )
            readable: list[JobRecord] = []
            awaited: dict[str, set[str]] = {}
            for record in self.rows.readable("settle_waits", batch):
                with self.rows.row("settle_waits", record.id):
                    awaited[record.id] = set(Waits.from_dict(record.waits or {}).awaited)
                    readable.append(record)
            wanted = set().union(*awaited.values()) if awaited else set()
            found = {row.id: row for row in store.get_many(wanted)} if wanted else {}
            for record in readable:
                unreadable = [
                    found[i]
                    for i in sorted(awaited[record.id])
                    if i in found and found[i].damaged is not None
                ]
                if unreadable:  # deciding on a row read in part could end it wrongly
                    parent = unreadable[0]
                    self.rows.skip(
                        "settle_waits",
                        record.id,
                        f"it awaits job {parent.id}, whose row cannot be read: {parent.damaged}",
                        ("awaits damaged", parent.id),
                    )
                    continue
                with self.rows.row("settle_waits", record.id):
                    # A held job takes no channel slot while it waits: nothing to give back.
                    outcome, _ = settle(store, record, found, now)
                    if outcome is not Settled.WAITING and outcome is not Settled.LOST:
                        ended += 1
            if self._waiting_after is None:
                break
        return ended

    def release_due(self, now: datetime) -> int:
        """Send the first message of the jobs held in the store (long delays, ended
        waits) that are due before the next pass, each delayed to arrive at its
        planned start. Returns how many were sent.

        A held job takes its channel slot now: while its channel is full it stays
        held (tried again at the next tick, behind the other due jobs), and the
        stop flag does not hold it back, as it was accepted before any stop.
        Batch after batch until none is due (many jobs may share one eta): per
        batch one admission call per channel, the messages, and one store
        transaction marking the rows, so that a batch never repeats a row.
        """
        store = get_job_store()
        # This runs every tick: what falls due before the next tick goes now.
        tick = min(self.interval, TICK_SECONDS)
        until = now + timedelta(seconds=tick + RELEASE_AHEAD_SECONDS)
        seen: set[str] = set()
        sent = 0
        while batch := [r for r in store.due_releases(until, self.batch) if r.id not in seen]:
            seen.update(r.id for r in batch)  # a row whose mark lost a race is not resent
            readable = self.rows.readable("release_held", batch)
            try:
                sent += release_held(store, readable, now, self.broker, tick)
            except Exception as exc:
                if is_outage(exc):
                    raise
                # One row spoilt the batch: the rows still due go row by row, so that
                # it alone stays held (read again: those sent before it are marked).
                fresh = self.rows.readable("release_held", store.get_many([r.id for r in readable]))
                sent += sum(1 for r in fresh if r.release_at is None)
                for record in fresh:
                    if record.release_at is None or record.release_at > until:
                        continue
                    with self.rows.row("release_held", record.id):
                        sent += release_held(store, [record], now, self.broker, tick)
        return sent

    def cancel_overdue(self, now: datetime) -> int:
        """Cancel the Scheduled jobs past their start deadline that nobody picked up."""
        cancelled = 0
        for record in self.rows.readable(
            "cancel_overdue", get_job_store().overdue(now, self.batch)
        ):
            with self.rows.row("cancel_overdue", record.id):
                if self.book.cancel_overdue(record, now):
                    cancelled += 1
                    manager.release_slot(record.channel_id, record.id, self.broker)
        return cancelled

    def report_depths(self, now: datetime | None = None) -> int:
        """Tell the observers how many jobs wait in each channel this process knows
        (one read per channel; nothing when no observer listens); returns how many
        channels were read."""
        if not observers.observing():
            return 0
        depths = _channel_depths()
        if depths is None:
            return 0
        observers.channel_depths(depths)
        # The jobs held in the store (waiting for a time or for other jobs): one
        # count per pass, the sweep leader's; a failure is this duty's.
        observers.held_jobs(get_job_store().held_counts())
        return len(depths)

    def count_ends(self, now: datetime) -> int:
        """Count the ends nobody counted (:data:`~pypepper_dramatiq.records.state.MARKED_ENDS`:
        a cancel, or a failure decided at submit, by a process without metrics, of a
        job no worker meets again); returns how many. Only in a process that tells
        observers.

        Reads, per status, the rows updated since a watermark kept here (a new leader
        starts :data:`COUNT_LOOKBACK_SECONDS` back), batch after batch, and counts
        each unmarked one as a worker meeting it would
        (:meth:`~pypepper_dramatiq.engine.step_io.StepIO.count_end`: whoever sets
        ``state["counted"]`` counts). Completed rows are not read: only a worker
        writes them, and it counts them.
        """
        if not observers.observing():
            self._ends_after = {}
            return 0
        return sum(self._count_ends_of(status, now) for status in MARKED_ENDS)

    def _count_ends_of(self, status: Status, now: datetime) -> int:
        store = get_job_store()
        lagging = (now - timedelta(seconds=COUNT_LAG_SECONDS), "")
        after = self._ends_after.get(status) or (
            now - timedelta(seconds=COUNT_LOOKBACK_SECONDS),
            "",
        )
        counted = 0
        for _ in range(END_BATCHES):
            batch = store.ended_since(status, after, self.batch)
            for record in self.rows.readable("count_ends", batch):
                if is_counted(record.state):
                    continue
                with self.rows.row("count_ends", record.id):
                    if self.book.count_end(record):
                        counted += 1
            last = max([after] + [(r.updated, r.id) for r in batch[-1:]])
            if len(batch) < self.batch:
                # Caught up: stay behind the clock (never going back).
                after = max(after, min(last, lagging))
                break
            after = last
        self._ends_after[status] = after
        return counted

    def roll_up_activity(self, now: datetime) -> int:
        """Add the ends of the minutes since the rollup's mark, and the channels' depths
        now, to the activity rollup the dashboard's charts read
        (:mod:`~pypepper_dramatiq.records.activity`); returns how many ends it added.

        Reads, per final status, the rows ended from the mark (kept in the store; a
        first leader starts :data:`COUNT_LOOKBACK_SECONDS` back) up to the minute
        :data:`ROLLUP_LAG_SECONDS` behind the clock, and adds them with the move of the
        mark in one transaction, by compare-and-set: a leader that lost the lead adds
        nothing, and no end is added twice. A pass reads at most :data:`END_BATCHES`
        batches a status (past them it stops at the last minute read whole: the next
        pass goes on). Minutes older than :data:`ROLLUP_KEEP` are deleted. Nothing
        with a store that keeps no rollup.
        """
        store = get_job_store()
        if not store.keeps_activity:
            return 0
        mark = store.activity_mark()
        depths = _channel_depths()
        if depths:
            at = minute_of(now)
            store.add_activity({(at, ch): Activity(depth=n) for ch, n in depths.items()})
        until = minute_of(now - timedelta(seconds=ROLLUP_LAG_SECONDS))
        start = (
            mark.next_minute
            if mark is not None
            else minute_of(now - timedelta(seconds=COUNT_LOOKBACK_SECONDS))
        )
        if until <= start:
            return 0
        ends: list[JobRecord] = []
        for status in ENDED:
            found, until = self._ends_between(store, status, start, until)
            ends.extend(found)
        minutes = add_up(
            ((minute_of(r.updated), r.channel_id), activity_of(r))
            for r in ends
            if r.updated < until
        )
        first = mark.first_minute if mark is not None else start
        if not store.add_activity(minutes, moved=(mark, ActivityMark(first, until))):
            logger.info(
                "activity rollup: its mark moved meanwhile (another sweep leader); "
                "nothing added by this pass",
                extra={"action": "roll_up_activity"},
            )
            return 0
        # On an hour: the rows of every grain before it go, none cut in two.
        store.forget_activity((now - ROLLUP_KEEP).replace(minute=0, second=0, microsecond=0))
        return sum(sum(a.ended) for a in minutes.values())

    def prune_rate_keys(self, now: datetime) -> int:
        """Forget the rate limit keys unused for
        :data:`~pypepper_dramatiq.limits.rates.IDLE_KEEP_SECONDS` (PostgreSQL's rows of
        ``scheduler_rate_turns``, this process's counts; Redis expires its keys
        itself): a key per tenant would otherwise stay for ever. At most every
        :data:`RATE_PRUNE_SECONDS`, :data:`RATE_PRUNE_BATCHES` batches a pass; returns
        how many were forgotten.
        """
        started = time.monotonic()
        if self._pruned_at is not None and started - self._pruned_at < RATE_PRUNE_SECONDS:
            return 0
        forgotten = 0
        for _ in range(RATE_PRUNE_BATCHES):
            pruned = self.transport.prune_rate_keys(limit=self.batch)
            forgotten += pruned
            if pruned < self.batch:
                break
        self._pruned_at = started
        if forgotten:
            logger.info(
                "forgot %d rate limit key(s) unused for %.0f h",
                forgotten,
                IDLE_KEEP_SECONDS / 3600,
                extra={"action": "prune_rate_keys", "keys": forgotten},
            )
        return forgotten

    def _ends_between(
        self, store: Any, status: Status, start: datetime, until: datetime
    ) -> tuple[list[JobRecord], datetime]:
        """The readable rows that ended ``status`` from ``start`` to ``until``, and
        ``until`` itself, moved back to the last minute read whole when there were more
        than a pass reads."""
        after = (start, "")  # strictly after (start, ""): every row of start's minute
        found: list[JobRecord] = []
        for read in itertools.count(1):
            batch = store.ended_since(status, after, limit=self.batch)
            found.extend(self.rows.readable("roll_up_activity", batch))
            if len(batch) < self.batch or batch[-1].updated >= until:
                break
            after = (batch[-1].updated, batch[-1].id)
            if read >= END_BATCHES and minute_of(batch[-1].updated) > start:
                until = min(until, minute_of(batch[-1].updated))
                break
        return [r for r in found if r.updated < until], until

    def reclaim_slots(self, now: datetime) -> int:
        """Give back the channel slots of jobs that left their channel while the
        release could not be made (Redis unreachable as a worker took the job):
        returns how many.

        Every channel the transport knows (the leader's own when the state lives in
        this process) is looked at, about ``batch`` waiting ids a pass each (the
        next pass goes on from there), with one store read for them. An id whose
        row is InProgress or ended left the channel: its slot is given back (its
        worker's release, if it comes, changes nothing). One whose row is
        Scheduled still waits, and one with no row may be a producer's that has
        not inserted it yet: both keep their slot. Each channel fails alone.
        """
        states = self.transport.channel_states()
        if states is None:
            names = manager.ids()
        else:
            names = [state.name for state in states if state.waiting]
        for gone in set(self._slot_cursors) - set(names):
            del self._slot_cursors[gone]
        store = get_job_store()
        given_back = 0
        for name in names:
            with self.rows.row("reclaim_slots", name, what="channel"):
                gate = manager.gate_of(name, self.broker)
                cursor, ids = gate.waiting_ids(self._slot_cursors.get(name, 0), self.batch)
                self._slot_cursors[name] = cursor
                rows = self.rows.readable("reclaim_slots", store.get_many(ids)) if ids else []
                left = sorted(r.id for r in rows if r.status in _LEFT_THE_CHANNEL)
                for job_id in left:
                    gate.release(job_id)
                given_back += len(left)
                if left:
                    logger.info(
                        "channel %s: %d slot(s) given back, of jobs that had left it (%s)",
                        name,
                        len(left),
                        ", ".join(printable(i) for i in left[:5])
                        + (", ..." if len(left) > 5 else ""),
                        extra={"action": "reclaim_slots", "channel_id": name, "slots": len(left)},
                    )
        return given_back

    def _send(self, step: StepMessage, channel_id: str, delay: float = 0.0) -> Any:
        return send_step(self.broker, step, channel_id, delay)

    def resend_lost_first_steps(self, now: datetime) -> int:
        """Send again the first message of Scheduled jobs whose message is gone.

        A Scheduled row waits for its first message. If that message is no
        longer in the broker (a Redis that lost data, a message dropped by a
        fault no other part repairs), nothing would ever start the job. Each
        pass looks at the next ``batch`` Scheduled rows (oldest first, wrapping
        around), and for those unchanged for ``dispatch_seconds``, asks Redis
        whether the message the producer recorded still exists (waiting, delayed
        or held by a worker); if not, it sends a new one and records it.
        """
        if not self.transport.shared:
            return 0  # in-process: the messages and the rows live and die together
        store = get_job_store()
        listed = list(
            store.list(status=Status.SCHEDULED, limit=self.batch, after=self._scheduled_after)
        )
        self._scheduled_after = (
            (listed[-1].created, listed[-1].id) if len(listed) >= self.batch else None
        )
        rows = self.rows.readable("resend_first_steps", listed)
        cutoff = now - timedelta(seconds=self.dispatch_seconds)
        # A job held in the store has no message yet, and one planned later waits
        # in a delay queue: neither has lost anything.
        stale = [
            r
            for r in rows
            if r.updated < cutoff
            and r.release_at is None
            and r.waiting_since is None
            and (r.not_before is None or r.not_before <= now)
        ]
        if not stale:
            return 0
        resent = 0
        for record, alive in zip(stale, self._alive(stale), strict=True):
            if alive or not self._resend(store, record, now):
                continue
            resent += 1
            observers.recovered(record, observers.MESSAGE_LOST)
            logger.warning(
                "job %s: Scheduled for %.0fs and its message is gone from the broker; sent again",
                record.id,
                (now - record.updated).total_seconds(),
                extra={"action": "resend_first_step", "job_id": record.id},
            )
        return resent

    def _resend(self, store: Any, record: JobRecord, now: datetime) -> bool:
        """Send ``record``'s first message again and record it; False if this row failed
        (skipped: logged once, counted)."""
        done = False
        with self.rows.row("resend_first_steps", record.id):
            sent = self._send(StepMessage(record.id, Position(), record), record.channel_id)
            # Compare-and-set: a row claimed meanwhile keeps its own state.
            store.advance(
                record.evolve(
                    updated=now,
                    state=dict(record.state, **{DISPATCH_KEY: dispatch_of(sent)}),
                )
            )
            done = True
        return done

    def _alive(self, records: list[JobRecord]) -> list[bool]:
        """Whether each record's recorded first message is still stored in the broker."""
        found = self.transport.messages_exist([_recorded_message(record) for record in records])
        return found if found is not None else [True] * len(records)

    # -- retention ----------------------------------------------------------------------

    #: Rows per purge statement, and statements per status in one pass: a pass
    #: deletes at most 10,000 jobs of each status, so that it stays short (the next
    #: full pass goes on where it stopped).
    purge_batch: int = BATCH
    purge_batches: int = 10
    #: The share of ``interval`` a pass's purge may take: past it, no further
    #: batch starts (each status still gets one), the next pass goes on. A backlog
    #: of ended rows (retention turned on, a loaded database) is then purged over
    #: more passes instead of holding the sweep, its database connection and this
    #: process's GIL for seconds while the worker threads run jobs.
    purge_share: float = 0.1

    def purge_ended(self, now: datetime) -> int:
        """Delete the ended jobs kept longer than :attr:`retention` says
        (``IJobStore.purge``: never one another job still needs); returns how many.

        Runs in the full passes only (every ``interval``), within its budget
        (:attr:`purge_share`). Logged at INFO when it deleted any (at DEBUG
        otherwise, not to print a line per interval).
        """
        if not self.retention:
            return 0
        store = get_job_store()
        started = time.monotonic()
        until = started + self.interval * self.purge_share
        purged: dict[str, int] = {}
        for status, kept in self.retention.items():
            # One status's retention that cannot be applied leaves the others' purge.
            with self.rows.row("purge", status.value, what="retention of status"):
                ended_before = now - timedelta(seconds=kept)
                count = 0
                for batch in range(self.purge_batches):
                    if batch and time.monotonic() >= until:
                        break
                    deleted = len(store.purge(status, ended_before, self.purge_batch))
                    count += deleted
                    if deleted < self.purge_batch:
                        break
                purged[status.value] = count
        total = sum(purged.values())
        logger.log(
            logging.INFO if total else logging.DEBUG,
            "purged %d ended jobs past their retention (%s) in %.0f ms",
            total,
            ", ".join(f"{status} {count}" for status, count in purged.items()),
            (time.monotonic() - started) * 1000,
            extra={"action": "purge", "purged": total, "by_status": purged},
        )
        return total


@dataclass(frozen=True)
class Duty:
    """One duty of the recovery sweep: a name (its label in logs, metrics and the
    workers page) and the method that does it."""

    name: str
    run: Callable[[RecoverySweeper, datetime], int]
    #: Only in the full passes (every ``interval``), not at every tick.
    full_only: bool = False
    #: What it returns counts as steps sent (what :meth:`RecoverySweeper.sweep` returns).
    sends: bool = False


#: The sweep's duties, in the order a pass runs them: one line each.
DUTIES: tuple[Duty, ...] = (
    Duty("requeue_prefetch", RecoverySweeper.requeue_dead_prefetch, full_only=True),
    Duty("recover_leases", RecoverySweeper.recover_lapsed, full_only=True, sends=True),
    Duty("fire_schedules", RecoverySweeper.fire_recurring),
    Duty("settle_waits", RecoverySweeper.settle_waiting),
    Duty("release_held", RecoverySweeper.release_due, sends=True),
    Duty("cancel_overdue", RecoverySweeper.cancel_overdue),
    Duty("resend_first_steps", RecoverySweeper.resend_lost_first_steps, full_only=True, sends=True),
    # Before the purge: a job whose slot it gives back must still have its row.
    Duty("reclaim_slots", RecoverySweeper.reclaim_slots, full_only=True),
    Duty("purge", RecoverySweeper.purge_ended, full_only=True),
    Duty("lapsed_hooks", RecoverySweeper.run_lapsed_hooks),
    Duty("depth_reports", RecoverySweeper.report_depths, full_only=True),
    Duty("count_ends", RecoverySweeper.count_ends, full_only=True),
    Duty("roll_up_activity", RecoverySweeper.roll_up_activity, full_only=True),
    Duty("prune_rate_keys", RecoverySweeper.prune_rate_keys, full_only=True),
)

#: The statuses of a job no longer waiting in its channel: taken by a worker, or ended.
_LEFT_THE_CHANNEL = frozenset(
    {Status.IN_PROGRESS, Status.COMPLETED, Status.FAILED, Status.CANCELLED}
)


def _channel_depths() -> dict[str, int] | None:
    """How many jobs wait in each channel this process knows (one read per channel);
    None if they could not be read (a figure for a graph: the next pass reads again)."""
    depths: dict[str, int] = {}
    try:
        for channel_id in manager.ids():
            channel = manager.get(channel_id)
            if channel is not None:
                depths[channel_id] = channel.length()
    except Exception as exc:
        logger.debug("channel depths not read: %s", exc)
        return None
    return depths


def _recorded_message(record: JobRecord) -> tuple[str, str | None]:
    dispatch = record.state.get(DISPATCH_KEY) or {}
    return str(dispatch.get("queue") or record.channel_id), dispatch.get("message_id")
