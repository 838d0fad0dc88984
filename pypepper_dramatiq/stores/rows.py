"""Stored rows read back: what each column holds is checked before it becomes a record.

A row holds what this package's writers write. One changed by hand or by another
program may hold something else (a list where the state's object goes, a status no
version knows, MariaDB's zero date). Read as if it were whole, it fails later and
anywhere: a ``TypeError`` inside a step, a page answering 500, a sweep failing every
second. So each column is checked here, where a row becomes a
:class:`~pypepper_dramatiq.records.record.JobRecord`,
:class:`~pypepper_dramatiq.records.recurring.RecurringSchedule` or
:class:`~pypepper_dramatiq.records.workers.WorkerInfo`:

* a single read (``get``, ``claim_step``) raises
  :class:`~pypepper_dramatiq.errors.CorruptRecordError` naming the row and the column;
* a listing or a batch read of jobs gets a placeholder instead: a record with
  :attr:`~pypepper_dramatiq.records.record.JobRecord.damaged` set and what could be read, so
  that one row never fails a page or a batch. A damaged schedule or worker row is
  left out of its listing, logged once per row per process (a placeholder is not
  logged here: the pages and the CLI show it, the recovery sweep logs its skips).

The checks are of what the code relies on: each column's type, the status a known
one, the top-level shapes of the JSON columns (the state's keys, the payload's
workflows and tasks as lists of objects). They cost microseconds a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import CorruptRecordError, CorruptScheduleError
from ..ops.display import printable
from ..ops.isolation import OnceEach
from ..ops.logs import get_logger
from ..records.progress import PROGRESS_KEY
from ..records.record import MAX_ID_LENGTH, JobRecord
from ..records.recurring import RecurringSchedule
from ..records.state import DISPATCH_KEY, HOOKS_DONE_KEY, HOOKS_KEY, PARENT_RESULTS_KEY
from ..records.workers import MAX_OWNER_LENGTH, SweepHealth, WorkerInfo
from ..rules.cron import CATCH_UP, OVERLAP
from ..rules.status import Status

__all__ = [
    "job_record",
    "listed_job",
    "listed_jobs",
    "listed_schedules",
    "listed_workers",
    "due_schedules",
    "readable_waits",
    "recurring_schedule",
    "status_or_unknown",
]

logger = get_logger(__name__)

#: What a placeholder shows for a time that could not be read.
UNREADABLE_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)

_STATUSES = {status.value: status for status in Status}

#: A row as the database driver hands it over: its columns by name.
Row = Mapping[Any, Any]


class _Damaged(Exception):
    """One column that cannot be read (turned into the public error by the caller)."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(column, reason)
        self.column = column
        self.reason = reason


# -- what a value is, in the words of JSON ----------------------------------------------


def _kind_of(value: object) -> str:
    """What ``value`` is, as a person reading the row would say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, datetime):
        return "a time"
    return f"a {type(value).__name__}"


def _shown(value: object, limit: int = 40) -> str:
    """A stored value quoted for a message (escaped, cut)."""
    text = printable(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _expected(what: str, value: object) -> str:
    return f"expected {what}, found {_kind_of(value)}"


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- column checks: each returns why the value cannot be read, or None -------------------

Check = Callable[[Any], "str | None"]


def _text(*, optional: bool = False, limit: int | None = None) -> Check:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            return _expected("a string", value)
        if limit is not None and not 0 < len(value) <= limit:
            return f"expected 1 to {limit} characters, found {len(value)}"
        return None

    return check


def _time(*, optional: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, datetime):
            shown = f" {_shown(value)}" if isinstance(value, str) else ""
            return f"expected a time, found {_kind_of(value)}{shown}"
        return None

    return check


def _status(value: Any) -> str | None:
    if isinstance(value, str) and value in _STATUSES:
        return None
    if isinstance(value, str):
        return f"expected a status, found {_shown(value)}, which names none"
    return _expected("a status", value)


def _version(value: Any) -> str | None:
    if not _is_whole(value):
        return _expected("a whole number", value)
    return None if value >= 0 else f"expected a version of 0 or more, found {value}"


def _workflows(payload: Mapping[str, Any]) -> str | None:
    """The payload's top level: ``workflows`` a list of objects, each one's ``tasks``
    a list of objects (what rebuilding the job and naming its tasks walk)."""
    workflows = payload.get("workflows", [])
    if not isinstance(workflows, list):
        return f"key 'workflows': {_expected('a list', workflows)}"
    for w, workflow in enumerate(workflows):
        if not isinstance(workflow, dict):
            return f"workflow {w}: {_expected('an object', workflow)}"
        tasks = workflow.get("tasks", [])
        if not isinstance(tasks, list):
            return f"workflow {w} key 'tasks': {_expected('a list', tasks)}"
        for t, task in enumerate(tasks):
            if not isinstance(task, dict):
                return f"task {w}.{t}: {_expected('an object', task)}"
    return None


def _object(
    read: Callable[[dict[str, Any]], str | None],
    *,
    optional: bool = False,
    expected: str = "an object",
) -> Check:
    """A check of an object column: null passes where ``optional``, anything else but
    an object is named (as ``expected``), and ``read`` checks the object's keys."""

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, dict):
            return _expected(expected, value)
        return read(value)

    return check


_payload = _object(_workflows, optional=True, expected="an object or null")


def _entries(what: str, test: Callable[[Any], bool]) -> Callable[[Any], str | None]:
    """A check of an object whose every value passes ``test`` (``what`` it must be)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return _expected("an object", value)
        for key, entry in value.items():
            if not test(entry):
                return f"entry {_shown(key)}: {_expected(what, entry)}"
        return None

    return check


def _any_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else _expected("an object", value)


def _any_list(value: Any) -> str | None:
    return None if isinstance(value, list) else _expected("a list", value)


def _cursor(value: Any) -> str | None:
    if not isinstance(value, list):
        return _expected("a list", value)
    if len(value) != 4 or not all(_is_whole(part) for part in value):
        return f"expected 4 whole numbers (workflow, task, round, attempt), found {_shown(value)}"
    return None


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _is_attempt_list(value: Any) -> bool:
    """A task's attempt history: a list of objects (the pages read each one's keys)."""
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _is_hold(value: Any) -> bool:
    """A hook's hold: an object whose ``until`` is null or an ISO time (the sweep
    compares it with the clock to take the hook over)."""
    if not isinstance(value, dict):
        return False
    until = value.get("until")
    if until is None:
        return True
    if not isinstance(until, str):
        return False
    try:
        datetime.fromisoformat(until)
    except ValueError:
        return False
    return True


#: The state's keys the engine reads, and what each must hold when present and not
#: empty (:meth:`JobState.from_dict <pypepper_dramatiq.records.state.JobState.from_dict>`
#: takes a missing, null or empty one as empty).
_STATE_KEYS: dict[str, Check] = {
    "cursor": _cursor,
    "results": _any_object,
    "errors": _any_object,
    "attempts": _entries("a whole number", _is_whole),
    "skipped": _any_list,
    "history": _entries("a list of objects", _is_attempt_list),
    "history_dropped": _entries("a whole number", _is_whole),
    DISPATCH_KEY: _any_object,
    PARENT_RESULTS_KEY: _any_object,
    HOOKS_KEY: _entries("an object whose 'until' is null or an ISO time", _is_hold),
    HOOKS_DONE_KEY: _entries("an object", _is_object),
    PROGRESS_KEY: _entries("an object", _is_object),
}


def _state_keys(value: dict[str, Any]) -> str | None:
    for key, check in _STATE_KEYS.items():
        entry = value.get(key)
        if entry:  # absent, null or empty: read as empty
            problem = check(entry)
            if problem is not None:
                return f"key {key!r}: {problem}"
    return None


#: A null state was never written: it reads as empty, as it always did.
_state = _object(_state_keys, optional=True)


def _wait_keys(value: dict[str, Any]) -> str | None:
    parents = value.get("parents")
    if parents and (not isinstance(parents, list) or not all(isinstance(p, str) for p in parents)):
        return f"key 'parents': {_expected('a list of job ids', parents)}"
    for key in ("key", "holder", "on_parent_failure"):
        entry = value.get(key)
        if entry is not None and not isinstance(entry, str):
            return f"key {key!r}: {_expected('a string', entry)}"
    return None


_waits = _object(_wait_keys, optional=True, expected="an object or null")

#: Each column of ``scheduler_jobs`` a record is read from, and its check.
_JOB_COLUMNS: dict[str, Check] = {
    "id": _text(limit=MAX_ID_LENGTH),
    "channel_id": _text(limit=128),
    "category": _text(optional=True),
    "status": _status,
    "version": _version,
    "created": _time(),
    "updated": _time(),
    "payload": _payload,
    "state": _state,
    "error": _text(optional=True),
    "lease_owner": _text(optional=True),
    "lease_expires": _time(optional=True),
    "not_before": _time(optional=True),
    "release_at": _time(optional=True),
    "start_deadline": _time(optional=True),
    "unique_key": _text(optional=True),
    "waits": _waits,
    "waiting_since": _time(optional=True),
}

#: What a placeholder holds in place of a column that could not be read.
_JOB_DEFAULTS: dict[str, Any] = {
    "channel_id": "default",
    "status": Status.UNKNOWN,
    "version": 0,
    "created": UNREADABLE_TIME,
    "updated": UNREADABLE_TIME,
    "state": {},
}


def _problems(row: Row, columns: Mapping[str, Check]) -> list[tuple[str, str]]:
    """(column, reason) of each of ``columns`` (each with its check) that cannot be
    read in ``row``, in column order."""
    problems = []
    for column, check in columns.items():
        reason = check(row[column])
        if reason is not None:
            problems.append((column, reason))
    return problems


def _job_fields(row: Row, bad: Iterable[str] = ()) -> dict[str, Any]:
    fields = {column: row[column] for column in _JOB_COLUMNS}
    for column in bad:
        fields.pop(column)
        if column in _JOB_DEFAULTS:
            fields[column] = _JOB_DEFAULTS[column]
    fields["status"] = _STATUSES.get(fields["status"], Status.UNKNOWN)
    fields["state"] = dict(fields["state"] or {})
    return fields


def job_record(row: Row) -> JobRecord:
    """The record of a ``scheduler_jobs`` row (a mapping of its columns).

    Raises:
        CorruptRecordError: a column holds what no writer of this package writes;
            the error names the first such column.
    """
    problems = _problems(row, _JOB_COLUMNS)
    if problems:
        column, reason = problems[0]
        raise CorruptRecordError(_id_of(row), column, reason)
    return JobRecord(**_job_fields(row))


def listed_job(row: Row) -> JobRecord | None:
    """The record of a row in a listing or batch read: :func:`job_record`, or for a
    damaged row a placeholder with ``damaged`` set; None when not even its id can be
    read (left out, logged once per process)."""
    problems = _problems(row, _JOB_COLUMNS)
    if not problems:
        return JobRecord(**_job_fields(row))
    damaged = "; ".join(f"column {column!r}: {reason}" for column, reason in problems)
    if any(column == "id" for column, _ in problems):
        _report(_id_of(row), damaged, "left out of listings")
        return None
    return JobRecord(**_job_fields(row, (column for column, _ in problems)), damaged=damaged)


def readable_waits(values: Iterable[Any]) -> list[Any]:
    """The ``waits`` column values that can be read: a damaged one names no parent
    that can be trusted, so a batch reading many (the purge) leaves it out."""
    return [value for value in values if _waits(value) is None]


def listed_jobs(rows: Iterable[Row]) -> list[JobRecord]:
    """:func:`listed_job` of each row, those with a readable id."""
    return [record for record in map(listed_job, rows) if record is not None]


def status_or_unknown(value: object) -> Status:
    """A stored status value, or Unknown for one no version knows."""
    return _STATUSES.get(value, Status.UNKNOWN) if isinstance(value, str) else Status.UNKNOWN


def _id_of(row: Row) -> str:
    value = row.get("id")
    return value if isinstance(value, str) else repr(value)


# -- recurring schedules ---------------------------------------------------------------


def _cron(value: Any) -> str | None:
    if not isinstance(value, str):
        return _expected("a cron expression", value)
    fields = value.split()
    if not value.strip().startswith("@") and len(fields) not in (5, 6):
        return f"expected a cron expression of 5 or 6 fields, found {_shown(value)}"
    return None


def _zone(value: Any) -> str | None:
    if not isinstance(value, str):
        return _expected("a time zone name", value)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"expected an IANA time zone, found {_shown(value)}"
    return None


def _template_keys(value: dict[str, Any]) -> str | None:
    channel = value.get("channel_id")
    if not isinstance(channel, str) or not channel:
        return f"key 'channel_id': {_expected('a channel name', channel)}"
    category = value.get("category")
    if category is not None and not isinstance(category, str):
        return f"key 'category': {_expected('a string or null', category)}"
    payload = value.get("payload")
    if not isinstance(payload, dict):
        return f"key 'payload': {_expected('an object', payload)}"
    problem = _workflows(payload)
    return None if problem is None else f"key 'payload' {problem}"


_template = _object(_template_keys)


def _one_of(choices: Iterable[str]) -> Check:
    allowed = tuple(choices)

    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        return f"expected one of {', '.join(allowed)}, found {_shown(value)}"

    return check


def _seconds(*, optional: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not _is_number(value) or not value >= 0:
            return _expected("a number of seconds (0 or more)", value)
        return None

    return check


def _flag(value: Any) -> str | None:
    # MySQL's BOOLEAN is a TINYINT: 0 and 1 come back as numbers.
    return None if isinstance(value, bool) or value in (0, 1) else _expected("a boolean", value)


_SCHEDULE_COLUMNS: dict[str, Check] = {
    "name": _text(limit=128),
    "cron": _cron,
    "timezone": _zone,
    "template": _template,
    "next_slot": _time(),
    "max_start_delay": _seconds(optional=True),
    "overlap": _one_of(OVERLAP),
    "catch_up": _one_of(CATCH_UP),
    "last_slot": _time(optional=True),
    "last_job_id": _text(optional=True),
    "paused": _flag,
    "version": _version,
    "created": _time(),
    "updated": _time(),
}


#: What a schedule's placeholder holds in place of a column that could not be read,
#: when what it holds is not even of the column's type (text is kept as stored).
_SCHEDULE_DEFAULTS: dict[str, Any] = {
    "name": "?",
    "cron": "?",
    "timezone": "?",
    "template": {},
    "next_slot": UNREADABLE_TIME,
    "max_start_delay": None,
    "overlap": "?",
    "catch_up": "?",
    "last_slot": None,
    "last_job_id": None,
    "paused": False,
    "version": 0,
    "created": UNREADABLE_TIME,
    "updated": UNREADABLE_TIME,
}


def _shown_as_read(column: str, value: Any) -> bool:
    """Whether a placeholder may show ``value`` of a damaged ``column`` as stored: text
    that is not a valid cron or zone is still text to show; a wrong type is not."""
    default = _SCHEDULE_DEFAULTS[column]
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, dict):
        return isinstance(value, dict)
    return False


def _schedule(row: Row, problems: Sequence[tuple[str, str]] = ()) -> RecurringSchedule:
    values = {column: row[column] for column in _SCHEDULE_COLUMNS}
    for column, _ in problems:
        if not _shown_as_read(column, values[column]):
            values[column] = _SCHEDULE_DEFAULTS[column]
    values.update(template=dict(values["template"]), paused=bool(values["paused"]))
    damaged = "; ".join(f"column {column!r}: {reason}" for column, reason in problems)
    return RecurringSchedule(**values, damaged=damaged or None)


def recurring_schedule(row: Row) -> RecurringSchedule:
    """The schedule of a ``scheduler_recurring`` row.

    Raises:
        CorruptScheduleError: a column holds what no writer of this package writes.
    """
    problems = _problems(row, _SCHEDULE_COLUMNS)
    if problems:
        column, reason = problems[0]
        raise CorruptScheduleError(_name_of(row), column, reason)
    return _schedule(row)


def listed_schedules(rows: Iterable[Row]) -> list[RecurringSchedule]:
    """The schedules of ``rows``, a damaged one as a placeholder (``damaged`` set)."""
    return [_schedule(row, _problems(row, _SCHEDULE_COLUMNS)) for row in rows]


def due_schedules(rows: Iterable[Row]) -> list[RecurringSchedule]:
    """The schedules of ``rows`` that may fire: a damaged row is left out (logged once
    per process), so that it never fires nor stops the others."""
    found = []
    for row in rows:
        problems = _problems(row, _SCHEDULE_COLUMNS)
        if not problems:
            found.append(_schedule(row))
            continue
        damaged = "; ".join(f"column {column!r}: {reason}" for column, reason in problems)
        _report(_name_of(row), damaged, "left out: it does not fire", what="schedule")
    return found


def _name_of(row: Row) -> str:
    value = row.get("name")
    return value if isinstance(value, str) else repr(value)


# -- worker rows ----------------------------------------------------------------------


def _channels(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        return _expected("a list of channel names", value)
    return None


def _heartbeat(value: Any) -> str | None:
    if not _is_number(value) or not value > 0:
        return _expected("a number of seconds above 0", value)
    return None


_WORKER_COLUMNS: dict[str, Check] = {
    "owner": _text(limit=MAX_OWNER_LENGTH),
    "host": _text(),
    "pid": lambda value: None if _is_whole(value) else _expected("a whole number", value),
    "started": _time(),
    "last_seen": _time(),
    "heartbeat": _heartbeat,
    "channels": _channels,
    "dramatiq_version": _text(optional=True),
}


def _worker(row: Row) -> WorkerInfo:
    for column, check in _WORKER_COLUMNS.items():
        reason = check(row[column])
        if reason is not None:
            raise _Damaged(column, reason)
    return WorkerInfo(
        owner=row["owner"],
        host=row["host"],
        pid=row["pid"],
        started=row["started"],
        last_seen=row["last_seen"],
        heartbeat=float(row["heartbeat"]),
        channels=tuple(row["channels"] or ()),
        dramatiq_version=row["dramatiq_version"],
        # Read leniently where it is defined: a value that is not one is no health.
        sweep=SweepHealth.from_dict(row["sweep"]),
    )


def listed_workers(rows: Iterable[Row]) -> list[WorkerInfo]:
    """The workers of ``rows``; a damaged row is left out (logged once per process)."""
    found = []
    for row in rows:
        try:
            found.append(_worker(row))
        except _Damaged as exc:
            owner = row.get("owner")
            shown = owner if isinstance(owner, str) else repr(owner)
            damaged = f"column {exc.column!r}: {exc.reason}"
            _report(shown, damaged, "left out of the workers listing", what="worker row")
    return found


# -- rows left out ---------------------------------------------------------------------

#: The rows left out of a listing that this process has logged (a damaged job row
#: is not: it is listed as a placeholder, which the pages show and the sweep logs).
_logged = OnceEach()


def _report(key: str, damaged: str, outcome: str, *, what: str = "job") -> None:
    """Log a row left out of a listing, the first time this process reads it so."""
    if _logged.first((what, key, damaged)):
        logger.warning("%s %s: stored row is damaged (%s); %s", what, key, damaged, outcome)
