"""Records as the rows the SQL store writes (``stores.rows`` is the one reader of them)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
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
        payload=_payload_text(record),
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
        payload=_payload_text(record),
        state=json_text(record.state),
        waits=None if record.waits is None else json_text(record.waits),
    )
    return params


def pg_insert_rows(records: Sequence[JobRecord]) -> str:
    """The parameter of PG_INSERT_MANY: the rows as one JSON array (times as ISO 8601
    text). A payload whose check kept its text (``schedule_many``) goes in as that
    text, not encoded a second time: about 7 us of CPU a one-task job."""
    texts = []
    for record in records:
        row = row_values(record)
        for name in TIME_COLUMNS:
            if row[name] is not None:
                row[name] = row[name].isoformat()
        kept = record.payload_text()
        if kept is None:
            texts.append(json_text(row))
        else:
            del row["payload"]  # the row's other columns, then the kept text
            texts.append(f'{json_text(row)[:-1]}, "payload": {kept}}}')
    return "[" + ", ".join(texts) + "]"


def _payload_text(record: JobRecord) -> str | None:
    """The payload column's JSON text: the text its check made, when the record kept
    it (``scheduled()``), else encoded now."""
    if record.payload is None:
        return None
    return record.payload_text() or json_text(record.payload)


def _iso(moment: datetime | None) -> str | None:
    """``moment`` as the ISO 8601 text a JSON row carries (JSON has no time type)."""
    return None if moment is None else moment.isoformat()


def pg_claim_rows(requests: Sequence[StepClaim], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameter of PG_CLAIM_MANY: a row per request, as one JSON array (times as
    ISO 8601 text), one ``json.dumps`` where an array per column cost psycopg a
    Python loop per value."""
    rows = []
    for n in chosen:
        r = requests[n]
        rows.append(
            {
                "n": n,
                "id": r.job_id,
                "cursor": list(r.cursor),
                "owner": r.owner,
                "now": _iso(r.now),
                "lease_until": _iso(r.lease_until),
                "start": r.start,
                "retry": is_retry(r.cursor),
            }
        )
    return {"rows": json.dumps(rows)}


#: The stored statuses each status may replace, as the comma-separated text of
#: PG_ADVANCE_MANY's rows.
_ALLOWED_TEXT = {status: ",".join(values) for status, values in ALLOWED.items()}


def pg_advance_rows(records: Sequence[JobRecord], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameter of PG_ADVANCE_MANY: its rows as one JSON array, times as ISO 8601
    text. One ``json.dumps`` of the batch, where one array parameter per column cost
    psycopg a Python loop per value (the outcome batch's biggest client-side item)."""
    rows = []
    for n in chosen:
        record = records[n]
        row_values(record)  # refuses a damaged placeholder, as every write does
        rows.append(
            {
                "n": n,
                "id": record.id,
                "version": record.version,
                "allowed": _ALLOWED_TEXT[record.status],
                "status": record.status.value,
                "updated": _iso(record.updated),
                "state": record.state,
                "error": record.error,
                "lease_owner": record.lease_owner,
                "lease_expires": _iso(record.lease_expires),
                "not_before": _iso(record.not_before),
                "release_at": _iso(record.release_at),
                "start_deadline": _iso(record.start_deadline),
                "unique_key": record.unique_key,
                "waits": record.waits,
                "waiting_since": _iso(record.waiting_since),
            }
        )
    return {"rows": json_text(rows)}


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
