"""Group commit and bulk scheduling: many rows per statement or transaction."""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from ...errors import CorruptRecordError, StoreError, retry_may_cure
from ...records.links import parents_of
from ..base import IJobStore, JobRecord, StepClaim, claimed_row, why_not_claimable
from .boundary import once_more_if_stale, refused_by_key_index
from .engine import transaction
from .mapping import row_values
from .parts import SqlStorePart
from .statements import advance_statement

T = TypeVar("T")

#: Rows per multi-row INSERT of ``put_many`` (PostgreSQL takes 65,535 parameters a
#: statement, 18 a row; MySQL's packet limit bounds the statement's size).
_INSERT_ROWS = 500


class BatchRows(SqlStorePart):
    """Many rows at once, each answered in its own place."""

    def advance_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        # One transaction (one commit) for all rows. A row refused by the unique
        # index of active keys rolls it back: then row by row, so that the
        # refusal names its own row.
        if not records:
            return []
        return self._whole_or_row_by_row(
            records, self._advance_many, lambda: [self.advance(record) for record in records]
        )

    def _whole_or_row_by_row(
        self,
        records: Sequence[JobRecord],
        whole: Callable[[Sequence[JobRecord]], builtins.list[T]],
        row_by_row: Callable[[], builtins.list[T]],
        *,
        after_data_error: bool = False,
    ) -> builtins.list[T]:
        """``whole(records)``, all rows at once; ``row_by_row()`` instead when the
        unique index of active keys refused one of them (and so undid them all),
        or, with ``after_data_error``, when the database refused one row's content
        (:class:`StoreDataError`): then only that row gets the refusal."""
        try:
            return once_more_if_stale(
                self._engine, f"updating {len(records)} jobs", lambda: whole(records)
            )
        except StoreError as exc:
            refused_row = after_data_error and not retry_may_cure(exc)
            if not refused_row and not refused_by_key_index(exc.__cause__):
                raise
        return row_by_row()

    def _advance_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        written: dict[int, bool] = {}
        with transaction(self._engine) as connection:
            # In id order, so that two multi-row writers never wait on each other.
            for n in sorted(range(len(records)), key=lambda n: records[n].id):
                written[n] = connection.execute(advance_statement(records[n])).rowcount == 1
        return [written[n] for n in range(len(records))]

    # -- group commit ------------------------------------------------------------------

    def claim_steps(
        self, requests: Sequence[StepClaim]
    ) -> builtins.list[JobRecord | CorruptRecordError | None]:
        # MySQL and MariaDB: one read of every row, then the claims that may win
        # in one transaction (one commit), each guarded by its version.
        if len(requests) <= 1:
            return super().claim_steps(requests)
        current = {r.id: r for r in self.get_many({q.job_id for q in requests})}
        answers: builtins.list[JobRecord | CorruptRecordError | None] = [None] * len(requests)
        chosen: dict[str, tuple[int, JobRecord]] = {}
        for n, request in enumerate(requests):
            row = current.get(request.job_id)
            if row is not None and row.damaged is not None:
                answers[n] = self._corrupt(request.job_id)  # None: mended since, read again
                continue
            if (
                row is None
                or request.job_id in chosen  # one claim per job: the others would lose
                or why_not_claimable(row, request.cursor, request.now, request.start) is not None
            ):
                continue
            chosen[request.job_id] = (n, claimed_row(row, request))
        tried = list(chosen.values())
        for (n, claimed), won in zip(
            tried, self.advance_each([claimed for _, claimed in tried]), strict=True
        ):
            if isinstance(won, Exception):
                raise won
            if won:
                answers[n] = claimed.evolve(version=claimed.version + 1)
        return answers

    def advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        # One round trip (PostgreSQL) or one transaction (MySQL) for all rows. A
        # row refused by the unique index of active keys, or for its content (a
        # data error), undoes it: then row by row, so that the refusal is answered
        # in its own row's place and the other rows are written.
        if len(records) <= 1:
            return super().advance_each(records)
        return self._whole_or_row_by_row(
            records,
            self._advance_each,
            lambda: IJobStore.advance_each(self, records),
            after_data_error=True,
        )

    def _advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        return list(self._advance_many(records))

    # -- bulk scheduling ------------------------------------------------------------------

    def put_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        # New jobs without links go in multi-row INSERTs of up to _INSERT_ROWS rows;
        # anything else (an update, a job with parents, an id twice) and a
        # statement the database refused whole (a unique key taken; on MySQL, an
        # id stored already) are put row by row, so that each row gets its own answer.
        ids = [record.id for record in records]
        if len(set(ids)) < len(ids) or any(
            record.version != 0 or parents_of(record.id, record.payload, record.waits)
            for record in records
        ):
            return super().put_many(records)
        answers: builtins.list[bool] = []
        for start in range(0, len(records), _INSERT_ROWS):
            chunk = records[start : start + _INSERT_ROWS]
            try:
                inserted = once_more_if_stale(
                    self._engine,
                    f"inserting {len(chunk)} jobs",
                    functools.partial(self._insert_many, chunk),
                )
            except StoreError as exc:
                cause = exc.__cause__
                if not isinstance(cause, sa_exc.IntegrityError) and not refused_by_key_index(cause):
                    raise
                answers += super().put_many(chunk)
                continue
            answers += [record.id in inserted for record in chunk]
        return answers

    def _insert_many(self, records: Sequence[JobRecord]) -> set[str]:
        """Insert new rows in one statement; the ids inserted."""
        # One statement compiled once (SQLAlchemy caches it), executed for many
        # rows: PyMySQL's executemany (and SQLAlchemy's "insertmanyvalues" on
        # psycopg, in a caller's transaction) send them as one multi-row INSERT.
        # A VALUES list built with .values(rows) would be compiled anew per call,
        # at about 1 ms a row. PostgresJobStore sends arrays instead.
        rows = [row_values(record) for record in records]
        stmt = self._dialect.insert_new
        if self._dialect.answers_each_new_row:
            with self._engine.connect() as connection:
                return {row[0] for row in connection.execute(stmt, rows)}
        # MySQL and MariaDB answer no row by row: an id stored already fails the
        # insert, and the transaction (PyMySQL splits a long one in several
        # statements) leaves nothing written.
        with self._linked_write() as connection:
            connection.execute(stmt, rows)
        return {record.id for record in records}
