"""What the retry of an ended job starts with: the decisions, pure (no I/O).

``Job.retry_saved(job_id, from_task)`` makes a new job of a Failed or
Cancelled one: the job I/O reads the original's row and schedules the record
:func:`retry_record` makes of it. The new job

* resumes where the original stopped: at the task of its stored cursor (the
  task that failed, or that ran or was next when the job was cancelled; the
  first task of a job that ended before it started), or at ``from_task``, a
  task name or a ``"workflow.task"`` position, which may be earlier, not later;
* starts with the results of the tasks before that position (and which
  optional tasks among them were skipped, with their errors), and the
  parents' results of a job that waited for others, so that those tasks do
  not run again and the later ones read their results; it starts its task at
  round 0, attempt 0, with no attempts nor history of its own;
* keeps the original's workflows, channel and category, and names the
  original in ``payload["retry_of"]`` (:data:`~pypepper_dramatiq.records.links.RETRY_OF_KEY`).

The original's row is not touched: its status is final.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ..errors import (
    AmbiguousTaskNameError,
    JobNotRetriableError,
    RetryError,
    UnknownExecutorError,
    UnknownTaskError,
)
from ..records.links import RETRY_OF_KEY
from ..records.record import JobRecord
from ..records.state import JobState
from ..rules.priorities import priority_in, with_priority
from ..rules.status import Status
from ..rules.steps import Position

#: The statuses a job may be retried from.
RETRIABLE = frozenset({Status.FAILED, Status.CANCELLED})

#: A task's position as ``from_task`` may give it: ``"workflow.task"``.
_POSITION = re.compile(r"([0-9]+)\.([0-9]+)")


def stopped_at(record: JobRecord) -> Position:
    """The task where ``record``'s job stopped: its cursor's (round and attempt 0),
    or the first task when it has none (it ended before it started)."""
    cursor = JobState.from_dict(record.state).cursor
    return Position() if cursor is None else Position(cursor.workflow, cursor.task)


def task_position(record: JobRecord, from_task: str) -> Position:
    """The position of the task ``from_task`` names in ``record``'s job: a task
    name (as ``JobRecord.result`` finds it), else a ``"workflow.task"`` position.

    Raises:
        UnknownTaskError: no task has that name or is at that position.
        AmbiguousTaskNameError: several tasks have that name.
        NoTaskResultError: the record holds no workflows.
    """
    found = record.positions_of(from_task)
    if len(found) > 1:
        places = ", ".join(f"{w}.{t}" for w, t in found)
        raise AmbiguousTaskNameError(
            f"task name {from_task!r} is ambiguous in job {record.id}: tasks {places} "
            "(workflow.task) have it; give the position of the one to start from"
        )
    if found:
        return Position(*found[0])
    names = record.task_names()
    given = _POSITION.fullmatch(from_task)
    if given is not None:
        workflow, task = int(given.group(1)), int(given.group(2))
        if workflow < len(names) and task < len(names[workflow]):
            return Position(workflow, task)
    raise UnknownTaskError(record.id, from_task, names)


def resume_position(record: JobRecord, from_task: str | None = None) -> Position:
    """Where the retry of ``record``'s job starts: where it stopped, or at ``from_task``.

    Raises:
        UnknownTaskError, AmbiguousTaskNameError: see :func:`task_position`.
        RetryError: ``from_task`` comes after where the job stopped (the
            tasks in between have no result to keep).
    """
    stop = stopped_at(record)
    if from_task is None:
        return stop
    start = task_position(record, from_task)
    if (start.workflow, start.task) > (stop.workflow, stop.task):
        raise RetryError(
            f"job {record.id!r} stopped at task {stop.key()} (workflow.task); it cannot be "
            f"retried from {from_task!r} ({start.key()}), later: the tasks in between "
            "have no result. Retry from where it stopped, or earlier"
        )
    return start


def initial_state(record: JobRecord, start: Position) -> dict[str, Any]:
    """The state the retry of ``record``'s job starts with at ``start`` (see the module)."""
    before = {
        f"{w}.{t}"
        for w, tasks in enumerate(record.task_names())
        for t in range(len(tasks))
        if (w, t) < (start.workflow, start.task)
    }
    old = JobState.from_dict(record.state)
    skipped = [key for key in old.skipped if key in before]
    state = JobState(
        cursor=start,
        results={key: value for key, value in old.results.items() if key in before},
        errors={key: old.errors[key] for key in skipped if key in old.errors},
        skipped=skipped,
        parent_results=old.parent_results,
    ).to_dict()
    return with_priority(state, priority_in(record.state))  # a retry keeps the priority


def retry_record(
    original: JobRecord, new_id: str, from_task: str | None = None, *, now: datetime
) -> JobRecord:
    """The record of the job ``new_id`` that retries ``original``, not stored yet
    (status Unknown, version 0): its workflows, channel and category, the
    original's id as ``payload["retry_of"]``, and the state it starts with.

    Raises:
        JobNotRetriableError: ``original`` is not Failed or Cancelled.
        UnknownExecutorError: ``original`` was stored without its workflows.
        UnknownTaskError, AmbiguousTaskNameError, RetryError: a ``from_task``
            that names no task, several, or one after where the job stopped.
    """
    if original.status not in RETRIABLE:
        raise JobNotRetriableError(original.id, original.status.value)
    if original.payload is None:
        raise UnknownExecutorError(
            None,
            f"job {original.id} was stored without its workflows, so it cannot be "
            "retried from the store",
        )
    start = resume_position(original, from_task)
    return JobRecord(
        id=new_id,
        channel_id=original.channel_id,
        category=original.category,
        created=now,
        updated=now,
        payload={**original.payload, RETRY_OF_KEY: original.id},
        state=initial_state(original, start),
    )
