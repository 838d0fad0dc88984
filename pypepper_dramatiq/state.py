"""A job's progress as its row stores it (``JobRecord.state``): one typed definition.

Both drivers write it through the engine, recovery and the dashboard read
it. The stored form is a JSON object with these keys (all optional):

* ``cursor``: the position ``[workflow, task, round, attempt]`` to run next
  (or last run, once the job ended);
* ``results``, ``errors``: by task key ``"workflow.task"``, the result of a
  finished task and the last error of a failed one;
* ``attempts``: attempts made per task key; ``skipped``: optional tasks that
  failed for good;
* ``history`` / ``history_dropped``: the bounded attempt history
  (:mod:`~pypepper_dramatiq.history`);
* ``dispatch``: the broker message that carries the job's first step;
* ``parent_results``: for a job scheduled ``after=`` other jobs, their results
  by parent id and task name, copied in when its wait ended.

Keys it does not know are kept as they are (a row written by a newer version).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .rules import Position

#: Key of the broker message that carries the job's first step (the producer writes it).
DISPATCH_KEY = "dispatch"
#: Key of the parents' results (parent id -> task name -> result).
PARENT_RESULTS_KEY = "parent_results"
#: The keys :class:`JobState` knows.
KNOWN_KEYS = frozenset(
    {"cursor", "results", "errors", "attempts", "skipped", "history", "history_dropped"}
    | {DISPATCH_KEY, PARENT_RESULTS_KEY}
)


@dataclass
class JobState:
    """The typed view of a row's ``state``."""

    cursor: Position | None = None
    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str | None] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    history_dropped: dict[str, int] = field(default_factory=dict)
    dispatch: dict[str, Any] | None = None
    parent_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Keys this version does not know, kept for the next write.
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        cursor = data.get("cursor")
        return cls(
            cursor=Position.from_list(cursor) if cursor else None,
            results=dict(data.get("results") or {}),
            errors=dict(data.get("errors") or {}),
            attempts={k: int(v) for k, v in (data.get("attempts") or {}).items()},
            skipped=list(data.get("skipped") or []),
            history={k: list(v) for k, v in (data.get("history") or {}).items()},
            history_dropped={k: int(v) for k, v in (data.get("history_dropped") or {}).items()},
            dispatch=dict(data[DISPATCH_KEY]) if data.get(DISPATCH_KEY) else None,
            parent_results=dict(data.get(PARENT_RESULTS_KEY) or {}),
            other={k: v for k, v in data.items() if k not in KNOWN_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The stored form, as the engine writes it once a step was recorded
        (the history and the dispatch only when there are some)."""
        data: dict[str, Any] = dict(self.other)
        if self.cursor is not None:
            data["cursor"] = self.cursor.to_list()
        data.update(
            results=self.results,
            errors=self.errors,
            attempts=self.attempts,
            skipped=self.skipped,
        )
        if self.history:
            data["history"] = self.history
        if self.history_dropped:
            data["history_dropped"] = self.history_dropped
        if self.dispatch is not None:
            data[DISPATCH_KEY] = self.dispatch
        if self.parent_results:
            data[PARENT_RESULTS_KEY] = self.parent_results
        return data
