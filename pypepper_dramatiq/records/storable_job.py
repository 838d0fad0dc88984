"""Whether the job row can hold what a user submits: the one check at every user write.

:mod:`~pypepper_dramatiq.limits.storable` says what a column holds; this applies it to a
job's row as :meth:`Job.to_record <pypepper_dramatiq.model.job.Job.to_record>` builds
it: the id, channel id, category and unique key, and every string of the stored
workflows (task names, parameters and their keys, tags...). The job I/O calls it
before anything is stored or sent (``scheduled()``, ``schedule_many()``,
``save()``, ``retry_saved()``, a recurring schedule's template), whatever the
store: the in-memory store refuses what PostgreSQL or MySQL could not keep, so
that the embedded default teaches the truth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..limits.storable import (
    CATEGORY_LENGTH,
    CHANNEL_ID_LENGTH,
    ID_LENGTH,
    UNIQUE_KEY_LENGTH,
    check_json,
    check_text,
    checked_json_text,
    unstorable_in,
)
from .record import JobRecord, check_job_id

__all__ = ["check_job_record", "could_be_stored"]


def check_job_record(record: JobRecord) -> JobRecord:
    """``record`` if a job row can hold every value a user gave it; else ``ValueError``
    (``TypeError`` for a value of the wrong type) naming the field and its limit.

    The engine's own fields (``state``, ``error``) are not checked here: the
    engine makes what it writes storable (:func:`~pypepper_dramatiq.limits.storable.storable_text`).
    The payload's JSON text, made by its check, is kept on ``record`` for the store
    (:meth:`JobRecord.payload_text <pypepper_dramatiq.records.record.JobRecord.payload_text>`).
    """
    check_job_id(record.id)
    check_channel_id(record.channel_id)
    if record.category is not None:
        if not isinstance(record.category, str):
            raise TypeError(f"category must be a string or None, got {record.category!r}")
        check_text("category", record.category, CATEGORY_LENGTH)
    if record.unique_key is not None:
        check_text("unique_key", record.unique_key, UNIQUE_KEY_LENGTH)
    if record.payload is not None:
        record.keep_payload_text(_check_payload(record.payload))
    if record.waits is not None:
        check_json("waits", record.waits)
    return record


def check_channel_id(channel_id: object) -> str:
    """``channel_id`` if it is a non-empty string a row (and a queue name) can hold."""
    if not isinstance(channel_id, str) or not channel_id:
        raise ValueError(f"channel_id must be a non-empty string, got {channel_id!r}")
    return check_text("channel_id", channel_id, CHANNEL_ID_LENGTH)


def could_be_stored(job_id: object) -> bool:
    """Whether a job row could have the id ``job_id``: a lookup of an id no row can
    hold (too long, a NUL) finds no job, without asking the store."""
    return (
        isinstance(job_id, str) and 0 < len(job_id) <= ID_LENGTH and unstorable_in(job_id) is None
    )


def _check_payload(payload: Mapping[str, Any]) -> str:
    """The payload checked in one pass, as its JSON text for the store; when refused,
    the task at fault is named."""
    try:
        return checked_json_text("the job's payload", payload)
    except ValueError:
        workflows = payload.get("workflows")
        for w, workflow in enumerate(workflows if isinstance(workflows, list) else ()):
            tasks = workflow.get("tasks") if isinstance(workflow, Mapping) else None
            for t, task in enumerate(tasks if isinstance(tasks, list) else ()):
                name = task.get("name") if isinstance(task, Mapping) else None
                shown = f"{name!r:.60}" if isinstance(name, str) else f"#{t}"
                # A task sits 4 levels down: workflows, a workflow, its tasks.
                check_json(f"task {shown} (workflow {w}, task {t})", task, depth=4)
        raise  # not in a task: the payload's own keys
