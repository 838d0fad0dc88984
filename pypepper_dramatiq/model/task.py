"""A task: one unit of work in a workflow, with its retry policy."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final, Literal

from ..defaults import default_channel, installed_defaults
from ..errors import UnknownExecutorError
from ..limits.durations import timeout_seconds
from ..records.payloads import encode_params
from ..records.spec import TaskSpec
from ..rules.steps import RetryPolicy
from .context import Context
from .executor import FinalFailureHook, IExecutor, executor_policy, executor_registry


class _Unset(enum.Enum):
    """A retry option a :class:`Task` was not given: its executor's, else the default."""

    UNSET = "unset"


#: The default of each retry option of :class:`Task`: not given.
UNSET: Final = _Unset.UNSET
Unset = Literal[_Unset.UNSET]

#: What an option takes when neither the task, its executor nor the application's
#: defaults (:data:`~pypepper_dramatiq.defaults.installed_defaults`) set it.
_DEFAULTS: dict[str, Any] = {
    "retry_count": RetryPolicy.retry_count,
    "retry_delay": RetryPolicy.retry_delay,
    "retry_until_completed": RetryPolicy.retry_until_completed,
    "retry_until_max": RetryPolicy.retry_until_max,
    "round_times": RetryPolicy.round_times,
    "round_timeout": 0,
    "round_timeout_join": 0,
    "optional": RetryPolicy.optional,
    "retry_backoff": RetryPolicy.retry_backoff,
    "retry_delay_max": RetryPolicy.retry_delay_max,
    "retry_jitter": RetryPolicy.retry_jitter,
}


class Task:
    """One step of a workflow.

    Args:
        channel_id: the channel the task belongs to; None (what ``.task()`` of a
            ``@workflow_task`` and :func:`actor_task` give): the channel of the job it
            is added to, as its stored form says. Else a non-empty string (a
            ``ValueError`` naming the task otherwise).
        executor: runs the work; may be None when ``executor_id`` names a
            registered one.
        retry_count: with ``retry_delay``, ``retry_until_completed``,
            ``retry_until_max``, ``round_times``, ``optional``, ``retry_backoff``,
            ``retry_delay_max`` and ``retry_jitter``, the retry table (see
            :class:`RetryPolicy`): the n-th retry of a
            round waits ``retry_delay * retry_backoff ** (n - 1)`` seconds, at
            most ``retry_delay_max`` (None: no cap of your own), a random part
            of it with ``retry_jitter``.
        round_timeout: seconds one attempt may take (0 = no limit); a timeout
            counts as a failed attempt.
        round_timeout_join: extra seconds to wait for a timed-out attempt that
            already started (0 = wait forever).
        executor_id: registry id; when every task has one, the job's
            workflows are stored and can be rebuilt with ``Job.from_record``.
        params: keyword arguments for the executor. A task with an ``executor_id``
            holds them in their stored form (:mod:`~pypepper_dramatiq.records.payloads`):
            JSON values as given; dataclasses, pydantic models, ``datetime``,
            ``date``, ``time``, ``Decimal``, ``UUID``, enums (and lists, tuples, sets
            and dicts of these) encoded, and decoded by the task function's
            annotations before it is called.
        on_final_failure: ``hook(task, context, error)``, called once when this
            task has failed for good (its attempts and rounds used up, or a
            ``NonRetriableError``), whether it is required or optional; not on
            a cancel. ``error`` is the task's last error as stored. The Dramatiq
            driver finds it with the executor registered under ``executor_id``
            (``@workflow_task(on_final_failure=...)`` registers it there).
            None: the hook of the executor (given, or registered under
            ``executor_id`` in this process), e.g. a handler class's
            ``on_final_failure`` method.

    A retry option not given takes the executor's value (a handler class's
    attribute, see :func:`~pypepper_dramatiq.model.executor.executor_policy`),
    else the application's default (``setup(defaults=...)``, see
    :class:`~pypepper_dramatiq.defaults.Defaults`), else its built-in default
    above; one given here wins. They are resolved now, in the process that builds
    the task, and stored with its job.

    Raises:
        ValueError: if a bound is out of range.
        TypeError: a count, delay, backoff or ``retry_jitter`` of the wrong
            type.
        PayloadError: (a ``TypeError``) ``params`` holding a value no stored
            payload can hold while an ``executor_id`` is set (named with its
            parameter).
    """

    #: The priority its ``@workflow_task(priority=...)`` gives the job it is the first
    #: task of, when the job names none (see :meth:`Job.scheduled
    #: <pypepper_dramatiq.model.job.Job.scheduled>`); None: no say. Not stored: the
    #: job's resolved priority is.
    priority: int | None = None

    def __init__(
        self,
        channel_id: str | None,
        dag_id: str,
        fingerprint: str,
        name: str,
        category: str | None,
        description: str,
        tags: Sequence[str] | None,
        executor: IExecutor | None,
        retry_count: int | Unset = UNSET,
        retry_delay: float | Unset = UNSET,
        retry_until_completed: bool | Unset = UNSET,
        retry_until_max: int | Unset = UNSET,
        round_times: int | Unset = UNSET,
        round_timeout: float | Unset = UNSET,
        round_timeout_join: float | Unset = UNSET,
        optional: bool | Unset = UNSET,
        *,
        executor_id: str | None = None,
        params: dict[str, Any] | None = None,
        retry_backoff: float | Unset = UNSET,
        retry_delay_max: float | Unset | None = UNSET,
        retry_jitter: bool | Unset = UNSET,
        on_final_failure: FinalFailureHook | None = None,
    ) -> None:
        if executor is None and executor_id is None:
            raise ValueError(f"task {name!r} needs an executor or an executor_id")
        source = (
            executor if executor is not None else executor_registry.registered(executor_id or "")
        )
        given = {
            "retry_count": retry_count,
            "retry_delay": retry_delay,
            "retry_until_completed": retry_until_completed,
            "retry_until_max": retry_until_max,
            "round_times": round_times,
            "round_timeout": round_timeout,
            "round_timeout_join": round_timeout_join,
            "optional": optional,
            "retry_backoff": retry_backoff,
            "retry_delay_max": retry_delay_max,
            "retry_jitter": retry_jitter,
        }
        options: dict[str, Any] = {k: v for k, v in given.items() if v is not UNSET}
        if len(options) < len(given):  # some not given (a rebuilt task gives them all)
            own = {**(executor_policy(source) if source is not None else {}), **options}
            defaults = installed_defaults.current.task_options(own)
            options = {**_DEFAULTS, **defaults, **own}
        if on_final_failure is None and source is not None:
            on_final_failure = source.on_final_failure
        # A wait too long would reach the thread's timer as an OverflowError.
        round_timeout = timeout_seconds("round_timeout", options.pop("round_timeout"))
        round_timeout_join = timeout_seconds(
            "round_timeout_join", options.pop("round_timeout_join")
        )
        if on_final_failure is not None and not callable(on_final_failure):
            raise TypeError(f"on_final_failure of task {name!r} must be callable")
        if channel_id is not None and (not isinstance(channel_id, str) or not channel_id):
            raise ValueError(
                f"channel_id of task {name!r} must be a non-empty string or None "
                f"(the job's channel), got {channel_id!r}"
            )
        self.policy = RetryPolicy(**options)  # every other option is the retry table's
        self.channel_id = channel_id
        self.dag_id = dag_id
        self.fingerprint = fingerprint
        self.name = name
        self.category = category
        self.description = description
        self.tags = list(tags or [])
        self._executor = executor
        self.executor_id = executor_id
        self.params: dict[str, Any] = dict(params or {})
        if executor_id is not None:  # stored with the job: in its stored form from here on
            self.params = encode_params(name, self.params)
        self.round_timeout = float(round_timeout)
        self.round_timeout_join = float(round_timeout_join)
        self.context = Context()
        self.on_final_failure = on_final_failure

    # The retry table, readable as pypepper's scheduler names it.
    retry_count = property(lambda self: self.policy.retry_count)
    retry_delay = property(lambda self: self.policy.retry_delay)
    retry_until_completed = property(lambda self: self.policy.retry_until_completed)
    retry_until_max = property(lambda self: self.policy.retry_until_max)
    round_times = property(lambda self: self.policy.round_times)
    optional = property(lambda self: self.policy.optional)
    retry_backoff = property(lambda self: self.policy.retry_backoff)
    retry_delay_max = property(lambda self: self.policy.retry_delay_max)
    retry_jitter = property(lambda self: self.policy.retry_jitter)

    @property
    def executor(self) -> IExecutor:
        """The executor, resolved from the registry by ``executor_id`` if not given."""
        if self._executor is None:
            self._executor = executor_registry.get(str(self.executor_id))
        return self._executor

    def to_dict(self, job_channel: str | None = None) -> dict[str, Any]:
        """JSON form (as stored with its job, on ``job_channel``); needs an ``executor_id``."""
        if self.executor_id is None:
            raise UnknownExecutorError(None, f"task {self.name!r}")
        return self.spec(job_channel).to_dict()

    def spec(self, job_channel: str | None = None) -> TaskSpec:
        """The stored form of this task (also without an ``executor_id``): what
        the engine reads of a task, whichever driver runs it. A task without a
        channel of its own takes ``job_channel``, the channel of the job it runs in
        (when none is given: :func:`~pypepper_dramatiq.defaults.default_channel`)."""
        return TaskSpec(
            name=self.name,
            executor_id=self.executor_id,
            params=self.params,
            retry_count=self.policy.retry_count,
            retry_delay=self.policy.retry_delay,
            retry_until_completed=self.policy.retry_until_completed,
            retry_until_max=self.policy.retry_until_max,
            round_times=self.policy.round_times,
            round_timeout=self.round_timeout,
            round_timeout_join=self.round_timeout_join,
            optional=self.policy.optional,
            on_final_failure=self.on_final_failure is not None,
            retry_backoff=self.policy.retry_backoff,
            retry_delay_max=self.policy.retry_delay_max,
            retry_jitter=self.policy.retry_jitter,
            channel_id=self.channel_id or job_channel or default_channel(),
            dag_id=self.dag_id,
            fingerprint=self.fingerprint,
            category=self.category,
            description=self.description,
            tags=tuple(self.tags),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        """Rebuild a task; its executor id must be registered.

        Raises:
            UnknownExecutorError: (a ``ValueError``) for a missing or unknown id.
        """
        return cls.from_spec(TaskSpec.from_dict(data))

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> Task:
        """Rebuild a task from its parsed stored form (a claim parses it once per step).

        Raises:
            UnknownExecutorError: (a ``ValueError``) for a missing or unknown id.
        """
        if spec.executor_id is None:
            raise UnknownExecutorError(None, f"task {spec.name!r}")
        task = cls(
            channel_id=spec.channel_id,
            dag_id=spec.dag_id,
            fingerprint=spec.fingerprint,
            name=spec.name,
            category=spec.category,
            description=spec.description,
            tags=list(spec.tags),
            executor=executor_registry.get(spec.executor_id),
            retry_count=spec.retry_count,
            retry_delay=spec.retry_delay,
            retry_until_completed=spec.retry_until_completed,
            retry_until_max=spec.retry_until_max,
            round_times=spec.round_times,
            round_timeout=spec.round_timeout,
            round_timeout_join=spec.round_timeout_join,
            optional=spec.optional,
            executor_id=spec.executor_id,
            retry_backoff=spec.retry_backoff,
            retry_delay_max=spec.retry_delay_max,
            retry_jitter=spec.retry_jitter,
        )
        # Read from JSON: no need to check (on every step of a worker) that it survives JSON.
        task.params = spec.params
        task.on_final_failure = task.executor.on_final_failure  # the registry's, as the executor
        return task

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, executor_id={self.executor_id!r})"
