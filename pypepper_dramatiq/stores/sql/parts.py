"""What every part of the SQL store shares: its engine, and the transaction a job's
row and its links are written in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from ...errors import CorruptRecordError
from ..base import IJobStore
from .dialects import Dialect, dialect_named
from .engine import transaction


class SqlStorePart(IJobStore):
    """The base of each concern of :class:`~pypepper_dramatiq.stores.sql.SqlJobStore`
    (jobs, listings, leases, batches, schedules, workers, links, purge): the
    store is all of them over one engine."""

    _engine: Engine

    @property
    def _dialect(self) -> Dialect:
        """What differs on this store's backend in the portable statements."""
        return dialect_named(self._engine.dialect.name)

    @contextmanager
    def _linked_write(self) -> Iterator[Connection]:
        """A transaction for a row and its links."""
        with transaction(self._engine) as connection:
            yield connection

    def _corrupt(self, job_id: str) -> CorruptRecordError | None:
        """The error of a damaged row that a batch read as a placeholder: the single
        read's, naming the column (None if the row reads whole by now)."""
        try:
            self.get(job_id)
        except CorruptRecordError as exc:
            return exc
        return None
