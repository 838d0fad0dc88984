"""Retention: choosing the ended rows no one needs, deleting them guarded, and keeping
the tombstones of the rows deleted."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, delete, insert, literal, select, tuple_

from ...records.record import utcnow
from ...rules import retention
from ...rules.status import Status
from ..rows import readable_waits
from ..schema import jobs, purged
from .boundary import boundary, once_more_if_stale
from .engine import transaction
from .parts import SqlStorePart
from .statements import purge_guard, unawaited


class _Candidate(NamedTuple):
    """What :func:`~pypepper_dramatiq.rules.retention.still_needed` reads of a row to purge."""

    id: str
    state: dict[str, Any]


class PurgeRows(SqlStorePart):
    """Purging ended jobs."""

    # -- retention ----------------------------------------------------------------------

    def purge_ended(
        self, ended: Status, cutoff: datetime, limit: int, *, dry_run: bool
    ) -> builtins.list[str]:
        with boundary(self._engine, f"purging {ended.value} jobs"):
            chosen = self._purgeable(ended, cutoff, limit)
            if dry_run:
                return [job_id for job_id, _ in chosen]
            deleted: builtins.list[str] = []
            for start in range(0, len(chosen), retention.BATCH):
                batch = chosen[start : start + retention.BATCH]
                deleted.extend(self._delete_purgeable(ended, cutoff, batch))
            with self._engine.connect() as conn:
                expired = retention.tombstones_expire_before(utcnow())
                conn.execute(delete(purged).where(purged.c.purged_at < expired))
            return deleted

    def was_purged(self, job_id: str) -> bool:
        def tombstone() -> object:
            with self._engine.connect() as conn:
                query = select(literal(1)).where(purged.c.job_id == job_id)
                return conn.execute(query).scalar()

        found = once_more_if_stale(self._engine, f"looking for job {job_id}'s tombstone", tombstone)
        return found is not None

    def _purgeable(
        self, ended: Status, older_than: datetime, limit: int
    ) -> builtins.list[tuple[str, int]]:
        """Up to ``limit`` rows ``purge`` may delete, as (id, version), oldest created first.

        Read by the (status, created, id) index (an ended job was created before it
        ended), a page at a time, past the rows still needed; of each candidate only
        its hooks are read (``state -> 'hooks'``, ``JSON_EXTRACT`` on MySQL).
        """
        chosen: builtins.list[tuple[str, int]] = []
        if limit == 0:
            return chosen
        hooks = jobs.c.state[retention.HOOKS_KEY].label("hooks")
        page = min(limit, retention.BATCH)
        after: tuple[datetime, str] | None = None
        with self._engine.connect() as conn:
            waits = conn.execute(
                select(jobs.c.waits).where(
                    jobs.c.waiting_since.is_not(None), jobs.c.status == Status.SCHEDULED.value
                )
            ).scalars()
            waited_for = retention.awaited(readable_waits(waits))
            while len(chosen) < limit:
                query = (
                    select(jobs.c.id, jobs.c.version, jobs.c.created, hooks)
                    .where(
                        jobs.c.status == ended.value,
                        jobs.c.created < older_than,
                        jobs.c.updated < older_than,
                    )
                    .order_by(jobs.c.created, jobs.c.id)
                    .limit(page)
                )
                if after is not None:
                    query = query.where(tuple_(jobs.c.created, jobs.c.id) > after)
                rows = conn.execute(query).all()
                for row in rows:
                    state = {} if row.hooks is None else {retention.HOOKS_KEY: row.hooks}
                    if not retention.still_needed(_Candidate(row.id, state), waited_for):
                        chosen.append((row.id, row.version))
                if len(rows) < page:
                    break
                after = (rows[-1].created, rows[-1].id)
        return chosen[:limit]

    def _delete_purgeable(
        self, ended: Status, older_than: datetime, chosen: Sequence[tuple[str, int]]
    ) -> builtins.list[str]:
        """Delete the ``chosen`` rows that are still as read (version, status, time);
        their ids. MySQL has no DELETE ... RETURNING: lock, then delete. A row
        another transaction holds (a child's scheduling share-locks its parents)
        is skipped, not waited for: the next purge takes it."""
        with transaction(self._engine) as conn:
            guard = purge_guard(ended, older_than, chosen)
            lock = select(jobs.c.id).where(guard).with_for_update(skip_locked=True)
            locked = list(conn.execute(lock).scalars())
            if not locked:
                return []
            # A locking read: it sees the links of children committed meanwhile.
            kept = select(jobs.c.id).where(jobs.c.id.in_(locked), unawaited(locked))
            ids = list(conn.execute(kept.with_for_update(read=True)).scalars())
            if ids:
                conn.execute(delete(jobs).where(jobs.c.id.in_(ids), guard))
                bury(conn, ids)
        return ids


def bury(conn: Connection, ids: Sequence[str]) -> None:
    """Write the tombstones of the rows ``ids`` just deleted, in the deleting
    transaction (``conn``): purged now; an id purged before gets the new time."""
    now = utcnow()
    conn.execute(delete(purged).where(purged.c.job_id.in_(ids)))
    conn.execute(insert(purged), [{"job_id": job_id, "purged_at": now} for job_id in ids])
