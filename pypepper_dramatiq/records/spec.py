"""The stored form of a task: one definition of its fields and their defaults.

A job's row keeps its workflows as JSON (``payload["workflows"][w]["tasks"]``);
every reader of that JSON (rebuilding a :class:`~pypepper_dramatiq.model.task.Task`,
the engine reading a retry table, the step actor reading ``round_timeout``)
goes through :class:`TaskSpec`, so a missing key has one default everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..rules.steps import RetryPolicy
from .payloads import params_to_store, stored_params

#: The retry table of a task stored without one (its defaults are RetryPolicy's).
_DEFAULT_POLICY = RetryPolicy()
#: The stored fields that say how a task is retried and timed (``@workflow_task``'s options).
POLICY_KEYS = frozenset(
    {
        "retry_count",
        "retry_delay",
        "retry_until_completed",
        "retry_until_max",
        "round_times",
        "round_timeout",
        "round_timeout_join",
        "optional",
        "retry_backoff",
        "retry_delay_max",
        "retry_jitter",
    }
)


@dataclass(frozen=True)
class TaskSpec:
    """A task as stored with its job (JSON), without its executor object."""

    name: str
    executor_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    retry_count: int = _DEFAULT_POLICY.retry_count
    retry_delay: float = _DEFAULT_POLICY.retry_delay
    retry_until_completed: bool = _DEFAULT_POLICY.retry_until_completed
    retry_until_max: int = _DEFAULT_POLICY.retry_until_max
    round_times: int = _DEFAULT_POLICY.round_times
    round_timeout: float = 0.0
    round_timeout_join: float = 0.0
    optional: bool = _DEFAULT_POLICY.optional
    #: The task has an ``on_final_failure`` hook (the callable itself is found
    #: where the task runs, with its executor): its final failure marks it due.
    on_final_failure: bool = False
    retry_backoff: float = _DEFAULT_POLICY.retry_backoff
    retry_delay_max: float | None = _DEFAULT_POLICY.retry_delay_max
    retry_jitter: bool = _DEFAULT_POLICY.retry_jitter
    channel_id: str = "default"
    dag_id: str = ""
    fingerprint: str = ""
    category: str | None = None
    description: str = ""
    tags: tuple[str, ...] = ()

    @property
    def policy(self) -> RetryPolicy:
        """The task's retry table, for :mod:`~pypepper_dramatiq.rules.steps`."""
        return RetryPolicy(
            retry_count=self.retry_count,
            retry_delay=self.retry_delay,
            retry_until_completed=self.retry_until_completed,
            retry_until_max=self.retry_until_max,
            round_times=self.round_times,
            optional=self.optional,
            retry_backoff=self.retry_backoff,
            retry_delay_max=self.retry_delay_max,
            retry_jitter=self.retry_jitter,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored in a job's payload."""
        return {
            "channel_id": self.channel_id,
            "dag_id": self.dag_id,
            "fingerprint": self.fingerprint,
            "name": self.name,
            "category": self.category,
            "description": self.description,
            "tags": list(self.tags),
            "executor_id": self.executor_id,
            "params": params_to_store(self.params),
            "retry_count": self.retry_count,
            "retry_delay": self.retry_delay,
            "retry_until_completed": self.retry_until_completed,
            "retry_until_max": self.retry_until_max,
            "round_times": self.round_times,
            "round_timeout": self.round_timeout,
            "round_timeout_join": self.round_timeout_join,
            "optional": self.optional,
            "on_final_failure": self.on_final_failure,
            "retry_backoff": self.retry_backoff,
            "retry_delay_max": self.retry_delay_max,
            "retry_jitter": self.retry_jitter,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        """Read a stored task; a missing key takes its default (older rows, or a
        hand-written payload)."""
        executor_id = data.get("executor_id")
        return cls(
            name=str(data.get("name", "?")),
            executor_id=None if not executor_id else str(executor_id),
            params=stored_params(data.get("params")),
            retry_count=int(data.get("retry_count", cls.retry_count)),
            retry_delay=float(data.get("retry_delay", cls.retry_delay)),
            retry_until_completed=bool(
                data.get("retry_until_completed", cls.retry_until_completed)
            ),
            retry_until_max=int(data.get("retry_until_max", cls.retry_until_max)),
            round_times=int(data.get("round_times", cls.round_times)),
            round_timeout=float(data.get("round_timeout") or 0.0),
            round_timeout_join=float(data.get("round_timeout_join") or 0.0),
            optional=bool(data.get("optional", cls.optional)),
            on_final_failure=bool(data.get("on_final_failure", False)),
            # Absent from tasks stored before backoff existed: they keep a fixed delay.
            retry_backoff=float(data.get("retry_backoff", cls.retry_backoff)),
            retry_delay_max=_seconds_or_none(data.get("retry_delay_max")),
            retry_jitter=bool(data.get("retry_jitter", cls.retry_jitter)),
            channel_id=str(data.get("channel_id", "default")),
            dag_id=str(data.get("dag_id", "")),
            fingerprint=str(data.get("fingerprint", "")),
            category=data.get("category"),
            description=str(data.get("description", "")),
            tags=tuple(data.get("tags") or ()),
        )


def _seconds_or_none(value: Any) -> float | None:
    """A stored optional number of seconds (None or absent: not set)."""
    return None if value is None else float(value)
