"""Step leases: renewing them, and recovering the rows whose lease lapsed."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from ...rules.status import Status
from ..base import JobRecord
from ..rows import listed_jobs, status_or_unknown
from ..schema import jobs
from .boundary import boundary
from .engine import transaction
from .parts import SqlStorePart
from .statements import lapsed


class LeaseRows(SqlStorePart):
    """Lease renewal and recovery."""

    def renew_leases(
        self, owner: str, job_ids: Collection[str], until: datetime
    ) -> dict[str, Status]:
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        held = jobs.c.id.in_(ids) & (jobs.c.lease_owner == owner)
        # Deliberately no ``version = version + 1``: a renewal must not make the
        # owner's own next put look stale.
        renew = update(jobs).where(held).values(lease_expires=until)
        with boundary(self._engine, f"renewing {len(ids)} leases of {owner}"):
            rows = self._renew(renew, held)
        return {job_id: status_or_unknown(status) for job_id, status in rows}

    def _renew(self, renew: Any, held: Any) -> Sequence[Any]:
        # No RETURNING on UPDATE: read back in the same transaction. The
        # renewed rows stay locked by it, so the read sees them as written.
        with transaction(self._engine) as conn:
            conn.execute(renew)
            return conn.execute(select(jobs.c.id, jobs.c.status).where(held)).all()

    def recover_expired(
        self, now: datetime, lease_until: datetime, limit: int = 100
    ) -> builtins.list[JobRecord]:
        changes = {
            "lease_owner": None,
            "lease_expires": lease_until,
            "version": jobs.c.version + 1,
        }
        with boundary(self._engine, "recovering lapsed leases"):
            return self._recover(now, limit, changes)

    def _recover(
        self, now: datetime, limit: int, changes: dict[str, Any]
    ) -> builtins.list[JobRecord]:
        # MySQL cannot LIMIT a subquery of IN, nor update the table it selects
        # from; so lock, then update. Under READ COMMITTED the locking read takes
        # no gap locks, which could otherwise hold up a concurrent recoverer
        # moving its rows' (status, lease_expires) index entries into the gap.
        with transaction(self._engine) as conn:
            ids: builtins.list[str] = list(conn.execute(lapsed(now, limit)).scalars())
            if not ids:
                return []
            conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(changes))
            rows = conn.execute(select(jobs).where(jobs.c.id.in_(ids))).mappings().all()
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted(listed_jobs(rows), key=lambda r: order[r.id])
