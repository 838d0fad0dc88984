"""Links between jobs (``after=``, retries): their rows and the parents' locks."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence

from sqlalchemy import Connection, select

from ...errors import UnknownJobError
from ...records.links import RETRY, Link, parent_order
from ..schema import jobs, links
from .boundary import boundary
from .parts import SqlStorePart


def lock_parents(connection: Connection, parents: Sequence[str]) -> None:
    """Share-lock the rows of ``parents`` until the transaction ends, or raise
    UnknownJobError for the first that is not stored.

    A purge locks the rows it deletes for update, then checks that no waiting
    child links to them (:func:`unawaited`): whichever comes first, the child
    either sees its parent stored and keeps it until its links are committed,
    or sees it gone and is refused, never stored waiting for a lost parent.
    """
    if not parents:
        return
    query = select(jobs.c.id).where(jobs.c.id.in_(parents)).with_for_update(read=True)
    present = set(connection.execute(query).scalars())
    for parent in parents:
        if parent not in present:
            raise UnknownJobError(parent)


class LinkRows(SqlStorePart):
    """The links of a job."""

    def retries_of(self, job_ids: Collection[str], limit: int = 3) -> dict[str, builtins.list[str]]:
        # One read of the links table by its primary key's first column (parent_id).
        wanted = list(dict.fromkeys(job_ids))
        if not wanted:
            return {}
        query = (
            select(links.c.parent_id, links.c.child_id)
            .select_from(links.join(jobs, jobs.c.id == links.c.child_id))
            .where(links.c.parent_id.in_(wanted), links.c.kind == RETRY)
            .order_by(links.c.parent_id, jobs.c.created, jobs.c.id)
        )
        found: dict[str, builtins.list[str]] = {}
        with boundary(self._engine, "reading retry links"), self._engine.connect() as conn:
            for parent, child in conn.execute(query):
                children = found.setdefault(str(parent), [])
                if len(children) < max(0, limit):
                    children.append(str(child))
        return {parent: children for parent, children in found.items() if children}

    def links(self, job_id: str, limit: int = 100) -> builtins.list[Link]:
        columns = (links.c.parent_id, links.c.child_id, links.c.kind)
        parents = select(*columns).where(links.c.child_id == job_id)
        children = (
            select(*columns)
            .select_from(links.join(jobs, jobs.c.id == links.c.child_id))
            .where(links.c.parent_id == job_id)
            .order_by(jobs.c.created, jobs.c.id)
            .limit(max(0, limit))
        )
        reading = boundary(self._engine, f"reading the links of job {job_id}")
        with reading, self._engine.connect() as conn:
            above = [Link(*row) for row in conn.execute(parents)]
            below = [Link(*row) for row in conn.execute(children)]
        return sorted(above, key=parent_order) + below
