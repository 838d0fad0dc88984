"""Ending the wait of a job scheduled after other jobs (or after a key's holder).

:func:`~pypepper_dramatiq.rules.waits.verdict` decides; :func:`settle` writes the
decision with a compare-and-set on the waiting row. The Dramatiq driver's
recovery sweep settles the waiting rows it finds, the in-process worker the
job it took: the same decision and the same write on both drivers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from enum import Enum
from typing import Any

from ..channels.end_notices import publish_ended
from ..errors import DuplicateJobError, NoTaskResultError
from ..ops import observers
from ..ops.logs import get_logger
from ..records.record import JobRecord, utcnow
from ..records.state import PARENT_RESULTS_KEY, counting
from ..rules.events import CANCEL, FAIL, transition
from ..rules.waits import Action, Waits, verdict
from ..stores.base import IJobStore

logger = get_logger(__name__)


class Settled(str, Enum):
    """What :func:`settle` did to a waiting job."""

    #: Still waiting (or the key it was to take went to another job: it waits for that one).
    WAITING = "waiting"
    #: The wait ended: the job may start (a held job is due for release now).
    RELEASED = "released"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: The row changed under the write (cancelled, or settled by someone else).
    LOST = "lost"


def settle(
    store: IJobStore,
    record: JobRecord,
    rows: Mapping[str, JobRecord | None] | None = None,
    now: datetime | None = None,
) -> tuple[Settled, JobRecord]:
    """Decide the waiting job ``record`` and write the decision; returns it and the row.

    ``rows`` are the rows of the jobs it waits for (read here when not given;
    a missing key means not stored). When the wait ends the job's row gets the
    parents' results by task name (``state["parent_results"]``), takes the
    key it waited for (if another job took that key meanwhile, it waits for
    that one instead), and, if no message was sent for it, becomes due for
    release at its planned start.

    Raises:
        StoreError: the store failed (nothing was decided).
    """
    if record.waits is None:
        return Settled.RELEASED, record
    now = now or utcnow()
    waits = Waits.from_dict(record.waits)
    if rows is None:
        found = {row.id: row for row in store.get_many(waits.awaited)}
        rows = {job_id: found.get(job_id) for job_id in waits.awaited}
    decided = verdict(waits, rows)
    if decided.action is Action.WAIT:
        return Settled.WAITING, record
    if decided.action is not Action.RUN:
        failed = decided.action is Action.FAIL
        ended = record.evolve(
            status=transition(record.status, FAIL if failed else CANCEL),
            error=decided.error,
            updated=now,
            release_at=None,
            state=counting(record.state),
        )
        if not store.advance(ended):
            return Settled.LOST, record
        logger.info(
            "job %s %s: %s",
            record.id,
            "failed" if failed else "cancelled",
            decided.error,
            extra={"action": "parent_failed", "job_id": record.id},
        )
        observers.job_ended(ended)
        publish_ended(record.id)
        return (Settled.FAILED if failed else Settled.CANCELLED), ended.evolve(
            version=ended.version + 1
        )
    state = dict(record.state)
    if waits.parents:
        state[PARENT_RESULTS_KEY] = {job_id: _results(rows.get(job_id)) for job_id in waits.parents}
    changes: dict[str, Any] = {"waits": None, "state": state, "updated": now}
    if waits.key is not None:
        changes["unique_key"] = waits.key
    if waits.held:
        changes["release_at"] = max(now, record.not_before or now)
    released = record.evolve(**changes)
    try:
        written = store.advance(released)
    except DuplicateJobError as exc:
        # Another job took the key between its holder's end and now: wait for it.
        if exc.existing_id is None or exc.existing_id == record.id:
            return Settled.WAITING, record
        again = record.evolve(waits=replace(waits, holder=exc.existing_id).to_dict(), updated=now)
        if not store.advance(again):
            return Settled.LOST, record
        return Settled.WAITING, again.evolve(version=again.version + 1)
    if not written:
        return Settled.LOST, record
    logger.debug(
        "job %s: wait ended", record.id, extra={"action": "wait_ended", "job_id": record.id}
    )
    return Settled.RELEASED, released.evolve(version=released.version + 1)


def _results(row: JobRecord | None) -> dict[str, Any]:
    if row is None:
        return {}
    try:
        return row.results_by_name()
    except NoTaskResultError:  # stored without its workflows
        return {}
