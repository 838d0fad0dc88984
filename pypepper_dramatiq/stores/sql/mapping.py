"""Records as the rows the SQL store writes (``stores.rows`` is the one reader of them)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ...errors import CorruptRecordError, CorruptScheduleError
from ...limits.storable import json_text
from ...records.recurring import RecurringSchedule
from ...records.workers import WorkerInfo
from ...rules.start_times import is_retry
from ...rules.status import Status, overwritable_by
from ..base import JobRecord, StepClaim
from ..schema import UtcDateTime, jobs


def row_values(record: JobRecord) -> dict[str, Any]:
    """The columns of ``record``'s row (every write goes through here).

    Raises:
        CorruptRecordError: ``record`` is a listing's placeholder for a damaged row
            (or made from one): writing it would replace what could not be read.
    """
    if record.damaged is not None:
        raise CorruptRecordError(
            record.id, "-", f"a placeholder is never written back ({record.damaged})"
        )
    return {
        "id": record.id,
        "channel_id": record.channel_id,
        "category": record.category,
        "status": record.status.value,
        "version": record.version + 1,
        "created": record.created,
        "updated": record.updated,
        "payload": record.payload,
        "state": record.state,
        "error": record.error,
        "lease_owner": record.lease_owner,
        "lease_expires": record.lease_expires,
        "not_before": record.not_before,
        "release_at": record.release_at,
        "start_deadline": record.start_deadline,
        "unique_key": record.unique_key,
        "waits": record.waits,
        "waiting_since": record.waiting_since,
    }


#: The stored statuses each status may replace, as the arrays the statements take.
ALLOWED = {status: sorted(s.value for s in overwritable_by(status)) for status in Status}


def pg_params(record: JobRecord) -> dict[str, Any]:
    """Parameters of the hot PostgreSQL statements: the seen version, JSON as text."""
    params = row_values(record)
    params.update(
        version=record.version,
        payload=None if record.payload is None else json_text(record.payload),
        state=json_text(record.state),
        waits=None if record.waits is None else json_text(record.waits),
        allowed=ALLOWED[record.status],
    )
    return params


def pg_insert_params(record: JobRecord) -> dict[str, Any]:
    """Parameters of PG_INSERT (a first write): the row's columns, JSON as text."""
    params = row_values(record)
    del params["version"]  # always 1
    params.update(
        payload=None if record.payload is None else json_text(record.payload),
        state=json_text(record.state),
        waits=None if record.waits is None else json_text(record.waits),
    )
    return params


def pg_claim_arrays(requests: Sequence[StepClaim], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameters of PG_CLAIM_MANY: one array per column, a row per request."""
    picked = [requests[n] for n in chosen]
    return {
        "n": list(chosen),
        "id": [r.job_id for r in picked],
        "cursor": [json.dumps(list(r.cursor)) for r in picked],
        "owner": [r.owner for r in picked],
        "now": [r.now for r in picked],
        "lease_until": [r.lease_until for r in picked],
        "start": [r.start for r in picked],
        "retry": [is_retry(r.cursor) for r in picked],
    }


#: The columns PG_ADVANCE_MANY takes as arrays, besides ``n`` and ``allowed``.
_ADVANCE_ARRAYS = (
    "id",
    "version",
    "status",
    "updated",
    "state",
    "error",
    "lease_owner",
    "lease_expires",
    "not_before",
    "release_at",
    "start_deadline",
    "unique_key",
    "waits",
    "waiting_since",
)


def pg_advance_arrays(records: Sequence[JobRecord], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameters of PG_ADVANCE_MANY: one array per column, a row per record."""
    rows = [pg_params(records[n]) for n in chosen]
    arrays: dict[str, Any] = {"n": list(chosen)}
    for column in _ADVANCE_ARRAYS:
        arrays[column] = [row[column] for row in rows]
    arrays["allowed"] = [",".join(row["allowed"]) for row in rows]
    return arrays


#: The columns ``put_many``'s rows send as ISO 8601 text (JSON has no time type).
TIME_COLUMNS = tuple(column.name for column in jobs.c if isinstance(column.type, UtcDateTime))


def schedule_values(schedule: RecurringSchedule) -> dict[str, Any]:
    """The row of ``schedule``: its fields are the table's columns, by name.

    Raises:
        CorruptScheduleError: ``schedule`` is a listing's placeholder for a damaged row.
    """
    if schedule.damaged is not None:
        raise CorruptScheduleError(
            schedule.name, "-", f"a placeholder is never written back ({schedule.damaged})"
        )
    return {
        field.name: getattr(schedule, field.name)
        for field in dataclasses.fields(schedule)
        if field.name != "damaged"
    }


def worker_values(worker: WorkerInfo) -> dict[str, Any]:
    """The ``scheduler_workers`` row of ``worker``."""
    return {
        "owner": worker.owner,
        "host": worker.host,
        "pid": worker.pid,
        "started": worker.started,
        "last_seen": worker.last_seen,
        "heartbeat": worker.heartbeat,
        "channels": list(worker.channels),
        "dramatiq_version": worker.dramatiq_version,
        "sweep": None if worker.sweep is None else worker.sweep.to_dict(),
    }
