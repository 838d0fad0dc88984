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
  (:mod:`~pypepper_dramatiq.records.history`);
* ``dispatch``: the broker message that carries the job's first step;
* ``parent_results``: for a job scheduled ``after=`` other jobs, their results
  by parent id and task name, copied in when its wait ended;
* ``hooks``: by task key, the ``on_final_failure`` hooks due and not run yet
  (absent when none is: the recovery sweep looks for rows that have the key).
  An entry is written in the write that records the task's final failure, by
  the worker that then runs the hook, and says who holds it until when:
  ``{"status": "pending" | "running", "owner": <lease owner id>, "since":
  <ISO time>, "until": <ISO time> | null}``. ``pending``: held by the worker
  that recorded the failure; ``running``: taken over by the recovery sweep
  after that hold lapsed. The holder renews ``until`` while the hook runs;
  once ``until`` has passed (never while it is null: the in-process driver's
  hold) the sweep may take the hook over by compare-and-set;
* ``hooks_done``: by task key, the hooks that ran: ``{"ended": <ISO time>,
  "owner": <who ran it>}``, plus ``"error": "Type: message"`` when the hook
  raised (the job's outcome is not changed by it);
* ``progress``: by task key, what the task reported last (the entry format is
  :mod:`~pypepper_dramatiq.records.progress`'s). Written while the task runs without
  moving the row's version, and by the write that records the attempt;
* ``cancelled_by``: who or what cancelled the job, written with Cancelled by a
  cancel from outside its tasks: ``{"by": <who>, "host": <host name>, "at":
  <ISO time>}``. ``by`` is ``"api"`` (``Job.cancel`` / ``cancel_saved``),
  ``"cli"``, ``"dashboard:<user>"``, or what the caller passed;
* ``counted``: True once the job's end was told to the observers (the metrics),
  set in the write that ends the job by a writer that tells them, or later by
  compare-and-set (a worker whose attempt lost to the cancel, the worker that
  meets the message of a job cancelled while Scheduled, the recovery sweep's
  leader reading recent Cancelled and Failed rows, :data:`MARKED_ENDS`): whoever
  sets it counts the end, so each end is counted once across processes;
* ``trace``: the trace context of the span that scheduled the job, as text pairs
  (W3C ``traceparent``, and ``tracestate`` when there is one), written once with
  the Scheduled row (and the first message, which a worker may heal the row
  from) when a tracer observes the scheduling (:mod:`~pypepper_dramatiq.metrics.tracing`);
  every attempt's span, in any process, is its child.

Keys it does not know are kept as they are (a row written by a newer version).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..limits.storable import storable_text
from ..ops import observers
from ..rules.status import Status
from ..rules.steps import Position
from .progress import PROGRESS_KEY

#: Key of the broker message that carries the job's first step (the producer writes it).
DISPATCH_KEY = "dispatch"
#: Key of the parents' results (parent id -> task name -> result).
PARENT_RESULTS_KEY = "parent_results"
#: Key of the ``on_final_failure`` hooks due and not run yet (task key -> entry).
HOOKS_KEY = "hooks"
#: Key of the hooks that ran (task key -> entry).
HOOKS_DONE_KEY = "hooks_done"
#: Key of who cancelled the job (see the module's docstring).
CANCELLED_BY_KEY = "cancelled_by"
#: Key of the marker that the job's end was counted.
COUNTED_KEY = "counted"
#: Key of the trace context the job was scheduled in (text pairs: ``traceparent``...).
TRACE_KEY = "trace"
#: The ends that carry the marker: those a process other than a worker may write (a
#: cancel; a failure decided at submit, a parent having failed). The recovery sweep
#: counts those left unmarked; a Completed end is only ever written by a worker.
MARKED_ENDS = (Status.CANCELLED, Status.FAILED)
#: The keys :class:`JobState` knows.
KNOWN_KEYS = frozenset(
    {"cursor", "results", "errors", "attempts", "skipped", "history", "history_dropped"}
    | {DISPATCH_KEY, PARENT_RESULTS_KEY, HOOKS_KEY, HOOKS_DONE_KEY, PROGRESS_KEY}
    | {CANCELLED_BY_KEY, COUNTED_KEY, TRACE_KEY}
)
#: ``cancelled_by["by"]`` of a cancel through the Python API (``Job.cancel`` / ``cancel_saved``)...
BY_API = "api"
#: ...of the command line's ``cancel``...
BY_CLI = "cli"
#: ...and of the dashboard's Cancel button (``"dashboard:<user>"``).
BY_DASHBOARD = "dashboard"
#: Longest ``cancelled_by["by"]`` / ``["host"]`` stored, in characters.
CANCELLER_LIMIT = 200

#: A hook's entry in ``hooks``: held by the worker that recorded the failure...
HOOK_PENDING = "pending"
#: ...or by the recovery sweep that took it over.
HOOK_RUNNING = "running"


def trace_of(state: Mapping[str, Any]) -> dict[str, str] | None:
    """The trace context stored in a row's ``state`` (None: none, or not text pairs)."""
    trace = state.get(TRACE_KEY)
    if not isinstance(trace, dict) or not trace:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in trace.items()):
        return None
    return dict(trace)


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
    #: Hooks due and not run yet, by task key (see the module's docstring).
    hooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Hooks that ran, by task key.
    hooks_done: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What each task reported last, by task key (see :mod:`~pypepper_dramatiq.records.progress`).
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Who cancelled the job, when a cancel from outside its tasks did.
    cancelled_by: dict[str, Any] | None = None
    #: Whether the job's end was told to the observers (see the module's docstring).
    counted: bool = False
    #: The trace context the job was scheduled in (see the module's docstring).
    trace: dict[str, str] | None = None
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
            hooks={k: dict(v) for k, v in (data.get(HOOKS_KEY) or {}).items()},
            hooks_done={k: dict(v) for k, v in (data.get(HOOKS_DONE_KEY) or {}).items()},
            progress={k: dict(v) for k, v in (data.get(PROGRESS_KEY) or {}).items()},
            cancelled_by=dict(data[CANCELLED_BY_KEY]) if data.get(CANCELLED_BY_KEY) else None,
            counted=data.get(COUNTED_KEY) is True,
            trace=trace_of(data),
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
        if self.hooks:  # absent when none is due: what the recovery sweep looks for
            data[HOOKS_KEY] = self.hooks
        if self.hooks_done:
            data[HOOKS_DONE_KEY] = self.hooks_done
        if self.progress:
            data[PROGRESS_KEY] = self.progress
        if self.cancelled_by is not None:
            data[CANCELLED_BY_KEY] = self.cancelled_by
        if self.counted:
            data[COUNTED_KEY] = True
        if self.trace is not None:
            data[TRACE_KEY] = self.trace
        return data

    # -- on_final_failure hooks ------------------------------------------------------

    def hold_hook(
        self, key: str, status: str, owner: str, now: datetime, until: datetime | None
    ) -> None:
        """Mark the hook of task ``key`` due, held by ``owner`` until ``until``
        (None: for good, as the in-process driver holds its steps)."""
        self.hooks[key] = {
            "status": status,
            "owner": owner,
            "since": now.isoformat(),
            "until": None if until is None else until.isoformat(),
        }

    def hook_done(self, key: str, owner: str, now: datetime, error: str | None = None) -> None:
        """Move the hook of task ``key`` from due to done (``error``: it raised)."""
        self.hooks.pop(key, None)
        entry: dict[str, Any] = {"ended": now.isoformat(), "owner": owner}
        if error is not None:
            entry["error"] = error
        self.hooks_done[key] = entry

    def free_hooks(self, now: datetime) -> list[str]:
        """Keys of the due hooks whose holder's hold lapsed before ``now``: the
        recovery sweep may take them over."""
        return [key for key, entry in self.hooks.items() if _lapsed(entry, now)]


def canceller(by: str, host: str, at: datetime) -> dict[str, Any]:
    """The ``cancelled_by`` entry of a cancel by ``by`` from ``host`` at ``at``
    (texts made storable and clipped to :data:`CANCELLER_LIMIT`)."""
    return {
        "by": storable_text(by)[:CANCELLER_LIMIT],
        "host": storable_text(host)[:CANCELLER_LIMIT],
        "at": at.isoformat(),
    }


def by_dashboard(user: str | None) -> str:
    """``cancelled_by["by"]`` of a cancel from the dashboard by ``user`` (None: anonymous)."""
    return f"{BY_DASHBOARD}:{user or 'anonymous'}"


def cancelled_state(data: Mapping[str, Any], by: str, host: str, at: datetime) -> dict[str, Any]:
    """The stored ``state`` ``data`` with the cancel by ``by`` recorded (and the
    end marked counted when this process tells the observers), other keys kept."""
    out = dict(data)
    out[CANCELLED_BY_KEY] = canceller(by, host, at)
    return counting(out)


def mark_counted(data: Mapping[str, Any]) -> dict[str, Any]:
    """The stored ``state`` ``data`` with the job's end marked counted."""
    return {**data, COUNTED_KEY: True}


def counting(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``state`` of a write that ends a job: marked counted when this process
    tells observers of the end it writes (else a worker counts it later, by
    compare-and-set of the marker: see the module's docstring)."""
    return mark_counted(data) if observers.observing() else dict(data)


def is_counted(data: Mapping[str, Any]) -> bool:
    """Whether the stored ``state`` ``data`` says the job's end was counted."""
    return data.get(COUNTED_KEY) is True


def _lapsed(entry: Mapping[str, Any], now: datetime) -> bool:
    until = entry.get("until")
    if not until:
        return False  # held for good (or a malformed entry: never taken twice)
    return datetime.fromisoformat(str(until)) < now
