"""The SQL store on PostgreSQL: the hot statements sent as prepared text on psycopg."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import update

from ...errors import CorruptRecordError, DuplicateJobError, StoreError
from ...ops.group_commit import rounds_of
from ...rules.start_times import is_retry
from ...rules.status import Status
from ..base import JobRecord, StepClaim, utcnow
from ..rows import job_record, listed_jobs
from ..schema import jobs
from .boundary import (
    DRIVER_DISCONNECTS,
    DRIVER_REFUSALS,
    dict_row,
    once_more_if_stale,
    purged_meanwhile,
    tuple_row,
)
from .engine import transaction
from .mapping import (
    pg_advance_rows,
    pg_claim_rows,
    pg_insert_params,
    pg_insert_rows,
    pg_params,
)
from .statements import (
    PG_ADVANCE,
    PG_ADVANCE_MANY,
    PG_CLAIM,
    PG_CLAIM_MANY,
    PG_GET,
    PG_INSERT,
    PG_INSERT_MANY,
    PG_PURGE_DELETE,
    PG_PURGE_LOCK,
    PG_UPSERT,
    lapsed,
)
from .store import SqlJobStore


class PostgresJobStore(SqlJobStore, backend="postgresql"):
    """:class:`SqlJobStore` on PostgreSQL: the hot statements in PostgreSQL's SQL.

    ``put``, ``advance``, ``get`` and ``claim_step`` are fixed statements
    (``INSERT ... SELECT ... WHERE NOT EXISTS`` a tombstone ``... ON CONFLICT DO
    UPDATE ... WHERE``, guarded ``UPDATE ...
    RETURNING``) sent as prepared statements on the pooled psycopg connection:
    building them with SQLAlchemy Core per call cost more CPU than the database
    spent on them. Renewals and recovery use ``RETURNING`` in one statement.
    """

    @contextmanager
    def _driver_cursor(self) -> Iterator[Any]:
        """A cursor of a pooled driver connection, for the hot statements.

        SQLAlchemy's Connection and result objects cost more CPU per call than
        these one-statement round trips themselves; the pool stays SQLAlchemy's.
        Each pooled connection keeps one cursor for them (:func:`_kept_cursor`).
        """
        with self._pooled() as connection:
            yield _kept_cursor(connection)

    @contextmanager
    def _pooled(self) -> Iterator[Any]:
        """A pooled connection (SQLAlchemy's pool, the driver's connection under it);
        one that fails is invalidated, so it is not handed out again."""
        connection = self._engine.raw_connection()
        try:
            yield connection
        except DRIVER_DISCONNECTS:
            connection.invalidate()
            raise
        finally:
            connection.close()

    def _run(self, sql: str, params: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """Execute a prepared hot statement: (rowcount, first row or None)."""
        with self._driver_cursor() as cursor:
            cursor.execute(sql, params, prepare=True)
            row = cursor.fetchone() if cursor.description is not None else None
            return cursor.rowcount, row

    def _count(self, sql: str, params: dict[str, Any]) -> int:
        """Execute a prepared hot statement whose rows are not read: how many it wrote.

        On a kept cursor of its own that makes rows as tuples: the dict cursor of
        :meth:`_run` learns the column names of every answer and a fetch builds
        the row, about 8 us of CPU a write that only needs the count.
        """
        connection = self._engine.raw_connection()  # _pooled(), inline (about 1 us)
        try:
            cursor = _kept_cursor(connection, _KEPT_COUNTING_CURSOR, tuple_row)
            cursor.execute(sql, params, prepare=True)
            return int(cursor.rowcount)
        except DRIVER_DISCONNECTS:
            connection.invalidate()
            raise
        finally:
            connection.close()

    def _upsert(self, record: JobRecord) -> bool:
        # A first write (version 0) is a plain insert: every stored row has a version
        # of 1 or more, so the upsert's guarded update could never apply.
        if record.version == 0:
            statement, params = PG_INSERT, pg_insert_params(record)
        else:
            statement, params = PG_UPSERT, pg_params(record)
        try:
            return self._count(statement, params) == 1
        except DRIVER_REFUSALS as exc:
            if purged_meanwhile(exc):
                # Retention deleted it while the insert waited on its row: the
                # trigger of migration 0018 refused the row, never to be stored again.
                return False
            raise

    def _advance(self, record: JobRecord) -> bool:
        return self._count(PG_ADVANCE, pg_params(record)) == 1

    def _get(self, job_id: str) -> Any:
        return self._run(PG_GET, {"id": job_id})[1]

    def claim_request(self, request: StepClaim) -> JobRecord | None:
        params = {
            "id": request.job_id,
            "cursor": json.dumps(list(request.cursor)),
            "owner": request.owner,
            "now": request.now,
            "lease_until": request.lease_until,
            "start": request.start,
            "retry": is_retry(request.cursor),
        }

        def claim() -> dict[str, Any] | None:
            return self._run(PG_CLAIM, params)[1]

        what = f"claiming a step of job {request.job_id}"
        row = once_more_if_stale(self._engine, what, claim)
        return None if row is None else job_record(row)

    def _renew(self, renew: Any, held: Any) -> Sequence[Any]:
        with self._engine.connect() as conn:
            return conn.execute(renew.returning(jobs.c.id, jobs.c.status)).all()

    def _recover(
        self, now: datetime, limit: int, changes: dict[str, Any]
    ) -> builtins.list[JobRecord]:
        stmt = (
            update(jobs).where(jobs.c.id.in_(lapsed(now, limit))).values(changes).returning(*jobs.c)
        )
        with self._engine.connect() as conn:
            return listed_jobs(conn.execute(stmt).mappings())

    def _delete_purgeable(
        self, ended: Status, older_than: datetime, chosen: Sequence[tuple[str, int]]
    ) -> builtins.list[str]:
        # Two fixed statements with the ids as an array (PG_PURGE_LOCK): the guard
        # of the portable path (purge_guard) without rendering 4,000 values a batch.
        read = dict(chosen)
        params: dict[str, Any] = {
            "ids": list(read),
            "status": ended.value,
            "older_than": older_than,
        }
        with transaction(self._engine) as conn:
            rows = conn.exec_driver_sql(PG_PURGE_LOCK, params).all()
            # A row written since it was read (its version moved) is left alone.
            locked = [job_id for job_id, version in rows if read.get(job_id) == version]
            if not locked:
                return []
            params = {**params, "ids": locked, "now": utcnow()}
            return list(conn.exec_driver_sql(PG_PURGE_DELETE, params).scalars())

    def claim_steps(
        self, requests: Sequence[StepClaim]
    ) -> builtins.list[JobRecord | CorruptRecordError | None]:
        # One UPDATE ... FROM unnest(...) RETURNING for the first request of each
        # job; a job asked for again in the same batch is claimed alone after it.
        if len(requests) <= 1:
            return super().claim_steps(requests)
        # (a multi-row UPDATE ... FROM would apply only one of two source rows for a job)
        first, *again = rounds_of([r.job_id for r in requests])
        rows = once_more_if_stale(
            self._engine,
            f"claiming {len(first)} steps",
            lambda: self._run_many(PG_CLAIM_MANY, pg_claim_rows(requests, first)),
        )
        answers: builtins.list[JobRecord | CorruptRecordError | None] = [None] * len(requests)
        for row in rows:
            n = row.pop("n")
            try:
                answers[n] = job_record(row)
            except CorruptRecordError as exc:  # this row's own answer
                answers[n] = exc
        for n in (n for later in again for n in later):
            r = requests[n]
            answers[n] = self.claim_step(
                r.job_id, r.cursor, r.owner, r.now, r.lease_until, start=r.start
            )
        return answers

    def _advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        # One guarded UPDATE ... FROM unnest(...) for the first record of each job
        # (one statement: all or nothing, so an error here leaves no row written);
        # a job given again in the same batch is written alone after it.
        first, *again = rounds_of([r.id for r in records])
        answers: builtins.list[bool | Exception] = [False] * len(records)
        for row in self._run_many(PG_ADVANCE_MANY, pg_advance_rows(records, first)):
            answers[row["n"]] = True
        for n in (n for later in again for n in later):
            try:
                answers[n] = self.advance(records[n])
            except (DuplicateJobError, StoreError) as exc:  # this row's own fate
                answers[n] = exc
        return answers

    def _run_many(self, sql: str, params: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        """Execute a prepared multi-row hot statement: the rows it returns."""
        with self._driver_cursor() as cursor:
            cursor.execute(sql, params, prepare=True)
            return list(cursor.fetchall())

    def _insert_many(self, records: Sequence[JobRecord]) -> set[str]:
        # One fixed statement, prepared once, over the rows as one JSON array: the
        # long VALUES list of a multi-row INSERT is parsed anew by psycopg every
        # call, and one array per column costs psycopg a Python loop per value.
        with self._driver_cursor() as cursor:
            cursor.execute(PG_INSERT_MANY, {"rows": pg_insert_rows(records)}, prepare=True)
            return {row["id"] for row in cursor.fetchall()}


#: Where a pooled connection keeps the cursor of the hot statements (its ``info``,
#: which lives as long as the driver connection does).
_KEPT_CURSOR = "pypepper_hot_cursor"
#: Where it keeps the cursor of the hot writes whose rows are not read (``_count``).
_KEPT_COUNTING_CURSOR = "pypepper_hot_counting_cursor"


def _kept_cursor(connection: Any, name: str = _KEPT_CURSOR, rows: Any = dict_row) -> Any:
    """The cursor ``connection`` (a pooled connection, used by one thread at a time)
    keeps under ``name`` for the hot statements, made on its first use.

    A new cursor per statement cost about 25 us of CPU a call: psycopg's cursor
    learns how to send each Python type once (its dumpers), and a kept one keeps
    that. It is made again if the driver connection under it changed or it was
    closed. ``rows``: its row factory.
    """
    driver = connection.driver_connection
    cursor = connection.info.get(name)
    if cursor is None or cursor.closed or cursor.connection is not driver:
        cursor = connection.info[name] = driver.cursor(row_factory=rows)
    return cursor
