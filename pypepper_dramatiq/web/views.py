"""What each page shows, read from the stored rows: plain data for the templates.

Nothing here writes; the templates only lay it out (Jinja2 escapes every value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..channels.broker import transport_of
from ..channels.channel import manager
from ..errors import ConfigError
from ..ops.display import printable
from ..records.links import AFTER, RETRY, Link
from ..records.progress import PROGRESS_KEY
from ..records.record import JobRecord, utcnow
from ..records.recurring import RecurringSchedule
from ..records.spec import TaskSpec
from ..records.state import CANCELLED_BY_KEY, HOOKS_DONE_KEY
from ..records.workers import LIVE, ListedWorker, WorkerInfo, listing, sweep_leader
from ..rules.cron import CronSchedule, firing_id
from ..rules.priorities import priority_in
from ..rules.status import Status
from ..rules.waits import Waits
from ..stores.base import IJobStore
from ..transport.base import Transport, channel_slot_key
from .cron_words import in_words

#: Characters of a result or error shown before "more" (the rest is in a <details>).
SHORT = 120
#: Longest text a page shows of one value (a result, the raw record); the rest is cut.
LONGEST = 100_000
#: Most items of one list a job's page shows (parents, children, one task's attempts);
#: a "more" link leads to the rest, or the page says how many it left out.
LISTED = 50
#: Linked jobs per page of the list of one job's parents or children.
LINKED_PAGE = 200
#: Longest reason a job's "Waits for" gives (its parents are listed apart).
REASON_LONGEST = 500
#: The statuses a job may be cancelled in.
CANCELLABLE = frozenset({Status.SCHEDULED, Status.IN_PROGRESS})


def moment_of(value: datetime | str | None) -> datetime | None:
    """A stored time (a datetime, or ISO text as the row's state keeps it) as an aware
    datetime (naive ones are UTC); None for none or for text that is not a time."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def when(value: datetime | str | None) -> str:
    """A time as the shell shows it (UTC, to the second); "-" for none."""
    if value is None:
        return "-"
    moment = moment_of(value)
    if moment is None:
        return str(value)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


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


def count_text(counts: Iterable[int], limit: int) -> str:
    """The sum of counts made by ``count_by_status(limit=limit)`` as the page shows it:
    ``"1,234"``, or ``"10,000+"`` when one of them was more than ``limit`` (it then
    adds ``limit``)."""
    values = list(counts)
    total = sum(min(value, limit) for value in values)
    return f"{total:,}+" if any(value > limit for value in values) else f"{total:,}"


#: The statuses a stored job can have (the filter offers these): ``Unknown`` and
#: ``Initializing`` are a job's before it is stored.
STORED_STATUSES = tuple(s for s in Status if s not in (Status.UNKNOWN, Status.INITIALIZING))
#: Most task names a row of the list names (then "and N more").
ROW_TASKS = 3


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    channel_id: str
    category: str
    created: str
    updated: str
    error: str
    #: Why the stored row could not be read (the list shows it in the error's place).
    damaged: str | None = None
    #: The names of its first tasks, "and N more" for the rest ("-": none stored).
    tasks: str = "-"
    #: From created to its end, for an ended job; "-" for one not ended.
    duration: str = "-"
    #: The jobs that retry it (``Job.retry_saved``), oldest first.
    retried_as: tuple[str, ...] = ()
    #: 0 (the lowest, a job's that names none) to 9.
    priority: int = 0


def task_names(record: JobRecord) -> list[str]:
    """The names of the job's tasks in order, as its payload stores them."""
    payload = record.payload if isinstance(record.payload, Mapping) else {}
    return [
        str(task.get("name") or "?")
        for workflow in payload.get("workflows") or []
        if isinstance(workflow, Mapping)
        for task in workflow.get("tasks") or []
        if isinstance(task, Mapping)
    ]


def tasks_text(names: Sequence[str]) -> str:
    """Task names as a list row shows them: the first :data:`ROW_TASKS`, then a count."""
    if not names:
        return "-"
    shown = ", ".join(names[:ROW_TASKS])
    rest = len(names) - ROW_TASKS
    return f"{shown} and {rest} more" if rest > 0 else shown


def job_duration(record: JobRecord) -> str:
    """How long an ended job took from its creation to its end, in words; "-" otherwise."""
    if not record.status.is_terminal:
        return "-"
    seconds = (record.updated - record.created).total_seconds()
    return f"{seconds:.1f}s" if seconds < 60 else _duration(seconds)


def job_row(record: JobRecord, retried_as: Sequence[str] = ()) -> JobRow:
    readable = record.damaged is None
    return JobRow(
        id=record.id,
        status=record.status.value if readable else DAMAGED,
        channel_id=record.channel_id,
        category=record.category or "-",
        created=when(record.created),
        updated=when(record.updated),
        error=first_line(record.error if readable else record.damaged, 200),
        damaged=record.damaged,
        tasks=tasks_text(task_names(record)) if readable else "-",
        duration=job_duration(record) if readable else "-",
        retried_as=tuple(retried_as),
        priority=priority_in(record.state) if readable else 0,
    )


#: The statuses whose jobs may have been retried (the list looks up their retries).
RETRIABLE = frozenset({Status.FAILED, Status.CANCELLED})
#: Most retries a row of the list links.
ROW_RETRIES = 3


def retries_of(records: Sequence[JobRecord], store: IJobStore) -> dict[str, list[str]]:
    """The ids of the jobs that retry each Failed or Cancelled row of ``records`` (its
    links of kind retry), :data:`ROW_RETRIES` at most each, read in one call."""
    wanted = [r.id for r in records if r.damaged is None and r.status in RETRIABLE]
    return store.retries_of(wanted, limit=ROW_RETRIES) if wanted else {}


# -- a row that cannot be read -----------------------------------------------------------------

#: What the pages call a job whose stored row cannot be read, in place of its status.
DAMAGED = "Damaged"


@dataclass(frozen=True)
class DamagedView:
    """What a job's page shows of a row that cannot be read: why, and what could be."""

    id: str
    reason: str
    facts: list[tuple[str, str]]


def damaged_view(record: JobRecord) -> DamagedView:
    """The page of a listing's placeholder (``record.damaged`` set): the columns named
    in the reason are shown as unreadable, the others as read."""
    reason = record.damaged or ""
    unreadable = set(re.findall(r"column '(\w+)':", reason))

    def read(column: str, shown: str) -> str:
        return "(cannot be read)" if column in unreadable else shown

    return DamagedView(
        id=record.id,
        reason=reason,
        facts=[
            ("Stored status", read("status", record.status.value)),
            ("Channel", read("channel_id", record.channel_id)),
            ("Category", read("category", record.category or "-")),
            ("Created", read("created", when(record.created))),
            ("Updated", read("updated", when(record.updated))),
            ("Version", read("version", str(record.version))),
            ("Error", read("error", first_line(record.error, 200) or "-")),
            ("Lease owner", read("lease_owner", record.lease_owner or "-")),
            ("Unique key", read("unique_key", record.unique_key or "-")),
        ],
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
    #: What the task reported last (``context.progress``), if it did.
    progress: Progress | None = None
    #: Attempts the row holds beyond the :data:`LISTED` shown.
    history_more: int = 0


@dataclass(frozen=True)
class Progress:
    """A task's last progress report, as a bar shows it."""

    done: float
    total: float | None
    note: str
    updated: str

    @property
    def percent(self) -> str:
        if not self.total:
            return ""
        return f"{min(100.0, 100.0 * self.done / self.total):.0f} %"


def _progress(entry: Mapping[str, Any] | None) -> Progress | None:
    if not entry:
        return None
    try:
        done = float(entry.get("done") or 0)
        total = float(entry["total"]) if entry.get("total") is not None else None
    except (TypeError, ValueError):
        return None
    return Progress(
        done=done,
        total=total if total and total > 0 else None,
        note=str(entry.get("note") or ""),
        updated=when(entry.get("updated")),
    )


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
    #: The jobs that came from this one (waited for it, retry it).
    children: list[Related] = field(default_factory=list)
    #: How many parents the page leaves out, and whether it leaves children out.
    more_parents: int = 0
    more_children: bool = False
    timeline: list[Moment] = field(default_factory=list)

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
    # The engine keeps HISTORY_LIMIT attempts; a row written otherwise may hold more.
    history = list((state.get("history") or {}).get(key, []))
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
        history=[_attempt(item) for item in history[:LISTED]],
        dropped=int((state.get("history_dropped") or {}).get(key, 0)),
        progress=_progress((state.get(PROGRESS_KEY) or {}).get(key)),
        history_more=max(0, len(history) - LISTED),
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


#: How a job's page names a linked job, by link kind: (as a parent, as a child).
ROLES = {AFTER: ("parent", "waits for this job"), RETRY: ("retry of", "retried as")}


def _parents(record: JobRecord, links: Sequence[Link]) -> list[tuple[str, str]]:
    """The jobs ``record`` came from (the job it retries, its parents, a key holder) with
    their roles, in order: from its links and, for a row stored before the links were
    kept, its ``waits``."""
    above = [(link.parent, ROLES[link.kind][0]) for link in links if link.child == record.id]
    if record.waits:
        waits = Waits.from_dict(record.waits)
        seen = set(above)
        above += [(p, "parent") for p in waits.parents if (p, "parent") not in seen]
        if waits.holder:
            above.append((waits.holder, f"holder of key {waits.key}"))
    return above


def _children(record: JobRecord, links: Sequence[Link]) -> list[tuple[str, str]]:
    """The jobs that came from ``record`` (waited for it, retry it), oldest first."""
    return [(link.child, ROLES[link.kind][1]) for link in links if link.parent == record.id]


def _with_status(pairs: Sequence[tuple[str, str]], store: IJobStore) -> list[Related]:
    """``pairs`` of (job id, role) with each job's status, read in one ``get_many``."""
    wanted = [job_id for job_id, _ in pairs]
    rows = {row.id: row for row in store.get_many(wanted)} if wanted else {}
    return [
        Related(
            id=job_id,
            role=role,
            status=rows[job_id].status.value if job_id in rows else None,
        )
        for job_id, role in pairs
    ]


def _related(record: JobRecord, store: IJobStore) -> tuple[list[Related], list[Related], int, bool]:
    """The first :data:`LISTED` jobs ``record`` came from and that came from it
    (:meth:`IJobStore.links`), how many more parents there are, and whether there
    are more children: the rest are on their own pages (:func:`linked_page`)."""
    links = store.links(record.id, limit=LISTED + 1)
    above, below = _parents(record, links), _children(record, links)
    shown = _with_status(above[:LISTED] + below[:LISTED], store)
    parents = shown[: min(len(above), LISTED)]
    return parents, shown[len(parents) :], max(0, len(above) - LISTED), len(below) > LISTED


#: The lists of linked jobs a page of their own shows, with their headings.
LINKED_KINDS = {"parents": "Parents", "children": "Children"}


@dataclass(frozen=True)
class LinkedPage:
    """One page of a job's parents or children."""

    job_id: str
    kind: str
    heading: str
    start: int
    rows: list[Related]
    #: Where the next page starts, if there is one.
    next_start: int | None


def linked_page(record: JobRecord, store: IJobStore, kind: str, start: int) -> LinkedPage:
    """The parents or children (``kind``) of ``record`` from the ``start``-th on,
    :data:`LINKED_PAGE` of them (the children read as far as this page goes)."""
    end = start + LINKED_PAGE
    if kind == "parents":
        pairs = _parents(record, store.links(record.id, limit=0))
    else:
        pairs = _children(record, store.links(record.id, limit=end + 1))
    return LinkedPage(
        job_id=record.id,
        kind=kind,
        heading=LINKED_KINDS[kind],
        start=start,
        rows=_with_status(pairs[start:end], store),
        next_start=end if len(pairs) > end else None,
    )


# -- the timeline ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """One line of a job's timeline."""

    at: str
    what: str
    detail: str = ""
    kind: str = "info"


def timeline(record: JobRecord, names: Mapping[str, str] | None = None) -> list[Moment]:
    """The job's transitions, oldest first, from what its row keeps (no other table):
    created, each attempt's start and end (the bounded history), the hooks that ran,
    and the end. ``names`` gives the task names by key ``"workflow.task"``."""
    names = names or {}
    found: list[tuple[datetime, int, Moment]] = []

    def add(at: datetime | str | None, moment: Moment) -> None:
        parsed = moment_of(at)
        if parsed is not None:
            found.append((parsed, len(found), moment))

    add(record.created, Moment(when(record.created), "Created", f"in channel {record.channel_id}"))
    if record.not_before is not None and record.not_before > record.created:
        add(record.not_before, Moment(when(record.not_before), "Planned start"))
    state = record.state
    for key, items in (state.get("history") or {}).items():
        task = names.get(key, f"task {key}")
        dropped = int((state.get("history_dropped") or {}).get(key, 0))
        for n, item in enumerate(items):
            attempt = _counted(item.get("attempt"))
            where = f"on {item['worker']}" if item.get("worker") else ""
            add(
                item.get("started"),
                Moment(when(item.get("started")), f"{task}: attempt {attempt} started", where),
            )
            outcome = str(item.get("outcome") or "ended")
            error = ": ".join(str(x) for x in (item.get("error_type"), item.get("message")) if x)
            add(
                item.get("ended"),
                Moment(
                    when(item.get("ended")),
                    f"{task}: attempt {attempt} {outcome.replace('_', ' ')}",
                    error,
                    "bad" if outcome != "succeeded" else "good",
                ),
            )
            if n == 0 and dropped:
                add(
                    item.get("ended"),
                    Moment(when(item.get("ended")), f"{task}: {dropped} later attempts dropped"),
                )
    for key, done in (state.get(HOOKS_DONE_KEY) or {}).items():
        task = names.get(key, f"task {key}")
        add(
            done.get("ended"),
            Moment(
                when(done.get("ended")),
                f"{task}: on_final_failure hook ran",
                str(done.get("error") or ""),
            ),
        )
    if record.status.is_terminal:
        kind = "good" if record.status is Status.COMPLETED else "bad"
        detail = record.error or ""
        canceller = cancelled_by(record)
        if record.status is Status.CANCELLED and canceller:
            detail = f"{canceller}; {detail}" if detail else canceller
        add(record.updated, Moment(when(record.updated), record.status.value, detail, kind))
    elif record.status is Status.IN_PROGRESS and record.lease_owner:
        add(
            record.updated,
            Moment(when(record.updated), "Running", f"on {record.lease_owner}"),
        )
    return [moment for _, _, moment in sorted(found, key=lambda item: (item[0], item[1]))]


def cancelled_by(record: JobRecord) -> str:
    """Who cancelled the job and from where (``state["cancelled_by"]``), as a page
    says it: ``"by cli on host1"``; empty when the row does not say."""
    entry = record.state.get(CANCELLED_BY_KEY)
    if not isinstance(entry, Mapping) or not entry.get("by"):
        return ""
    host = entry.get("host")
    return f"by {entry['by']}" + (f" on {host}" if host else "")


def _capped(moments: list[Moment]) -> list[Moment]:
    """A timeline as a page shows it: its first and last :data:`LISTED` moments, and a
    line saying how many between were left out."""
    if len(moments) <= 2 * LISTED:
        return moments
    left_out = len(moments) - 2 * LISTED
    gap = Moment(
        "...", f"{left_out} moments left out", "the attempts of each task are listed above"
    )
    return [*moments[:LISTED], gap, *moments[-LISTED:]]


def job_view(record: JobRecord, store: IJobStore) -> JobView:
    workflows = _workflows(record)
    tasks = [task for workflow in workflows for task in workflow.tasks]
    facts = [
        ("Channel", record.channel_id),
        ("Priority", str(priority_in(record.state))),
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
    if cancelled_by(record):
        facts.append(("Cancelled", cancelled_by(record)))
    parents, children, more_parents, more_children = _related(record, store)
    return JobView(
        record=record,
        workflows=workflows,
        done=sum(task.status in ("Completed", "Skipped") for task in tasks),
        total=len(tasks),
        waiting_for=[clip(reason, REASON_LONGEST) for reason in record.waiting_for(utcnow())],
        related=parents,
        children=children,
        more_parents=more_parents,
        more_children=more_children,
        timeline=_capped(timeline(record, {task.key: task.name for task in tasks})),
        raw=as_json(record.to_dict(), indent=2),
        facts=facts,
    )


# -- schedules and channels ------------------------------------------------------------------


#: How many of a schedule's latest firings its row shows.
FIRINGS = 5


@dataclass(frozen=True)
class Firing:
    """One firing of a schedule: its slot, its job and how the job stands."""

    slot: str
    job_id: str
    #: The job's status; None when no job of that slot is stored (a slot skipped as
    #: the schedule's catch-up says, one before it was stored, or a purged job).
    status: str | None
    duration: str


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
    #: Why the stored row could not be read (it does not fire; no action applies).
    damaged: str | None = None
    #: The expression in words (:func:`in_words`); None: the page shows it alone.
    cron_words: str | None = None
    #: Its latest firings, newest first.
    firings: tuple[Firing, ...] = ()


def firing_slots(schedule: RecurringSchedule, count: int = FIRINGS) -> list[tuple[str, str]]:
    """The (slot as shown, job id) of the ``count`` latest slots of ``schedule`` up to
    its last one, newest first, and of its last job when that is no slot's (a firing
    by ``trigger``): each slot's job has the id :func:`firing_id` gives it, so they
    are read by id. None for a row that cannot be read or fired here."""
    if schedule.damaged is not None or schedule.last_slot is None:
        return []
    try:
        slots = CronSchedule(schedule.cron, schedule.timezone).slots_until(
            schedule.last_slot, count
        )
    except (ConfigError, ValueError):  # croniter missing, an expression not read here
        return []
    found = [(when(slot), firing_id(schedule.name, slot)) for slot in slots]
    last = schedule.last_job_id
    if last and all(job_id != last for _, job_id in found):
        found.insert(0, (when(schedule.last_slot), last))
    return found[:count]


def schedule_rows(schedules: Sequence[RecurringSchedule], store: IJobStore) -> list[ScheduleRow]:
    """The schedules page: each schedule with its latest firings' jobs (one read of
    them all, by id)."""
    slots = {schedule.name: firing_slots(schedule) for schedule in schedules}
    wanted = [job_id for pairs in slots.values() for _, job_id in pairs]
    rows = {row.id: row for row in store.get_many(wanted)} if wanted else {}
    return [
        schedule_row(
            schedule,
            [
                Firing(
                    slot=slot,
                    job_id=job_id,
                    status=rows[job_id].status.value if job_id in rows else None,
                    duration=job_duration(rows[job_id]) if job_id in rows else "-",
                )
                for slot, job_id in slots[schedule.name]
            ],
        )
        for schedule in schedules
    ]


def schedule_row(schedule: RecurringSchedule, firings: Sequence[Firing] = ()) -> ScheduleRow:
    return ScheduleRow(
        cron_words=in_words(schedule.cron) if schedule.damaged is None else None,
        firings=tuple(firings),
        name=schedule.name,
        cron=schedule.cron,
        timezone=schedule.timezone,
        next_slot=when(schedule.next_slot),
        last_slot=when(schedule.last_slot),
        last_job_id=schedule.last_job_id,
        paused=schedule.paused,
        channel_id=str(schedule.template.get("channel_id") or "-"),
        category=str(schedule.template.get("category") or "-"),
        damaged=schedule.damaged,
    )


@dataclass(frozen=True)
class ChannelRow:
    name: str
    waiting: int
    maxsize: int
    stopped: bool
    #: Paused in the job store (:mod:`~pypepper_dramatiq.engine.pausing`): jobs taken,
    #: none started.
    paused: bool = False
    #: The channel's rate limit ("50/s"): the one the workers last applied (shared
    #: transports), else the one this process declared; None: none.
    rate_limit: str | None = None
    #: The concurrency limit this process declared (``max_running``); None: none.
    max_running: int | None = None
    #: The slots of that limit held now, on every worker (None: no limit here).
    running: int | None = None


def channel_rows(broker: Any, local: Sequence[Any]) -> tuple[str, list[ChannelRow]]:
    """Where the channels were read ("Redis", "PostgreSQL" or "this process") and their
    rows.

    Every channel the broker's transport shares with other processes (as
    ``pypepper-dramatiq channels`` lists them); with no shared transport, the channels
    of this process (``local``).

    Raises:
        Exception: the transport's server could not be read (its own errors).
    """
    transport = transport_of(broker)
    states = transport.channel_states()
    if states is None:
        return transport.where, [
            ChannelRow(
                channel.id,
                channel.length(),
                channel.maxsize,
                channel.stop,
                rate_limit=_declared_rate(channel.id),
                max_running=manager.max_running(channel.id),
                running=_running(transport, channel.id),
            )
            for channel in local
        ]
    rows = [
        ChannelRow(
            state.name,
            state.waiting,
            state.maxsize,
            state.stopped,
            rate_limit=state.rate_limit or _declared_rate(state.name),
            # The limit this process declared, else the one a worker last applied.
            max_running=manager.max_running(state.name) or state.max_running,
            running=(
                _running(transport, state.name)
                if manager.max_running(state.name) is not None
                else state.running
            ),
        )
        for state in states
    ]
    return transport.where, rows


def _running(transport: Transport, channel_id: str) -> int | None:
    """The slots of ``channel_id``'s concurrency limit held now on every worker; None
    when this process declared no limit for it (then nothing is read)."""
    if manager.max_running(channel_id) is None:
        return None
    return len(transport.slots_held(channel_slot_key(channel_id)))


def _declared_rate(channel_id: str) -> str | None:
    """The rate limit this process declared for ``channel_id``, as written (None: none)."""
    rate = manager.rate_limit(channel_id)
    return None if rate is None else str(rate)


# -- workers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRow:
    job_id: str
    #: The task's name and position ("load (0.1)"), or "-" when the cursor says none.
    task: str
    #: Round and attempt, counted from 1 as the job page counts them ("-": unknown).
    round: str
    attempt: str
    since: str


@dataclass(frozen=True)
class WorkerRow:
    owner: str
    host: str
    pid: int
    live: bool
    #: How long since its last heartbeat, in words ("12s", "3m 05s").
    silent_for: str
    started: str
    last_seen: str
    heartbeat: str
    channels: str
    dramatiq_version: str
    steps: list[StepRow]
    #: Whether it leads the recovery sweep now
    #: (:func:`~pypepper_dramatiq.records.workers.sweep_leader`).
    leads_sweep: bool = False


@dataclass(frozen=True)
class FailingDutyRow:
    duty: str
    #: Its latest error, escaped (:func:`~pypepper_dramatiq.ops.display.printable`).
    error: str
    since: str
    failures: int


@dataclass(frozen=True)
class SweepRow:
    """The recovery sweep's health, as the leading worker wrote it with its heartbeat."""

    #: The leader's host and pid ("-": no live worker leads now).
    leader: str
    last_full_pass: str
    #: How long ago, in words ("-": none yet).
    last_full_ago: str
    failing: list[FailingDutyRow]


def worker_rows(
    store: IJobStore, now: datetime, found: Sequence[WorkerInfo] | None = None
) -> list[WorkerRow]:
    """The workers page: each worker row the store lists at ``now``, live or gone, with
    the steps it holds (two reads: the rows, unless given as ``found``, then their
    InProgress jobs)."""
    found = store.workers(now) if found is None else found
    leader = sweep_leader(found, now)
    return [
        _worker_row(entry, leader is not None and entry.worker.owner == leader.owner)
        for entry in listing(found, store.held_by([w.owner for w in found]), now)
    ]


def sweep_row(found: Sequence[WorkerInfo], now: datetime) -> SweepRow | None:
    """The recovery sweep's health from the worker rows ``found``; None when no row
    carries any (workers of an older release)."""
    if not any(w.sweep is not None for w in found):
        return None
    leader = sweep_leader(found, now)
    if leader is None or leader.sweep is None:
        return SweepRow(leader="-", last_full_pass="-", last_full_ago="-", failing=[])
    health = leader.sweep
    last = health.last_full_pass
    return SweepRow(
        leader=f"{leader.host} (pid {leader.pid})",
        last_full_pass=when(last),
        last_full_ago="-" if last is None else _duration(max(0.0, (now - last).total_seconds())),
        failing=[
            FailingDutyRow(
                duty=failure.duty,
                error=printable(clip(failure.error, LONGEST)),
                since=when(failure.since),
                failures=failure.failures,
            )
            for failure in health.failing
        ],
    )


def _worker_row(entry: ListedWorker, leads_sweep: bool = False) -> WorkerRow:
    worker = entry.worker
    return WorkerRow(
        leads_sweep=leads_sweep,
        owner=worker.owner,
        host=worker.host,
        pid=worker.pid,
        live=entry.state == LIVE,
        silent_for=_duration(entry.silent_for),
        started=when(worker.started),
        last_seen=when(worker.last_seen),
        heartbeat=f"{worker.heartbeat:g}s",
        channels=", ".join(worker.channels) or "-",
        dramatiq_version=worker.dramatiq_version or "-",
        steps=[
            StepRow(
                job_id=step.job_id,
                task=f"{step.task or '?'} ({step.key})" if step.key else "-",
                round="-" if step.round is None else str(step.round + 1),
                attempt="-" if step.attempt is None else str(step.attempt + 1),
                since=when(step.since),
            )
            for step in entry.steps
        ],
    )


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"
