"""The distributed driver's bookkeeping: claim a step, then record how it ended.

One message runs one attempt of one task. Before the attempt the worker
*claims* the step with a compare-and-set on the job row (the cursor must
match the message, the lease must be free); after it, the worker *records*
the outcome and the next position that :mod:`~pypepper_dramatiq.rules.steps`
decides, again with compare-and-set. A stale or duplicate message fails the
claim and is acknowledged without running user code.

What an outcome's write holds and what must follow it is decided, without I/O,
by :mod:`~pypepper_dramatiq.engine.outcomes`; :meth:`StepIO.record_outcome` is the
shell that writes it, decides again over a fresher row when only its hooks
moved, and performs the effects (observers, notices, hooks, the held step).

The row's ``state`` is :class:`~pypepper_dramatiq.records.state.JobState`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, NoReturn, TypeGuard, overload

from ..channels.end_notices import publish_ended
from ..channels.messages import StepMessage
from ..errors import StoreDataError, StoreError, retry_may_cure
from ..model.task import Task
from ..ops import observers
from ..ops.group_commit import Combiner, in_rounds
from ..ops.logs import get_logger
from ..records import history
from ..records.pauses import PAUSED_UNTIL, held_for_pause
from ..records.progress import ProgressReporter
from ..records.record import JobRecord, utcnow
from ..records.spec import TaskSpec
from ..records.state import MARKED_ENDS, JobState, counting, is_counted, mark_counted
from ..rules import steps as rules
from ..rules.events import CANCEL, COMPLETE, RUN, transition
from ..rules.start_times import missed_deadline
from ..rules.status import Status
from ..rules.steps import Position, RetryPolicy
from ..settings import Settings
from ..stores.base import IJobStore, StepClaim, retry_past_deadline, why_not_claimable
from . import hooks, outcomes
from .job_io import publish_cancel
from .outcomes import Outcome as Outcome
from .pausing import PausedSet, paused_here, why_held
from .running import running_here

logger = get_logger(__name__)

#: How often the message of a waiting job (sent at once, without Redis) comes back.
WAIT_POLL_SECONDS = 0.5
#: Reads of a row a claim may take when its Scheduled row keeps changing under it.
CLAIM_ATTEMPTS = 3
#: Tries of an outcome's write over a row whose hooks other writers keep changing.
REBASE_ATTEMPTS = 5


class StepSkipped(Exception):
    """The message must be acknowledged without running: stale, duplicate, or job ended."""

    def __init__(
        self,
        job_id: str,
        reason: str,
        *,
        dead: bool = False,
        retry_at: datetime | None = None,
    ) -> None:
        super().__init__(f"job {job_id}: {reason}")
        self.job_id = job_id
        self.reason = reason
        #: The message can never run (unknown job, no stored workflows): dead-letter it.
        self.dead = dead
        #: The job may not start yet: send the message again to arrive at this time.
        self.retry_at = retry_at


@dataclass(frozen=True)
class Claim:
    """A step this worker holds: the row as stored after the claim, and the plan."""

    record: JobRecord
    position: Position
    tasks: list[list[dict[str, Any]]]

    # Read several times per step (the rules, the hooks, the observers): parsed once.
    @cached_property
    def plan(self) -> list[Policies]:
        plan = plan_of(self.tasks)
        workflow, task = self.position.workflow, self.position.task
        if 0 <= workflow < len(plan) and 0 <= task < len(plan[workflow]):
            # The step's own table from the spec the claim parses anyway: one parse.
            plan[workflow].keep(task, self.spec.policy)
        return plan

    @property
    def task(self) -> dict[str, Any]:
        return self.tasks[self.position.workflow][self.position.task]

    @cached_property
    def spec(self) -> TaskSpec:
        """The stored form of the task this step runs."""
        return TaskSpec.from_dict(self.task)

    def results_by_name(self) -> dict[str, Any]:
        """Results of finished tasks of this job, by task name."""
        results = self.record.state.get("results") or {}
        named: dict[str, Any] = {}
        for w, workflow in enumerate(self.tasks):
            for t, task in enumerate(workflow):
                key = f"{w}.{t}"
                if key in results:
                    named[TaskSpec.from_dict(task).name] = results[key]
        return named


class OutcomeNotRecorded(StoreError):
    """The store failed the write that records an outcome (after retries).

    Carries what the rules decided and the row as it would have been written
    (its version unchanged), so that a driver that runs the next step itself
    can go on and let a later write carry this one's progress.
    """

    def __init__(self, cause: StoreError, decision: rules.Step, record: JobRecord) -> None:
        super().__init__(str(cause))
        self.decision = decision
        self.record = record


@dataclass(frozen=True)
class Recorded:
    """An outcome as written: what the rules decided next, and the row as it now is."""

    decision: rules.Step
    record: JobRecord


class Policies(Sequence[RetryPolicy]):
    """One workflow's retry tables, each built from its stored task when first read.

    The rules read one task's table per step; building every table of a long
    workflow on each step made the per-task cost grow with the workflow.
    """

    def __init__(self, tasks: Sequence[dict[str, Any]]) -> None:
        self._tasks = tasks
        self._built: dict[int, RetryPolicy] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def keep(self, index: int, policy: RetryPolicy) -> None:
        """Take ``policy`` as task ``index``'s table (built from its task already)."""
        self._built[index] = policy

    @overload
    def __getitem__(self, index: int) -> RetryPolicy: ...

    @overload
    def __getitem__(self, index: slice) -> list[RetryPolicy]: ...

    def __getitem__(self, index: int | slice) -> RetryPolicy | list[RetryPolicy]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self._tasks))[index]]
        if index < 0:
            index += len(self._tasks)
            if index < 0:
                raise IndexError("workflow task index out of range")
        policy = self._built.get(index)
        if policy is None:
            policy = self._built[index] = policy_of(self._tasks[index])
        return policy


def plan_of(tasks: Sequence[Sequence[dict[str, Any]]]) -> list[Policies]:
    """The plan of a stored job's workflows (task dicts), for :mod:`rules`."""
    return [Policies(workflow) for workflow in tasks]


def policy_of(task: dict[str, Any]) -> RetryPolicy:
    return TaskSpec.from_dict(task).policy


def store_missing_row(store: IJobStore, scheduled: JobRecord) -> JobRecord | None:
    """Write the Scheduled row its producer could not, and return the row as stored.

    ``scheduled`` is the job as its producer scheduled it (the first message's
    record, or the in-process worker's Job). If another writer stored the row
    first, theirs is returned (it may have moved on). None when retention
    deleted the job meanwhile (it ran and ended since the caller found no
    row): the store never inserts a purged id again, and the message is dropped.

    Raises:
        StoreError: the store failed, or the row cannot be read back.
    """
    inserted = store.put(scheduled.evolve(version=0))  # False: stored first, or purged
    record = store.get(scheduled.id)
    if record is None:
        if not inserted and store.was_purged(scheduled.id):
            return None
        raise StoreError(f"job {scheduled.id}: the healed row cannot be read back")
    return record


def first_executor_id(record: JobRecord) -> str | None:
    """The executor id of the task a job's first step runs (None: none known)."""
    if record.payload is None:
        return None
    tasks = [w.get("tasks", []) for w in record.payload.get("workflows", [])]
    first = rules.first_step(plan_of(tasks), start=cursor_of(record))
    if first.position is None:
        return None
    return TaskSpec.from_dict(tasks[first.position.workflow][first.position.task]).executor_id


def cursor_of(record: JobRecord) -> Position | None:
    cursor = record.state.get("cursor")  # only the cursor: no need to parse the rest
    return Position.from_list(cursor) if cursor else None


def _step_held_by(
    record: JobRecord | None, position: Position, owner: str | None
) -> TypeGuard[JobRecord]:
    """Whether ``record`` still stands InProgress at ``position`` with its lease held by
    ``owner`` (None: by nobody): what a write over a step taken earlier checks first."""
    return (
        record is not None
        and record.status is Status.IN_PROGRESS
        and record.lease_owner == owner
        and cursor_of(record) == position
    )


class StepIO:
    """Claims and records steps in the job store for one worker process.

    Args:
        store: returns the job store (read at each call, so reconfiguration applies).
        owner: this process's lease owner id.
        lease_seconds: how long a claimed step stays reserved without
            renewal before recovery may hand it to another worker.
        write_attempts: tries for the write that records an outcome.
        dispatch_seconds: how long the next step's message may wait in its
            queue (after its delay) before recovery sends it again; longer
            than a lease, since a message may wait behind a backlog.
        holds_steps: the caller runs the next step itself, in this thread (the
            in-process driver): the recorded row keeps it, owned by ``owner``
            with no expiry, so that no recovery sweep sends it elsewhere.
    """

    def __init__(
        self,
        store: Callable[[], IJobStore],
        owner: str,
        lease_seconds: float,
        write_attempts: int = 5,
        dispatch_seconds: float | None = None,
        *,
        holds_steps: bool = False,
    ) -> None:
        self._store = store
        self.owner = owner
        self.holds_steps = holds_steps
        self.lease_seconds = lease_seconds
        self.write_attempts = write_attempts
        self.dispatch_seconds = Settings(
            lease_seconds=lease_seconds, dispatch_seconds=dispatch_seconds
        ).next_step_dispatch_seconds
        #: Calls the ``on_final_failure`` hooks of the failures this book records.
        self.hooks = hooks.HookRunner(store)
        #: Group commit: the claims of this process's threads, coalesced into one
        #: store call per batch (:mod:`..ops.group_commit`); each thread its own answer.
        self.claims: Combiner[StepClaim, JobRecord | None] = Combiner(self._claim_batch)
        #: The same for the writes that record outcomes.
        self.outcomes: Combiner[JobRecord, bool] = Combiner(self._outcome_batch)
        #: The paused channels and tasks, read at most once a second.
        self.pauses: PausedSet = paused_here

    # -- before the attempt ----------------------------------------------------

    def claim(self, step: StepMessage) -> Claim:
        """Take the step for this worker.

        Raises:
            StepSkipped: stale, duplicate, or the job ended (ack without running).
            StoreError: the store failed (the caller defers the message).
        """
        store = self._store()
        if step.record is not None:
            self._hold_first_if_paused(store, step)
        fast = self._claim_in_one_write(store, step)
        if fast is not None:
            return self._unless_paused(store, fast)
        # A Scheduled row may be rewritten by its producer (its own Scheduled
        # write, racing our heal) between our read and our write: read again.
        for _ in range(CLAIM_ATTEMPTS):
            record = store.get(step.job_id)
            if record is None:
                record = self._heal(store, step)
            claimed, position, tasks = self._claimable(record, step)
            if store.advance(claimed):
                claim = Claim(claimed.evolve(version=claimed.version + 1), position, tasks)
                _log_claim(claim, started=record.status is Status.SCHEDULED)
                if record.status is Status.SCHEDULED:
                    observers.job_started(claimed, claimed.updated)
                return self._unless_paused(store, claim)
            if record.status is not Status.SCHEDULED:
                break
        raise StepSkipped(step.job_id, "another worker claimed the step first")

    # -- paused channels and tasks ------------------------------------------------

    def _hold_first_if_paused(self, store: IJobStore, step: StepMessage) -> None:
        """A job's first message while its channel or first task is paused: its
        Scheduled row is held in the store (``release_at`` = ``PAUSED_UNTIL``), unrun,
        and StepSkipped raised (the message is acknowledged, its channel slot given
        back; resuming releases the row). Returns when nothing holds it; the store
        is read only when the paused set (read at most once a second) names it."""
        assert step.record is not None
        if not self.pauses.current():
            return  # nothing paused: no work per step
        executor_id = first_executor_id(step.record)
        why = self.pauses.holds(step.record.channel_id, executor_id)
        if why is None:
            return
        # The producer may still be writing its Scheduled row (a plain job is sent,
        # then stored): read again while it moves under the hold.
        for _ in range(CLAIM_ATTEMPTS):
            record = store.get(step.job_id)
            if record is None:
                record = self._heal(store, step)
            if record.status is not Status.SCHEDULED or record.waiting_since is not None:
                return  # the ordinary claim decides (ended, started, waiting)
            if held_for_pause(record.release_at):
                break  # held already (a duplicate message)
            # A row held for a time whose release is being marked is held all the
            # same: the sweep's mark then loses its compare-and-set, as it should.
            held = record.evolve(release_at=PAUSED_UNTIL, updated=utcnow())
            if store.advance(held):
                self._unless_resumed(store, held.evolve(version=held.version + 1), executor_id)
                break
        else:
            return  # the row kept moving: the claim holds the step (_unless_paused)
        observers.start_held(step.record.channel_id, observers.HELD_BY_PAUSE)
        _log("pause_hold", step.job_id, step.position, " held unrun: %s", why)
        raise StepSkipped(step.job_id, f"held: {why}")

    def _unless_paused(self, store: IJobStore, claim: Claim) -> Claim:
        """``claim``, unless its channel or task is paused: then the step is handed
        back unrun (no attempt counted) and held in the store (a free lease expiring
        at ``PAUSED_UNTIL``, which no recovery reaches) until resumed; StepSkipped."""
        why = self.pauses.holds(claim.record.channel_id, claim.spec.executor_id)
        if why is None:
            return claim
        held = claim.record.evolve(updated=utcnow(), lease_owner=None, lease_expires=PAUSED_UNTIL)
        if store.advance(held):
            written = held.evolve(version=held.version + 1)
            self._unless_resumed(store, written, claim.spec.executor_id)
        observers.start_held(claim.record.channel_id, observers.HELD_BY_PAUSE)
        _log("pause_hold", claim.record.id, claim.position, " held unrun: %s", why)
        raise StepSkipped(claim.record.id, f"held: {why}")

    def _unless_resumed(self, store: IJobStore, held: JobRecord, executor_id: str | None) -> None:
        """After holding ``held``: read the paused set afresh, and release the row at
        once if its pause is gone (this process's copy was up to a second old: a
        resume in between released the held rows before this one was held)."""
        try:
            if why_held(store.paused(), held.channel_id, executor_id) is not None:
                return  # a resume from now on finds the row held
            if held.status is Status.SCHEDULED:
                store.advance(held.evolve(release_at=held.created))
            else:
                store.advance(held.evolve(lease_expires=held.created))
        except StoreError as exc:
            logger.warning(
                "job %s: held for a pause, not checked against a resume (%s); "
                "the next resume releases it",
                held.id,
                exc,
            )

    def _claim_in_one_write(self, store: IJobStore, step: StepMessage) -> Claim | None:
        """The common case, one statement: the row is at the message's step and free.

        None when it is not (or the first position is unknown here): the caller
        then reads the row to learn why, heals it, or skips the message.
        """
        asked = self._one_write_request(step)
        if asked is None:
            return None
        return self._claimed(self.claims.submit(asked[0]), asked[1], asked[0])

    def claim_ahead(self, steps: Sequence[StepMessage]) -> list[Claim | StoreError | None]:
        """Claim ``steps`` (the step messages of one fetch) in one store call, before
        any thread runs them; one answer per step, in order.

        An answer is None wherever the one-write claim did not take the step (not at
        its cursor or not free, a first position unknown here, the store refused
        its row, or something is paused now): that message then takes the ordinary
        path in its thread (:meth:`claim`), which reads the row to learn why, heals
        it, holds it for its pause or dead-letters it, as it does for any message.
        It is the error where the store could not be reached (an outage a retry may
        cure): its thread defers the message without asking the store again.
        """
        answers: list[Claim | StoreError | None] = [None] * len(steps)
        if not steps or self.pauses.current():
            return answers  # a pause holds steps with writes of their own: the ordinary path
        asked = [(n, self._one_write_request(step)) for n, step in enumerate(steps)]
        chosen = [(n, request) for n, request in asked if request is not None]
        if not chosen:
            return answers
        records = self._claim_batch([request[0] for _, request in chosen])
        for (n, request), record in zip(chosen, records, strict=True):
            if isinstance(record, StoreError) and retry_may_cure(record):
                answers[n] = record
            elif record is not None and not isinstance(record, BaseException):
                answers[n] = self._claimed(record, request[1], request[0])
        return answers

    def _one_write_request(self, step: StepMessage) -> tuple[StepClaim, Position] | None:
        """What the one-write claim of ``step`` asks the store, with the cursor it
        claims; None when the first position of a job is unknown here."""
        cursor, start = step.position, False
        if step.record is not None and step.position == Position():
            if step.record.payload is None:
                return None
            plan = plan_of([w.get("tasks", []) for w in step.record.payload.get("workflows", [])])
            # A retry starts at its stored cursor (the record the message carries).
            first = rules.first_step(plan, start=cursor_of(step.record))
            if first.position is None:
                return None
            cursor, start = first.position, True
        now = utcnow()
        lease = now + timedelta(seconds=self.lease_seconds)
        return StepClaim(step.job_id, cursor.to_list(), self.owner, now, lease, start), cursor

    def _claimed(
        self, record: JobRecord | None, cursor: Position, asked: StepClaim
    ) -> Claim | None:
        """The claim the one-write claim ``asked`` took (``record``: the row it
        returned; None, not taken)."""
        if record is None or record.payload is None:
            return None
        tasks = [list(w.get("tasks", [])) for w in record.payload.get("workflows", [])]
        claim = Claim(record, cursor, tasks)
        _log_claim(claim, started=asked.start)
        if asked.start:
            observers.job_started(record, asked.now)
        return claim

    def _claimable(
        self, record: JobRecord, step: StepMessage
    ) -> tuple[JobRecord, Position, list[list[dict[str, Any]]]]:
        """The row as this worker's claim would write it; StepSkipped if it may not."""
        if record.payload is None:
            raise StepSkipped(record.id, "the job was stored without workflows", dead=True)
        tasks = [list(w.get("tasks", [])) for w in record.payload.get("workflows", [])]
        now = utcnow()
        lease = now + timedelta(seconds=self.lease_seconds)
        start = step.position == Position()
        reason = why_not_claimable(record, step.position.to_list(), now, start)
        if reason is not None and retry_past_deadline(record, step.position.to_list(), now):
            # A retry picked up after the job's start deadline: the job ends here.
            name = TaskSpec.from_dict(tasks[step.position.workflow][step.position.task]).name
            self.cancel_overdue(record, now, retry_of=name)
            raise StepSkipped(record.id, reason)
        if reason is not None and start and record.status is Status.SCHEDULED:
            if record.start_deadline is not None and record.start_deadline < now:
                self.cancel_overdue(record, now)
                raise StepSkipped(record.id, reason)
            if record.not_before is not None and record.not_before > now:
                raise StepSkipped(record.id, reason, retry_at=record.not_before)
            if record.waiting_since is not None:
                # A held job has no message to keep; one sent with its message
                # (a broker without Redis) keeps looking until the wait ends.
                held = bool((record.waits or {}).get("held"))
                retry = None if held else now + timedelta(seconds=WAIT_POLL_SECONDS)
                raise StepSkipped(record.id, reason, retry_at=retry)
        if reason is not None:
            if record.status is Status.CANCELLED:
                self.count_end(record)  # cancelled while Scheduled: its message came
            raise StepSkipped(record.id, reason)
        if record.status is Status.SCHEDULED:
            first = rules.first_step(plan_of(tasks), start=cursor_of(record))
            if first.action is rules.Action.COMPLETE:
                done = transition(transition(record.status, RUN), COMPLETE)
                ended = record.evolve(status=done, updated=now)
                if self._store().put(ended):
                    observers.job_ended(ended)
                    publish_ended(record.id)
                raise StepSkipped(record.id, "no tasks: completed")
            assert first.position is not None
            state = dict(record.state, cursor=first.position.to_list())
            claimed = record.evolve(
                status=transition(record.status, RUN),
                state=state,
                updated=now,
                lease_owner=self.owner,
                lease_expires=lease,
            )
            return claimed, first.position, tasks
        claimed = record.evolve(updated=now, lease_owner=self.owner, lease_expires=lease)
        return claimed, step.position, tasks

    def cancel_overdue(
        self, record: JobRecord, now: datetime, *, retry_of: str | None = None
    ) -> JobRecord | None:
        """End a job past its start deadline: Cancelled, with an error naming the
        deadline, before any (more) of its code runs. ``record`` is a Scheduled job,
        or with ``retry_of`` a running one whose retry of that task came too late
        (:func:`~pypepper_dramatiq.rules.start_times.late_retry`). Returns the row as
        written; None if the row moved meanwhile."""
        assert record.start_deadline is not None
        error = missed_deadline(record.start_deadline, now, retry_of)
        cancelled = record.evolve(
            status=transition(record.status, CANCEL),
            error=error,
            updated=now,
            release_at=None,
            lease_owner=None,
            lease_expires=None,
            state=counting(record.state),
        )
        written = self._store().advance(cancelled)
        if written:
            logger.info(
                "job %s cancelled: %s",
                record.id,
                error,
                extra={"action": "deadline_cancel", "job_id": record.id},
            )
            observers.deadline_missed(cancelled)
            observers.job_ended(cancelled)
            publish_ended(record.id)
        return cancelled.evolve(version=cancelled.version + 1) if written else None

    def _heal(self, store: IJobStore, step: StepMessage) -> JobRecord:
        """The row of a message that found none: healed from the first message.

        Unless retention deleted the job (its tombstone, asked only here, on the
        rare path with no row): then its message came back late (a dead worker's
        copy requeued, a broker restored) and is dropped, acknowledged unrun. A
        store that fails the question raises: the message waits as in any outage.
        """
        if store.was_purged(step.job_id):
            return self._drop_purged(step)
        if step.record is None:
            raise StepSkipped(step.job_id, "no such job in the store", dead=True)
        record = store_missing_row(store, step.record)
        if record is None:  # purged between the question and the insert, which refused it
            return self._drop_purged(step)
        _log(
            "heal",
            step.job_id,
            step.position,
            ": its row was not stored yet (the worker was faster than its producer); "
            "stored it as the message carries it",
        )
        return record

    def _drop_purged(self, step: StepMessage) -> NoReturn:
        """Drop the message of a job retention deleted (acknowledged unrun)."""
        _log("drop_purged", step.job_id, step.position, PURGED_WORDS)
        raise StepSkipped(step.job_id, "deleted by retention: its message is dropped")

    # -- after the attempt -------------------------------------------------------

    def progress_reporter(self, claim: Claim) -> ProgressReporter:
        """Where the claimed attempt's task reports its progress: the row's
        ``state["progress"]``, written without moving its version (so no step or
        cancel loses its compare-and-set to it), at most once a second."""
        job_id = claim.record.id

        def write(key: str, value: dict[str, Any]) -> None:
            self._store().write_progress(job_id, key, value)

        return ProgressReporter(claim.position.key(), claim.spec.name, sink=write)

    def record(self, claim: Claim, outcome: Outcome) -> rules.Step | None:
        """Store the outcome and the next position; returns what to do next.

        Returns None when the write lost to another writer (the job was
        cancelled, or the step was taken over): nothing more to do here.
        """
        recorded = self.record_outcome(claim, outcome)
        return None if recorded is None else recorded.decision

    def record_outcome(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        task: Task | None = None,
        hold_next: Callable[[rules.Step], bool] | None = None,
        verdict: outcomes.Verdict | None = None,
    ) -> Recorded | None:
        """:meth:`record`, also returning the row as written (None: the write lost).

        The row and what follows its write are :mod:`~pypepper_dramatiq.engine.outcomes`'s
        decision (:func:`~pypepper_dramatiq.engine.outcomes.decide`, then
        :func:`~pypepper_dramatiq.engine.outcomes.outcome_write`); here they are written
        and carried out.

        ``hold_next`` says, for a step to run, whether the caller runs it at once
        in this thread (continuation): the same write then claims it for this
        worker (owner and a lease of ``lease_seconds``, which the caller renews
        while the attempt runs), so that no message is needed and a worker that
        dies meanwhile leaves it to the recovery sweep as any claimed step.
        The written row's ``lease_owner`` tells the caller whether it holds it.

        When the task failed for good and has an ``on_final_failure`` hook, the
        same write marks the hook due (held by this worker), and the hook is
        called here after the write, before the caller goes on to the next
        step (see :mod:`.hooks`). ``task`` is the task object when the driver
        holds it (in process: its hook and context); otherwise the hook is
        found through the executor registry. A next step to run is then held by
        this worker while the hook runs, as a claimed step (a lease of
        ``lease_seconds``, renewed with the hook's hold), so that a worker that
        dies in the hook leaves it to the recovery sweep after its lease, not
        after ``dispatch_seconds``; after the hook, ``hold_next`` is asked (the
        step is kept to run here) or the step is released for the caller's
        message (:meth:`_hand_on`). None then also when the step is no longer
        this worker's (the job was cancelled, or recovery took the step over).

        ``verdict``: the outcome's :meth:`verdict`, when the caller decided it
        already (to choose where the outcome is recorded).
        """
        attempt = _attempt_of(claim)
        writer = self._writer()
        now = utcnow()
        if verdict is None:
            verdict = outcomes.decide(attempt, outcome, now)
        outcome, decision = verdict.outcome, verdict.step
        position = claim.position
        _log_failed_attempt(claim, outcome)
        keeps_next = verdict.asks_caller(writer) and hold_next is not None and hold_next(decision)
        write = outcomes.outcome_write(
            claim.record, attempt, verdict, writer, now, keeps_next=keeps_next
        )
        kind = outcome.history_kind
        try:
            write, written = self._rebased(
                claim, verdict, write, self._write(write.row), writer, now, keeps_next
            )
        except StoreError as exc:
            if isinstance(exc, StoreDataError) and not outcome.refused:
                # The store refused what this write holds (sending it again cannot
                # help): record the attempt as a failure that names the refusal,
                # without the content it carried, so the job goes on by its retry
                # table and ends instead of leaving the step to its lease.
                _log_outcome_refused(claim, exc)
                return self.record_outcome(
                    claim, outcome.refused_by_store(exc), task=task, hold_next=hold_next
                )
            _tell_task_ended(claim, kind, outcome)
            row = write.row
            if verdict.hook_due and self.holds_steps:
                # The caller carries this row to its next write (never re-running
                # the step): the hook is called now, and that write says it ran.
                row = self._call_hook_unrecorded(row, position, outcome, task)
            raise OutcomeNotRecorded(exc, decision, row) from exc
        if not written:
            self._lost(claim, outcome, kind)
            return None
        _tell_task_ended(claim, kind, outcome)
        _log_decision(claim, decision, outcome, write.attempts)
        return self._after_write(claim, outcome, write, task, hold_next)

    def verdict(self, claim: Claim, outcome: Outcome) -> outcomes.Verdict:
        """What ``outcome`` decides for ``claim``'s job, before any write
        (:func:`~pypepper_dramatiq.engine.outcomes.decide`): a caller chooses by it
        where the outcome is recorded, then hands it to the record."""
        return outcomes.decide(_attempt_of(claim), outcome, utcnow())

    def record_outcomes(
        self, finished: Sequence[tuple[Claim, outcomes.Verdict]]
    ) -> list[Recorded | BaseException | None]:
        """The outcomes of many attempts, written in one store call (per round of
        :func:`~pypepper_dramatiq.ops.group_commit.in_rounds`), each then carried out as
        :meth:`record_outcome` does; one answer per attempt, in order.

        For a caller that runs none of the next steps itself and calls no hook
        (no verdict here may have ``hook_due``): each step to run is left free for
        the caller's message. An answer is the :class:`Recorded` row, None (the
        write lost to another writer, as :meth:`record_outcome`), or the error that
        kept this attempt's outcome from the store (:class:`OutcomeNotRecorded`
        after ``write_attempts`` tries of an outage; the observers are told of the
        attempt's end all the same). A row the store refused for its content is
        recorded as the failure that names the refusal, as :meth:`record_outcome`
        does, in a write of its own.
        """
        writer, now = self._writer(), utcnow()
        writes: list[outcomes.OutcomeWrite] = []
        for claim, verdict in finished:
            if verdict.hook_due:
                raise ValueError(f"job {claim.record.id}: a hook falls due; record it alone")
            _log_failed_attempt(claim, verdict.outcome)
            writes.append(
                outcomes.outcome_write(
                    claim.record, _attempt_of(claim), verdict, writer, now, keeps_next=False
                )
            )
        answers = self._write_all([write.row for write in writes])
        results: list[Recorded | BaseException | None] = []
        for (claim, verdict), write, answer in zip(finished, writes, answers, strict=True):
            try:
                results.append(self._recorded_one(claim, verdict, write, answer, writer, now))
            except Exception as exc:  # this attempt's answer, not the batch's
                results.append(exc)
        return results

    def _recorded_one(
        self,
        claim: Claim,
        verdict: outcomes.Verdict,
        write: outcomes.OutcomeWrite,
        answer: bool | BaseException,
        writer: outcomes.Writer,
        now: datetime,
    ) -> Recorded | None:
        """Carry out one write of :meth:`record_outcomes` by its store ``answer``."""
        outcome = verdict.outcome
        kind = outcome.history_kind
        try:
            if isinstance(answer, BaseException):
                raise answer
            write, written = self._rebased(claim, verdict, write, answer, writer, now, False)
        except StoreError as exc:
            if isinstance(exc, StoreDataError) and not outcome.refused:
                _log_outcome_refused(claim, exc)
                return self.record_outcome(claim, outcome.refused_by_store(exc))
            _tell_task_ended(claim, kind, outcome)
            raise OutcomeNotRecorded(exc, verdict.step, write.row) from exc
        if not written:
            self._lost(claim, outcome, kind)
            return None
        _tell_task_ended(claim, kind, outcome)
        _log_decision(claim, verdict.step, outcome, write.attempts)
        return self._after_write(claim, outcome, write, None, None)

    def _rebased(
        self,
        claim: Claim,
        verdict: outcomes.Verdict,
        write: outcomes.OutcomeWrite,
        written: bool,
        writer: outcomes.Writer,
        now: datetime,
        keeps_next: bool,
    ) -> tuple[outcomes.OutcomeWrite, bool]:
        """An outcome's ``write`` that lost its compare-and-set (``written`` False)
        written again over a row whose hooks alone moved (a recovered hook of an
        earlier task), up to :data:`REBASE_ATTEMPTS` times: the write last sent, and
        whether it was stored."""
        seen: JobRecord = claim.record
        for _ in range(REBASE_ATTEMPTS):
            if written:
                break
            current = self._store().get(claim.record.id)
            if current is None or not outcomes.only_hooks_moved(seen, current):
                break
            seen = current
            write = outcomes.outcome_write(
                current, _attempt_of(claim), verdict, writer, now, keeps_next=keeps_next
            )
            written = self._write(write.row)
        return write, written

    def _write_all(self, rows: list[JobRecord]) -> list[bool | BaseException]:
        """:meth:`_write` for many rows in one store call: the rows an outage kept
        out are sent again together, up to ``write_attempts`` calls in all."""
        answers = list(self._outcome_batch(rows))
        delay = 0.1
        for _ in range(self.write_attempts - 1):
            again = [
                n
                for n, answer in enumerate(answers)
                if isinstance(answer, StoreError) and retry_may_cure(answer)
            ]
            if not again:
                break
            logger.warning(
                "outcome writes of %d jobs failed (%s); retrying", len(again), answers[again[0]]
            )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            for n, answer in zip(again, self._outcome_batch([rows[n] for n in again]), strict=True):
                answers[n] = answer
        return answers

    def _after_write(
        self,
        claim: Claim,
        outcome: Outcome,
        write: outcomes.OutcomeWrite,
        task: Task | None,
        hold_next: Callable[[rules.Step], bool] | None,
    ) -> Recorded | None:
        """Do what the outcome's written row calls for (:class:`outcomes.AfterWrite`):
        tell the observers, publish the end or the task's cancel, run the hook the
        write marked due, hand on the step held for it."""
        after, decision = write.after, write.step
        if after.tells_end:
            observers.job_ended(write.row)
        elif after.tells_retry:
            observers.retried(write.row, claim.spec.name)
        if after.notice is outcomes.Notice.CANCELLED_BY_TASK:
            assert write.row.error is not None
            _cancelled_by_task(claim.record.id, claim.spec.name, write.row.error)
        elif after.notice is outcomes.Notice.ENDED:
            # Completed or Failed: one notice per job end, for Job.wait().
            publish_ended(claim.record.id)
        record = write.row.evolve(version=write.row.version + 1)
        if after.runs_hook:
            key = claim.position.key()
            try:
                record = (
                    self._call_hook(
                        record, claim.position, outcome, task, holds_next=after.hands_on
                    )
                    or record
                )
            except Exception:  # the outcome is recorded: the job goes on regardless
                logger.exception(
                    "job %s: the on_final_failure hook of task %s could not be run here; "
                    "it stays due",
                    record.id,
                    key,
                    extra={"action": "hook_not_run", "job_id": record.id, "task": key},
                )
        if after.hands_on:
            return self._hand_on(record.id, decision, hold_next)
        return Recorded(decision, record)

    def _lost(self, claim: Claim, outcome: Outcome, kind: str) -> None:
        """The outcome's write lost to another writer: say why, and when it was a
        cancel, keep the attempt in the Cancelled row (:meth:`_record_interrupted`)."""
        current = self._store().get(claim.record.id)
        status = current.status.value if current else "gone"
        # Losing to a cancel is the cancel working; anything else is worth a line.
        expected = current is not None and current.status is Status.CANCELLED
        _log(
            "lost_to_cancel" if expected else "lost",
            claim.record.id,
            claim.position,
            ": the outcome of task %s was not recorded: %s",
            claim.spec.name,
            "the job was cancelled meanwhile"
            if expected
            else f"its row changed meanwhile (now {status})",
        )
        if expected:
            assert current is not None
            _tell_task_ended(claim, history.CANCELLED, outcome)
            self._record_interrupted(current, claim, outcome)
        else:
            _tell_task_ended(claim, kind, outcome)

    def _hand_on(
        self,
        job_id: str,
        decision: rules.Step,
        hold_next: Callable[[rules.Step], bool] | None,
    ) -> Recorded | None:
        """The next step this worker held while a hook ran: kept to run here (when
        ``hold_next`` says so, with a fresh lease) or released for its message
        (a lease expiry of delay + ``dispatch_seconds``, as the outcome write
        would have written it), by compare-and-set on the row as it is now (the
        hook's bookkeeping moved its version).

        None when the step is no longer this worker's (cancelled, or recovered
        after its lease lapsed: someone else sends it) or the store fails: the
        lease, no longer renewed, then lapses and recovery sends the step.
        """
        assert decision.position is not None
        for _ in range(REBASE_ATTEMPTS):
            try:
                store = self._store()
                current = store.get(job_id)
                if not _step_held_by(current, decision.position, self.owner):
                    status = current.status.value if current else "gone"
                    cancelled = current is not None and current.status is Status.CANCELLED
                    action = "lost_to_cancel" if cancelled else "lost"
                    _log(action, job_id, decision.position, f"{status} after the hook")
                    if cancelled:
                        assert current is not None
                        self.count_end(current)  # cancelled while the hook ran
                    return None
                now = utcnow()
                keep = hold_next is not None and hold_next(decision)
                owner, until = outcomes.next_step_lease(self._writer(), now, decision, held=keep)
                handed = current.evolve(updated=now, lease_owner=owner, lease_expires=until)
                if store.advance(handed):
                    return Recorded(decision, handed.evolve(version=handed.version + 1))
            except StoreError as exc:
                logger.warning(
                    "job %s: step %s not handed on after the hook (%s); recovery sends it "
                    "after its lease",
                    job_id,
                    decision.position.key(),
                    exc,
                )
                return None
        logger.warning(
            "job %s: step %s not handed on after the hook (the row kept moving); recovery "
            "sends it after its lease",
            job_id,
            decision.position.key(),
        )
        return None

    def _record_interrupted(self, current: JobRecord, claim: Claim, outcome: Outcome) -> None:
        """Keep the attempt whose outcome lost to a cancel in the Cancelled row's
        history (ended ``cancelled``, with its worker and times), and count the
        job's end if nobody did: one compare-and-set, read again while the row
        moves (another late attempt, a worker meeting the message)."""
        attempt, writer, now = _attempt_of(claim), self._writer(), utcnow()
        row: JobRecord | None = current
        for _ in range(REBASE_ATTEMPTS):
            if row is None:
                return
            kept = outcomes.interrupted_write(row, attempt, outcome, writer, now)
            if kept is None:
                return  # not Cancelled, or the attempt is in it already
            try:
                if self._store().advance(kept.row):
                    if kept.tells_end:
                        observers.job_ended(kept.row)
                    return
            except StoreError as exc:
                logger.warning(
                    "job %s: the attempt interrupted by the cancel was not recorded (%s)",
                    row.id,
                    exc,
                )
                return
            row = self._store().get(row.id)

    def count_end(self, record: JobRecord) -> bool:
        """Count the end of the Cancelled or Failed ``record`` (``MARKED_ENDS``) if
        nobody did (no process that tells observers wrote it): mark it counted by
        compare-and-set, and tell the observers only if this write set the marker.
        True if it did."""
        row: JobRecord | None = record
        for _ in range(REBASE_ATTEMPTS):
            if not observers.observing() or row is None or row.status not in MARKED_ENDS:
                return False
            if is_counted(row.state):
                return False
            marked = row.evolve(state=mark_counted(row.state))
            try:
                if self._store().advance(marked):
                    observers.job_ended(marked)
                    return True
            except StoreError as exc:
                logger.warning("job %s: its end was not counted (%s)", row.id, exc)
                return False
            row = self._store().get(row.id)
        return False

    def _call_hook_unrecorded(
        self, record: JobRecord, position: Position, outcome: Outcome, task: Task | None
    ) -> JobRecord:
        """Call the hook of a failure whose write failed; ``record`` with it done."""
        if task is None or task.on_final_failure is None:
            return record  # stays due, as the next write stores it
        key = position.key()
        found = hooks.Found(task.on_final_failure, task, task.context, outcome.error or "")
        error = self.hooks.call(record.id, key, found)
        state = JobState.from_dict(record.state)
        state.hook_done(key, self.owner, utcnow(), error)
        return record.evolve(state=state.to_dict())

    def _call_hook(
        self,
        record: JobRecord,
        position: Position,
        outcome: Outcome,
        task: Task | None,
        *,
        holds_next: bool = False,
    ) -> JobRecord | None:
        """Call the hook this worker just marked due; the row after its done mark.

        ``holds_next``: the row's next step is held by this worker meanwhile; its
        lease is renewed with the hook's hold."""
        error = outcome.error or ""
        found: hooks.Found | None = None
        if task is not None and task.on_final_failure is not None:
            found = hooks.Found(task.on_final_failure, task, task.context, error)
        else:
            found = hooks.find(record, position, error)
        if found is None:
            logger.warning(
                "job %s: the on_final_failure hook of task %s is not known in this process; "
                "left due for a worker that has its code",
                record.id,
                position.key(),
                extra={"action": "hook_unknown", "job_id": record.id, "task": position.key()},
            )
            return None
        hold = None if self.holds_steps else self.lease_seconds
        return self.hooks.run(
            record, position.key(), found, self.owner, hold, step_lease=holds_next
        )

    def release(self, claim: Claim, until: datetime) -> bool:
        """Give up the claimed step unrun (no attempt counted); False if the row moved.

        ``until`` is when recovery may send the step again if no message for
        it comes through (the caller enqueues one).
        """
        released = claim.record.evolve(updated=utcnow(), lease_owner=None, lease_expires=until)
        return self._store().advance(released)

    def due_now(self, job_id: str, position: Position, delay: float = 0.0) -> bool:
        """The message for ``position`` could not be enqueued: let recovery send it
        when it is due (``delay`` seconds from now) instead of after ``dispatch_seconds``.

        Only a row still at that position and free is touched; store failures
        are logged (the lease expiry already written still recovers it, later).
        """
        try:
            store = self._store()
            record = store.get(job_id)
            if not _step_held_by(record, position, None):
                return False
            due = utcnow() + timedelta(seconds=delay)
            return store.advance(record.evolve(lease_expires=due))
        except StoreError as exc:
            logger.warning(
                "job %s: could not mark step %s due (%s); recovery sends it later",
                job_id,
                position.key(),
                exc,
            )
            return False

    def _writer(self) -> outcomes.Writer:
        """This book's settings as the outcome's row is decided with them (whether
        this process observes is read at each write: observers come and go)."""
        return outcomes.Writer(
            self.owner,
            self.lease_seconds,
            self.dispatch_seconds,
            self.holds_steps,
            observers.observing(),
        )

    def _write(self, record: JobRecord) -> bool:
        delay = 0.1
        for attempt in range(self.write_attempts):
            try:
                return self.outcomes.submit(record)
            except StoreError as exc:
                if attempt + 1 == self.write_attempts or not retry_may_cure(exc):
                    raise
                logger.warning("job %s: outcome write failed (%s); retrying", record.id, exc)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False  # pragma: no cover - the loop returns or raises

    def _claim_batch(self, requests: list[StepClaim]) -> list[JobRecord | BaseException | None]:
        """The claims pending in this process, in one store call (per round: a job
        asked for twice is decided in a second one, which sees the first).

        A batch statement the store refused for its content (a data error: one
        row's) is refused whole: its claims are then tried one by one, so that
        only the claim that holds the refused content meets the refusal (and its
        message alone is dead-lettered)."""
        store = self._store()
        answers = in_rounds(requests, _job_of_claim, store.claim_steps)
        if len(requests) > 1:
            for n, answer in enumerate(answers):
                if isinstance(answer, StoreError) and not retry_may_cure(answer):
                    try:
                        answers[n] = store.claim_steps([requests[n]])[0]
                    except StoreError as exc:
                        answers[n] = exc
        return answers

    def _outcome_batch(self, records: list[JobRecord]) -> list[bool | BaseException]:
        """The outcome writes pending in this process, in one store call (per round,
        as claims); a row's own error (a key refusal) is its answer."""
        return in_rounds(records, _job_of_record, self._store().advance_each)


def _job_of_claim(request: StepClaim) -> str:
    return request.job_id


def _job_of_record(record: JobRecord) -> str:
    return record.id


def _attempt_of(claim: Claim) -> outcomes.Attempt:
    """The claimed step as :mod:`~pypepper_dramatiq.engine.outcomes` decides its outcome."""
    return outcomes.Attempt(
        claim.position,
        claim.spec.name,
        claim.plan,
        bool(claim.spec.on_final_failure),
        claim.record.updated,
    )


def _log_outcome_refused(claim: Claim, exc: StoreError) -> None:
    """Say that the store refused an outcome's content, which is recorded as failed."""
    logger.error(
        "job %s: the job store refused the outcome of task %s (%s); "
        "recording the attempt as failed without it",
        claim.record.id,
        claim.spec.name,
        exc,
        extra={"action": "outcome_refused", "job_id": claim.record.id},
    )


def _log_failed_attempt(claim: Claim, outcome: Outcome) -> None:
    """Say that the claimed attempt failed (a cancel that ended it is not a failure)."""
    if outcome.succeeded or outcome.cancels_job:
        return
    position = claim.position
    logger.info(
        "job %s: task %s failed (%s): %s",
        claim.record.id,
        claim.spec.name,
        rules.attempt_of(position, claim.spec.policy),
        outcome.error,
        extra={
            "action": "attempt_failed",
            "job_id": claim.record.id,
            "position": position.to_list(),
        },
    )


def _tell_task_ended(claim: Claim, kind: str, outcome: Outcome) -> None:
    """Tell the observers how the attempt ended (``kind``: the history's word)."""
    if observers.observing():
        observers.task_ended(claim.record, claim.spec.name, kind, outcome.started, outcome.ended)


def _cancelled_by_task(job_id: str, task_name: str, error: str) -> None:
    """A task cancelled its job (the row says Cancelled): tell whoever waits on it,
    as ``Job.cancel()`` does (a cancel event set here, the cancel channel)."""
    logger.info(
        "job %s cancelled by task %s",
        job_id,
        task_name,
        extra={"action": "task_cancel", "job_id": job_id, "error": error},
    )
    running_here.cancel(job_id)
    publish_cancel(job_id)


#: Like Dramatiq, nothing per message above DEBUG (a job's start and completion,
#: a row healed because the worker was faster than its producer, a write lost
#: to a cancel); a failed job is a WARNING; a write lost to anything else, and a
#: purged job's message dropped (rare: a late copy), are INFO.
_LEVELS = {"fail": logging.WARNING, "lost": logging.INFO, "drop_purged": logging.INFO}

#: What a worker says, after "job <id>", of a message it drops because retention
#: deleted the job (both drivers).
PURGED_WORDS = " was deleted by retention; its returning message is dropped"


def _logged(action: str) -> bool:
    """Whether the line of ``action`` would be logged (its words are worth composing)."""
    return logger.isEnabledFor(_LEVELS.get(action, logging.DEBUG))


def _log(action: str, job_id: str, position: Position, words: str, *args: object) -> None:
    """Log a step's line: "job <id>" then ``words`` (a %-format of ``args``), a sentence a
    reader understands; ``action``, ``job_id`` and ``position`` (from 0, as stored) go in
    the record's fields for programs."""
    if not _logged(action):
        return
    logger.log(
        _LEVELS.get(action, logging.DEBUG),
        "job %s" + words,
        job_id,
        *args,
        extra={"action": action, "job_id": job_id, "position": position.to_list()},
    )


def _log_claim(claim: Claim, *, started: bool) -> None:
    """The line of a claimed step: the job started, or its next attempt runs."""
    action = "start" if started else "claim"
    if _logged(action):
        _log(
            action,
            claim.record.id,
            claim.position,
            " started: task %s runs (%s)" if started else ": task %s runs (%s)",
            claim.spec.name,
            rules.attempt_of(claim.position, claim.spec.policy),
        )


def _log_decision(claim: Claim, decision: rules.Step, outcome: Outcome, attempts: int) -> None:
    """The line of what the rules decided after an attempt, as a sentence: the job
    failed (after how many attempts, with the error), was cancelled by its task,
    completed, or goes on (the task retried, when, which attempt; or the next task)."""
    action = decision.action.value
    if not _logged(action):
        return
    job_id, name = claim.record.id, claim.spec.name
    at = decision.position or claim.position
    skipped = f"; optional task {name} failed for good and was skipped" * decision.skipped_optional
    if decision.action is rules.Action.FAIL:
        why = "" if outcome.retriable else " (another attempt cannot help)"
        tries = f"{attempts} attempt{'s' * (attempts != 1)}"
        words = " failed: task %s failed for good after %s%s: %s"
        _log(action, job_id, at, words, name, tries, why, outcome.error)
    elif decision.action is rules.Action.CANCEL:
        _log(action, job_id, at, " cancelled by its task %s: %s", name, outcome.error)
    elif decision.action is rules.Action.COMPLETE:
        _log(action, job_id, at, " completed%s", skipped)
    elif at.key() == claim.position.key():  # the same task again: a retry or a new round
        when = f"in {decision.delay:g} s" if decision.delay > 0 else "now"
        again = "retried" if at.round == claim.position.round else "run again in a new round"
        words = ": task %s will be %s %s (%s)"
        _log(action, job_id, at, words, name, again, when, rules.attempt_of(at, claim.spec.policy))
    else:
        following = TaskSpec.from_dict(claim.tasks[at.workflow][at.task]).name
        done = (
            f"optional task {name} failed for good and was skipped"
            if skipped
            else f"task {name} done"
        )
        _log(action, job_id, at, ": %s; next: task %s", done, following)
