"""The jobs a bulk action of the dashboard takes, chosen by a filter or by ids (read only:
the app acts on what the confirmation page lists)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from ..records.job_filter import JobFilter
from ..records.record import JobRecord
from ..rules.status import Status
from ..stores.base import IJobStore

# -- bulk actions ------------------------------------------------------------------------------
#
# Which jobs "retry the failed" and "cancel the waiting" touch, chosen by a filter of the
# jobs list or by a selection of its rows. The confirmation page shows the jobs chosen
# (their ids go in its form), and the POST that follows acts on those ids alone, each
# checked again. One request touches at most BULK_MOST jobs; a filter reads at most
# BULK_SCAN rows to find them.

#: The most jobs one bulk request touches (run it again for the rest).
BULK_MOST = 100
#: The most rows a filter reads to find them (jobs already was_retried are passed over).
BULK_SCAN = 2_000
#: Rows read per page of that scan.
_BULK_PAGE = 200


@dataclass(frozen=True)
class BulkAction:
    """One kind of bulk action."""

    name: str
    #: The button's words, and what the result page says was done.
    verb: str
    done: str
    #: The status a job must have to be touched.
    status: Status
    #: What the jobs it bulk_takes are called on the pages.
    jobs: str


BULK_ACTIONS = {
    "retry": BulkAction("retry", "Retry", "retried", Status.FAILED, "failed jobs"),
    "cancel": BulkAction("cancel", "Cancel", "cancelled", Status.SCHEDULED, "waiting jobs"),
}


@dataclass(frozen=True)
class BulkChoice:
    """The jobs a bulk action touches, oldest first."""

    records: list[JobRecord]
    #: Whether more jobs match than the request touches (:data:`BULK_MOST`), or the scan
    #: stopped at :data:`BULK_SCAN` rows before the end.
    more: bool
    #: How many jobs asked for are left out: not in the action's status, already
    #: was_retried, or not stored.
    left_out: int = 0


def bulk_taken(
    action: BulkAction, records: Sequence[JobRecord], store: IJobStore
) -> list[JobRecord]:
    """Those of ``records`` that ``action`` touches: in its status, readable, and for a
    retry not retried already (so that a form sent twice retries each job once); the
    retries of them all read in one call."""
    shaped = [r for r in records if r.damaged is None and r.status is action.status]
    if action.name != "retry" or not shaped:
        return shaped
    retried = store.retries_of([r.id for r in shaped], limit=1)
    return [r for r in shaped if r.id not in retried]


def bulk_by_filter(store: IJobStore, action: BulkAction, where: JobFilter) -> BulkChoice:
    """The first :data:`BULK_MOST` jobs ``where`` keeps (its status aside: the action's)
    that ``action`` touches, oldest first."""
    found: list[JobRecord] = []
    after: tuple[datetime, str] | None = None
    read = 0
    while read < BULK_SCAN:
        page = store.list_matching(
            replace(where, status=action.status, after=after), limit=_BULK_PAGE
        )
        read += len(page)
        for record in bulk_taken(action, page, store):
            if len(found) == BULK_MOST:
                return BulkChoice(found, more=True)
            found.append(record)
        if len(page) < _BULK_PAGE:
            return BulkChoice(found, more=False)
        after = (page[-1].created, page[-1].id)
    return BulkChoice(found, more=True)


def bulk_by_ids(store: IJobStore, action: BulkAction, job_ids: Sequence[str]) -> BulkChoice:
    """The jobs among ``job_ids`` (at most :data:`BULK_MOST`) ``action`` touches, oldest first."""
    wanted = list(dict.fromkeys(job_ids))
    rows = bulk_taken(action, store.get_many(wanted), store)
    rows.sort(key=lambda record: (record.created, record.id))
    return BulkChoice(rows, more=False, left_out=len(wanted) - len(rows))
