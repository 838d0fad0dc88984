"""The in-process driver: takes jobs from a channel and runs their steps here.

The steps go through the same engine as the Dramatiq driver's
(:mod:`~pypepper_dramatiq.rules.steps` decides, :class:`~pypepper_dramatiq.step_io.StepIO`
records), in the worker's thread: a retry delay is a wait on the job's cancel
event, and ``round_timeout`` is enforced by the workflow's attempt pool.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import weakref
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ...channels.channel import Channel
from ...channels.end_notices import publish_ended
from ...engine import concurrency, rate_limits, step_io, waiting
from ...engine.job_io import JOB_IO
from ...engine.pausing import paused_here, why_held
from ...engine.running import running_here
from ...errors import (
    BrokerUnavailableError,
    CorruptRecordError,
    InvalidTransitionError,
    JobRedeliveryError,
    JobRequeuedError,
    StoreDataError,
    StoreError,
    describe,
    is_retriable,
    retry_may_cure,
)
from ...limits.storable import storable_error
from ...model.context import POSITION_KEY, PROGRESS_REPORTER_KEY
from ...model.job import SAVE_ATTEMPTS, Job
from ...model.task import Task
from ...model.workflow import Workflow
from ...ops import observers
from ...ops.logs import get_logger
from ...records import history
from ...records.progress import ProgressReporter
from ...records.record import JobRecord, utcnow
from ...records.state import counting
from ...rules import steps as rules
from ...rules.events import CANCEL, COMPLETE, FAIL, RUN
from ...rules.start_times import late_retry, missed_deadline
from ...rules.status import Status
from ...stores.registry import get_job_store
from ...transport.base import HeldStart

logger = get_logger(__name__)

#: How often a worker whose channel is empty looks again at the jobs it put aside.
PARK_POLL_SECONDS = 0.05
#: How often a worker waiting for a job's planned start looks whether it was cancelled.
PLANNED_START_POLL_SECONDS = 0.05
#: How long a start waits before asking its channel's rate limit again, when the
#: transport could not be reached (seconds).
RATE_RETRY_SECONDS = 1.0
#: How often a started job whose next task is paused looks whether it was resumed or
#: cancelled (the paused set itself is read at most once a second).
PAUSED_POLL_SECONDS = 0.05


class Worker:
    """Consumes one channel; each job runs RUN -> workflows -> COMPLETE or FAIL."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        #: Jobs taken from the channel that wait for other jobs to end.
        self._parked: list[Job] = []
        #: Jobs taken from the channel while it or their first task is paused, in
        #: the order taken: started in that order once resumed.
        self._held: list[tuple[Job, str | None]] = []
        #: The paused set every held job was last found held by (None: look again).
        self._held_by: frozenset[tuple[str, str]] | None = None
        #: When the put-aside jobs are looked at next (``time.monotonic()``).
        self._next_look = 0.0
        #: Jobs taken from the channel whose first step waits for a slot of its
        #: concurrency limits: the worker goes on with other jobs, and any worker of
        #: the channel in this process starts one once woken or due.
        self._slot_line = _slot_line_of(channel)

    async def run_once(self) -> Job | None:
        """Receive and process one job; None when the channel is stopped and empty.

        A job that waits for other jobs (``after=``, a key holder) is put aside
        while the worker goes on with the next ones, and processed once its
        wait ended; the worker does not return None while one waits.

        Cancelled (``asyncio.wait_for``, ``Task.cancel()``, an application's
        shutdown), it loses no job: one it took and did not start, and the jobs
        put aside, go back on the channel; one started runs on to its recorded
        end in its thread (see :meth:`process`).

        Raises:
            JobRequeuedError: the RUN snapshot did not persist; the job went back
                on the channel.
            JobRedeliveryError: it could not go back either; it was marked Failed.
        """
        try:
            while True:
                job = self._resumed() or self._unparked() or self._slot_due()
                if job is None and (self._parked or self._held or self._slot_line.waits):
                    job = self.channel.take()
                    if job is None:
                        await asyncio.sleep(PARK_POLL_SECONDS)
                        continue
                elif job is None:
                    job = await self.channel.receive()
                    if job is None:
                        return None
                if await self.process(job):
                    return job
        except asyncio.CancelledError:
            held = [job for job, _ in self._held] + self._slot_line.take_all()
            parked, self._parked, self._held = held + self._parked, [], []
            for waiting_job in parked:
                self._put_back(waiting_job)
            raise

    async def run_forever(self) -> None:
        """Process jobs until the channel is stopped and drained.

        Job errors are logged and the loop goes on, except that
        :class:`JobRequeuedError` and a ``full`` :class:`JobRedeliveryError` are
        re-raised at once, and a ``stopped`` one after the leftovers drained.
        """
        deferred: JobRedeliveryError | None = None
        while True:
            try:
                job = await self.run_once()
            except JobRequeuedError:
                raise
            except JobRedeliveryError as exc:
                if exc.reason == "full":
                    raise
                deferred = exc
                continue
            except Exception:
                logger.exception("worker on channel %s: job failed", self.channel.id)
                continue
            if job is None:
                break
        if deferred is not None:
            raise deferred

    async def process(self, job: Job) -> bool:
        """Carry one job through RUN, its steps, and COMPLETE or FAIL.

        Returns False when the job waits for other jobs: it is put aside (see
        :meth:`run_once`) and nothing else happened to it.

        Cancelled while it waits for the job's planned start, the job goes back
        on the channel, unstarted. Once started, the job's steps and its end run
        in a thread of their own, which a cancel does not stop: the job is carried
        to its recorded end there (``asyncio.run`` waits for that thread before
        it returns), and the cancel goes on up at once.
        """
        if job.is_cancelled:
            self._settle_cancelled(job)
            return True
        if job.waits is not None:
            may_start = self._wait_ended(job)
            if may_start is None:
                self._parked.append(job)
                return False
            if not may_start:
                return True
        executor_id = self._first_task(job)
        why = paused_here.holds(job.channel_id, executor_id)
        if why is not None:
            self._held.append((job, executor_id))  # nothing started: taken again once resumed
            observers.start_held(job.channel_id, observers.HELD_BY_PAUSE)
            _log(job, "pause_hold", why)
            return False
        # Planned later: wait for it here (a cancel of the job ends the wait).
        if job.not_before is not None and await self._cancelled_waiting(
            job, _until(job.not_before, job.cancel_event)
        ):
            return True
        if job.start_deadline is not None and job.start_deadline < utcnow():
            self._cancel_overdue(job)
            return True
        slots: concurrency.Slots | None = None
        if concurrency.limited(job.channel_id, job.concurrency_key):
            # A slot under its channel's or key's concurrency limit (its first step's:
            # given back once that step is recorded). Refused, the job is put aside
            # and asks again later, while the worker goes on with other jobs.
            slots = self._slot_or_wait(job)
            if slots is None:
                return False
        handed = False  # once the job's thread has the slots, it gives them back
        try:
            # Its turn under the channel's rate limit, awaited without a thread.
            if rate_limits.limited(job.channel_id, job.rate_key) and await self._cancelled_waiting(
                job, _turn(job)
            ):
                return True
            if not self._start(job):
                return True
            _log(job, "start")
            job.share_cancel_event()
            carried = _Carried(job)
            handed = True
            try:
                await asyncio.to_thread(self._carry, job, carried, slots)
            except asyncio.CancelledError:
                carried.detach()
                raise
        finally:
            if slots is not None and not handed:
                slots.release()
        carried.raise_error()
        return True

    def _carry(self, job: Job, carried: _Carried, slots: concurrency.Slots | None) -> None:
        """In the job's thread: its steps, then its end (its state machine, the end's
        snapshot); an error of this code goes to ``carried``. ``slots``: those its
        first step took already (given back here, whatever happens)."""
        try:
            self._run_to_the_end(job, slots)
        except Exception as exc:
            carried.failed(exc)
        finally:
            if slots is not None:
                slots.release()

    def _run_to_the_end(self, job: Job, slots: concurrency.Slots | None = None) -> None:
        with running_here.holding(job.id, job.cancel_event):
            try:
                ended = self._run_steps(job, slots)
            except step_io.OutcomeNotRecorded as exc:
                # The work is done; only its last write failed: keep the ending
                # the rules decided and retry the snapshot (never re-run).
                logger.warning("job %s: its end could not be recorded: %s", job.id, exc)
                job.follow_progress(exc.record.evolve(version=job.version))
                if exc.record.status is Status.CANCELLED:  # a task cancelled its job
                    job.adopt(exc.record.evolve(version=job.version))
                self._finish(job, exc.record.error, new_end=True)
                return
            except Exception as exc:  # a bug outside the executors
                logger.exception("job %s: its steps could not run to the end", job.id)
                self._finish(job, describe(exc))
                return
        if ended is None:  # cancelled, or the row moved on: follow it
            self._finish(job, None)
            return
        self._ended(job, ended)

    async def _cancelled_waiting(self, job: Job, wait: Coroutine[Any, Any, None]) -> bool:
        """Await ``wait``, the taken ``job`` waiting to start (no thread held): True when
        the job was cancelled meanwhile (settled here). Should the ``run_once`` be
        cancelled instead, the job goes back on the channel."""
        try:
            await wait
        except asyncio.CancelledError:
            self._put_back(job)
            raise
        if _cancelled(job):
            self._settle_cancelled(job)
            return True
        return False

    def _put_back(self, job: Job) -> None:
        """``job`` was taken and not started, and its ``run_once`` was cancelled: it
        goes back on the channel. Should the broker refuse it, its row stays
        Scheduled (with Redis, the recovery sweep sends its message again)."""
        try:
            self.channel.put_back(job)
        except Exception as exc:
            logger.error(
                "job %s: taken from channel %s, not started, and not put back (%s); "
                "its row stays Scheduled",
                job.id,
                self.channel.id,
                exc,
                extra={"action": "put_back_failed", "job_id": job.id},
            )
            return
        _log(job, "put_back")

    def _run_steps(self, job: Job, slots: concurrency.Slots | None = None) -> JobRecord | None:
        """Run the job's steps in this thread through the shared engine.

        Each attempt is recorded in the job row as the Dramatiq driver records
        it (:class:`~pypepper_dramatiq.step_io.StepIO`: results, attempts,
        history, cursor, the rules' decision), so a job's stored state does not
        depend on who ran it. Returns the row once the engine wrote its end
        (Completed or Failed, or Cancelled: by a task, or for a retry picked up
        after the job's start deadline); None when it stopped without (a
        cancel, or a write that lost to another writer).
        """
        tasks = [
            [task.spec(job.channel_id).to_dict() for task in workflow.get_tasks()]
            for workflow in job.workflows
        ]
        record = job.to_record()
        try:
            return self._steps_recorded(job, record, tasks, slots)
        finally:
            if slots is not None:
                slots.release()

    def _steps_recorded(
        self,
        job: Job,
        record: JobRecord,
        tasks: list[list[dict[str, object]]],
        slots: concurrency.Slots | None,
    ) -> JobRecord | None:
        """:meth:`_run_steps` from the job's row: each step under its limits
        (``slots``: the first step's, taken already; later steps take their own)."""
        # A retry starts at its stored cursor, with the results of the tasks before it.
        step = rules.first_step(
            step_io.plan_of(tasks), cancelled=job.is_cancelled, start=step_io.cursor_of(record)
        )
        if step.action is not rules.Action.RUN:
            return None  # nothing to run (or cancelled): the end is written by _finish
        assert step.position is not None
        job.context.results.update(step_io.Claim(record, step.position, tasks).results_by_name())
        book = step_io.StepIO(get_job_store, _IN_PROCESS_OWNER, _IN_PROCESS_LEASE, holds_steps=True)
        first = True  # the first attempt's start was granted before the job started
        while True:
            position = step.position
            assert position is not None
            if step.delay > 0:
                job.cancel_event.wait(step.delay)
            if job.is_cancelled:
                return None
            if not self._unpaused(job, tasks[position.workflow][position.task]):
                return None
            if slots is None:
                slots = _slot_came(job)
                if slots is None:  # cancelled while it waited
                    return None
            try:
                if not first and not _turn_came(job):
                    return None
                first = False
                workflow = job.workflows[position.workflow]
                task = workflow.get_tasks()[position.task]
                now = utcnow()
                if late_retry(record.start_deadline, position.to_list(), now):
                    # Picked up after the job's start deadline: the job ends Cancelled,
                    # as the Dramatiq driver's claim ends it (None: the row moved on).
                    _log(job, "deadline_cancel", task.name)
                    return book.cancel_overdue(record, now, retry_of=task.name)
                claim = step_io.Claim(record, position, tasks)
                traced = observers.observing()
                if traced:
                    observers.attempt_started(
                        record, task.name, position.attempt + 1, position.round + 1
                    )
                try:
                    outcome, recorded = self._attempt_recorded(book, claim, workflow, task, job)
                finally:
                    if traced:
                        observers.attempt_ended(job.id)
            finally:
                slots.release()  # the step is recorded: the next one takes a slot of its own
                slots = None
            if recorded is None:
                return None
            step, record = recorded.decision, recorded.record
            # As recorded: a result the store refused was recorded as a failure.
            if outcome.succeeded and position.key() in (record.state.get("results") or {}):
                job.context.results[task.name] = outcome.result
            if step.action is not rules.Action.RUN:
                return record

    @staticmethod
    def _unpaused(job: Job, task: dict[str, object]) -> bool:
        """Wait in the job's thread while the next task (its stored form) is paused,
        its attempt not started nor counted; True once it may start, False if the job
        was cancelled meanwhile."""
        given = task.get("executor_id")
        executor_id = given if isinstance(given, str) else None
        told = False
        while (why := paused_here.holds(job.channel_id, executor_id)) is not None:
            if not told:
                observers.start_held(job.channel_id, observers.HELD_BY_PAUSE)
                _log(job, "pause_wait", why)
                told = True
            job.cancel_event.wait(PAUSED_POLL_SECONDS)
            if job.is_cancelled:
                return False
        return not job.is_cancelled

    def _attempt_recorded(
        self,
        book: step_io.StepIO,
        claim: step_io.Claim,
        workflow: Workflow,
        task: Task,
        job: Job,
    ) -> tuple[step_io.Outcome, step_io.Recorded | None]:
        """Run the claimed attempt in this thread and record its outcome."""
        position = claim.position
        observers.step_started(job.channel_id, task.name)
        try:
            outcome = _attempt(workflow, task, position, book.progress_reporter(claim))
        finally:
            observers.step_finished(job.channel_id, task.name)
        try:
            return outcome, book.record_outcome(claim, outcome, task=task)
        except step_io.OutcomeNotRecorded as exc:
            if exc.decision.action is not rules.Action.RUN:
                raise
            # Go on: the next write carries this step's progress (same version).
            logger.warning(
                "job %s: outcome of %s not recorded yet (%s); going on",
                job.id,
                position.key(),
                exc,
            )
            return outcome, step_io.Recorded(exc.decision, exc.record)

    def _ended(self, job: Job, ended: JobRecord) -> None:
        """The engine wrote the end: the state machine follows it (no other write)."""
        if ended.status is Status.CANCELLED:
            # A task cancelled its job: the Worker does not cancel, it follows the row.
            job.adopt(ended)
            job.follow_progress(ended)
            _log(job, "end", job.status)
            return
        try:
            job.apply_event(COMPLETE if ended.status is Status.COMPLETED else FAIL)
        except InvalidTransitionError:
            if not _cancelled(job):
                raise
        job.follow_progress(ended)
        _log(job, "end", job.status)

    # -- pauses --------------------------------------------------------------

    @staticmethod
    def _first_task(job: Job) -> str | None:
        """The executor id of ``job``'s first task; read only while something is paused."""
        if not paused_here.current():
            return None
        return step_io.first_executor_id(job.to_record())

    def _resumed(self) -> Job | None:
        """The first held job whose pause is over (or that was cancelled), taken off
        the list; None if none. The list is looked through only when the paused set
        changed since every job on it was found held (or one was cancelled)."""
        if not self._held:
            return None
        pairs = paused_here.current()
        for n, (job, executor_id) in enumerate(self._held):
            if job.is_cancelled or (
                pairs != self._held_by and why_held(pairs, job.channel_id, executor_id) is None
            ):
                del self._held[n]
                return job
        self._held_by = pairs
        return None

    # -- concurrency limits ---------------------------------------------------

    def _slot_or_wait(self, job: Job) -> concurrency.Slots | None:
        """The slots of the first step of ``job`` now; None when a limit is reached:
        the job is put aside until its next ask (:func:`_try_slot`), its first
        refusal logged."""
        line = self._slot_line
        with line.lock:
            holds = line.holds.pop(job.id, 0)
        slots, wait = _try_slot(job, holds)
        if slots is not None:
            concurrency.woken.take(job.id)  # woken too: nothing left to wake
            return slots
        if not holds:
            _log(job, "concurrency_hold")
        with line.lock:
            line.waits.append(_SlotWait(job, holds + 1, time.monotonic() + wait))
        return None

    def _slot_due(self) -> Job | None:
        """The put-aside job to ask for its slots now (woken by a released slot, due to
        ask again, or cancelled), taken off the list: of those, the highest priority,
        then the first taken."""
        line = self._slot_line
        if not line.waits:
            return None
        with line.lock:
            waits = line.waits
            for wait in waits:
                if concurrency.woken.take(wait.job.id):
                    wait.due = 0.0
            now = time.monotonic()
            due = [n for n, wait in enumerate(waits) if wait.due <= now or wait.job.is_cancelled]
            if not due:
                return None
            n = min(due, key=lambda n: (-waits[n].job.priority, n))
            wait = waits.pop(n)
            line.holds[wait.job.id] = wait.holds
            return wait.job

    # -- waits --------------------------------------------------------------

    def _unparked(self) -> Job | None:
        """A put-aside job that no longer waits (or was cancelled), taken off the list.

        The put-aside jobs' rows are read at most every :data:`PARK_POLL_SECONDS`
        (not before each job the worker takes), and again at once after one was found.
        """
        if not self._parked or time.monotonic() < self._next_look:
            return None
        self._next_look = time.monotonic() + PARK_POLL_SECONDS
        for job in list(self._parked):
            if job.is_cancelled:
                self._parked.remove(job)
                self._next_look = 0.0
                return job
            ended = self._wait_ended(job)
            if ended is not None:
                self._parked.remove(job)
                if ended:
                    self._next_look = 0.0  # others may be ready too
                    return job
        return None

    def _wait_ended(self, job: Job) -> bool | None:
        """Settle the wait of ``job`` through the shared engine.

        None: it still waits. True: it may start (its row holds its parents'
        results and the key it waited for). False: the wait ended it (a parent
        failed or was cancelled, by ``on_parent_failure``; or it was cancelled).
        """
        store = get_job_store()
        try:
            record = store.get(job.id)
            if record is None or record.status is not Status.SCHEDULED:
                if record is not None:
                    job.adopt(record)
                    job.error = record.error
                    _log(job, "follow_durable", record.status)
                    _count_end(record)
                return record is None
            outcome, record = waiting.settle(store, record)
        except StoreError as exc:
            logger.warning("job %s: its wait could not be settled (%s); later", job.id, exc)
            return None
        if outcome in (waiting.Settled.WAITING, waiting.Settled.LOST):
            return None
        if outcome is not waiting.Settled.RELEASED:
            job.adopt(record)
            job.error = record.error
            _log(job, "parent_failed", record.status)
            return False
        job.adopt_version(record)
        job.waits, job.unique_key = None, record.unique_key
        return True

    # -- steps --------------------------------------------------------------

    def _cancel_overdue(self, job: Job) -> None:
        """The job was not started by its start deadline: it ends Cancelled, unrun."""
        assert job.start_deadline is not None
        job.apply_event(CANCEL)
        job.cancel_event.set()
        job.error = missed_deadline(job.start_deadline, utcnow())
        job.state = counting(job.state)  # told below: no sweep leader counts it again
        _log(job, "deadline_cancel")
        written = JOB_IO.persist_own(job, SAVE_ATTEMPTS)
        if written is not None:
            # Told only if this write ended it (not a cancel stored meanwhile).
            if written and observers.observing():
                record = job.to_record()
                observers.deadline_missed(record)
                observers.job_ended(record)
            publish_ended(job.id)

    def _settle_cancelled(self, job: Job) -> None:
        """Skip a cancelled job; make sure Cancelled is stored."""
        _log(job, "skip_cancelled")
        try:
            durable = get_job_store().get(job.id)
        except StoreError:
            durable = None
        if durable is None or durable.status is not Status.CANCELLED:
            job.persist()
        else:
            _count_end(durable)

    def _start(self, job: Job) -> bool:
        """Heal, follow the durable row, RUN and persist it; True if work may start."""
        before = job.status
        store = get_job_store()
        try:
            durable = store.get(job.id)
            if durable is None and not store.was_purged(job.id):
                # The Dramatiq driver's heal (pypepper.scheduler's rule: persist Scheduled first).
                durable = step_io.store_missing_row(store, job.to_record())
                if durable is not None:
                    _log(job, "heal")
            if durable is None:
                # Retention deleted the job (it had ended) while this copy was away
                # from the channel, before or during the heal (the store refuses a
                # purged id): it is not run again (the Dramatiq driver's drop).
                _log(job, "drop_purged")
                return False
            if durable.status is not Status.SCHEDULED:
                _log(job, "follow_durable", durable.status)
                job.adopt(durable)
                _count_end(durable)
                return False
            elif durable.version != job.version:
                job.version = durable.version
        except CorruptRecordError as exc:
            # Retrying cannot mend the row, and writing this job over it would
            # hide what a person must see: the job is dropped, the row left as is.
            logger.error("job %s: not run, its stored row cannot be read: %s", job.id, exc)
            return False
        except StoreError as exc:
            if not retry_may_cure(exc):
                return self._refused(job, exc)
            logger.warning("job %s: store failed before RUN: %s", job.id, exc)
            return self._start_failed(job, before)

        job.apply_event(RUN)
        try:
            if job.save():
                if observers.observing():
                    observers.job_started(job.to_record(), utcnow())
                return True
            durable = store.get(job.id)
        except StoreError as exc:
            if not retry_may_cure(exc):
                return self._refused(job, exc)
            logger.warning("job %s: RUN snapshot failed: %s", job.id, exc)
            return self._start_failed(job, before)
        if durable is not None and durable.status in (
            Status.IN_PROGRESS,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
        ):
            _log(job, "follow_durable", durable.status)
            job.adopt(durable)
            return False
        return self._start_failed(job, before)

    def _refused(self, job: Job, exc: StoreError) -> bool:
        """The store refused the job's row for its content (a data error), or the
        row cannot be read (damaged): another try, or the channel again, would meet
        the same. The job fails unstarted, its error naming why; False (no work).

        The end is written only over a refused write (a damaged row is left as it
        is, for whoever looks at it)."""
        logger.error(
            "job %s: the job store refused its row (%s); it fails unstarted",
            job.id,
            exc,
            extra={"action": "start_refused", "job_id": job.id},
        )
        refused = exc if isinstance(exc, StoreDataError) else None  # else damaged
        if _status(job) is Status.CANCELLED:
            if refused is not None:
                job.persist()
            return False
        job.apply_event(FAIL)
        # The database's words, not its URL.
        reason = str(exc) if refused is None else refused.reason
        job.error = storable_error(f"the job store refused the job's row: {reason}")
        _mark_end(job)
        if refused is not None and job.persist():
            _observe_end(job)
        return False

    def _start_failed(self, job: Job, before: Status) -> bool:
        """The RUN persist-failure path of pypepper's scheduler. Returns False or raises."""
        if _status(job) is Status.CANCELLED:
            job.persist()
            return False
        try:
            job.apply_event(FAIL)
        except InvalidTransitionError:
            if _status(job) is Status.CANCELLED:  # a cancel won the race
                job.persist()
                return False
            raise
        job.error = "the RUN snapshot could not be persisted"
        _mark_end(job)
        if job.persist():
            _log(job, "fail_unpersisted_run")
            _observe_end(job)
            return False
        job.restore_status(before)
        job.error = None
        result = self.channel.offer(job)
        if result == "ok":
            _log(job, "requeue")
            raise JobRequeuedError(job)
        job.apply_event(FAIL)
        job.error = f"could not be re-enqueued: channel {result}"
        job.persist()
        _log(job, "redelivery_failed", result)
        raise JobRedeliveryError(job, result)

    def _finish(self, job: Job, error: str | None, *, new_end: bool | None = None) -> None:
        """COMPLETE or FAIL, unless cancelled; then persist (retried, never re-run).

        ``new_end``: whether this write is the job's end for the observers (None:
        unless the job was cancelled already, which the cancel reported).
        """
        if new_end is None:
            new_end = not job.is_cancelled
        if not job.is_cancelled:
            try:
                job.apply_event(FAIL if error else COMPLETE)
                # The job's error column: an exception's text (a bug's), made storable.
                job.error = None if error is None else storable_error(error)
            except InvalidTransitionError:
                if not _cancelled(job):
                    raise
        _log(job, "end", job.status)
        if new_end:
            _mark_end(job)
        if job.persist():
            if new_end:
                _observe_end(job)
            return
        durable = _stored(job.id)
        if durable is not None and durable.status is Status.CANCELLED:
            # Cancelled by id (Job.cancel_saved) while it ran: follow the row.
            _log(job, "follow_durable", durable.status)
            job.adopt(durable)
            _count_end(durable)
            return
        logger.error("job %s ended %s but the snapshot did not persist", job.id, job.status)


#: Who holds the steps an in-process Worker runs, as the job row names it.
_IN_PROCESS_OWNER = f"{socket.gethostname()}:{os.getpid()}:in-process"
#: Unused by the in-process driver (it holds its steps without expiry), but the
#: ledger needs one.
_IN_PROCESS_LEASE = 30.0


class _Carried:
    """A started job's thread and the ``run_once`` that awaits it: an error of the
    thread is raised by ``run_once`` (as before it ran in a thread), or logged by
    whichever of the two comes last once ``run_once`` was cancelled."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._lock = threading.Lock()
        self._detached = False
        self._error: Exception | None = None

    def failed(self, exc: Exception) -> None:
        """In the thread: the job's own code (not a task's) raised ``exc``."""
        with self._lock:
            if not self._detached:
                self._error = exc
                return
        self._log(exc)

    def detach(self) -> None:
        """In ``run_once``, cancelled: the thread goes on alone."""
        with self._lock:
            self._detached = True
            error, self._error = self._error, None
        logger.info(
            "job %s: cancelled while the job runs; its thread carries it to its end",
            self._job.id,
            extra={"action": "carried_on", "job_id": self._job.id},
        )
        if error is not None:
            self._log(error)

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _log(self, exc: Exception) -> None:
        logger.error(
            "job %s: failed after its run_once was cancelled: %s",
            self._job.id,
            describe(exc),
            exc_info=exc,
            extra={"action": "carried_failed", "job_id": self._job.id},
        )


async def _until(when: datetime, cancel: threading.Event) -> None:
    """Wait until ``when``, or until ``cancel`` is set; no thread is held, so a
    cancel of the waiting coroutine leaves nothing behind."""
    while not cancel.is_set():
        left = (when - utcnow()).total_seconds()
        if left <= 0:
            return
        await asyncio.sleep(min(left, PLANNED_START_POLL_SECONDS))


async def _turn(job: Job) -> None:
    """Wait, no thread held, until the job's first attempt may start under its channel's
    rate limit (asking again when the limiter says; every :data:`RATE_RETRY_SECONDS`
    while the transport is out of reach); returns early when the job is cancelled."""
    told = False
    while not job.is_cancelled:
        wait = _start_or_wait(job, told)
        if wait <= 0:
            return
        told = True
        await _until(utcnow() + timedelta(seconds=wait), job.cancel_event)


def _turn_came(job: Job) -> bool:
    """In the job's thread: wait until its next attempt may start under its channel's
    rate limit; True once it may, False if the job was cancelled meanwhile."""
    told = False
    while rate_limits.limited(job.channel_id, job.rate_key) and not job.is_cancelled:
        wait = _start_or_wait(job, told)
        if wait <= 0:
            break
        told = True
        job.cancel_event.wait(wait)
    return not job.is_cancelled


def _start_or_wait(job: Job, told: bool = False) -> float:
    """:func:`rate_limits.start_or_wait` for the job's channel (``told``: it was told a
    time already, and asks at it); a transport out of reach (logged) waits
    :data:`RATE_RETRY_SECONDS`. A wait is a start held: counted each time, logged the
    first (not ``told``), here for both ways of waiting for the turn."""
    try:
        wait = rate_limits.start_or_wait(job.channel_id, job.rate_key, told)
    except BrokerUnavailableError as exc:
        logger.warning("job %s: its channel's rate limit could not be asked: %s", job.id, exc)
        wait = RATE_RETRY_SECONDS
    if wait > 0:
        observers.start_held(job.channel_id, observers.HELD_BY_RATE_LIMIT)
        if not told:
            _log(job, "rate_hold", f"{wait:.3f}s")
    return wait


class _SlotLine:
    """The jobs of one channel put aside by its Workers in this process until they ask
    for their slots again, in the order taken: shared, so that a worker whose own jobs
    are done starts one a released slot woke rather than wait for a new job."""

    def __init__(self) -> None:
        self.waits: list[_SlotWait] = []
        #: The refusals of a put-aside job asking again (it asks less often each time).
        self.holds: dict[str, int] = {}
        self.lock = threading.Lock()

    def take_all(self) -> list[Job]:
        """Every job put aside, taken off the line (a worker cancelled puts them back
        on the channel)."""
        with self.lock:
            jobs = [wait.job for wait in self.waits]
            self.waits = []
            return jobs


#: Each channel's line of put-aside jobs, while the channel is in use.
_slot_lines: weakref.WeakKeyDictionary[Channel, _SlotLine] = weakref.WeakKeyDictionary()
_slot_lines_lock = threading.Lock()


def _slot_line_of(channel: Channel) -> _SlotLine:
    """``channel``'s line of put-aside jobs (made on first use)."""
    with _slot_lines_lock:
        line = _slot_lines.get(channel)
        if line is None:
            line = _slot_lines[channel] = _SlotLine()
        return line


@dataclass
class _SlotWait:
    """A job put aside until it asks for its slots again."""

    job: Job
    #: Its refusals so far.
    holds: int
    #: When it asks again (``time.monotonic()``).
    due: float


def _slot_came(job: Job) -> concurrency.Slots | None:
    """In the job's thread: wait until its next step may run under its concurrency
    limits (:func:`_slot_tries`): its slots (empty ones when it is under none); None if
    the job was cancelled meanwhile."""
    for slots, wait in _slot_tries(job):
        if slots is not None:
            concurrency.woken.take(job.id)  # woken too: nothing left to wake
            return slots
        concurrency.woken.wait(job.id, wait)  # a released slot wakes it sooner
    return None


def _slot_tries(job: Job) -> Iterator[tuple[concurrency.Slots | None, float]]:
    """The job's asks for its slots until it has them or is cancelled: (its slots, 0)
    last, or (None, the seconds to wait before asking again) after a refusal
    (:func:`~pypepper_dramatiq.engine.concurrency.hold_seconds`; every
    :data:`RATE_RETRY_SECONDS` while the transport is out of reach). Its first
    refusal is logged."""
    holds = 0
    while not job.is_cancelled:
        slots, wait = _try_slot(job, holds)
        if slots is not None:
            yield slots, 0.0
            return
        if not holds:
            _log(job, "concurrency_hold")
        holds += 1
        yield None, wait


def _try_slot(job: Job, holds: int) -> tuple[concurrency.Slots | None, float]:
    """The job's slots now, or None and how long to wait before asking again, after
    ``holds`` refusals (a transport out of reach, logged: :data:`RATE_RETRY_SECONDS`)."""
    try:
        slots = concurrency.try_start(
            job.channel_id,
            job.concurrency_key,
            job.id,
            _IN_PROCESS_OWNER,
            _IN_PROCESS_LEASE,
            HeldStart(job.id, job.priority),
        )
    except BrokerUnavailableError as exc:
        logger.warning("job %s: its concurrency limit could not be asked: %s", job.id, exc)
        return None, RATE_RETRY_SECONDS
    if slots is None:
        observers.start_held(job.channel_id, observers.HELD_BY_CONCURRENCY)
    return slots, concurrency.hold_seconds(holds)


def _attempt(
    workflow: Workflow, task: Task, position: rules.Position, reporter: ProgressReporter
) -> step_io.Outcome:
    """One attempt in this thread, under the workflow's ``round_timeout`` pool;
    the task reports its progress to ``reporter`` (its last value goes with the
    outcome, for the write that records the attempt).

    The task's context gets the attempt's position, as the Dramatiq driver's
    step actor gives it (``context.idempotency_key`` is read from it); it stays
    there for the task's ``on_final_failure`` hook, called after the attempt.
    """
    started = utcnow()
    values = task.context.context
    values[POSITION_KEY] = position.to_list()
    values[PROGRESS_REPORTER_KEY] = reporter
    try:
        succeeded, value = workflow.attempt(task)
    finally:
        progress = reporter.close()
        if values.get(PROGRESS_REPORTER_KEY) is reporter:
            del values[PROGRESS_REPORTER_KEY]
    if succeeded:
        return step_io.Outcome(True, value, started=started, ended=utcnow(), progress=progress)
    error = value if isinstance(value, BaseException) else RuntimeError(str(value))
    outcome = step_io.Outcome.failure(
        error, retriable=is_retriable(error), kind=history.kind_of(error), started=started
    )
    return outcome if progress is None else replace(outcome, progress=progress)


#: What each of this worker's lines says after "job <id>", as a sentence; ``{detail}`` is
#: the call's detail (a status, a channel's answer).
_WORDS = {
    "start": " started",
    "follow_durable": ": its stored row says {detail}; this worker follows it",
    "parent_failed": ": its wait ended without a release; its stored row says {detail}",
    "deadline_cancel": " cancelled: {error}",
    "skip_cancelled": " was cancelled before it ran: skipped",
    "heal": ": its row was not stored yet; stored it as scheduled",
    "drop_purged": step_io.PURGED_WORDS,
    "fail_unpersisted_run": " failed: {error}",
    "requeue": " was put back in its channel's queue",
    "redelivery_failed": " failed: {error}",
    "pause_hold": ": {detail}; held unstarted until it is resumed",
    "pause_wait": ": {detail}; its next task waits, unstarted, until it is resumed",
    "concurrency_hold": ": a concurrency limit is reached; held unstarted until a slot frees",
}


def _log(job: Job, action: str, detail: object = None) -> None:
    """One line of this worker about ``job``: a sentence for people (see :data:`_WORDS`;
    an ``end`` says how the job ended, with its error), ``action``, ``job_id`` and
    ``status`` in the record's fields for programs."""
    if action == "end":
        status = str(detail if detail is not None else job.status.value)
        why = f": {job.error}" if job.error and job.status is not Status.COMPLETED else ""
        words = f" {status.lower()}{why}"
    else:
        words = _WORDS.get(action, f" {action}").format(detail=detail, error=job.error)
    logger.info(
        "job %s%s",
        job.id,
        words,
        extra={"action": action, "job_id": job.id, "status": job.status.value},
    )


def _mark_end(job: Job) -> None:
    """Mark the Failed end this worker is about to write counted when it tells the
    observers (told by ``_observe_end`` after the write), so that no sweep leader
    counts it again; other ends are left as they are."""
    if job.status is Status.FAILED:
        job.state = counting(job.state)


def _observe_end(job: Job) -> None:
    """Tell the observers of an end this worker wrote as a snapshot."""
    if observers.observing():
        observers.job_ended(job.to_record())


def _count_end(record: JobRecord) -> None:
    """Count the end of a job found Cancelled in the store, if its canceller did not
    (a process without metrics), as the Dramatiq driver's worker meeting it does:
    the in-process driver has no sweep to count it later. Never raises."""
    book = step_io.StepIO(get_job_store, _IN_PROCESS_OWNER, _IN_PROCESS_LEASE, holds_steps=True)
    try:
        book.count_end(record)
    except StoreError as exc:
        logger.warning("job %s: its end was not counted (%s)", record.id, exc)


def _stored(job_id: str) -> JobRecord | None:
    try:
        return get_job_store().get(job_id)
    except StoreError:
        return None


def _cancelled(job: Job) -> bool:
    # Read through a call: another thread may cancel the job at any moment.
    return job.is_cancelled


def _status(job: Job) -> Status:
    return job.status
