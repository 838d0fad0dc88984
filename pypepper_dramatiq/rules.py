"""What happens next to a job: the one rule set every driver obeys.

Pure functions, no I/O. A job's plan is its workflows' task policies; a
:class:`Position` says which attempt of which task is current. After each
attempt the driver asks :func:`next_step` what to do, and carries it out:
the in-process :class:`~pypepper_dramatiq.worker.Worker` inline, the Dramatiq
middleware as messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class RetryPolicy:
    """A task's retry table.

    Raises:
        ValueError: if a bound is out of range.
        TypeError: if a count is not an int or the delay not a number.
    """

    retry_count: int = 0
    retry_delay: float = 0
    retry_until_completed: bool = False
    retry_until_max: int = 1000
    round_times: int = 1
    optional: bool = False

    def __post_init__(self) -> None:
        for name in ("retry_count", "retry_until_max", "round_times"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if isinstance(self.retry_delay, bool) or not isinstance(self.retry_delay, (int, float)):
            raise TypeError(f"retry_delay must be a number of seconds, got {self.retry_delay!r}")
        # Written as "not >=" so that NaN is refused too.
        if not self.retry_count >= 0:
            raise ValueError(f"retry_count must be >= 0, got {self.retry_count}")
        if not self.retry_delay >= 0:
            raise ValueError(f"retry_delay must be >= 0, got {self.retry_delay}")
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


def first_step(plan: Plan, *, cancelled: bool = False) -> Step:
    """Where a job starts."""
    if cancelled:
        return CANCEL_STEP
    start = _first_task_from(plan, 0, 0)
    return COMPLETE_STEP if start is None else Step(Action.RUN, start)


def next_step(
    plan: Plan, at: Position, succeeded: bool, *, cancelled: bool = False, retriable: bool = True
) -> Step:
    """What follows the attempt at ``at``, given its outcome.

    A success moves to the next task. A failure retries after ``retry_delay``
    while the round has attempts left, then starts the next round at once
    with a fresh budget; when every round is used up, an optional task is
    skipped and a required one fails the job. A failure that is not
    ``retriable`` uses up the task at once (no more attempts nor rounds).
    Cancellation wins over all.
    """
    if cancelled:
        return CANCEL_STEP
    policy = plan[at.workflow][at.task]
    if not succeeded and retriable:
        if at.attempt + 1 < policy.attempts_per_round:
            return Step(
                Action.RUN,
                Position(at.workflow, at.task, at.round, at.attempt + 1),
                delay=float(policy.retry_delay),
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


def max_attempts(policy: RetryPolicy) -> int:
    """Attempts a task may use across all its rounds."""
    return policy.attempts_per_round * policy.round_times
