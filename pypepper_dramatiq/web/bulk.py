"""Bulk actions of the dashboard: which jobs "retry the failed" and "cancel the waiting"
touch, chosen by a filter of the jobs list or by a selection of its rows.

Nothing here writes: the confirmation page shows the jobs chosen (their ids go in its
form), and the POST that follows acts on those ids alone, each checked again. One
request touches at most :data:`MOST` jobs; a filter reads at most :data:`SCAN` rows to
find them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..records.links import RETRY
from ..rules.status import Status
from ..stores.base import IJobStore, JobRecord

#: The most jobs one bulk request touches (run it again for the rest).
MOST = 100
#: The most rows a filter reads to find them (jobs already retried are passed over).
SCAN = 2_000
#: Rows read per page of that scan.
_PAGE = 200


@dataclass(frozen=True)
class BulkAction:
    """One kind of bulk action."""

    name: str
    #: The button's words, and what the result page says was done.
    verb: str
    done: str
    #: The status a job must have to be touched.
    status: Status
    #: What the jobs it takes are called on the pages.
    jobs: str


ACTIONS = {
    "retry": BulkAction("retry", "Retry", "retried", Status.FAILED, "failed jobs"),
    "cancel": BulkAction("cancel", "Cancel", "cancelled", Status.SCHEDULED, "waiting jobs"),
}


@dataclass(frozen=True)
class Chosen:
    """The jobs a bulk action touches, oldest first."""

    records: list[JobRecord]
    #: Whether more jobs match than the request touches (:data:`MOST`), or the scan
    #: stopped at :data:`SCAN` rows before the end.
    more: bool
    #: How many jobs asked for are left out: not in the action's status, already
    #: retried, or not stored.
    left_out: int = 0


def retried(record: JobRecord, store: IJobStore) -> bool:
    """Whether a job was retried already (a link of kind retry from it)."""
    return any(
        link.parent == record.id and link.kind == RETRY for link in store.links(record.id, limit=1)
    )


def takes(action: BulkAction, record: JobRecord, store: IJobStore) -> bool:
    """Whether ``action`` touches ``record``: in its status, readable, and for a retry
    not retried already (so that a form sent twice retries each job once)."""
    if record.damaged is not None or record.status is not action.status:
        return False
    return action.name != "retry" or not retried(record, store)


def by_filter(
    store: IJobStore,
    action: BulkAction,
    *,
    channel_id: str | None = None,
    category: str | None = None,
    created_from: datetime | None = None,
    created_until: datetime | None = None,
) -> Chosen:
    """The first :data:`MOST` jobs of the filter ``action`` touches, oldest first."""
    found: list[JobRecord] = []
    after: tuple[datetime, str] | None = None
    read = 0
    filters: dict[str, Any] = {
        "channel_id": channel_id,
        "category": category,
        "created_from": created_from,
        "created_until": created_until,
    }
    while read < SCAN:
        page = store.list(status=action.status, limit=_PAGE, after=after, **filters)
        read += len(page)
        for record in page:
            if takes(action, record, store):
                if len(found) == MOST:
                    return Chosen(found, more=True)
                found.append(record)
        if len(page) < _PAGE:
            return Chosen(found, more=False)
        after = (page[-1].created, page[-1].id)
    return Chosen(found, more=True)


def by_ids(store: IJobStore, action: BulkAction, job_ids: Sequence[str]) -> Chosen:
    """The jobs among ``job_ids`` (at most :data:`MOST`) ``action`` touches, oldest first."""
    wanted = list(dict.fromkeys(job_ids))
    rows = [record for record in store.get_many(wanted) if takes(action, record, store)]
    rows.sort(key=lambda record: (record.created, record.id))
    return Chosen(rows, more=False, left_out=len(wanted) - len(rows))
