"""What each page shows, read from the stored rows: plain data for the templates.

Nothing here writes; the templates only lay it out (Jinja2 escapes every value).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..channels.admission import channel_states
from ..record import JobRecord, utcnow
from ..recurring import RecurringSchedule
from ..redis_layout import redis_client_of
from ..spec import TaskSpec
from ..status import Status
from ..stores.base import IJobStore
from ..waits import Waits

#: Characters of a result or error shown before "more" (the rest is in a <details>).
SHORT = 120
#: Longest text a page shows of one value (a result, the raw record); the rest is cut.
LONGEST = 100_000
#: The statuses a job may be cancelled in.
CANCELLABLE = frozenset({Status.SCHEDULED, Status.IN_PROGRESS})


def when(value: datetime | str | None) -> str:
    """A time as the shell shows it (UTC, to the second); "-" for none."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def as_json(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON text, cut at :data:`LONGEST` characters."""
    # Keys sorted: PostgreSQL's jsonb keeps them in an order of its own.
    text = json.dumps(value, indent=indent, sort_keys=True, default=str)
    return clip(text, LONGEST)


def first_line(text: str | None, limit: int = 80) -> str:
    lines = (text or "").strip().splitlines()
    shown = lines[0] if lines else ""
    return clip(shown, limit) + ("\u2026" if len(lines) > 1 and len(shown) <= limit else "")


# -- the jobs list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    channel_id: str
    category: str
    created: str
    updated: str
    error: str


def job_row(record: JobRecord) -> JobRow:
    return JobRow(
        id=record.id,
        status=record.status.value,
        channel_id=record.channel_id,
        category=record.category or "-",
        created=when(record.created),
        updated=when(record.updated),
        error=first_line(record.error),
    )


# -- one job ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    round: str
    attempt: str
    started: str
    ended: str
    seconds: str
    worker: str
    outcome: str
    error: str
    traceback: str


@dataclass(frozen=True)
class TaskView:
    key: str
    name: str
    status: str
    attempts: int
    optional: bool
    result_short: str
    result_full: str
    has_result: bool
    error: str
    history: list[Attempt]
    dropped: int


@dataclass(frozen=True)
class WorkflowView:
    index: int
    tasks: list[TaskView]


@dataclass(frozen=True)
class Related:
    """A job this one points at (a parent, a key holder), with its status if stored."""

    id: str
    role: str
    status: str | None


@dataclass
class JobView:
    record: JobRecord
    workflows: list[WorkflowView]
    done: int
    total: int
    waiting_for: list[str]
    related: list[Related]
    raw: str
    facts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def cancellable(self) -> bool:
        return self.record.status in CANCELLABLE


def _seconds(started: str | None, ended: str | None) -> str:
    try:
        if started and ended:
            delta = datetime.fromisoformat(ended) - datetime.fromisoformat(started)
            return f"{delta.total_seconds():.3f}"
    except ValueError:
        pass
    return "-"


def _counted(index: Any) -> str:
    """A stored 0-based round or attempt number as people count (1 is the first)."""
    return str(index + 1) if isinstance(index, int) else "-"


def _attempt(item: Mapping[str, Any]) -> Attempt:
    error_type, message = item.get("error_type"), item.get("message")
    error = ": ".join(str(part) for part in (error_type, message) if part)
    return Attempt(
        round=_counted(item.get("round")),
        attempt=_counted(item.get("attempt")),
        started=when(item.get("started")),
        ended=when(item.get("ended")),
        seconds=_seconds(item.get("started"), item.get("ended")),
        worker=str(item.get("worker") or "-"),
        outcome=str(item.get("outcome") or "-"),
        error=error,
        traceback=str(item.get("traceback") or ""),
    )


def _task_status(record: JobRecord, key: str, place: tuple[int, int]) -> str:
    state = record.state
    if key in (state.get("skipped") or []):
        return "Skipped"
    if key in (state.get("results") or {}):
        return "Completed"
    cursor = list(state.get("cursor") or [])
    here = len(cursor) >= 2 and (cursor[0], cursor[1]) == place
    failed = (state.get("errors") or {}).get(key) is not None
    if here and record.status is Status.IN_PROGRESS:
        return "Running" if record.lease_owner else ("Retrying" if failed else "Queued")
    if here and record.status in (Status.FAILED, Status.CANCELLED):
        return str(record.status.value)
    if failed and record.status is Status.FAILED:
        return "Failed"
    return "Not run" if record.status.is_terminal else "Pending"


def _task_view(record: JobRecord, key: str, name: str, optional: bool) -> TaskView:
    state = record.state
    results = state.get("results") or {}
    has_result = key in results
    full = as_json(results[key], indent=2) if has_result else ""
    w, t = (int(part) for part in key.split(".", 1)) if _is_key(key) else (-1, -1)
    return TaskView(
        key=key,
        name=name,
        status=_task_status(record, key, (w, t)),
        attempts=int((state.get("attempts") or {}).get(key, 0)),
        optional=optional,
        result_short=clip(as_json(results[key]), SHORT) if has_result else "",
        result_full=full,
        has_result=has_result,
        error=str((state.get("errors") or {}).get(key) or ""),
        history=[_attempt(item) for item in (state.get("history") or {}).get(key, [])],
        dropped=int((state.get("history_dropped") or {}).get(key, 0)),
    )


def _is_key(key: str) -> bool:
    parts = key.split(".")
    return len(parts) == 2 and all(part.isdigit() for part in parts)


def _workflows(record: JobRecord) -> list[WorkflowView]:
    if record.payload is not None:
        return [
            WorkflowView(
                index=w,
                tasks=[
                    _task_view(record, f"{w}.{t}", spec.name, spec.optional)
                    for t, spec in enumerate(
                        TaskSpec.from_dict(task) for task in workflow.get("tasks", [])
                    )
                ],
            )
            for w, workflow in enumerate(record.payload.get("workflows", []))
        ]
    # Stored without its workflows (a task without executor_id): what the state names.
    state = record.state
    keys: set[str] = set()
    for part in ("results", "errors", "attempts", "history"):
        keys.update(k for k in (state.get(part) or {}) if _is_key(k))
    keys.update(k for k in (state.get("skipped") or []) if _is_key(k))
    by_workflow: dict[int, list[TaskView]] = {}
    for key in sorted(keys, key=lambda k: tuple(int(p) for p in k.split("."))):
        view = _task_view(record, key, f"task {key}", False)
        by_workflow.setdefault(int(key.split(".")[0]), []).append(view)
    return [WorkflowView(index=w, tasks=tasks) for w, tasks in sorted(by_workflow.items())]


def _related(record: JobRecord, store: IJobStore) -> list[Related]:
    if not record.waits:
        return []
    waits = Waits.from_dict(record.waits)
    wanted = [(job_id, "parent") for job_id in waits.parents]
    if waits.holder:
        wanted.append((waits.holder, f"holder of key {waits.key}"))
    rows = {row.id: row for row in store.get_many([job_id for job_id, _ in wanted])}
    return [
        Related(
            id=job_id,
            role=role,
            status=rows[job_id].status.value if job_id in rows else None,
        )
        for job_id, role in wanted
    ]


def job_view(record: JobRecord, store: IJobStore) -> JobView:
    workflows = _workflows(record)
    tasks = [task for workflow in workflows for task in workflow.tasks]
    facts = [
        ("Channel", record.channel_id),
        ("Category", record.category or "-"),
        ("Created", when(record.created)),
        ("Updated", when(record.updated)),
        ("Version", str(record.version)),
        ("Lease owner", record.lease_owner or "-"),
        ("Lease expires", when(record.lease_expires)),
        ("Planned start", when(record.not_before)),
        ("Start deadline", when(record.start_deadline)),
        ("Unique key", record.unique_key or "-"),
    ]
    return JobView(
        record=record,
        workflows=workflows,
        done=sum(task.status in ("Completed", "Skipped") for task in tasks),
        total=len(tasks),
        waiting_for=record.waiting_for(utcnow()),
        related=_related(record, store),
        raw=as_json(record.to_dict(), indent=2),
        facts=facts,
    )


# -- schedules and channels ------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRow:
    name: str
    cron: str
    timezone: str
    next_slot: str
    last_slot: str
    last_job_id: str | None
    paused: bool
    channel_id: str
    category: str


def schedule_row(schedule: RecurringSchedule) -> ScheduleRow:
    return ScheduleRow(
        name=schedule.name,
        cron=schedule.cron,
        timezone=schedule.timezone,
        next_slot=when(schedule.next_slot),
        last_slot=when(schedule.last_slot),
        last_job_id=schedule.last_job_id,
        paused=schedule.paused,
        channel_id=str(schedule.template.get("channel_id") or "-"),
        category=str(schedule.template.get("category") or "-"),
    )


@dataclass(frozen=True)
class ChannelRow:
    name: str
    waiting: int
    maxsize: int
    stopped: bool


def channel_rows(broker: Any, local: Sequence[Any]) -> tuple[str, list[ChannelRow]]:
    """Where the channels were read ("Redis" or "this process") and their rows.

    With a Redis broker, every channel with a key in Redis (as ``pypepper-dramatiq
    channels`` lists them); otherwise the channels of this process (``local``).

    Raises:
        redis.RedisError: Redis could not be read.
    """
    client = redis_client_of(broker)
    if client is None:
        return "this process", [
            ChannelRow(channel.id, channel.length(), channel.maxsize, channel.stop)
            for channel in local
        ]
    rows = [
        ChannelRow(state.name, state.waiting, state.maxsize, state.stopped)
        for state in channel_states(client)
    ]
    return "Redis", rows
