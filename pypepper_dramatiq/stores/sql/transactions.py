"""Caller transactions: the store writing through a caller's connection (transactional enqueue)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session

from ...errors import ConfigError
from .parts import SqlStorePart


class InCallerTransaction(SqlStorePart):
    """What makes a SQL store run its statements in a caller's transaction: put
    before :class:`~pypepper_dramatiq.stores.sql.SqlJobStore` in the bases.

    The portable statements only (the PostgreSQL subclass's hot paths use pooled
    driver connections of their own); made by ``SqlJobStore.within``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> InCallerTransaction:
        return object.__new__(cls)

    def __init__(self, connection: Connection, engine: Engine, given: object) -> None:
        self._engine = cast(Engine, _CallerTransaction(connection, engine))
        self._session = given if isinstance(given, Session) else None
        self.tells_commits = self._session is not None

    @contextmanager
    def _linked_write(self) -> Iterator[Connection]:
        """A savepoint in the caller's transaction."""
        with self._engine.connect() as connection:
            yield connection

    def after_commit(self, callback: Callable[[], object]) -> None:
        if self._session is not None:
            # Once, after the commit that makes the row visible (never on a rollback).
            event.listen(self._session, "after_commit", lambda _session: callback(), once=True)


class _CallerTransaction:
    """What a :class:`SqlJobStore` needs of an engine, on a caller's connection:
    each ``connect()`` is a savepoint in the caller's transaction."""

    def __init__(self, connection: Connection, engine: Engine) -> None:
        self._connection = connection
        self.url = engine.url
        self.dialect = connection.dialect

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._connection.begin_nested():
            yield self._connection

    def dispose(self) -> None:
        """The connection is the caller's: nothing to release."""


def caller_connection(connection: object) -> Connection:
    if isinstance(connection, Session):
        return connection.connection()
    if isinstance(connection, Connection):
        return connection
    raise ConfigError(
        f"connection= takes a SQLAlchemy Connection or Session, got {type(connection).__name__}"
    )
