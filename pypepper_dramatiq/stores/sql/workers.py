"""Worker processes' rows (the workers page) and the steps they hold."""

from __future__ import annotations

import builtins
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import delete, select

from ...records.workers import WorkerInfo, forget_before, listed
from ...rules.status import Status
from ..base import JobRecord
from ..rows import listed_jobs, listed_workers
from ..schema import jobs
from ..schema import workers as worker_rows
from .boundary import boundary, once_more_if_stale
from .mapping import worker_values
from .parts import SqlStorePart


class WorkerRows(SqlStorePart):
    """Worker rows."""

    def beat_worker(self, worker: WorkerInfo) -> None:
        # One statement whether the row exists or not: PostgreSQL's ON CONFLICT DO
        # UPDATE, MySQL's and MariaDB's ON DUPLICATE KEY UPDATE. ``started`` keeps the
        # value first written; a retry after a stale connection writes the same row.
        values = worker_values(worker)
        kept = ("owner", "started")
        stmt = self._dialect.worker_upsert(values, kept)

        def beat() -> None:
            with self._engine.connect() as connection:
                connection.execute(stmt)

        once_more_if_stale(self._engine, f"recording worker {worker.owner}", beat)

    def forget_worker(self, owner: str) -> bool:
        stmt = delete(worker_rows).where(worker_rows.c.owner == owner)
        with boundary(self._engine, f"forgetting worker {owner}"), self._engine.connect() as c:
            return c.execute(stmt).rowcount == 1

    def workers(self, now: datetime) -> builtins.list[WorkerInfo]:
        # A few rows per worker process: sorted here, as MySQL's collations would not.
        query = select(worker_rows).where(worker_rows.c.last_seen >= forget_before(now))
        with boundary(self._engine, "listing workers"), self._engine.connect() as c:
            found = listed_workers(c.execute(query).mappings())
        return listed(found, now)

    def prune_workers(self, before: datetime) -> int:
        stmt = delete(worker_rows).where(worker_rows.c.last_seen < before)
        with boundary(self._engine, "deleting old worker rows"), self._engine.connect() as c:
            return int(c.execute(stmt).rowcount)

    def held_by(self, owners: Collection[str]) -> builtins.list[JobRecord]:
        # InProgress rows are few: the (status, ...) indexes find them.
        wanted = sorted(set(owners))
        found: builtins.list[JobRecord] = []
        with boundary(self._engine, "listing the steps workers hold"), self._engine.connect() as c:
            for start in range(0, len(wanted), 500):
                query = select(jobs).where(
                    jobs.c.status == Status.IN_PROGRESS.value,
                    jobs.c.lease_owner.in_(wanted[start : start + 500]),
                )
                found.extend(listed_jobs(c.execute(query).mappings()))
        return sorted(found, key=lambda r: r.id)
