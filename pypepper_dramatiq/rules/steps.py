"""What happens next to a job: the one rule set every driver obeys.

Pure functions, no I/O; the random source of a retry's jitter is a parameter.
A job's plan is its workflows' task policies; a :class:`Position` says which
attempt of which task is current. After each attempt the driver asks
:func:`next_step` what to do, and carries it out: the in-process
:class:`~pypepper_dramatiq.worker.Worker` inline, the Dramatiq middleware as
messages.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from ..limits.durations import bounded

#: The longest wait that backoff alone grows a retry delay to, in seconds (7 days,
#: the longest delay Dramatiq's Redis broker documents for a message). A
#: ``retry_delay`` or ``retry_delay_max`` set longer is kept as written.
MAX_BACKOFF_SECONDS = 7 * 24 * 3600.0


def _is_number(value: object) -> bool:
    """An int or a float; a bool is not a number of seconds."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class RetryPolicy:
    """A task's retry table.

    The n-th retry of a round (n = 1 after the round's first attempt failed)
    waits ``retry_delay * retry_backoff ** (n - 1)`` seconds, capped at
    ``retry_delay_max``; with ``retry_jitter`` the wait is a uniformly random
    part of that (full jitter), so that many failing jobs do not retry in
    lockstep. Without a ``retry_delay_max``, backoff stops growing a wait at
    :data:`MAX_BACKOFF_SECONDS` (or at ``retry_delay``, if that is longer). The
    defaults (backoff 1, no cap, no jitter) wait ``retry_delay`` before every retry.

    Raises:
        ValueError: if a bound is out of range.
        TypeError: if a count is not an int, a delay or the backoff not a
            number, or ``retry_jitter`` not a bool.
    """

    retry_count: int = 0
    retry_delay: float = 0
    retry_until_completed: bool = False
    retry_until_max: int = 1000
    round_times: int = 1
    optional: bool = False
    retry_backoff: float = 1.0
    retry_delay_max: float | None = None
    retry_jitter: bool = False

    def __post_init__(self) -> None:
        for name in ("retry_count", "retry_until_max", "round_times"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not _is_number(self.retry_delay):
            raise TypeError(f"retry_delay must be a number of seconds, got {self.retry_delay!r}")
        if not _is_number(self.retry_backoff):
            raise TypeError(f"retry_backoff must be a number, got {self.retry_backoff!r}")
        if self.retry_delay_max is not None and not _is_number(self.retry_delay_max):
            raise TypeError(
                f"retry_delay_max must be a number of seconds or None, got {self.retry_delay_max!r}"
            )
        if not isinstance(self.retry_jitter, bool):
            raise TypeError(f"retry_jitter must be a bool, got {self.retry_jitter!r}")
        # Written as "not >=" so that NaN is refused too.
        if not self.retry_count >= 0:
            raise ValueError(f"retry_count must be >= 0, got {self.retry_count}")
        if not self.retry_delay >= 0:
            raise ValueError(f"retry_delay must be >= 0, got {self.retry_delay}")
        # An endless wait would reach the broker (or Event.wait) as an OverflowError.
        bounded("retry_delay", self.retry_delay)
        if not 1 <= self.retry_backoff < math.inf:
            raise ValueError(
                f"retry_backoff must be a finite number >= 1, got {self.retry_backoff}"
            )
        if self.retry_delay_max is not None:
            if not 0 <= self.retry_delay_max < math.inf:
                raise ValueError(
                    f"retry_delay_max must be a finite number >= 0 (None: no cap), "
                    f"got {self.retry_delay_max}"
                )
            bounded("retry_delay_max", self.retry_delay_max)
            if self.retry_delay_max < self.retry_delay:
                raise ValueError(
                    f"retry_delay_max ({self.retry_delay_max}) must not be below "
                    f"retry_delay ({self.retry_delay})"
                )
        if not self.retry_until_max >= 1:
            raise ValueError(f"retry_until_max must be >= 1, got {self.retry_until_max}")
        if not self.round_times >= 1:
            raise ValueError(f"round_times must be >= 1, got {self.round_times}")

    @property
    def attempts_per_round(self) -> int:
        """Attempts allowed in one round.

        ``retry_until_max`` applies only when retrying until completed with
        ``retry_count == 0``; otherwise ``retry_count`` caps the round.
        """
        if self.retry_until_completed and self.retry_count == 0:
            return self.retry_until_max
        return self.retry_count + 1

    def backed_off(self, attempt: int) -> float:
        """The wait before ``attempt`` of a round without jitter: the most
        :meth:`delay_before` may answer (0 for a round's first attempt)."""
        if attempt <= 0:
            return 0.0
        delay = float(self.retry_delay)
        if delay == 0 or self.retry_backoff == 1 or attempt == 1:
            return delay  # no growth: the defaults give retry_delay exactly
        if self.retry_delay_max is not None:
            limit = float(self.retry_delay_max)
        else:
            limit = max(delay, MAX_BACKOFF_SECONDS)
        try:
            # A float power: an int one would be computed exactly, however large.
            grown = delay * float(self.retry_backoff) ** (attempt - 1)
        except OverflowError:  # the power alone is beyond floats: compare in logarithms
            exponent = math.log(delay) + (attempt - 1) * math.log(self.retry_backoff)
            return limit if exponent >= math.log(limit) else math.exp(exponent)
        return min(grown, limit)  # a product too large is inf, which min drops

    def delay_before(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before ``attempt`` (from 0) of a round.

        Args:
            attempt: the attempt about to run; the n-th retry is attempt n.
            rand: the random source for ``retry_jitter``, a float in [0, 1]
                (called only with jitter); tests pin it.
        """
        capped = self.backed_off(attempt)
        if not self.retry_jitter or capped == 0:
            return capped
        return capped * min(max(rand(), 0.0), 1.0)


Plan = Sequence[Sequence[RetryPolicy]]
"""Per workflow, the policies of its tasks in order."""


@dataclass(frozen=True)
class Position:
    """One attempt of one task: workflow and task index, round and attempt (all from 0)."""

    workflow: int = 0
    task: int = 0
    round: int = 0
    attempt: int = 0

    def key(self) -> str:
        """``"workflow.task"``: the task's place, the same for all its attempts."""
        return f"{self.workflow}.{self.task}"

    def to_list(self) -> list[int]:
        return [self.workflow, self.task, self.round, self.attempt]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> Position:
        workflow, task, round_, attempt = (int(v) for v in values)
        return cls(workflow, task, round_, attempt)


class Action(str, Enum):
    RUN = "run"  #: run the attempt at ``position`` after ``delay`` seconds
    COMPLETE = "complete"  #: every task is done: the job completes
    FAIL = "fail"  #: a required task used every attempt of every round
    CANCEL = "cancel"  #: the job was cancelled: stop without running more


@dataclass(frozen=True)
class Step:
    """A decision: what to do next."""

    action: Action
    position: Position | None = None
    delay: float = 0.0
    #: The task just finished failed for good but was optional.
    skipped_optional: bool = False


#: The decisions that carry no position (named apart from the events of ``events``).
COMPLETE_STEP = Step(Action.COMPLETE)
CANCEL_STEP = Step(Action.CANCEL)


def _first_task_from(plan: Plan, workflow: int, task: int) -> Position | None:
    """The first task at or after (workflow, task), skipping empty workflows."""
    while workflow < len(plan):
        if task < len(plan[workflow]):
            return Position(workflow, task)
        workflow, task = workflow + 1, 0
    return None


def first_step(plan: Plan, *, cancelled: bool = False, start: Position | None = None) -> Step:
    """Where a job starts: its first task, or, for a job that resumes another
    (``Job.retry_saved``: its stored cursor is ``start``), the task at ``start``
    (or the first task after it, when there is none there), with a fresh
    budget: round 0, attempt 0."""
    if cancelled:
        return CANCEL_STEP
    at = (0, 0) if start is None else (start.workflow, start.task)
    begin = _first_task_from(plan, *at)
    return COMPLETE_STEP if begin is None else Step(Action.RUN, begin)


def next_step(
    plan: Plan,
    at: Position,
    succeeded: bool,
    *,
    cancelled: bool = False,
    retriable: bool = True,
    rand: Callable[[], float] = random.random,
) -> Step:
    """What follows the attempt at ``at``, given its outcome.

    A success moves to the next task. A failure retries after the policy's
    delay (:meth:`RetryPolicy.delay_before`: ``retry_delay``, backed off,
    capped, jittered with ``rand``) while the round has attempts left, then
    starts the next round at once with a fresh budget; when every round is
    used up, an optional task is skipped and a required one fails the job. A
    failure that is not ``retriable`` uses up the task at once (no more
    attempts nor rounds). Cancellation wins over all.
    """
    if cancelled:
        return CANCEL_STEP
    policy = plan[at.workflow][at.task]
    if not succeeded and retriable:
        if at.attempt + 1 < policy.attempts_per_round:
            return Step(
                Action.RUN,
                Position(at.workflow, at.task, at.round, at.attempt + 1),
                delay=policy.delay_before(at.attempt + 1, rand),
            )
        if at.round + 1 < policy.round_times:
            return Step(Action.RUN, Position(at.workflow, at.task, at.round + 1, 0))
    if not succeeded and not policy.optional:
        return Step(Action.FAIL, at)
    following = _first_task_from(plan, at.workflow, at.task + 1)
    skipped = not succeeded
    if following is None:
        return Step(Action.COMPLETE, skipped_optional=skipped)
    return Step(Action.RUN, following, skipped_optional=skipped)


def attempt_of(position: Position, policy: RetryPolicy) -> str:
    """``"attempt 2 of 3"`` (and ``", round 2 of 2"`` when the task has rounds): the words
    every line and page shown to people uses, counted from 1 as people count, where a
    :class:`Position` (the stored cursor, the JSON) counts from 0."""
    words = f"attempt {position.attempt + 1} of {policy.attempts_per_round}"
    if policy.round_times > 1:
        words += f", round {position.round + 1} of {policy.round_times}"
    return words


def max_attempts(policy: RetryPolicy) -> int:
    """Attempts a task may use across all its rounds."""
    return policy.attempts_per_round * policy.round_times


def may_continue(
    step: Step,
    *,
    continued: int,
    elapsed: float,
    max_steps: int,
    max_seconds: float,
    stopping: bool = False,
) -> bool:
    """Whether the worker thread that recorded ``step`` may run it at once itself,
    without a new message (continuation of a zero-delay step).

    Only a step to run now qualifies (the next task, or a retry or new round with
    no delay; a delayed retry waits as a delayed message, holding no thread). The
    thread has run ``continued`` steps past its message's own so far, for
    ``elapsed`` seconds since that message started: at ``max_steps`` continued
    steps or ``max_seconds``, the step goes back to the queue as a message, behind
    the jobs that waited meanwhile. Zero for either turns continuation off. A
    worker that is ``stopping`` starts nothing new.
    """
    return (
        step.action is Action.RUN
        and step.delay <= 0
        and not stopping
        and continued < max_steps
        and elapsed < max_seconds
    )
