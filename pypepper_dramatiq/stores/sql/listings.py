"""The job store's listings and counts: pages of jobs, due and held jobs, counts."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, literal, or_, select, tuple_, union_all
from sqlalchemy.sql import ColumnElement, Select

from ...records.pauses import PAUSED_UNTIL
from ...records.state import HOOKS_KEY
from ...rules.status import Status
from ..base import (
    EVERY_JOB,
    HELD_FOR_JOBS,
    HELD_FOR_PAUSE,
    HELD_FOR_TIME,
    JobFilter,
    JobRecord,
    check_ended,
)
from ..rows import listed_jobs
from ..schema import jobs
from .boundary import boundary
from .parts import SqlStorePart
from .statements import filters, status_is


def _in_created_order(query: Select[Any], newest_first: bool) -> Select[Any]:
    """``query`` ordered as :meth:`IJobStore.list` orders: by ``created`` then ``id``,
    both in one direction, so that one index serves the order and the cursor."""
    columns = query.selected_columns
    if newest_first:
        return query.order_by(columns.created.desc(), columns.id.desc())
    return query.order_by(columns.created, columns.id)


def _statuses(where: JobFilter) -> builtins.list[Status]:
    """The statuses ``where`` keeps, one branch of a listing or a count each: each
    branch reads its status's index in order."""
    return list(Status) if where.status is None else [where.status]


class JobListings(SqlStorePart):
    """Listings and counts of jobs."""

    def list_matching(
        self, where: JobFilter, *, limit: int | None = None, newest_first: bool = False
    ) -> Sequence[JobRecord]:
        # Both columns in one direction, and the cursor as one row comparison, so
        # that a status filter (alone, or with a channel or a category) reads the
        # (status, ...) / (channel_id, status, ...) / (category, status, ...) index
        # in order, backwards for newest first, starting at the cursor: a page
        # costs its own rows, however deep it is.
        conditions = filters(where)
        status = where.status

        def ordered(query: Select[Any]) -> Select[Any]:
            return _in_created_order(query, newest_first)

        if status is not None:
            query = ordered(select(jobs).where(status_is(status), *conditions))
            if limit is not None:
                query = query.limit(limit)
        elif limit is not None:
            # No status: the first ``limit`` rows of each status, each read in its
            # index's order, merged. No index leads with ``created``, and sorting
            # every row for one page is what a million rows cannot afford.
            branches = [
                ordered(select(jobs).where(status_is(value), *conditions)).limit(limit)
                for value in Status
            ]
            merged = union_all(*branches).subquery()
            query = ordered(select(merged)).limit(limit)
        else:
            query = ordered(select(jobs).where(*conditions))
        with boundary(self._engine, "listing jobs"), self._engine.connect() as conn:
            return listed_jobs(conn.execute(query).mappings())

    def list_keys(
        self, where: JobFilter = EVERY_JOB, *, offset: int, limit: int, newest_first: bool = False
    ) -> builtins.list[tuple[datetime, str]]:
        # As list_matching(), but (created, id) only: the (status, created, id) index
        # and its channel and category kin hold both, so each branch is an index-only
        # read of offset + limit entries.
        conditions = filters(where)
        offset, limit = max(0, offset), max(0, limit)
        reach = offset + limit

        def ordered(query: Select[Any]) -> Select[Any]:
            return _in_created_order(query, newest_first)

        keys = (jobs.c.created, jobs.c.id)
        branches = [
            ordered(select(*keys).where(status_is(value), *conditions)).limit(reach)
            for value in _statuses(where)
        ]
        merged = (branches[0] if len(branches) == 1 else union_all(*branches)).subquery()
        query = ordered(select(merged.c.created, merged.c.id)).offset(offset).limit(limit)
        with boundary(self._engine, "listing job keys"), self._engine.connect() as conn:
            return [(created, str(job_id)) for created, job_id in conn.execute(query)]

    def _first_by(
        self,
        what: str,
        key: ColumnElement[Any],
        where: builtins.list[ColumnElement[bool]],
        limit: int,
        after: tuple[datetime, str] | None = None,
    ) -> builtins.list[JobRecord]:
        """The first ``limit`` rows matching ``where`` in ``(key, id)`` order, past the
        keyset cursor ``after``: the sweep's pages, each read off its index in order."""
        query = select(jobs).where(*where).order_by(key, jobs.c.id).limit(limit)
        if after is not None:
            query = query.where(tuple_(key, jobs.c.id) > (after[0], after[1]))
        with boundary(self._engine, what), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def due_releases(self, until: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        return self._first_by(
            "listing jobs due for release",
            jobs.c.release_at,
            [jobs.c.status == Status.SCHEDULED.value, jobs.c.release_at <= until],
            limit,
        )

    def overdue(self, now: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        return self._first_by(
            "listing overdue jobs",
            jobs.c.start_deadline,
            [jobs.c.status == Status.SCHEDULED.value, jobs.c.start_deadline < now],
            limit,
        )

    def waiting(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        return self._first_by(
            "listing waiting jobs",
            jobs.c.waiting_since,
            [jobs.c.waiting_since.is_not(None), jobs.c.status == Status.SCHEDULED.value],
            limit,
            after,
        )

    def held_counts(self) -> dict[tuple[str, str], int]:
        reason = case(
            (jobs.c.waiting_since.is_not(None), literal(HELD_FOR_JOBS)),
            (jobs.c.release_at >= PAUSED_UNTIL, literal(HELD_FOR_PAUSE)),
            else_=literal(HELD_FOR_TIME),
        ).label("reason")
        first_steps = (
            select(jobs.c.channel_id, reason, func.count())
            .where(
                jobs.c.status == Status.SCHEDULED.value,
                or_(jobs.c.waiting_since.is_not(None), jobs.c.release_at.is_not(None)),
            )
            .group_by(jobs.c.channel_id, reason)
        )
        # Started jobs whose next step is held for a pause: the (status, lease_expires) index.
        later_steps = (
            select(jobs.c.channel_id, literal(HELD_FOR_PAUSE).label("reason"), func.count())
            .where(
                jobs.c.status == Status.IN_PROGRESS.value,
                jobs.c.lease_expires >= PAUSED_UNTIL,
                jobs.c.lease_owner.is_(None),
            )
            .group_by(jobs.c.channel_id)
        )
        counts: dict[tuple[str, str], int] = {}
        with boundary(self._engine, "counting held jobs"), self._engine.connect() as conn:
            for ch, why, n in conn.execute(union_all(first_steps, later_steps)):
                counts[str(ch), str(why)] = counts.get((str(ch), str(why)), 0) + int(n)
        return counts

    def ended_since(
        self, status: Status, after: tuple[datetime, str], limit: int = 100
    ) -> builtins.list[JobRecord]:
        check_ended(status)
        at, job_id = after
        # The keyset spelt out (not a row comparison) so that MySQL ranges over
        # ix_scheduler_jobs_status_updated as PostgreSQL does.
        query = (
            select(jobs)
            .where(
                jobs.c.status == status.value,
                jobs.c.updated >= at,
                or_(jobs.c.updated > at, jobs.c.id > job_id),
            )
            .order_by(jobs.c.updated, jobs.c.id)
            .limit(limit)
        )
        with boundary(self._engine, "listing ended jobs"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def ended_counts(
        self, since: datetime, until: datetime, bucket_seconds: int
    ) -> dict[tuple[Status, int], int]:
        # Per final status, a range of ix_scheduler_jobs_status_updated, grouped by
        # bucket: the index holds both columns, so no row is read.
        bucket = self._dialect.whole_seconds_since(jobs.c.updated, since) / int(bucket_seconds)
        bucket = func.floor(bucket).label("bucket")
        query = union_all(
            *(
                select(literal(status.value).label("status"), bucket, func.count().label("n"))
                .where(status_is(status), jobs.c.updated >= since, jobs.c.updated < until)
                .group_by(bucket)
                for status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
            )
        )
        with boundary(self._engine, "counting ended jobs"), self._engine.connect() as conn:
            return {
                (Status(str(status)), int(index)): int(n)
                for status, index, n in conn.execute(query)
            }

    # -- on_final_failure hooks -------------------------------------------------------

    def pending_hooks(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        # The key is absent from a row with no hook due (JobState.to_dict drops it);
        # ``->`` on PostgreSQL, ``JSON_EXTRACT`` on MySQL. No index serves it: the
        # recovery sweep runs it at most every interval.
        return self._first_by(
            "listing jobs with hooks due",
            jobs.c.created,
            [jobs.c.state[HOOKS_KEY].is_not(None)],
            limit,
            after,
        )

    # -- counts (the dashboard) ---------------------------------------------------------

    def count_by_status(
        self, where: JobFilter = EVERY_JOB, *, limit: int | None = None
    ) -> dict[Status, int]:
        conditions = filters(where)
        if limit is None:
            # One GROUP BY over the (status, ...) index of the filter.
            if where.status is not None:
                conditions.append(status_is(where.status))
            query: Any = (
                select(jobs.c.status, func.count()).where(*conditions).group_by(jobs.c.status)
            )
        else:
            # Per status, count at most limit + 1 entries of its index: bounded
            # however many rows match.
            query = union_all(
                *(
                    select(literal(value.value), func.count()).select_from(
                        select(literal(1).label("one"))
                        .select_from(jobs)
                        .where(status_is(value), *conditions)
                        .limit(max(0, limit) + 1)
                        .subquery()
                    )
                    for value in _statuses(where)
                )
            )
        counts = dict.fromkeys(Status, 0)
        with boundary(self._engine, "counting jobs"), self._engine.connect() as conn:
            for status, count in conn.execute(query):
                if status in counts:  # a status no version knows is not counted
                    counts[Status(status)] = int(count)
        return counts
