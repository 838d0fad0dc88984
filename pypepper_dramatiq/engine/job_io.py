"""Where the model meets stores and channels: scheduling, saving and cancelling jobs.

The :class:`~pypepper_dramatiq.model.job.Job` of pypepper's scheduler keeps its methods
(``scheduled()``, ``save()``, ``persist()``, ``cancel()``, ``cancel_saved()``,
``get_saved()``), but does no I/O of its own: each delegates to the job I/O of
:data:`~pypepper_dramatiq.model.job.runtime`, this module's :data:`JOB_IO`
(``setup()`` installs it; without setup, the package provides it on first use),
so the model sits below the stores and channels it is written to. Importing
this module changes nothing.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal

from dramatiq.broker import Broker

from ..channels.broker import (
    get_broker,
    get_transport,
    priority_options,
    queue_for,
    transport_of,
)
from ..channels.channel import Channel, hooks_enqueue, manager
from ..channels.end_notices import publish_ended, wait_for, wait_for_async, wake
from ..channels.messages import DISPATCH_KEY, StepMessage, dispatch_of
from ..errors import (
    BrokerUnavailableError,
    ChannelFullError,
    ChannelStoppedError,
    ConfigError,
    DuplicateJobError,
    InvalidTransitionError,
    StoreError,
    UnknownExecutorError,
    UnknownJobError,
    retry_may_cure,
)
from ..limits.concurrency import check_concurrency_key
from ..limits.rates import check_rate_key
from ..model.job import CANCEL_ATTEMPTS, SAVE_ATTEMPTS, Job, Scheduled, ScheduleOptions
from ..ops import observers
from ..ops.logs import get_logger
from ..records.record import JobRecord, as_utc, utcnow
from ..records.state import BY_API, TRACE_KEY, cancelled_state, counting
from ..records.storable_job import check_job_record, could_be_stored
from ..rules.events import CANCEL, INIT, SCHEDULE, transition
from ..rules.priorities import check_priority, priority_in
from ..rules.start_times import SHORT_DELAY_SECONDS, StartTimes
from ..rules.status import Status, may_overwrite
from ..rules.steps import Position
from ..rules.waits import Waits
from ..stores.base import IJobStore
from ..stores.registry import get_job_store
from ..transport import Admission, SendResult, Topic, Transport
from .retrying import retry_record
from .running import running_here

logger = get_logger(__name__)

#: Tries of a keyed insert while key holders come and go.
CONFLICT_ATTEMPTS = 5
#: How long a producer has to send the message of a job it stored first (a unique
#: key, parents) before the recovery sweep sends it instead.
HANDOFF_SECONDS = 15.0


class JobIO:
    """The model's way to the job store, the channels and the other workers."""

    # -- scheduling -------------------------------------------------------------------

    def schedule(
        self,
        job: Job,
        options: ScheduleOptions | None = None,
        *,
        insert_first: bool = False,
        serve: bool = True,
    ) -> str:
        """INIT, SCHEDULE, admit and enqueue, then persist Scheduled (see ``Job.scheduled``,
        which makes ``options``, checked; None: no option).

        A delayed job's first message rides on a Dramatiq delayed message when
        the delay is short; a longer one, on Redis, is held in the store (no
        message) and the recovery sweep sends it shortly before it is due. On
        other brokers (the in-process channel) the message goes at once and the
        worker waits for the planned start.

        A job with a unique key or parents takes another path (:meth:`_guarded`):
        its row is stored before any message, so that the database decides the
        key and the wait first. A plain job pays nothing for it. ``insert_first``
        takes that path for any job: a job id stored already then raises
        :class:`DuplicateJobError` and sends nothing (a recurring slot fired once).
        ``serve=False`` sends to the channel without making it one of this
        process's channels (a worker firing a schedule for a channel it does not
        serve must not start consuming it).

        With ``connection`` (the caller's SQLAlchemy ``Connection`` or
        ``Session``) the row is written in the caller's transaction and nothing
        is sent: the job is held until the caller commits, then released by
        the workers' sweep (within about a second), or at once by this process
        when a ``Session`` tells it of the commit.

        An observer that traces (:meth:`Observer.scheduling`) wraps all of it;
        the trace context it gives is stored with the job (``state["trace"]``).
        """
        _require_sync()
        options = options if options is not None else ScheduleOptions()
        if not observers.observing():
            return self._schedule(job, options, insert_first, serve)
        with observers.scheduling(job.id, job.channel_id) as trace:
            _carry(job, trace)
            return self._schedule(job, options, insert_first, serve)

    def _schedule(self, job: Job, options: ScheduleOptions, insert_first: bool, serve: bool) -> str:
        """:meth:`schedule`, inside the observers' scheduling context if any."""
        now = utcnow()
        times = options.start.times(now)
        key, waits, connection = options.key, options.waits, options.connection
        if job.id in waits.parents:
            raise ValueError(f"job {job.id} cannot be scheduled after itself")
        # Before any message: the row must hold it. Made once: the message carries it
        # and the row stores it, each as a copy with what scheduling changed.
        checked = check_job_record(job.to_record())
        store = get_job_store()  # a YAML durable backend never set up fails here, first
        if connection is not None:
            store = _transactional_store(store, connection)
        if job.version:
            # A job stored before (e.g. rebuilt by from_record) may already have ended:
            # a finished row is never overwritten, so refuse instead of queueing a no-op.
            durable = store.get(job.id)
            if durable is not None and durable.status.is_terminal:
                raise InvalidTransitionError(SCHEDULE.value, durable.status.value)
        if options.stored_first or insert_first:
            return self._guarded(
                job,
                times,
                now,
                key,
                options.on_conflict,
                waits,
                store,
                serve=serve,
                transactional=connection is not None,
            )
        before = job.status
        wait = times.delay_from(now)
        shared = get_transport().shared
        hold = shared and wait > SHORT_DELAY_SECONDS
        job.not_before, job.start_deadline = times.not_before, times.deadline
        job.release_at = times.not_before if hold else None
        # A held job takes its channel slot when the sweep releases it.
        channel = _admit(
            job,
            before,
            manager.available,
            "check" if hold else "send",
            wait if shared else 0.0,
            checked,
        )
        _log_scheduled(job, channel.id)
        # The user's values were checked before the message went: the write does not
        # check them again, nor make the job's record again (about 10 us a record).
        written = _scheduled_record(checked, job, utcnow())
        if not self.persist(job, SAVE_ATTEMPTS, checked=True, made=written):
            # The job is on the channel: do not roll back. The worker heals the row.
            logger.warning("job %s is queued but its Scheduled snapshot did not persist", job.id)
        return job.id

    def schedule_many(
        self,
        jobs: Iterable[Job],
        *,
        priority: int | None = None,
        rate_key: str | None = None,
        concurrency_key: str | None = None,
    ) -> list[Scheduled]:
        """Schedule ``jobs``: one multi-row insert, then one Redis round trip for the
        admission and the first message of all of them (see :func:`schedule_many`);
        a tracing observer wraps each job's scheduling, as :meth:`schedule`'s."""
        _require_sync()
        batch, checked = _checked_batch(jobs, priority, rate_key, concurrency_key)
        if not observers.observing():
            return self._schedule_many(batch, checked)
        with ExitStack() as stack:
            for job in batch:
                _carry(job, stack.enter_context(observers.scheduling(job.id, job.channel_id)))
            return self._schedule_many(batch, checked)

    def _schedule_many(self, batch: list[Job], checked: list[JobRecord]) -> list[Scheduled]:
        """:meth:`schedule_many` of the checked ``batch`` (``checked``: their records,
        as they were checked)."""
        store = get_job_store()  # a YAML durable backend never set up fails here, first
        if not batch:
            return []
        now = utcnow()
        broker = get_broker()
        hooks = hooks_enqueue(broker)  # the same for every message of the batch
        channels = {job.channel_id: manager.available(job.channel_id) for job in batch}
        one_call = all(channel.one_call for channel in channels.values())
        before = [(job.status, job.updated) for job in batch]
        prepared: list[tuple[Admission, Any] | None] = []
        records: list[JobRecord] = []
        try:
            for job, seen in zip(batch, checked, strict=True):
                job.apply_event(INIT)
                job.apply_event(SCHEDULE)
                job.not_before = job.start_deadline = job.release_at = None
                job.mark_saved(0, now)  # the row's version and time, without a copy
                # The checked record, Scheduled now (its state: a tracing observer's
                # context may have joined it since), not the job's made again.
                record = seen.scheduled_copy(job.status, now, dict(job.state))
                if one_call:
                    # The row records the message before it is sent: were it never
                    # sent, the recovery sweep finds the row without it and sends one.
                    offer, message = channels[job.channel_id].prepare(
                        job, record=record, hooks=hooks
                    )
                    prepared.append((offer, message))
                    record = record.with_state({**record.state, DISPATCH_KEY: dispatch_of(message)})
                else:
                    prepared.append(None)
                records.append(record)
            written = store.put_many(records)
        except BaseException:
            for job, (status, updated) in zip(batch, before, strict=False):
                _roll_back(job, status)
                job.mark_saved(0, updated)
            raise
        results: list[Scheduled | None] = [None] * len(batch)
        for i, (job, ok) in enumerate(zip(batch, written, strict=True)):
            if ok:
                job.mark_saved(1, now)
            else:
                _roll_back(job, before[i][0])
                job.mark_saved(0, before[i][1])
                results[i] = DuplicateJobError(None, job.id)
        stored = [i for i, ok in enumerate(written) if ok]
        answers = self._offer_many(batch, stored, prepared, channels, one_call, hooks)
        refusals: dict[tuple[str, SendResult], ChannelFullError | ChannelStoppedError] = {}
        for i, answer in zip(stored, answers, strict=True):
            job = batch[i]
            if answer == "ok":
                _log_scheduled(job, job.channel_id)
                results[i] = job.id
                continue
            if (job.channel_id, answer) not in refusals:  # the bound is read once
                refusals[job.channel_id, answer] = _refusal(channels[job.channel_id], answer)
            refused = refusals[job.channel_id, answer]
            try:
                store.delete(job.id)
            except StoreError as exc:
                # The row stays, and the sweep sends its message: the job is scheduled.
                logger.warning(
                    "job %s was refused by its channel (%s) but its row could not be "
                    "removed (%s); the recovery sweep sends it",
                    job.id,
                    refused,
                    exc,
                )
                results[i] = job.id
                continue
            _roll_back(job, before[i][0])
            job.mark_saved(0, before[i][1])
            results[i] = refused
        return [result for result in results if result is not None]

    def _offer_many(
        self,
        batch: Sequence[Job],
        stored: Sequence[int],
        prepared: Sequence[tuple[Admission, Any] | None],
        channels: dict[str, Channel],
        one_call: bool,
        hooks: bool = True,
    ) -> list[SendResult]:
        """Admit and send the jobs of ``batch`` at ``stored`` (their rows are stored):
        one call of the transport when its channels take it (one Lua script on
        Redis), a loop of :meth:`Channel.offer` elsewhere. ``hooks``: whether the
        broker's enqueue hooks run (as :meth:`Channel.prepare`'s did)."""
        if not one_call:
            return [channels[batch[i].channel_id].offer(batch[i]) for i in stored]
        offers = [(batch[i], prepared[i]) for i in stored]
        try:
            answers = get_transport().admit_and_enqueue([p[0] for _, p in offers if p is not None])
        except BrokerUnavailableError as exc:
            logger.warning(
                "%d jobs are stored but their messages may not have been sent (%s); "
                "the recovery sweep sends those missing",
                len(offers),
                exc,
            )
            return ["ok"] * len(offers)
        for (job, pair), answer in zip(offers, answers, strict=True):
            if answer == "ok" and pair is not None:
                channels[job.channel_id].sent(job, pair[1], hooks=hooks)
        return answers

    def _guarded(
        self,
        job: Job,
        times: StartTimes,
        now: datetime,
        key: str | None,
        on_conflict: str,
        waits: Waits,
        store: IJobStore,
        *,
        serve: bool = True,
        transactional: bool = False,
    ) -> str:
        """Schedule a job with a unique key or parents: the row first, then the message.

        The insert is where the database refuses a second active job per key;
        ``on_conflict`` then decides. Returns the id of the job in charge.
        A ``transactional`` job (``store`` writes in the caller's transaction)
        is held: the message goes once the caller has committed.
        """
        # The store refuses the insert if a parent is not stored (UnknownJobError),
        # decided with the insert so that a retention purge cannot come in between.
        conflict: DuplicateJobError | None = None
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                self._insert_then_send(
                    job, times, now, key, waits, store, serve=serve, transactional=transactional
                )
                return job.id
            except DuplicateJobError as exc:
                if exc.unique_key is None:  # this job id is stored already
                    raise
                conflict = exc
            holder = conflict.existing_id
            if holder is None:
                continue  # the holder ended while we looked: try again
            if on_conflict == "skip":
                logger.info(
                    "job %s not scheduled: key %r is held by job %s",
                    job.id,
                    key,
                    holder,
                    extra={"action": "skip_duplicate", "job_id": job.id, "holder": holder},
                )
                return holder
            if on_conflict == "raise":
                raise conflict
            if on_conflict == "replace" and self._replace(store, holder, job.id):
                continue
            # "after" (or "replace" of a holder that already started): wait for it,
            # and take the key when the wait ends.
            waits = replace(waits, key=key, holder=holder)
            key = None
        assert conflict is not None
        raise conflict

    def _insert_then_send(
        self,
        job: Job,
        times: StartTimes,
        now: datetime,
        key: str | None,
        waits: Waits,
        store: IJobStore,
        *,
        serve: bool = True,
        transactional: bool = False,
    ) -> None:
        """Admit ``job``, insert its Scheduled row, then send its message unless held.

        Until the message is sent (and marked), the row is due for release in
        :data:`HANDOFF_SECONDS`: a producer that dies in between leaves the
        sending to the recovery sweep. A ``transactional`` job is held, due
        for release at its planned start (or now).
        """
        before = job.status
        wait = times.delay_from(now)
        shared = get_transport().shared
        waiting = bool(waits.awaited)
        held = transactional or (shared and (waiting or wait > SHORT_DELAY_SECONDS))
        job.not_before, job.start_deadline = times.not_before, times.deadline
        job.unique_key = key
        job.waits = replace(waits, held=held).to_dict() if waiting else None
        if waiting:
            job.release_at = None  # released when the wait ends
        elif held:
            job.release_at = times.not_before or now
        else:
            job.release_at = max(now + timedelta(seconds=HANDOFF_SECONDS), times.not_before or now)
        # The message goes once the row is stored; a held job takes no slot until
        # the sweep releases it.
        channel_of = manager.available if serve else manager.sender
        channel = _admit(job, before, channel_of, "check" if held else "admit")
        try:
            written = store.put(job.to_record().evolve(version=0, updated=now))
        except BaseException:
            if not held:
                manager.release_slot(channel.id, job.id)
            _roll_back(job, before)
            raise
        if not written:
            if not held:
                manager.release_slot(channel.id, job.id)
            _roll_back(job, before)
            raise DuplicateJobError(None, job.id)
        job.mark_saved(1, now)
        _log_scheduled(job, channel.id)
        if transactional:
            store.after_commit(lambda: self.release_now(job.id))
        if held:
            return
        try:
            channel.dispatch(job, delay=wait if shared else 0.0)
        except BrokerUnavailableError as exc:
            logger.warning(
                "job %s is stored but its message was not sent (%s); the recovery sweep sends it",
                job.id,
                exc,
            )
            return
        job.release_at = None
        if not self.persist(job, SAVE_ATTEMPTS):
            logger.warning("job %s is queued but its dispatch was not recorded", job.id)

    def _replace(self, store: IJobStore, holder_id: str, by: str) -> bool:
        """Cancel the key holder if it has not started; True if it no longer holds the key."""
        for _ in range(CANCEL_ATTEMPTS):
            holder = store.get(holder_id)
            if holder is None or holder.status.is_terminal:
                return True
            if holder.status is not Status.SCHEDULED:
                return False  # running: not interrupted, the new job waits for it
            cancelled = holder.evolve(
                status=transition(holder.status, CANCEL),
                error=f"replaced by job {by} (on_conflict='replace')",
                updated=utcnow(),
                release_at=None,
                state=counting(holder.state),
            )
            if store.advance(cancelled):
                logger.info(
                    "job %s cancelled: replaced by job %s",
                    holder_id,
                    by,
                    extra={"action": "replace", "job_id": holder_id, "by": by},
                )
                observers.job_ended(cancelled)
                manager.release_slot(holder.channel_id, holder_id)
                running_here.cancel(holder_id)
                publish_cancel(holder_id)
                return True
        return False

    # -- snapshots --------------------------------------------------------------------

    def save(self, job: Job, *, checked: bool = False, made: JobRecord | None = None) -> bool:
        """Write ``job``'s snapshot; True if the store took it (see ``Job.save``).

        ``checked``: the caller checked the job's user values already (``scheduled()``
        did, just before its message went), so they are not checked again.
        ``made``: the snapshot as the caller made it (``scheduled()``, from the record
        it checked), written if the job still has its version, status and state;
        else the job's snapshot is made now.

        Raises:
            ValueError, TypeError: the row cannot hold a value of the job (named).
        """
        with job.write_lock:
            if made is not None and _still(job, made):
                record = made
            else:
                record = job.to_record(updated=utcnow())
            if not checked:
                check_job_record(record)
            if not get_job_store().put(record):
                return False
            job.mark_saved(record.version + 1, record.updated)
        if record.status in (Status.COMPLETED, Status.FAILED):
            publish_ended(job.id)  # the in-process worker's ends written as snapshots
        elif record.status is Status.CANCELLED:
            wake(job.id)  # cancel() publishes on the cancel channel, which waiters hear
        return True

    def persist(
        self,
        job: Job,
        attempts: int,
        keep: Mapping[str, Any] | None = None,
        *,
        checked: bool = False,
        made: JobRecord | None = None,
    ) -> bool:
        """``save``, retried; never raises for store failures (see ``Job.persist``).

        ``keep``: state keys this write adds, written again over the stored
        progress a retry adopts (a cancel's ``cancelled_by``). ``checked`` and
        ``made``: as :meth:`save`'s (``made`` serves the first try only)."""
        return self.persist_own(job, attempts, keep, checked=checked, made=made) is not None

    def persist_own(
        self,
        job: Job,
        attempts: int,
        keep: Mapping[str, Any] | None = None,
        *,
        checked: bool = False,
        made: JobRecord | None = None,
    ) -> bool | None:
        """:meth:`persist`, saying whose write holds the snapshot: True this call's,
        False another writer's (the row already held what it would write: adopted),
        None if nothing was stored. An end is counted only by its own writer."""
        for attempt in range(attempts):
            try:
                if self.save(job, checked=checked, made=made if attempt == 0 else None):
                    return True
                store = get_job_store()
                durable = store.get(job.id)
                if durable is None and store.was_purged(job.id):
                    # The job ran, ended and was deleted by retention before this
                    # write (a worker stored its row from its message): the store
                    # never inserts it again, and trying again would not either.
                    logger.info(
                        "job %s: not saved, retention deleted it already",
                        job.id,
                        extra={"action": "save_purged", "job_id": job.id},
                    )
                    return None
                if durable is not None and (
                    durable.status is job.status
                    or (job.status is Status.SCHEDULED and durable.status.rank > job.status.rank)
                ):
                    # Someone stored this status already (a worker healing the
                    # row), or a worker healed the row and started the job: our
                    # Scheduled write would only bump the version under them, or
                    # be refused. Either way the schedule is on record.
                    job.adopt_version(durable)
                    return False
                if (
                    durable is not None
                    and durable.version != job.version
                    and may_overwrite(durable.status, job.status)
                ):
                    # Retry on the stored row, keeping the progress workers stored there.
                    job.adopt_version(durable)
                    if keep:
                        job.state = {**job.state, **keep}
                    continue
            except StoreError as exc:
                logger.warning("job %s: snapshot write failed: %s", job.id, exc)
                if not retry_may_cure(exc):
                    return None  # the store refused the row's content: so would it again
            if attempt + 1 < attempts:
                time.sleep(0.01 * 2**attempt)
        return None

    def get_saved(self, job_id: str) -> JobRecord | None:
        """The row of ``job_id``; None when there is none (or no row could have that id)."""
        if not could_be_stored(job_id):
            return None
        return get_job_store().get(job_id)

    def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
        """Block until ``job_id`` has ended; its row (see ``Job.wait``)."""
        _require_storable_id(job_id)
        return wait_for(job_id, timeout)

    async def wait_async(self, job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
        """``wait`` for async code (see ``Job.wait_async``)."""
        _require_storable_id(job_id)
        return await wait_for_async(job_id, timeout)

    def release_now(self, job_id: str) -> bool:
        """Send the message of the held job ``job_id`` now, if it is due before the
        next tick (a transactional job whose caller just committed). Never raises:
        what is not sent here the workers' sweep sends."""
        try:
            store = get_job_store()
            record = store.get(job_id)
            now = utcnow()
            if (
                record is None
                or record.status is not Status.SCHEDULED
                or record.release_at is None
                or record.release_at > now + timedelta(seconds=SHORT_DELAY_SECONDS)
            ):
                return False
            return release_held(store, [record], now) == 1
        except Exception as exc:
            logger.warning(
                "job %s: not sent after its commit (%s); the workers' sweep sends it", job_id, exc
            )
            return False

    # -- cancelling -------------------------------------------------------------------

    def cancel(self, job: Job, by: str = BY_API) -> bool:
        """CANCEL, set the cancel event, persist Cancelled (saying ``by`` whom, from
        this host), tell the workers."""
        held = _held(job.status, job.release_at, job.waits)
        job.apply_event(CANCEL)
        job.cancel_event.set()
        host = socket.gethostname()
        added = cancelled_state({}, by, host, utcnow())
        job.state = {**job.state, **added}
        logger.info(
            "job %s cancelled by %s on %s",
            job.id,
            by,
            host,
            extra={"action": "cancel", "job_id": job.id, "by": by, "host": host},
        )
        written = self.persist_own(job, SAVE_ATTEMPTS, keep=added)
        persisted = written is not None
        # Counted only when this write ended the job: a row found Cancelled already
        # was ended (and counted, or left to the sweep leader) by its writer.
        if written and observers.observing():
            observers.job_ended(job.to_record())
        if held and persisted:
            manager.release_slot(job.channel_id, job.id)
        publish_cancel(job.id)
        return persisted

    def cancel_saved(self, job_id: str, by: str = BY_API) -> bool:
        """Cancel the stored job ``job_id`` (see ``Job.cancel_saved``)."""
        _require_storable_id(job_id)
        store = get_job_store()
        host = socket.gethostname()
        for _ in range(CANCEL_ATTEMPTS):
            record = store.get(job_id)
            if record is None:
                raise UnknownJobError(job_id)
            if record.status not in (Status.SCHEDULED, Status.IN_PROGRESS):
                # Already Cancelled is an end like Completed or Failed: nothing to do.
                raise InvalidTransitionError(CANCEL.value, record.status.value)
            # A cancelled job has no step to lease (the running attempt's worker
            # notices: its renewal no longer finds its lease).
            now = utcnow()
            cancelled = record.evolve(
                status=transition(record.status, CANCEL),
                updated=now,
                lease_owner=None,
                lease_expires=None,
                state=cancelled_state(record.state, by, host, now),
            )
            if store.advance(cancelled):
                logger.info(
                    "job %s cancelled by %s on %s",
                    job_id,
                    by,
                    host,
                    extra={"action": "cancel", "job_id": job_id, "by": by, "host": host},
                )
                observers.job_ended(cancelled)
                if _held(record.status, record.release_at, record.waits):
                    manager.release_slot(record.channel_id, job_id)
                running_here.cancel(job_id)
                publish_cancel(job_id)
                return True
        return False

    # -- retrying ---------------------------------------------------------------------

    def retry_saved(self, job_id: str, from_task: str | None = None) -> str:
        """Schedule a new job resuming the Failed or Cancelled job ``job_id``; its id
        (see ``Job.retry_saved``).

        :mod:`~pypepper_dramatiq.engine.retrying` decides where it resumes and what it
        keeps; the new job is then rebuilt (its tasks' executors must be
        registered here) and scheduled as ``scheduled()`` schedules a job that
        is stored first: admitted by its channel, inserted Scheduled, sent. The
        original's row is only read.
        """
        _require_sync()
        _require_storable_id(job_id)
        store = get_job_store()
        original = store.get(job_id)
        if original is None:
            raise UnknownJobError(job_id)
        record = retry_record(original, uuid.uuid4().hex, from_task, now=utcnow())
        try:
            job = Job.from_record(record)
        except UnknownExecutorError as exc:
            raise UnknownExecutorError(
                exc.executor_id,
                f"job {job_id} cannot be retried in this process: import the code of its "
                "tasks here first",
            ) from None
        new_id = self.schedule(job, ScheduleOptions(), insert_first=True)
        logger.info(
            "job %s retries job %s from task %s",
            new_id,
            job_id,
            Position.from_list(record.state["cursor"]).key(),
            extra={"action": "retry", "job_id": new_id, "retry_of": job_id},
        )
        return new_id


def schedule_many(
    jobs: Iterable[Job],
    *,
    priority: int | None = None,
    rate_key: str | None = None,
    concurrency_key: str | None = None,
    **options: object,
) -> list[Scheduled]:
    """Schedule many jobs at once; per job, in order, its id or why it was refused.

    Each job is scheduled as ``job.scheduled()`` with no option would schedule
    it, at a fraction of the cost: one multi-row INSERT for all the rows
    (:meth:`IJobStore.put_many`), then, on Redis, one round trip (one Lua
    script) that admits every job to its channel and queues the first message
    of each one admitted, in Dramatiq's own message format. Elsewhere (the
    stub broker, the in-process driver) the jobs are offered one by one.

    The rows go first and record the message each will get: a message is never
    sent for a row that is not stored, and a row whose message was never sent
    (the process died, Redis failed mid-call) is found by the recovery sweep,
    which sends one. Each job is decided alone; nothing is half-done:

    * admitted: its id, the job Scheduled and saved (version 1);
    * refused by its channel: a :class:`~pypepper_dramatiq.errors.ChannelFullError`
      or :class:`~pypepper_dramatiq.errors.ChannelStoppedError` *instance* in
      its place (not raised), its row removed, no message, the job rolled back
      (it may be scheduled again). A bounded channel that fills in the middle
      of the list takes the first jobs and refuses the rest;
    * its id stored already: a :class:`~pypepper_dramatiq.errors.DuplicateJobError`
      instance, nothing sent, the stored row untouched.

    So ``[r for r in results if isinstance(r, Exception)]`` are the refusals,
    as with ``asyncio.gather(..., return_exceptions=True)``.

    ``priority``, ``rate_key`` and ``concurrency_key`` apply to every job of the
    batch, as ``scheduled(priority=, rate_key=, concurrency_key=)`` would (None: each
    job's own, ``Job(priority=)``, ``job.rate_key`` and ``job.concurrency_key``).
    Options that need one job's own path (``delay``, ``eta``, ``max_start_delay``,
    ``unique_key``, ``after``, ``connection``...) are refused with a TypeError naming
    them: schedule those jobs with ``job.scheduled(...)``.

    Raises:
        TypeError: an item is not a :class:`Job`, or another option was given.
        InvalidPriorityError: ``priority`` (or a job's own) is not a whole number
            from 0 to 9; nothing was stored or sent.
        InvalidRateKeyError: ``rate_key`` (or a job's own) is no text of 1 to 128
            characters a row can hold; nothing was stored or sent.
        InvalidConcurrencyKeyError: ``concurrency_key`` (or a job's own) is no
            non-empty text a row can hold; nothing was stored or sent.
        ValueError: a job is given twice, or was stored before (rebuilt from its row),
            or holds a value its row cannot hold (named, as ``scheduled()`` names it).
        InvalidTransitionError: a job was scheduled already. Nothing was done.
        StoreError: the insert failed; nothing was sent, every job rolled back.
        RuntimeError: called inside a running event loop.
    """
    if options:
        names = ", ".join(sorted(options))
        raise TypeError(
            f"schedule_many() takes no scheduling options (got {names}): "
            "schedule such jobs one by one with job.scheduled(...)"
        )
    return JOB_IO.schedule_many(
        jobs, priority=priority, rate_key=rate_key, concurrency_key=concurrency_key
    )


def release_held(
    store: IJobStore,
    batch: Sequence[JobRecord],
    now: datetime,
    broker: Broker | None = None,
    tick: float = 1.0,
) -> int:
    """Send the first message of held jobs now due (the rows of ``batch``); returns
    how many were sent.

    Jobs of a higher priority go first, equal ones in the order of ``batch``.
    Each job takes its channel slot now (one admission call per channel; the
    bound applies, not the stop flag: the job was accepted before any stop).
    One refused by a full channel stays held, due again in ``tick`` seconds,
    behind the other due jobs. Each message is delayed to arrive at the job's
    planned start. The rows are marked (``release_at`` cleared, the message
    recorded) with compare-and-sets in one store call: a job cancelled
    meanwhile keeps its row, and the message sent for it is acknowledged unrun.

    Raises:
        BrokerUnavailableError, StoreError: the rows not sent stay due.
    """
    broker = broker or get_broker()
    # Priority first, then the store's order (due first: submit order, or a resume's);
    # the sort is stable. A full channel admits the highest, and where one queue
    # carries every priority the messages go in that order.
    batch = sorted(batch, key=lambda record: -priority_in(record.state))
    admitted: set[str] = set()
    by_channel: dict[str, list[str]] = {}
    for record in batch:
        by_channel.setdefault(record.channel_id, []).append(record.id)
    for channel_id, job_ids in by_channel.items():
        answers = manager.admit_released(channel_id, job_ids, broker)
        admitted.update(job_id for job_id, ok in zip(job_ids, answers, strict=True) if ok)
        if not all(answers):
            logger.info(
                "channel %s is full: %d due jobs stay held until it has room",
                channel_id,
                answers.count(False),
                extra={"action": "release_deferred", "channel_id": channel_id},
            )
    marks: list[JobRecord] = []
    failed: Exception | None = None
    for record in batch:
        if record.id not in admitted:
            later = now + timedelta(seconds=tick)
            marks.append(record.evolve(release_at=max(later, record.release_at or later)))
            continue
        if failed is not None:  # the broker failed: the rest stay due
            manager.release_slot(record.channel_id, record.id, broker)
            continue
        wait = 0.0
        if record.not_before is not None:
            wait = max(0.0, (record.not_before - now).total_seconds())
        step = StepMessage(record.id, Position(), record.evolve(release_at=None))
        try:
            message = send_step(broker, step, record.channel_id, wait)
        except Exception as exc:
            failed = exc
            manager.release_slot(record.channel_id, record.id, broker)
            continue
        marks.append(
            record.evolve(
                release_at=None,
                updated=now,
                state=dict(record.state, **{DISPATCH_KEY: dispatch_of(message)}),
            )
        )
    store.advance_many(marks)
    if failed is not None:
        raise failed
    return sum(1 for mark in marks if mark.release_at is None)


def send_step(broker: Broker, step: StepMessage, channel_id: str, delay: float = 0.0) -> Any:
    """Enqueue ``step`` on ``channel_id``'s queue (after ``delay`` seconds); the message sent.

    Redis takes a message for any queue, and declaring one in a worker process
    would make it consume a channel it does not serve; other brokers (the stub
    broker) need the queue declared first.
    """
    if (
        not transport_of(broker).takes_undeclared_queues
        and channel_id not in broker.get_declared_queues()
    ):
        broker.declare_queue(channel_id)
    state = step.record.state if step.record else None
    message = step.to_message(queue_for(channel_id, state, broker), priority_options(state, broker))
    return broker.enqueue(message, delay=int(delay * 1000) or None)


def _transactional_store(store: IJobStore, connection: object) -> IJobStore:
    """``store`` writing in the caller's transaction, once it is sure to be sent.

    Raises:
        ConfigError: not a SQL store, another database, or nothing would send
            the job (no Redis sweep, and a plain Connection tells no commit).
    """
    bound = store.within(connection)
    if not bound.tells_commits and not get_transport().shared:
        raise ConfigError(
            "scheduled(connection=...) without Redis needs a SQLAlchemy Session: "
            "with no workers' sweep, this process sends the job when the Session "
            "commits (a plain Connection does not tell it)"
        )
    return bound


def publish_cancel(job_id: str, transport: Transport | None = None) -> bool:
    """Announce a cancel to every worker over ``transport`` (default: the broker's).

    The job row is the truth (Cancelled is written first); the message only
    makes running attempts see it at once instead of at their next lease
    renewal. False when there is no Redis to tell, or it could not be told.
    Waiters hear it too (``Job.wait()``); those of this process are woken here.
    """
    wake(job_id)
    transport = transport if transport is not None else get_transport()
    if not transport.carries_notices:
        return False
    try:
        transport.publish(Topic.CANCEL, job_id)
    except Exception as exc:  # the lease keeper will notice it from the row instead
        logger.warning("job %s: cancel not published (%s); workers see it on renewal", job_id, exc)
        return False
    return True


def _held(status: Status, release_at: datetime | None, waits: dict[str, Any] | None) -> bool:
    """A Scheduled job with no message yet: held in the store (a long delay, a wait),
    or stored by a producer that has not sent it. If it holds a channel slot (the
    latter, or one the sweep admitted as it released it), no worker will give the
    slot back, so whoever ends it unrun must (a no-op for a job holding none)."""
    held_wait = bool((waits or {}).get("held"))
    return status is Status.SCHEDULED and (release_at is not None or held_wait)


def _roll_back(job: Job, before: Status) -> None:
    """Undo what scheduling set on ``job`` (nothing was queued or stored)."""
    job.restore_status(before)
    job.not_before = job.start_deadline = job.release_at = None
    job.unique_key = job.waits = None


def _scheduled_record(checked: JobRecord, job: Job, updated: datetime) -> JobRecord:
    """``job``'s record, written at ``updated``, made from ``checked`` (its record made
    before INIT and SCHEDULE, with the same user values): what ``job.to_record()``
    would give, without making the payload and checking every field again."""
    return checked.scheduled_copy(
        job.status,
        updated,
        dict(job.state),
        not_before=_utc(job.not_before),
        release_at=_utc(job.release_at),
        start_deadline=_utc(job.start_deadline),
    )


def _utc(value: datetime | None) -> datetime | None:
    """``value`` in UTC, as a record keeps it (an eta may come with another offset)."""
    return None if value is None else as_utc(value)


def _still(job: Job, made: JobRecord) -> bool:
    """Whether ``made`` is still ``job``'s snapshot: the job kept its version, status
    and state (a worker of this process may have taken the job up since)."""
    return job.version == made.version and job.status is made.status and job.state == made.state


def _admit(
    job: Job,
    before: Status,
    channel_of: Callable[[str], Channel],
    admission: Literal["send", "admit", "check"],
    delay: float = 0.0,
    checked: JobRecord | None = None,
) -> Channel:
    """INIT, SCHEDULE and offer ``job`` to its channel; the channel, once it took the job.

    ``admission`` says how: ``"send"`` admits and enqueues the first message
    (delayed by ``delay``); ``"admit"`` takes a slot and sends nothing yet
    (:meth:`Channel.dispatch` follows once the row is stored); ``"check"`` only
    asks whether the channel would take a job now: a job held in the store
    takes its slot when the sweep releases it. ``checked``: the job's record made
    (and checked) before the events, which the message carries as the job is
    now (None: the job's record is made again).

    Raises:
        ChannelFullError, ChannelStoppedError: refused; ``job`` is rolled back.
    """
    try:
        job.apply_event(INIT)
        job.apply_event(SCHEDULE)
        channel = channel_of(job.channel_id)
        if admission == "send":
            record = None if checked is None else _scheduled_record(checked, job, job.updated)
            result = channel.offer(job, delay=delay, record=record)
        elif admission == "admit":
            result = channel.admit(job)
        else:
            result = channel.check()
    except BaseException:
        _roll_back(job, before)
        raise
    if result != "ok":
        _roll_back(job, before)
        raise _refusal(channel, result)
    return channel


def _checked_batch(
    jobs: Iterable[Job],
    priority: int | None = None,
    rate_key: str | None = None,
    concurrency_key: str | None = None,
) -> tuple[list[Job], list[JobRecord]]:
    """``jobs`` as a list, each a new job given once, given ``priority``, ``rate_key``
    and ``concurrency_key`` (None: its own), and the record of each, checked; raises
    TypeError or ValueError (the options' typed errors first, before any job is
    changed)."""
    if priority is not None:
        priority = check_priority(priority)
    if rate_key is not None:
        rate_key = check_rate_key(rate_key)
    if concurrency_key is not None:
        concurrency_key = check_concurrency_key(concurrency_key)
    if isinstance(jobs, Job) or not isinstance(jobs, Iterable):
        raise TypeError(f"schedule_many() takes a list of jobs, not {type(jobs).__name__}")
    batch = list(jobs)
    seen: set[str] = set()
    records: list[JobRecord] = []
    for index, job in enumerate(batch):
        if not isinstance(job, Job):
            raise TypeError(f"schedule_many(): item {index} is a {type(job).__name__}, not a Job")
        if job.id in seen:
            raise ValueError(f"schedule_many(): job {job.id} is given twice")
        if job.version:
            raise ValueError(
                f"schedule_many(): job {job.id} was stored before; schedule it with "
                "job.scheduled(), which checks its stored row"
            )
        seen.add(job.id)
    for job in batch:
        if priority is not None:
            job.priority = priority
        job.settle_priority()  # its own, else its first task's, else the default
        if rate_key is not None:
            job.rate_key = rate_key
        elif job.rate_key is not None:
            check_rate_key(job.rate_key)  # set on the job directly: checked as scheduled()'s
        if concurrency_key is not None:
            job.concurrency_key = concurrency_key
        elif job.concurrency_key is not None:
            check_concurrency_key(job.concurrency_key)
        records.append(check_job_record(job.to_record()))  # before any row or message
    return batch, records


def _require_storable_id(job_id: str) -> None:
    """UnknownJobError for an id no job row can hold: no such job can be stored."""
    if not could_be_stored(job_id):
        raise UnknownJobError(job_id)


def _refusal(channel: Channel, answer: SendResult) -> ChannelFullError | ChannelStoppedError:
    """The error of a job ``channel`` refused (``answer`` is "full" or "stopped")."""
    if answer == "full":
        return ChannelFullError(f"channel {channel.id} is full (maxsize {channel.maxsize})")
    return ChannelStoppedError(f"channel {channel.id} is stopped")


def _log_scheduled(job: Job, channel_id: str) -> None:
    """Say that ``job`` is stored Scheduled on ``channel_id`` (a line, the observers)."""
    logger.info(
        "job %s scheduled on %s",
        job.id,
        channel_id,
        extra={"action": "schedule", "job_id": job.id},
    )
    observers.job_scheduled(channel_id)


def _carry(job: Job, trace: Mapping[str, str] | None) -> None:
    """Store the trace context ``trace`` with ``job`` (its row and first message)."""
    if trace:
        job.state = {**job.state, TRACE_KEY: dict(trace)}


def _require_sync() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "Job.scheduled() must be called from sync code; from async code use "
        "await job.scheduled_async() (or apply INIT and SCHEDULE, await "
        "channel.send(job), then job.save())"
    )


#: The engine's job I/O: ``setup()`` installs it as the job methods' I/O
#: (``model.job.runtime``), and the package provides it as the default one.
#: It holds no state of its own.
JOB_IO = JobIO()
