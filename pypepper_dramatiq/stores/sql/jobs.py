"""One job's row: put, advance, progress, get, delete, lookups by id and key."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy import exc as sa_exc

from ...errors import DuplicateJobError, StoreError
from ...limits.storable import json_text
from ...records.links import Link, parents_of, required_parents
from ...records.progress import PROGRESS_KEY
from ..base import JobRecord
from ..rows import job_record, listed_jobs
from ..schema import jobs, links
from .boundary import (
    boundary,
    is_duplicate_key,
    once_more_if_stale,
    purged_meanwhile,
    refused_by_key_index,
)
from .links import lock_parents
from .parts import SqlStorePart
from .statements import advance_statement, guarded_update, insert_unless_purged, tombstone_of


class _PurgedMeanwhile(Exception):
    """An insert found the tombstone of its id once done: raised to roll it back."""


def _insert_unless_purged(connection: Connection, record: JobRecord) -> bool:
    """Insert ``record``'s row in ``connection``'s transaction unless its id has a
    tombstone; False if the insert's own check found one.

    That check reads the tombstones as its statement began: an insert that waited on
    the lock of the row a purge was deleting goes on once the purge commits. The
    tombstone read again after it (a statement of its own, READ COMMITTED) sees that
    purge: :class:`_PurgedMeanwhile` is raised, to roll the transaction back.
    """
    try:
        inserted = connection.execute(insert_unless_purged(record)).rowcount
    except sa_exc.DBAPIError as exc:
        if purged_meanwhile(exc):  # PostgreSQL's trigger read it once the row was in
            raise _PurgedMeanwhile(record.id) from None
        raise
    if inserted == 0:
        return False
    if connection.execute(tombstone_of(record.id)).first() is not None:
        raise _PurgedMeanwhile(record.id)
    return True


class JobRows(SqlStorePart):
    """Writes and reads of one job's row."""

    def put(self, record: JobRecord) -> bool:
        # A new job that came from others (after=, a retry) is inserted with its
        # links in one transaction; every other put is the one upsert statement.
        found = parents_of(record.id, record.payload, record.waits) if record.version == 0 else []
        write = (lambda: self._insert_linked(record, found)) if found else None
        return self._keyed(
            record,
            lambda: once_more_if_stale(
                self._engine, f"saving job {record.id}", write or (lambda: self._upsert(record))
            ),
        )

    def _insert_linked(self, record: JobRecord, found: Sequence[Link]) -> bool:
        try:
            with self._linked_write() as connection:
                waiting = record.waiting_since is not None
                lock_parents(connection, required_parents(found, waiting=waiting))
                if not _insert_unless_purged(connection, record):
                    return False  # retention deleted this job: never inserted again
                connection.execute(
                    insert(links),
                    [{"parent_id": k.parent, "child_id": k.child, "kind": k.kind} for k in found],
                )
            return True
        except _PurgedMeanwhile:
            return False
        except sa_exc.IntegrityError as exc:
            if not is_duplicate_key(exc) or refused_by_key_index(exc):
                raise
        # The row is there already (a put tried again): its links went in with it.
        return self._upsert(record)

    def _keyed(self, record: JobRecord, write: Callable[[], bool]) -> bool:
        """``write()``; a refusal by the unique index of active keys becomes a
        DuplicateJobError naming the holder."""
        try:
            return write()
        except StoreError as exc:
            if record.unique_key is None or not refused_by_key_index(exc.__cause__):
                raise
        holder = self.key_holder(record.unique_key)
        raise DuplicateJobError(record.unique_key, None if holder is None else holder.id)

    def _upsert(self, record: JobRecord) -> bool:
        # Insert, and on a duplicate key update under the guard (MySQL has no
        # conditional upsert that reports whether the guard held).
        try:
            with self._linked_write() as connection:
                # Nothing inserted: retention deleted this job (its tombstone).
                return _insert_unless_purged(connection, record)
        except _PurgedMeanwhile:
            return False
        except sa_exc.IntegrityError as exc:
            if not is_duplicate_key(exc) or refused_by_key_index(exc):
                raise
        with self._engine.connect() as connection:
            return connection.execute(guarded_update(record, payload=True)).rowcount == 1

    def advance(self, record: JobRecord) -> bool:
        return self._keyed(
            record,
            lambda: once_more_if_stale(
                self._engine, f"updating job {record.id}", lambda: self._advance(record)
            ),
        )

    def _advance(self, record: JobRecord) -> bool:
        with self._engine.connect() as connection:
            return connection.execute(advance_statement(record)).rowcount == 1

    def write_progress(self, job_id: str, key: str, value: dict[str, Any]) -> bool:
        # One statement that merges the entry into state["progress"] on the server
        # and leaves version and status alone.
        patch = json_text({PROGRESS_KEY: {key: value}})
        merge = self._dialect.progress_merge
        with (
            boundary(self._engine, f"writing the progress of job {job_id}"),
            self._engine.connect() as connection,
        ):
            return connection.execute(merge, {"id": job_id, "patch": patch}).rowcount == 1

    def get(self, job_id: str) -> JobRecord | None:
        row = once_more_if_stale(self._engine, f"loading job {job_id}", lambda: self._get(job_id))
        return None if row is None else job_record(row)

    def _get(self, job_id: str) -> Any:
        with self._engine.connect() as connection:
            query = select(jobs).where(jobs.c.id == job_id)
            return connection.execute(query).mappings().first()

    def delete(self, job_id: str) -> bool:
        with boundary(self._engine, f"deleting job {job_id}"), self._engine.connect() as conn:
            return conn.execute(delete(jobs).where(jobs.c.id == job_id)).rowcount == 1

    def get_many(self, job_ids: Collection[str]) -> builtins.list[JobRecord]:
        ids = sorted(set(job_ids))
        found: builtins.list[JobRecord] = []
        with boundary(self._engine, f"loading {len(ids)} jobs"), self._engine.connect() as c:
            for start in range(0, len(ids), 500):
                query = select(jobs).where(jobs.c.id.in_(ids[start : start + 500]))
                found.extend(listed_jobs(c.execute(query).mappings()))
        return found

    def key_holder(self, key: str) -> JobRecord | None:
        query = select(jobs).where(jobs.c.active_key == self._dialect.active_key(key))
        with boundary(self._engine, f"looking up key {key!r}"), self._engine.connect() as c:
            row = c.execute(query).mappings().first()
        return None if row is None else job_record(row)
