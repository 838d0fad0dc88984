"""The process-local, thread-safe job store (the embedded default)."""

from __future__ import annotations

import builtins
import threading
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..errors import DuplicateJobError, UnknownJobError
from ..records.activity import Activity, ActivityMark, bucketed
from ..records.links import parents_of, required_parents
from ..records.pauses import check_kind, held_for_pause
from ..records.progress import PROGRESS_KEY
from ..records.recurring import RecurringSchedule
from ..records.state import HOOKS_KEY
from ..records.workers import WorkerInfo, listed
from ..rules.retention import awaited, still_needed, tombstones_expire_before
from ..rules.status import Status, may_overwrite
from .base import IJobStore, JobFilter, JobRecord, as_utc, utcnow

#: The statuses in which a job holds its unique key.
_ACTIVE = (Status.SCHEDULED, Status.IN_PROGRESS)


class MemoryJobStore(IJobStore):
    """Keeps records in a dict under a lock."""

    def __init__(self) -> None:
        self._rows: dict[str, JobRecord] = {}
        self._schedules: dict[str, RecurringSchedule] = {}
        self._workers: dict[str, WorkerInfo] = {}
        #: The paused channels and tasks: (kind, name) -> paused since.
        self._paused: dict[tuple[str, str], datetime] = {}
        #: The tombstones of the purged jobs: id -> when the purge deleted it.
        self._purged: dict[str, datetime] = {}
        #: The activity rollup: (minute, channel) -> what it held; and how far it reaches.
        self._activity: dict[tuple[datetime, str], Activity] = {}
        self._activity_mark: ActivityMark | None = None
        self._lock = threading.RLock()

    def _check_key(self, record: JobRecord) -> None:
        """Refuse a second active job per unique key (the SQL stores' unique index)."""
        if record.unique_key is None or record.status not in _ACTIVE:
            return
        for row in self._rows.values():
            if (
                row.id != record.id
                and row.unique_key == record.unique_key
                and row.status in _ACTIVE
            ):
                raise DuplicateJobError(record.unique_key, row.id)

    def _check_parents(self, record: JobRecord) -> None:
        """Under the lock a purge takes too: every ``after=`` parent still stored."""
        for parent in required_parents(
            parents_of(record.id, record.payload, record.waits),
            waiting=record.waiting_since is not None,
        ):
            if parent not in self._rows:
                raise UnknownJobError(parent)

    def put(self, record: JobRecord) -> bool:
        with self._lock:
            current = self._rows.get(record.id)
            if current is None or (
                current.version == record.version and may_overwrite(current.status, record.status)
            ):
                self._check_key(record)
            if current is None:
                if record.id in self._purged:
                    return False  # never inserted again while its tombstone is kept
                self._check_parents(record)
                self._rows[record.id] = record.evolve(version=record.version + 1)
                return True
            if current.version != record.version or not may_overwrite(
                current.status, record.status
            ):
                return False
            self._rows[record.id] = record.evolve(
                version=record.version + 1, created=current.created
            )
            return True

    def _read_check_write(self) -> AbstractContextManager[object]:
        # Re-entrant: the generic read-check-advance, and a whole batch of them, run
        # under one hold of it.
        return self._lock

    def advance(self, record: JobRecord) -> bool:
        with self._lock:
            current = self._rows.get(record.id)
            if (
                current is None
                or current.version != record.version
                or not may_overwrite(current.status, record.status)
            ):
                return False
            self._check_key(record)
            self._rows[record.id] = record.evolve(
                version=record.version + 1, created=current.created, payload=current.payload
            )
            return True

    def write_progress(self, job_id: str, key: str, value: dict[str, Any]) -> bool:
        with self._lock:
            current = self._rows.get(job_id)
            if current is None or current.status is not Status.IN_PROGRESS:
                return False
            progress = dict(current.state.get(PROGRESS_KEY) or {}, **{key: value})
            self._rows[job_id] = current.evolve(state={**current.state, PROGRESS_KEY: progress})
            return True

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            return self._rows.get(job_id)

    def delete(self, job_id: str) -> bool:
        with self._lock:
            return self._rows.pop(job_id, None) is not None

    def list_matching(
        self, where: JobFilter, *, limit: int | None = None, newest_first: bool = False
    ) -> Sequence[JobRecord]:
        with self._lock:
            rows = [r for r in self._rows.values() if where.admits(r)]
        rows.sort(key=lambda r: (r.created, r.id), reverse=newest_first)
        return rows if limit is None else rows[:limit]

    def renew_leases(
        self, owner: str, job_ids: Collection[str], until: datetime
    ) -> dict[str, Status]:
        renewed: dict[str, Status] = {}
        with self._lock:
            for job_id in job_ids:
                row = self._rows.get(job_id)
                if row is not None and row.lease_owner == owner:
                    self._rows[job_id] = row.evolve(lease_expires=until)
                    renewed[job_id] = row.status
        return renewed

    def recover_expired(
        self, now: datetime, lease_until: datetime, limit: int = 100
    ) -> builtins.list[JobRecord]:
        with self._lock:
            lapsed = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status is Status.IN_PROGRESS
                    and r.lease_expires is not None
                    and r.lease_expires < now
                ),
                key=lambda r: (r.lease_expires, r.id),
            )[:limit]
            recovered: builtins.list[JobRecord] = []
            for row in lapsed:
                updated = row.evolve(
                    lease_owner=None, lease_expires=lease_until, version=row.version + 1
                )
                self._rows[row.id] = updated
                recovered.append(updated)
        return recovered

    def get_many(self, job_ids: Collection[str]) -> builtins.list[JobRecord]:
        with self._lock:
            return [self._rows[i] for i in set(job_ids) if i in self._rows]

    def key_holder(self, key: str) -> JobRecord | None:
        with self._lock:
            for row in self._rows.values():
                if row.unique_key == key and row.status in _ACTIVE:
                    return row
        return None

    # -- recurring schedules ----------------------------------------------------------

    def save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        with self._lock:
            current = self._schedules.get(schedule.name)
            stored = schedule.evolve(
                version=(current.version if current else 0) + 1,
                created=current.created if current else schedule.created,
            )
            self._schedules[schedule.name] = stored
            return stored

    def advance_recurring(self, schedule: RecurringSchedule) -> bool:
        with self._lock:
            current = self._schedules.get(schedule.name)
            if current is None or current.version != schedule.version:
                return False
            self._schedules[schedule.name] = schedule.evolve(
                version=schedule.version + 1, created=current.created
            )
            return True

    def get_recurring(self, name: str) -> RecurringSchedule | None:
        with self._lock:
            return self._schedules.get(name)

    def list_recurring(self) -> builtins.list[RecurringSchedule]:
        with self._lock:
            return sorted(self._schedules.values(), key=lambda s: s.name)

    def delete_recurring(self, name: str) -> bool:
        with self._lock:
            return self._schedules.pop(name, None) is not None

    # -- on_final_failure hooks -------------------------------------------------------

    def pending_hooks(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        since = None if after is None else (as_utc(after[0]), after[1])
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r.state.get(HOOKS_KEY) and (since is None or (r.created, r.id) > since)
            ]
        rows.sort(key=lambda r: (r.created, r.id))
        return rows[:limit]

    # -- the activity rollup ------------------------------------------------------------

    keeps_activity = True

    def activity_mark(self) -> ActivityMark | None:
        with self._lock:
            return self._activity_mark

    def add_activity(
        self,
        minutes: Mapping[tuple[datetime, str], Activity],
        moved: tuple[ActivityMark | None, ActivityMark] | None = None,
    ) -> bool:
        with self._lock:
            if moved is not None:
                if self._activity_mark != moved[0]:
                    return False
                self._activity_mark = moved[1]
            for (minute, channel), added in minutes.items():
                key = (as_utc(minute), channel)
                before = self._activity.get(key)
                self._activity[key] = added if before is None else before.plus(added)
            return True

    def activity(
        self, since: datetime, until: datetime, bucket_seconds: int
    ) -> dict[tuple[int, str], Activity]:
        with self._lock:
            kept = dict(self._activity)
        return bucketed(kept, as_utc(since), as_utc(until), bucket_seconds)

    def forget_activity(self, before: datetime) -> int:
        cutoff = as_utc(before)
        with self._lock:
            old = [key for key in self._activity if key[0] < cutoff]
            for key in old:
                del self._activity[key]
            mark = self._activity_mark
            if mark is not None and mark.first_minute < cutoff:
                self._activity_mark = ActivityMark(min(cutoff, mark.next_minute), mark.next_minute)
            return len(old)

    # -- retention ----------------------------------------------------------------------

    def purge_ended(
        self, ended: Status, cutoff: datetime, limit: int, *, dry_run: bool
    ) -> builtins.list[str]:
        with self._lock:  # the choice and the deletes see one state
            waited_for = awaited(r.waits for r in self._rows.values() if r.waiting_since)
            chosen = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status is ended
                    and r.updated < cutoff
                    and r.created < cutoff
                    and not still_needed(r, waited_for)
                ),
                key=lambda r: (r.created, r.id),
            )[:limit]
            if not dry_run:
                now = utcnow()
                expired = tombstones_expire_before(now)
                for job_id, when in list(self._purged.items()):
                    if when < expired:
                        del self._purged[job_id]
                for row in chosen:
                    del self._rows[row.id]
                    self._purged[row.id] = now
        return [row.id for row in chosen]

    def was_purged(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._purged

    # -- worker processes (the workers page) --------------------------------------------

    def beat_worker(self, worker: WorkerInfo) -> None:
        with self._lock:
            current = self._workers.get(worker.owner)
            self._workers[worker.owner] = (
                worker if current is None else replace(worker, started=current.started)
            )

    def forget_worker(self, owner: str) -> bool:
        with self._lock:
            return self._workers.pop(owner, None) is not None

    def workers(self, now: datetime) -> builtins.list[WorkerInfo]:
        with self._lock:
            return listed(self._workers.values(), now)

    def prune_workers(self, before: datetime) -> int:
        cutoff = as_utc(before)
        with self._lock:
            old = [owner for owner, w in self._workers.items() if w.last_seen < cutoff]
            for owner in old:
                del self._workers[owner]
        return len(old)

    def held_by(self, owners: Collection[str]) -> builtins.list[JobRecord]:
        wanted = set(owners)
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r.status is Status.IN_PROGRESS and r.lease_owner in wanted
            ]
        return sorted(rows, key=lambda r: r.id)

    # -- paused channels and tasks -------------------------------------------------------

    def pause(self, kind: str, name: str, at: datetime) -> bool:
        check_kind(kind)
        with self._lock:
            if (kind, name) in self._paused:
                return False
            self._paused[kind, name] = as_utc(at)
            return True

    def resume(self, kind: str, name: str) -> bool:
        check_kind(kind)
        with self._lock:
            return self._paused.pop((kind, name), None) is not None

    def paused(self) -> frozenset[tuple[str, str]]:
        with self._lock:
            return frozenset(self._paused)

    def release_paused(self, now: datetime, keep_channels: Collection[str] = ()) -> int:
        kept = set(keep_channels)
        released = 0
        with self._lock:
            for row in list(self._rows.values()):
                if row.channel_id in kept:
                    continue
                if row.status is Status.SCHEDULED and held_for_pause(row.release_at):
                    changed = row.evolve(release_at=row.created)
                elif (
                    row.status is Status.IN_PROGRESS
                    and row.lease_owner is None
                    and held_for_pause(row.lease_expires)
                ):
                    changed = row.evolve(lease_expires=row.created)
                else:
                    continue
                self._rows[row.id] = changed.evolve(updated=now, version=row.version + 1)
                released += 1
        return released
