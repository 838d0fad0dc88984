"""The contract every job store keeps (the record itself is
:mod:`pypepper_dramatiq.records.record`)."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from ..errors import (
    ConfigError,
    CorruptRecordError,
    DuplicateJobError,
    PausingUnsupportedError,
    StoreDataError,
    StoreError,
)
from ..records.activity import Activity, ActivityMark
from ..records.job_filter import EVERY_JOB, JobFilter, matches
from ..records.links import RETRY, Link, parent_order, parents_of
from ..records.pauses import held_for_pause
from ..records.record import MAX_ID_LENGTH, JobRecord, as_utc, check_job_id, utcnow
from ..records.recurring import RecurringSchedule
from ..records.state import HOOKS_KEY
from ..records.workers import WorkerInfo
from ..rules.events import RUN, transition
from ..rules.retention import awaited, ended_status, still_needed
from ..rules.status import TERMINAL, Status
from . import claims

__all__ = [
    "MAX_ID_LENGTH",
    "IJobStore",
    "EVERY_JOB",
    "JobFilter",
    "JobRecord",
    "StepClaim",
    "as_utc",
    "check_ended",
    "check_job_id",
    "claimed_row",
    "matches",
    "retry_past_deadline",
    "utcnow",
    "why_not_claimable",
]


class StepClaim(NamedTuple):
    """One request of :meth:`IJobStore.claim_steps`: the arguments of
    :meth:`IJobStore.claim_step`."""

    job_id: str
    cursor: Sequence[int]
    owner: str
    now: datetime
    lease_until: datetime
    start: bool = False


class IJobStore(abc.ABC):
    """Where job records live.

    ``put`` upserts by id under these rules, and answers False (never raises)
    when one rejects the write:

    * an update needs the stored version to equal ``record.version``; the
      store then holds ``record.version + 1``;
    * ``created`` of an existing row is never overwritten;
    * a status never moves back to an earlier lifecycle, and distinct
      terminals never replace each other (:func:`~pypepper_dramatiq.rules.status.may_overwrite`);
    * the id of a job the retention purge deleted is never inserted again
      while its tombstone is kept (:meth:`was_purged`), decided with the insert:
      a late write of such a job (its producer's own Scheduled write, a worker
      healing its row from a message that came back) would run it again.

    A write that would give a second job the ``unique_key`` of an active
    (Scheduled or InProgress) job raises
    :class:`~pypepper_dramatiq.errors.DuplicateJobError` naming the holder.

    Failures to reach the backend raise :class:`~pypepper_dramatiq.errors.StoreError`.

    A stored row that cannot be read (a column changed by hand or by another
    program to what no writer of this package writes) raises
    :class:`~pypepper_dramatiq.errors.CorruptRecordError` from a single read
    (``get``, ``claim_step``, ``key_holder``); every read of several rows
    (``list``, ``get_many``, ``waiting``, ``due_releases``, ``overdue``,
    ``recover_expired``, ``pending_hooks``, ``held_by``, ``ended_since``) answers
    a placeholder in its place instead, :attr:`JobRecord.damaged
    <pypepper_dramatiq.records.record.JobRecord.damaged>` set, so that one row never
    fails a page or a batch. Nothing acts on a placeholder but to show or skip
    it. (The SQL stores check rows as they read them, :mod:`.rows`; the memory
    store keeps records, which nothing can damage so.)
    """

    @abc.abstractmethod
    def put(self, record: JobRecord) -> bool:
        """Insert or update ``record``; True if written.

        A new job scheduled ``after=`` other jobs is inserted only while each of
        them is stored, decided with the insert (a retention purge cannot delete
        one in between): otherwise :class:`~pypepper_dramatiq.errors.UnknownJobError`
        naming the first missing parent, and nothing is written.
        """

    def advance(self, record: JobRecord) -> bool:
        """Update an existing row under the rules of :meth:`put`, leaving ``payload``
        and ``created`` as stored; False if there is no row or a rule rejects it.

        Drivers use it for the writes of a running job, whose workflows never change.
        """
        current = self.get(record.id)
        if current is None:
            return False
        return self.put(record.evolve(payload=current.payload))

    def advance_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        """:meth:`advance` each of ``records``; the answers in their order.

        Each row is decided alone (one losing its compare-and-set does not stop
        the others); a store that can, writes them all in one transaction.
        """
        return [self.advance(record) for record in records]

    def write_progress(self, job_id: str, key: str, value: dict[str, Any]) -> bool:
        """Store what the running task at ``key`` reported (``state["progress"][key]``
        of an InProgress row), without moving the row's version or status, so that
        no step or cancel loses its compare-and-set to it. True if written.

        The default writes nothing (a store that can only write whole rows would
        move the version): the progress is then stored by the write that records
        the attempt.
        """
        return False

    def claim_step(
        self,
        job_id: str,
        cursor: Sequence[int],
        owner: str,
        now: datetime,
        lease_until: datetime,
        *,
        start: bool = False,
    ) -> JobRecord | None:
        """Take the step at ``cursor`` for ``owner`` in one compare-and-set.

        The row qualifies when it is InProgress at ``cursor`` with no live
        lease (no owner, or ``lease_expires`` before ``now``) and ``cursor`` is
        not a retry past the row's ``start_deadline``, or, with ``start``, when
        it is Scheduled (it then becomes InProgress at ``cursor``): see
        :func:`why_not_claimable`. The write sets the owner and ``lease_expires``, ``updated``
        to ``now`` and increments ``version``. Returns the row as written, or
        None when it does not qualify (the caller reads it to learn why).

        Raises:
            CorruptRecordError: the row cannot be read (a column holds what no
                writer of this package writes). The step is not run; the row is
                left as it is for a person to mend or delete.
        """
        return self.claim_request(StepClaim(job_id, cursor, owner, now, lease_until, start))

    def claim_request(self, request: StepClaim) -> JobRecord | None:
        """:meth:`claim_step` of the arguments ``request`` holds. This default reads
        the row, decides, then writes it by compare-and-set; PostgreSQL claims in one
        statement."""
        cursor, now = request.cursor, request.now
        with self._read_check_write():
            current = self.get(request.job_id)
            if (
                current is None
                or why_not_claimable(current, cursor, now, request.start) is not None
            ):
                return None
            claimed = current.evolve(
                status=(
                    transition(current.status, RUN)
                    if current.status is Status.SCHEDULED
                    else current.status
                ),
                state=dict(current.state, cursor=list(cursor)),
                updated=now,
                lease_owner=request.owner,
                lease_expires=request.lease_until,
            )
            if not self.advance(claimed):
                return None
        return claimed.evolve(version=claimed.version + 1)

    def _read_check_write(self) -> AbstractContextManager[object]:
        """Held around the generic read-then-write defaults (:meth:`claim_step`,
        :meth:`claim_steps`, :meth:`advance_each`): nothing by default, each write
        comparing and setting the version; a store with a lock of its own returns it,
        so that a batch runs under one hold of it."""
        return nullcontext()

    @abc.abstractmethod
    def get(self, job_id: str) -> JobRecord | None:
        """The stored record, or None.

        Raises:
            CorruptRecordError: the row cannot be read; the error names the column.
                (Listings and batch reads answer a placeholder with
                :attr:`JobRecord.damaged <pypepper_dramatiq.records.record.JobRecord.damaged>`
                set instead, so that one row never fails a page or a batch.)
        """

    @abc.abstractmethod
    def delete(self, job_id: str) -> bool:
        """Remove a record; True if there was one."""

    def list(
        self,
        *,
        status: Status | str | None = None,
        channel_id: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before: tuple[datetime, str] | None = None,
        after: tuple[datetime, str] | None = None,
        created_from: datetime | None = None,
        created_until: datetime | None = None,
        search: str | None = None,
    ) -> Sequence[JobRecord]:
        """Records matching every given filter, in ``(created, id)`` order: the
        keywords of :class:`~pypepper_dramatiq.records.job_filter.JobFilter`, read
        by :meth:`list_matching`.

        Args:
            limit: at most this many rows (the first ones in the order).
            newest_first: order by ``created`` then ``id`` descending; by default
                ascending (oldest first).
        """
        where = JobFilter(
            status=None if status is None else Status(status),
            channel_id=channel_id,
            category=category,
            created_from=created_from,
            created_until=created_until,
            search=search,
            before=before,
            after=after,
        )
        return self.list_matching(where, limit=limit, newest_first=newest_first)

    @abc.abstractmethod
    def list_matching(
        self, where: JobFilter, *, limit: int | None = None, newest_first: bool = False
    ) -> Sequence[JobRecord]:
        """The records ``where`` keeps, in ``(created, id)`` order (:meth:`list`).

        Args:
            limit: at most this many rows (the first ones in the order).
            newest_first: order by ``created`` then ``id`` descending; by default
                ascending (oldest first). With ``where.before``, the ``(created,
                id)`` of the last row of a page gives the next (older) page.
        """

    def list_keys(
        self, where: JobFilter = EVERY_JOB, *, offset: int, limit: int, newest_first: bool = False
    ) -> builtins.list[tuple[datetime, str]]:
        """The ``(created, id)`` of the rows :meth:`list_matching` gives with these
        arguments, at most ``limit`` of them from the ``offset``-th on (0 is the first).

        For the edge of a window of rows (a bounded search reads the rows up to
        it): the SQL stores read their indexes only, however wide the window. This
        default reads the rows.
        """
        rows = self.list_matching(
            where, newest_first=newest_first, limit=max(0, offset) + max(0, limit)
        )
        return [(row.created, row.id) for row in rows[max(0, offset) :]]

    @abc.abstractmethod
    def renew_leases(
        self, owner: str, job_ids: Collection[str], until: datetime
    ) -> dict[str, Status]:
        """Extend to ``until`` the leases ``owner`` still holds among ``job_ids``.

        Leaves ``version`` alone. Returns the status of each job whose lease
        was renewed; a job missing from the answer was lost (taken over, or gone).
        """

    @abc.abstractmethod
    def recover_expired(
        self, now: datetime, lease_until: datetime, limit: int = 100
    ) -> builtins.list[JobRecord]:
        """Hand back InProgress jobs whose lease lapsed before ``now``.

        Atomically, for at most ``limit`` such rows: clear the owner, set
        ``lease_expires`` to ``lease_until`` and increment ``version``, so
        that each lapsed step is recovered by exactly one caller. Returns
        the rows as updated.
        """

    def due_releases(self, until: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        """Scheduled jobs held in the store whose first message is due by ``until``
        (``release_at <= until``), soonest first. Stores with an index override it."""
        rows = [
            r
            for r in self.list(status=Status.SCHEDULED)
            if r.release_at is not None and r.release_at <= until
        ]
        rows.sort(key=lambda r: (r.release_at or until, r.id))
        return rows[:limit]

    def overdue(self, now: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        """Scheduled jobs whose start deadline passed before ``now``, oldest deadline
        first. Stores with an index override it."""
        rows = [
            r
            for r in self.list(status=Status.SCHEDULED)
            if r.start_deadline is not None and r.start_deadline < now
        ]
        rows.sort(key=lambda r: (r.start_deadline or now, r.id))
        return rows[:limit]

    def get_many(self, job_ids: Collection[str]) -> builtins.list[JobRecord]:
        """The stored records among ``job_ids`` (missing ones are left out), in no order."""
        return [r for r in (self.get(job_id) for job_id in set(job_ids)) if r is not None]

    def key_holder(self, key: str) -> JobRecord | None:
        """The active (Scheduled or InProgress) job holding unique ``key``, or None."""
        for status in (Status.SCHEDULED, Status.IN_PROGRESS):
            for row in self.list(status=status):
                if row.unique_key == key:
                    return row
        return None

    def waiting(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        """Scheduled jobs that wait for other jobs, by ``(waiting_since, id)``,
        strictly after ``after``. Stores with an index override it."""
        rows = sorted(
            (
                r
                for r in self.list(status=Status.SCHEDULED)
                if r.waiting_since is not None
                and (after is None or (r.waiting_since, r.id) > (as_utc(after[0]), after[1]))
            ),
            key=lambda r: (r.waiting_since or r.created, r.id),
        )
        return rows[:limit]

    def held_counts(self) -> dict[tuple[str, str], int]:
        """How many jobs are held in the store, by ``(channel, reason)``:
        :data:`HELD_FOR_JOBS` (waiting for other jobs or a key's holder) or
        :data:`HELD_FOR_TIME` (no message yet, sent at ``release_at``) or
        :data:`HELD_FOR_PAUSE` (until its channel or task is resumed; with the
        started jobs whose next step is held so). Stores with an index override it
        with a count."""
        counts: dict[tuple[str, str], int] = {}
        for r in self.list(status=Status.SCHEDULED):
            reason = held_reason(r.waiting_since, r.release_at)
            if reason is not None:
                counts[r.channel_id, reason] = counts.get((r.channel_id, reason), 0) + 1
        for r in self.list(status=Status.IN_PROGRESS):
            if r.lease_owner is None and held_for_pause(r.lease_expires):
                key = (r.channel_id, HELD_FOR_PAUSE)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def ended_since(
        self, status: Status, after: tuple[datetime, str], limit: int = 100
    ) -> builtins.list[JobRecord]:
        """Jobs that ended ``status`` (a final status), by ``(updated, id)``, strictly
        after ``after``: the recovery sweep's look at recent ends, for those whose
        end no process counted (``state["counted"]``, see :mod:`~pypepper_dramatiq.records.state`).
        Stores with an index override it.

        Raises:
            ValueError: ``status`` is not a final status.
        """
        check_ended(status)
        since = (as_utc(after[0]), after[1])
        rows = sorted(
            (r for r in self.list(status=status) if (r.updated, r.id) > since),
            key=lambda r: (r.updated, r.id),
        )
        return rows[:limit]

    def ended_counts(
        self, since: datetime, until: datetime, bucket_seconds: int
    ) -> dict[tuple[Status, int], int]:
        """How many jobs ended (Completed, Failed, Cancelled: their last ``updated``)
        in each bucket of ``bucket_seconds`` from ``since`` (bucket 0) to ``until``,
        by status; buckets with none are left out. For the dashboard's charts: the SQL
        stores count entries of the (status, updated, id) index in the range.
        """
        start, end = as_utc(since), as_utc(until)
        counts: dict[tuple[Status, int], int] = {}
        for status in TERMINAL:
            for row in self.list(status=status):
                if start <= row.updated < end:
                    key = (status, int((row.updated - start).total_seconds()) // bucket_seconds)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    # -- the activity rollup (the dashboard's charts) -----------------------------------

    #: Whether this store keeps the activity rollup (:mod:`~pypepper_dramatiq.records.activity`).
    #: A store that does not (this default) keeps nothing: the sweep does not fill it
    #: and the charts count ends from the rows (:meth:`ended_counts`) and show no times.
    keeps_activity: bool = False

    def activity_mark(self) -> ActivityMark | None:
        """How far the rollup holds every end; None: it holds none yet."""
        return None

    def add_activity(
        self,
        minutes: Mapping[tuple[datetime, str], Activity],
        moved: tuple[ActivityMark | None, ActivityMark] | None = None,
    ) -> bool:
        """Add ``minutes`` (per (minute, channel): counts summed, the deeper depth kept)
        to the rollup; True if added.

        With ``moved`` = (before, after), only if the stored mark is still ``before``
        (None: there is none), and the mark becomes ``after`` in the same transaction:
        a leader that lost the lead meanwhile adds nothing (False), so no end is added
        twice.
        """
        return False

    def activity(
        self, since: datetime, until: datetime, bucket_seconds: int
    ) -> dict[tuple[int, str], Activity]:
        """The rollup's minutes from ``since`` (bucket 0) to ``until`` added up per bucket
        of ``bucket_seconds`` and channel; buckets with none are left out."""
        return {}

    def forget_activity(self, before: datetime) -> int:
        """Delete the rollup's minutes before ``before`` (the mark's first minute moves
        up to it); returns how many rows went. ``before`` on an hour, so that a store
        keeping quarters and hours too cuts none of them in two."""
        return 0

    # -- recurring schedules ----------------------------------------------------------

    def save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        """Store ``schedule`` by name, replacing any stored one; returns it as stored."""
        raise StoreError(f"{type(self).__name__} does not keep recurring schedules")

    # A store that keeps no schedules has none: the reads below answer so, and
    # only storing one is refused.

    def advance_recurring(self, schedule: RecurringSchedule) -> bool:
        """Update a stored schedule if it still holds ``schedule.version`` (CAS)."""
        return False

    def get_recurring(self, name: str) -> RecurringSchedule | None:
        """The schedule named ``name``, or None."""
        return None

    def list_recurring(self) -> builtins.list[RecurringSchedule]:
        """Every schedule, by name."""
        return []

    def delete_recurring(self, name: str) -> bool:
        """Remove the schedule named ``name``; True if there was one."""
        return False

    def due_recurring(self, now: datetime, limit: int = 100) -> builtins.list[RecurringSchedule]:
        """Schedules not paused whose ``next_slot`` has come, soonest first."""
        due = [s for s in self.list_recurring() if not s.paused and s.next_slot <= now]
        due.sort(key=lambda s: (s.next_slot, s.name))
        return due[:limit]

    # -- on_final_failure hooks -------------------------------------------------------

    def pending_hooks(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        """Jobs whose state holds ``on_final_failure`` hooks not run yet
        (``state["hooks"]``, see :mod:`~pypepper_dramatiq.records.state`), by ``(created,
        id)``, strictly after ``after``. Stores that can filter in a query override it."""
        return [r for r in self.list(after=after) if r.state.get(HOOKS_KEY)][:limit]

    def within(self, connection: object) -> IJobStore:
        """This store writing in the caller's transaction (``scheduled(connection=)``).

        Only a SQL store can: its rows then become visible when the caller commits.

        Raises:
            ConfigError: this store cannot write in a caller's transaction.
        """
        raise ConfigError(
            f"{type(self).__name__} cannot write in a caller's transaction "
            "(scheduled(connection=...) needs a PostgreSQL or MySQL job store)"
        )

    #: Whether :meth:`after_commit` is told of the caller's commit (a store from
    #: :meth:`within` on a ``Session``).
    tells_commits: bool = False

    def after_commit(self, callback: Callable[[], object]) -> None:  # noqa: B027 - optional
        """Call ``callback`` once the caller's transaction this store writes in has
        committed; never called when this store is not told of it (``tells_commits``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    # -- retention ----------------------------------------------------------------------

    def purge(
        self,
        status: Status | str,
        older_than: datetime,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        """Delete up to ``limit`` jobs that ended ``status`` before ``older_than``.

        A row qualifies when its status is ``status`` (a final one: Completed,
        Failed or Cancelled; anything else is a ValueError) and both its
        ``updated`` (when it ended) and its ``created`` are before ``older_than``,
        unless another job still needs it
        (:func:`~pypepper_dramatiq.rules.retention.still_needed`: a Scheduled job waits
        for it, or one of its ``on_final_failure`` hooks has not run). Oldest
        created first; the delete checks status, time and version again, so a
        row that changed meanwhile stays. Scheduled and InProgress rows are never
        deleted.

        Returns:
            The ids deleted (with ``dry_run``: that would be, and nothing is deleted).

        The stores write it in :meth:`purge_ended`, given the arguments as read once here.
        """
        ended = ended_status(status)
        return self.purge_ended(ended, as_utc(older_than), max(0, limit), dry_run=dry_run)

    def purge_ended(
        self, ended: Status, cutoff: datetime, limit: int, *, dry_run: bool
    ) -> builtins.list[str]:
        """The rows :meth:`purge` deletes: of status ``ended`` (a final one), ended and
        created before ``cutoff`` (UTC), at most ``limit`` (not negative).

        This default reads every row of ``ended`` and deletes them one by one;
        the stores of this package override it with a delete that checks in one
        transaction. A child may be stored waiting for a row between the read of
        the waiting jobs and the row's delete (:meth:`put` checks its parents, not
        this purge's choice): so, once the rows are deleted, the waiting jobs are
        read again and every deleted row one of them waits for is put back as it
        was. A child stored after the delete is refused by :meth:`put`, so that
        read sees every child that kept its parent. The window left: until it is
        put back, such a parent is not stored (a sweep settling its child then,
        or a crash before the put back, counts it as no longer stored: the child
        fails or is cancelled as its ``on_parent_failure`` says).
        """
        waited_for = awaited(row.waits for row in _every_waiting(self))
        chosen = [
            row
            for row in self.list(status=ended)
            if row.updated < cutoff and row.created < cutoff and not still_needed(row, waited_for)
        ][:limit]
        if dry_run:
            return [row.id for row in chosen]
        deleted: dict[str, JobRecord] = {}
        for row in chosen:
            current = self.get(row.id)  # not atomic: a store that can, checks in the delete
            if current is not None and current.version == row.version and self.delete(row.id):
                deleted[row.id] = current
        if deleted:
            for job_id in awaited(row.waits for row in _every_waiting(self)) & deleted.keys():
                # Inserted at the version it had (an insert stores version + 1).
                kept = deleted.pop(job_id)
                self.put(kept.evolve(version=kept.version - 1))
        return builtins.list(deleted)

    def was_purged(self, job_id: str) -> bool:
        """Whether the retention purge deleted the row of ``job_id`` (its tombstone is
        kept :data:`~pypepper_dramatiq.rules.retention.TOMBSTONE_KEEP`).

        Asked only when a job's message finds no row: such a message of a purged job
        is dropped, where one of a job whose producer could not store it stores the
        row from the message (store_missing_row in the step I/O). The stores of this package write a
        tombstone for each row their ``purge`` deletes, in the same transaction.

        This default keeps none: False (the default ``purge`` writes none either),
        so a store that only inherits it may insert a purged id again.

        Raises:
            StoreError: the store failed (the caller treats it as any outage).
        """
        return False

    # -- counts (the dashboard) ---------------------------------------------------------

    def count_by_status(
        self, where: JobFilter = EVERY_JOB, *, limit: int | None = None
    ) -> dict[Status, int]:
        """How many jobs each status has (every status a key, 0 when none), among those
        ``where`` keeps (as :meth:`list_matching` reads them).

        Args:
            limit: count at most ``limit + 1`` rows of each status: a count above
                ``limit`` means "more than ``limit``". A page that shows counts
                stays fast however many rows there are (each count reads at most
                that many index entries).

        This default reads the rows through :meth:`list_matching`; the stores of this
        package override it with a count.
        """
        cap = None if limit is None else max(0, limit) + 1
        return {
            status: len(self.list_matching(replace(where, status=status), limit=cap))
            if where.status in (None, status)
            else 0
            for status in Status
        }

    # -- links (the dashboard) ----------------------------------------------------------

    def links(self, job_id: str, limit: int = 100) -> builtins.list[Link]:
        """The links of ``job_id`` (:mod:`~pypepper_dramatiq.records.links`): to the jobs it came
        from, then to at most ``limit`` jobs that came from it (oldest first).

        This default reads every row; the SQL stores keep the links in a table of
        their own, written with the child's row.
        """
        record = self.get(job_id)
        found = [] if record is None else parents_of(record.id, record.payload, record.waits)
        found.sort(key=parent_order)
        children = [
            link
            for row in self.list()
            for link in parents_of(row.id, row.payload, row.waits)
            if link.parent == job_id
        ]
        return found + children[: max(0, limit)]

    def retries_of(self, job_ids: Collection[str], limit: int = 3) -> dict[str, builtins.list[str]]:
        """The jobs that retry each of ``job_ids`` (links of kind retry from it), at most
        ``limit`` each; ids without any are left out. For the jobs list, which reads a
        page's in one call: this default asks :meth:`links` per id, the SQL stores
        read the links table once."""
        found: dict[str, builtins.list[str]] = {}
        for job_id in job_ids:
            children = [
                link.child
                for link in self.links(job_id, limit=max(0, limit) * 4 + 1)
                if link.parent == job_id and link.kind == RETRY
            ][: max(0, limit)]
            if children:
                found[job_id] = children
        return found

    # -- worker processes (the workers page) --------------------------------------------
    #
    # A store that keeps no worker rows lists none: the defaults below write nothing.

    def beat_worker(self, worker: WorkerInfo) -> None:  # noqa: B027 - optional
        """Insert or refresh the row of ``worker.owner``, in one statement: every field
        as given, but ``started``, which stays as first written. A worker process's
        lease keeper calls it once per heartbeat (:mod:`~pypepper_dramatiq.records.workers`)."""

    def forget_worker(self, owner: str) -> bool:
        """Delete the row of ``owner`` (a worker stopping cleanly); True if there was one."""
        return False

    def workers(self, now: datetime) -> builtins.list[WorkerInfo]:
        """The worker rows seen within
        :data:`~pypepper_dramatiq.records.workers.FORGET_AFTER_SECONDS`
        of ``now``, live or gone, by host, pid and owner."""
        return []

    def prune_workers(self, before: datetime) -> int:
        """Delete the worker rows last seen before ``before``; how many."""
        return 0

    def held_by(self, owners: Collection[str]) -> builtins.list[JobRecord]:
        """The InProgress jobs whose lease one of ``owners`` holds (the steps those
        workers run now), by id. The stores of this package read the (status, ...)
        index; this default reads every InProgress row."""
        wanted = set(owners)
        if not wanted:
            return []
        rows = [r for r in self.list(status=Status.IN_PROGRESS) if r.lease_owner in wanted]
        return sorted(rows, key=lambda r: r.id)

    # -- paused channels and tasks (pypepper_dramatiq.engine.pausing) ------------------
    #
    # A store of a third party that keeps no paused set answers that nothing is
    # paused, and refuses to pause: PausingUnsupportedError.

    def pause(self, kind: str, name: str, at: datetime) -> bool:
        """Store that the channel or task (``kind``: ``records.pauses.CHANNEL`` or
        ``TASK``) ``name`` is paused since ``at``; True if it was not paused already."""
        raise PausingUnsupportedError(self)

    def resume(self, kind: str, name: str) -> bool:
        """Forget the pause of ``kind`` ``name``; True if it was paused."""
        raise PausingUnsupportedError(self)

    def paused(self) -> frozenset[tuple[str, str]]:
        """The paused ``(kind, name)`` pairs. Every worker reads them, at most once a
        second (:class:`~pypepper_dramatiq.engine.pausing.PausedSet`)."""
        return frozenset()

    def release_paused(self, now: datetime, keep_channels: Collection[str] = ()) -> int:
        """Release the rows held for a pause (``records.pauses.PAUSED_UNTIL``), but those
        of the channels ``keep_channels``: a Scheduled row's ``release_at`` and an
        InProgress row's ``lease_expires`` become its ``created`` (past, so the sweep
        sends them oldest first), its version moves on. Returns how many."""
        raise PausingUnsupportedError(self)

    # -- group commit (a worker process's claims and outcomes, batched) ----------------

    def claim_steps(
        self, requests: Sequence[StepClaim]
    ) -> builtins.list[JobRecord | CorruptRecordError | None]:
        """:meth:`claim_step` for each of ``requests``; the answers in their order.

        Each row is decided alone, exactly as :meth:`claim_step` decides it; of
        several requests for one job, at most one wins. A row that cannot be read
        answers its :class:`~pypepper_dramatiq.errors.CorruptRecordError` in its
        place (the others are claimed all the same). This default claims them
        one by one; the stores of this package take them in one round trip
        (PostgreSQL) or one read and one transaction (MySQL).
        """
        answers: builtins.list[JobRecord | CorruptRecordError | None] = []
        with self._read_check_write():
            for r in requests:
                try:
                    answers.append(
                        self.claim_step(
                            r.job_id, r.cursor, r.owner, r.now, r.lease_until, start=r.start
                        )
                    )
                except CorruptRecordError as exc:
                    answers.append(exc)
        return answers

    def advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        """:meth:`advance_many`, with each row's error answered in its place instead of
        raised, so that each caller of a batch learns its own row's fate: the
        :class:`~pypepper_dramatiq.errors.DuplicateJobError` of a row refused by the
        unique key index (:meth:`advance` would raise it), or the
        :class:`~pypepper_dramatiq.errors.StoreError` of a row whose write may or
        may not have happened, or the :class:`~pypepper_dramatiq.errors.StoreDataError`
        of a row whose content the store refused (not written).

        A StoreError is raised when the store failed before any row's fate was
        known. This default advances the rows one by one; the stores of this
        package write them in one round trip (PostgreSQL) or one transaction
        (MySQL).
        """
        answers: builtins.list[bool | Exception] = []
        with self._read_check_write():
            for record in records:
                try:
                    answers.append(self.advance(record))
                except DuplicateJobError as exc:
                    answers.append(exc)
                except StoreDataError as exc:  # this row's content refused: its own answer
                    answers.append(exc)
        return answers

    # -- bulk scheduling ------------------------------------------------------------------

    def put_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        """:meth:`put` each of ``records``; the answers in their order.

        Each row is decided alone under the rules of :meth:`put`: a new job
        (version 0) whose id is stored already answers False, and so does a
        later record of an id the list holds twice. A record refused by the
        unique index of active keys raises
        :class:`~pypepper_dramatiq.errors.DuplicateJobError` as :meth:`put`
        does, the records before it written. This default puts them one by
        one; the stores of this package insert a list of new jobs in one
        statement (``schedule_many``).
        """
        return [self.put(record) for record in records]


#: Why a Scheduled job is held (:meth:`IJobStore.held_counts`): it waits for other jobs...
HELD_FOR_JOBS = "jobs"
#: ...or for a time (its message is sent at ``release_at``)...
HELD_FOR_TIME = "time"
#: ...or until its channel or task is resumed (``release_at`` is ``PAUSED_UNTIL``).
HELD_FOR_PAUSE = "paused"
#: Every reason a Scheduled job may be held for, in the order the metrics list them.
HELD_REASONS = (HELD_FOR_JOBS, HELD_FOR_TIME, HELD_FOR_PAUSE)


def held_reason(waiting_since: datetime | None, release_at: datetime | None) -> str | None:
    """Why a Scheduled row with these columns is held in the store; None: it is not."""
    if waiting_since is not None:
        return HELD_FOR_JOBS
    if held_for_pause(release_at):
        return HELD_FOR_PAUSE
    if release_at is not None:
        return HELD_FOR_TIME
    return None


def check_ended(status: Status) -> None:
    """Refuse (ValueError) a ``status`` that is not a final one, for ``ended_since``."""
    if status not in TERMINAL:
        raise ValueError(f"ended_since needs a final status, got {status!r}")


def why_not_claimable(
    record: JobRecord, cursor: Sequence[int] | None, now: datetime, start: bool
) -> str | None:
    """Why the step at ``cursor`` of ``record`` cannot be claimed now; None if it can.

    The claim rule of :mod:`~pypepper_dramatiq.stores.claims`, evaluated in Python
    (the SQL stores render the same conditions in their claiming statement): the
    job is InProgress at that cursor, no live lease holds it (no owner, or an
    expiry before ``now``; an owner without expiry holds it for good) and it is
    not a retry past the job's start deadline
    (:func:`~pypepper_dramatiq.rules.start_times.late_retry`; see
    :func:`retry_past_deadline`), or, with ``start``, the job is Scheduled (its
    first step), its planned start has come, its start deadline has not passed
    and it waits for no other job.
    """
    return claims.why_not(record, (cursor, now, start))


def retry_past_deadline(record: JobRecord, cursor: Sequence[int] | None, now: datetime) -> bool:
    """Whether the step at ``cursor`` of ``record`` is refused only for being a retry
    picked up after the job's start deadline: its claimer then cancels the job
    (a step held by a live lease, running somewhere, is never cancelled so)."""
    asked = (cursor, now, False)
    return (
        claims.first_refusal(claims.STEP_FREE, record, asked) is None
        and claims.NOT_LATE_RETRY.refusal(record, asked) is not None
    )


def claimed_row(current: JobRecord, request: StepClaim) -> JobRecord:
    """``current`` as :meth:`IJobStore.claim_step` writes it for ``request`` (its
    version as read: the write increments it)."""
    return current.evolve(
        status=(
            transition(current.status, RUN)
            if current.status is Status.SCHEDULED
            else current.status
        ),
        state=dict(current.state, cursor=list(request.cursor)),
        updated=request.now,
        lease_owner=request.owner,
        lease_expires=request.lease_until,
    )


def _every_waiting(store: IJobStore, batch: int = 500) -> builtins.list[JobRecord]:
    """Every Scheduled job of ``store`` that waits for other jobs, batch after batch."""
    found: builtins.list[JobRecord] = []
    after: tuple[datetime, str] | None = None
    while rows := store.waiting(batch, after=after):
        found.extend(rows)
        if len(rows) < batch:
            break
        after = (rows[-1].waiting_since or rows[-1].created, rows[-1].id)
    return found
