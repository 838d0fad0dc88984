"""Recording an attempt's outcome: the job row it writes and what must follow. Pure.

After a task's attempt the worker writes one row that says how the attempt
went (its history entry, its count, its result or error, what it reported)
and what comes next (the cursor and a lease for the next step, or the job's
end), then does what that write calls for: tell the observers, wake whoever
waits on the job, run the task's ``on_final_failure`` hook, hand on the next
step the hook held. This module decides all of that from the row, the outcome
and the writer's few settings, with no I/O (no store, no broker, no logging;
the time is given), so that:

* the decision is stated once and can be checked on its own, over any row and
  outcome (``tests/unit/test_outcomes.py``);
* a write that lost its compare-and-set to a writer that only moved the row's
  hooks is decided again, the same way, on the fresher row (:func:`outcome_write`
  called on it), instead of being patched by hand.

:class:`~pypepper_dramatiq.engine.step_io.StepIO` is the shell around it: it
writes the row, retries over a fresher one, and performs the effects.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from ..errors import ResultNotStorableError, StoreDataError, cancels_job, describe
from ..limits.storable import storable_error
from ..records import history
from ..records.record import JobRecord, utcnow
from ..records.results import check_storable
from ..records.state import HOOK_PENDING, HOOKS_DONE_KEY, HOOKS_KEY, JobState
from ..rules import steps as rules
from ..rules.events import CANCEL, COMPLETE, FAIL, transition
from ..rules.status import Status
from ..rules.steps import Position

__all__ = [
    "AfterWrite",
    "Attempt",
    "InterruptedWrite",
    "Notice",
    "Outcome",
    "OutcomeWrite",
    "Verdict",
    "Writer",
    "decide",
    "interrupted_write",
    "next_step_lease",
    "only_hooks_moved",
    "outcome_write",
]


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended."""

    succeeded: bool
    result: Any = None
    #: ``Type: message`` of a failure (storable: see ``__post_init__``).
    error: str | None = None
    #: False when another attempt cannot help (see ``errors.is_retriable``).
    retriable: bool = True
    #: The attempt-history outcome (``history.FAILED``, ``TIMED_OUT``, ...).
    kind: str | None = None
    #: The failure's traceback text, for the attempt history.
    traceback: str | None = None
    #: When the attempt started and ended (None: not known, e.g. a crashed actor).
    started: datetime | None = None
    ended: datetime | None = None
    #: The task's executor id is not registered in this worker (a rolling deploy?).
    unknown_task: bool = False
    #: The task raised :class:`~pypepper_dramatiq.errors.JobCancellationError`: the
    #: job ends Cancelled (the user's act, through the task), whatever its retries.
    cancels_job: bool = False
    #: What the task reported last (:mod:`~pypepper_dramatiq.records.progress`), stored by
    #: the write that records the attempt; None: it reported nothing.
    progress: dict[str, Any] | None = None
    #: This failure stands for an outcome the job store refused for its content
    #: (:meth:`refused_by_store`): its write is not replaced again.
    refused: bool = False

    def __post_init__(self) -> None:
        # The error is the task's text (an exception's message): made storable
        # here, the one place every attempt's error passes, so that the write
        # recording the attempt (the row's errors, the job's error, what the
        # hook is given) never fails on a NUL, a lone surrogate or its length. The
        # history entry's text is made storable by history.entry.
        if self.error is not None:
            object.__setattr__(self, "error", storable_error(self.error))

    @classmethod
    def failure(
        cls,
        exc: BaseException,
        *,
        retriable: bool = True,
        kind: str = history.FAILED,
        error: str | None = None,
        started: datetime | None = None,
        ended: datetime | None = None,
    ) -> Outcome:
        """A failed attempt that raised ``exc`` (ended ``ended``; None: now)."""
        return cls(
            False,
            error=error or describe(exc),
            retriable=retriable,
            kind=kind,
            traceback=history.traceback_text(exc),
            started=started,
            ended=ended or utcnow(),
            cancels_job=cancels_job(exc),
        )

    def refused_by_store(self, exc: StoreDataError) -> Outcome:
        """The failure recorded instead of this outcome when the store refused its
        write for what it holds (``exc``: a data error): the same attempt, without
        its result, progress, error text or traceback, and an error naming what
        could not be stored and why.

        Retried as the task's retry table says, unless this outcome was a failure
        another attempt cannot fix; an attempt that cancelled its job still
        cancels it.
        """
        carried = [
            name
            for name, present in (
                ("result", self.succeeded),
                ("error text", not self.succeeded and self.error is not None),
                ("traceback", self.traceback is not None),
                ("progress", self.progress is not None),
            )
            if present
        ]
        what = ", ".join(carried) or "outcome"
        return Outcome(
            False,
            error=f"{type(exc).__name__}: the job store refused this attempt's {what}"
            f" ({exc.reason})",
            retriable=self.succeeded or self.retriable,
            kind=history.FAILED,
            started=self.started,
            ended=self.ended,
            cancels_job=self.cancels_job,
            refused=True,
        )

    @property
    def history_kind(self) -> str:
        """The attempt history's word for how the attempt ended."""
        return self.kind or (history.SUCCEEDED if self.succeeded else history.FAILED)

    def history_entry(
        self,
        position: Position,
        worker: str,
        claimed: datetime,
        *,
        now: datetime | None = None,
    ) -> dict[str, Any]:
        """This attempt as the job row's history stores it (started when the step
        was ``claimed``, ended ``now``, when the outcome does not say)."""
        error_type = message = None
        if not self.succeeded and self.error:
            error_type, _, message = self.error.partition(": ")
            if not message:
                error_type, message = None, self.error
        return history.entry(
            started=self.started or claimed,
            ended=self.ended or now or utcnow(),
            worker=worker,
            outcome=self.history_kind,
            error_type=error_type,
            message=message,
            traceback=self.traceback,
            position=position.to_list(),
        )


@dataclass(frozen=True)
class Writer:
    """The process that records outcomes, and its settings that shape the row."""

    #: This process's lease owner id (and the attempt history's worker).
    owner: str
    #: How long a step or hook held by this process stays its own without renewal.
    lease_seconds: float
    #: How long a next step's message may wait in its queue (after its delay)
    #: before recovery sends it again.
    dispatch_seconds: float
    #: The caller runs each next step itself (the in-process driver): held for
    #: good, with no expiry, so no recovery sweep sends it elsewhere.
    holds_steps: bool = False
    #: This process tells observers (the metrics) of job ends: a Cancelled row it
    #: writes is marked counted (see :mod:`~pypepper_dramatiq.records.state`).
    observes: bool = False


@dataclass(frozen=True)
class Attempt:
    """The claimed step whose outcome is recorded: where it is in which plan."""

    position: Position
    #: The task's name (the job's error and a refused result name it).
    task_name: str
    #: The job's retry tables, for :func:`rules.next_step`.
    plan: rules.Plan
    #: The task has an ``on_final_failure`` hook.
    has_hook: bool
    #: When the step was claimed (the row's ``updated`` after the claim): the
    #: attempt's start in its history when the outcome does not know it.
    claimed: datetime


@dataclass(frozen=True)
class Verdict:
    """What an outcome decides before any row is read: the outcome as it will be
    stored, the step that follows, and whether the task's hook falls due.

    Kept apart from the row so that a write retried over a fresher row keeps
    the same decision (the retry delay's jitter, the caller's choice to run the
    next step itself) and only the row is built again.
    """

    #: The outcome as recorded (a success whose result cannot be stored is a
    #: failure that says so).
    outcome: Outcome
    step: rules.Step
    #: The task failed for good and has an ``on_final_failure`` hook: the write
    #: marks it due, held by this writer, which then runs it.
    hook_due: bool

    def asks_caller(self, writer: Writer) -> bool:
        """Whether the caller may take the next step to run in its own thread (its
        ``hold_next`` is asked): a step to run that neither this writer holds for
        good nor the hook holds already."""
        return self.step.action is rules.Action.RUN and not writer.holds_steps and not self.hook_due


def decide(
    attempt: Attempt,
    outcome: Outcome,
    now: datetime,
    *,
    rand: Callable[[], float] = random.random,
) -> Verdict:
    """The :class:`Verdict` of ``outcome`` for ``attempt`` (``rand``: the retry
    delay's jitter, as :func:`rules.next_step` takes it).

    A success whose result the job row cannot store becomes a failure that no
    retry can fix (keeping what the task reported), ending ``now``.
    """
    if outcome.succeeded:
        try:
            check_storable(attempt.task_name, outcome.result)
        except ResultNotStorableError as exc:
            refused = Outcome.failure(exc, retriable=False, started=outcome.started, ended=now)
            outcome = replace(refused, progress=outcome.progress)
    step = rules.next_step(
        attempt.plan,
        attempt.position,
        outcome.succeeded,
        retriable=outcome.retriable,
        cancelled=outcome.cancels_job,
        rand=rand,
    )
    hook_due = (
        attempt.has_hook
        and not outcome.succeeded
        and (step.action is rules.Action.FAIL or step.skipped_optional)
    )
    return Verdict(outcome, step, hook_due)


class Notice(Enum):
    """What the shell announces once the outcome is written."""

    #: The job Completed or Failed: the end notice that wakes ``Job.wait()``.
    ENDED = "ended"
    #: The task cancelled its job: the cancel notice, as ``Job.cancel()`` sends it
    #: (it wakes waiters and stops the job's attempts running elsewhere).
    CANCELLED_BY_TASK = "cancelled_by_task"


@dataclass(frozen=True)
class AfterWrite:
    """What the shell does once the outcome's row is written, in this order."""

    #: Tell the observers the job ended (only a writer that observes).
    tells_end: bool = False
    #: Tell the observers the task is retried (only a writer that observes).
    tells_retry: bool = False
    #: The notice to publish, if the job ended.
    notice: Notice | None = None
    #: Run the task's ``on_final_failure`` hook, which the write marked due.
    runs_hook: bool = False
    #: The write held the next step for this writer while the hook runs: after
    #: it, keep the step to run here or release it for its message.
    hands_on: bool = False


@dataclass(frozen=True)
class OutcomeWrite:
    """The row that records an outcome (at the version it was built on, for the
    compare-and-set) and what follows its write."""

    row: JobRecord
    step: rules.Step
    #: The task's attempts so far, this one included.
    attempts: int
    after: AfterWrite


def next_step_lease(
    writer: Writer, now: datetime, step: rules.Step, *, held: bool
) -> tuple[str | None, datetime | None]:
    """Who holds a next step to run, and until when (``lease_owner``, ``lease_expires``).

    The in-process driver holds it for good. A step ``held`` by this writer (it
    runs it in this thread, or a hook runs first) has a lease as a claim has,
    renewed while the writer lives, so that a writer dying now leaves the step
    to recovery after its lease. Any other step waits for its message: free,
    until its delay plus ``dispatch_seconds``, after which recovery sends it.
    """
    if writer.holds_steps:
        return writer.owner, None
    if held:
        return writer.owner, now + timedelta(seconds=writer.lease_seconds)
    return None, now + timedelta(seconds=step.delay + writer.dispatch_seconds)


def outcome_write(
    row: JobRecord,
    attempt: Attempt,
    verdict: Verdict,
    writer: Writer,
    now: datetime,
    *,
    keeps_next: bool = False,
) -> OutcomeWrite:
    """The write that records ``verdict`` on ``row`` (the claimed row, or a fresher
    one whose hooks alone moved), and what must follow it.

    ``keeps_next``: the caller runs the next step itself (its answer when
    :meth:`Verdict.asks_caller`): the write holds it for this writer.
    """
    outcome, step = verdict.outcome, verdict.step
    key = attempt.position.key()
    state = JobState.from_dict(row.state)
    entry = outcome.history_entry(attempt.position, writer.owner, attempt.claimed, now=now)
    history.append(state, key, entry)
    state.attempts[key] = state.attempts.get(key, 0) + 1
    if outcome.progress is not None:
        state.progress[key] = outcome.progress
    if outcome.succeeded:
        state.results[key] = outcome.result
        state.errors.pop(key, None)
    else:
        state.errors[key] = outcome.error
    if step.skipped_optional:
        state.skipped.append(key)
    if verdict.hook_due:  # durable in the write that records the failure
        hold = None if writer.holds_steps else now + timedelta(seconds=writer.lease_seconds)
        state.hold_hook(key, HOOK_PENDING, writer.owner, now, hold)
    changes: dict[str, Any] = {"updated": now, "lease_owner": None, "lease_expires": None}
    held_for_hook = False
    notice: Notice | None = None
    if step.action is rules.Action.RUN:
        assert step.position is not None
        state.cursor = step.position
        held = verdict.hook_due or keeps_next
        held_for_hook = verdict.hook_due and not writer.holds_steps
        changes["lease_owner"], changes["lease_expires"] = next_step_lease(
            writer, now, step, held=held
        )
    elif step.action is rules.Action.COMPLETE:
        changes["status"] = transition(row.status, COMPLETE)
        notice = Notice.ENDED
    elif step.action is rules.Action.CANCEL:
        changes["status"] = transition(row.status, CANCEL)
        changes["error"] = storable_error(
            f"task {attempt.task_name} cancelled the job: {outcome.error}"
        )
        state.counted = state.counted or writer.observes  # the shell tells them
        notice = Notice.CANCELLED_BY_TASK
    else:
        changes["status"] = transition(row.status, FAIL)
        changes["error"] = storable_error(f"task {attempt.task_name} failed: {outcome.error}")
        state.counted = state.counted or writer.observes  # the shell tells them
        notice = Notice.ENDED
    retried = (
        step.action is rules.Action.RUN
        and not outcome.succeeded
        and step.position is not None
        and (step.position.workflow, step.position.task)
        == (attempt.position.workflow, attempt.position.task)
    )
    after = AfterWrite(
        tells_end=writer.observes and step.action is not rules.Action.RUN,
        tells_retry=writer.observes and retried,
        notice=notice,
        runs_hook=verdict.hook_due,
        hands_on=held_for_hook,
    )
    written = row.evolve(state=state.to_dict(), **changes)
    return OutcomeWrite(written, step, state.attempts[key], after)


def only_hooks_moved(seen: JobRecord, current: JobRecord) -> bool:
    """Whether all that changed from ``seen`` to ``current`` (as far as an outcome's
    write reads it) is the state's hooks: another writer ran or took over a hook
    of an earlier task. Then the outcome is written over its changes (built again
    on ``current``) instead of the step being lost."""
    if (current.status, current.lease_owner, current.error) != (
        seen.status,
        seen.lease_owner,
        seen.error,
    ):
        return False
    return _without_hooks(current.state) == _without_hooks(seen.state)


def _without_hooks(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in (HOOKS_KEY, HOOKS_DONE_KEY)}


@dataclass(frozen=True)
class InterruptedWrite:
    """The Cancelled row with the attempt that lost to the cancel kept in it."""

    row: JobRecord
    #: This write marks the job's end counted: tell the observers after it.
    tells_end: bool


def interrupted_write(
    row: JobRecord, attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime
) -> InterruptedWrite | None:
    """Keep the attempt whose outcome lost to a cancel in the Cancelled ``row``'s
    history (ended ``cancelled``, with its worker and times; its count and what it
    reported too), so that the job's page shows what ran; and mark the end counted
    if nobody did and this writer observes.

    None when there is nothing to write: the row is not Cancelled, or it holds
    this attempt already (the same outcome recorded twice).
    """
    if row.status is not Status.CANCELLED:
        return None
    key = attempt.position.key()
    entry = outcome.history_entry(attempt.position, writer.owner, attempt.claimed, now=now)
    entry["outcome"] = history.CANCELLED
    state = JobState.from_dict(row.state)
    if any(item.get("started") == entry["started"] for item in state.history.get(key, [])):
        return None
    history.append(state, key, entry)
    state.attempts[key] = state.attempts.get(key, 0) + 1
    if outcome.progress is not None:
        state.progress[key] = outcome.progress
    counts = writer.observes and not state.counted
    state.counted = state.counted or counts
    return InterruptedWrite(row.evolve(state=state.to_dict()), tells_end=counts)
