"""Which jobs a listing or a count of the stores reads: the filters, written once.

Every store method that lists or counts jobs (``IJobStore.list``, ``list_keys``,
``count_by_status``) takes a :class:`JobFilter` rather than the same long list of
keywords each; the memory store asks :meth:`JobFilter.admits` of each row, the SQL
stores render the same conditions as a ``WHERE`` clause.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..rules.status import Status
from .record import JobRecord, as_utc


def matches(record: JobRecord, search: str) -> bool:
    """Whether ``record``'s id, category or error holds ``search``, ignoring case (the
    ``search`` filter of :class:`JobFilter`)."""
    needle = search.lower()
    return any(
        needle in text.lower() for text in (record.id, record.category or "", record.error or "")
    )


@dataclass(frozen=True)
class JobFilter:
    """The rows of a listing: each field given keeps only the rows that match it.

    Attributes:
        status, channel_id, category: keep only rows with these values (a status
            given as text is read as a :class:`Status`).
        created_from, created_until: keep only rows created at or after
            ``created_from`` and before ``created_until``.
        search: keep only rows whose id, category or error holds this text,
            ignoring case (:func:`matches`; ``%`` and ``_`` are plain characters).
            No index serves it: bound the rows it reads with ``before`` and
            ``after`` (``IJobStore.list_keys`` finds the edge of a window).
        before: a keyset cursor ``(created, id)``: keep only rows strictly
            before it, i.e. created earlier, or at the same instant with a
            smaller id. Newest first, the ``(created, id)`` of the last row of a
            page gives the next (older) page, stable while rows are added.
        after: the other way: keep only rows strictly after ``(created, id)``
            (oldest first, the last row of a page gives the next page).
    """

    status: Status | None = None
    channel_id: str | None = None
    category: str | None = None
    created_from: datetime | None = None
    created_until: datetime | None = None
    search: str | None = None
    before: tuple[datetime, str] | None = None
    after: tuple[datetime, str] | None = None

    def __post_init__(self) -> None:
        # Read once here: a status given as text is refused where it is given, and
        # the times are compared in UTC however they were given.
        if self.status is not None:
            object.__setattr__(self, "status", Status(self.status))
        for name in ("created_from", "created_until"):
            if (moment := getattr(self, name)) is not None:
                object.__setattr__(self, name, as_utc(moment))
        for name in ("before", "after"):
            if (cursor := getattr(self, name)) is not None:
                object.__setattr__(self, name, (as_utc(cursor[0]), cursor[1]))

    def admits(self, record: JobRecord) -> bool:
        """Whether ``record`` is one of the rows this filter keeps (the memory
        store's listing; the SQL stores render the same test in SQL)."""
        key = (record.created, record.id)
        return (
            (self.status is None or record.status is self.status)
            and (self.channel_id is None or record.channel_id == self.channel_id)
            and (self.category is None or record.category == self.category)
            and (self.before is None or key < self.before)
            and (self.after is None or key > self.after)
            and (self.created_from is None or record.created >= self.created_from)
            and (self.created_until is None or record.created < self.created_until)
            and (self.search is None or matches(record, self.search))
        )


#: The filter that keeps every row.
EVERY_JOB = JobFilter()
