"""The claim rule: which stored row's step may be taken now, defined once.

Each condition is written twice side by side, as the two forms one rule takes:
in Python (why a record fails it; the memory store and the batch claims of
MySQL evaluate it) and as a PostgreSQL condition (the claiming statements of
:mod:`pypepper_dramatiq.stores.sql.statements` render it). A condition
changed here changes every store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..records.record import JobRecord
from ..rules.start_times import late_retry
from ..rules.status import Status

#: What a claim asks: the step's cursor, the time, and whether it may start the job.
Asked = tuple[Sequence[int] | None, datetime, bool]


@dataclass(frozen=True)
class Condition:
    """One condition a row must meet to be claimed.

    Attributes:
        refusal: why ``record`` fails it for what is asked; None if it holds.
        postgres: the same condition in PostgreSQL, a template over ``{row}`` (the
            prefix of the row's columns) and the asked values ``{cursor}`` (JSON
            text), ``{now}``, ``{start}`` and ``{retry}`` (whether the cursor is a
            retry, :func:`~pypepper_dramatiq.rules.start_times.is_retry`).
    """

    refusal: Callable[[JobRecord, Asked], str | None]
    postgres: str


def _at_cursor(record: JobRecord, asked: Asked) -> str | None:
    cursor = asked[0]
    at = list(record.state.get("cursor") or [])
    if cursor is None or not at or at != list(cursor):
        return f"stale message for {cursor}, at {at or None}"
    return None


def _lease_free(record: JobRecord, asked: Asked) -> str | None:
    # An owner without expiry holds the step for good.
    if record.lease_owner is not None and (
        record.lease_expires is None or record.lease_expires >= asked[1]
    ):
        return f"step {list(record.state.get('cursor') or [])} is held by {record.lease_owner}"
    return None


def _not_late_retry(record: JobRecord, asked: Asked) -> str | None:
    if late_retry(record.start_deadline, asked[0], asked[1]):
        assert record.start_deadline is not None
        return f"a retry after its start deadline passed at {record.start_deadline.isoformat()}"
    return None


def _start_asked(record: JobRecord, asked: Asked) -> str | None:
    return None if asked[2] else f"not started, message for {asked[0]}"


def _start_due(record: JobRecord, asked: Asked) -> str | None:
    if record.not_before is not None and record.not_before > asked[1]:
        return f"planned to start at {record.not_before.isoformat()}"
    return None


def _in_time(record: JobRecord, asked: Asked) -> str | None:
    if record.start_deadline is not None and record.start_deadline < asked[1]:
        return f"its start deadline passed at {record.start_deadline.isoformat()}"
    return None


def _not_waiting(record: JobRecord, asked: Asked) -> str | None:
    return None if record.waiting_since is None else "it waits for other jobs to end"


def _status(status: Status) -> Condition:
    def refusal(record: JobRecord, asked: Asked) -> str | None:
        return None if record.status is status else f"job is {record.status.value}"

    return Condition(refusal, f"{{row}}status = '{status.value}'")


#: A running job's step is free: the job is InProgress at that cursor and no live
#: lease holds it (no owner, or an expiry before now).
STEP_FREE = (
    _status(Status.IN_PROGRESS),
    Condition(_at_cursor, "{row}state -> 'cursor' = {cursor}::jsonb"),
    Condition(_lease_free, "({row}lease_owner IS NULL OR {row}lease_expires < {now})"),
)
#: Not a retry picked up after the job's start deadline (start_times.late_retry).
NOT_LATE_RETRY = Condition(
    _not_late_retry, "(NOT {retry} OR {row}start_deadline IS NULL OR {row}start_deadline >= {now})"
)
#: The step of a running job that may be claimed.
RUNNING = (*STEP_FREE, NOT_LATE_RETRY)
#: A Scheduled job whose first step may be claimed: a start was asked for, its
#: planned start has come, its start deadline has not passed (a start exactly at
#: the deadline is in time) and it waits for no other job.
STARTING = (
    _status(Status.SCHEDULED),
    Condition(_start_asked, "{start}"),
    Condition(_start_due, "({row}not_before IS NULL OR {row}not_before <= {now})"),
    Condition(_in_time, "({row}start_deadline IS NULL OR {row}start_deadline >= {now})"),
    Condition(_not_waiting, "{row}waiting_since IS NULL"),
)


def first_refusal(conditions: Sequence[Condition], record: JobRecord, asked: Asked) -> str | None:
    """The refusal of the first of ``conditions`` that ``record`` fails; None if it meets all."""
    for condition in conditions:
        reason = condition.refusal(record, asked)
        if reason is not None:
            return reason
    return None


def why_not(record: JobRecord, asked: Asked) -> str | None:
    """Why ``record``'s step cannot be claimed for ``asked``; None if it can."""
    return first_refusal(STARTING if record.status is Status.SCHEDULED else RUNNING, record, asked)


def postgres_condition(row: str, asked: Mapping[str, str]) -> str:
    """The rule as one PostgreSQL condition: ``row`` prefixes the row's columns
    (``""`` or ``"j."``), ``asked`` holds the SQL of ``cursor``, ``now``, ``start``
    and ``retry``."""

    def both(conditions: Sequence[Condition]) -> str:
        return " AND ".join(c.postgres.format(row=row, **asked) for c in conditions)

    return f"(({both(RUNNING)}) OR ({both(STARTING)}))"
