"""What differs between the SQL backends in the portable statements, one small
class a dialect (PostgreSQL's hot statements are :mod:`.postgres`'s store)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, TextClause, func, insert, literal_column, select
from sqlalchemy.sql import ColumnElement, Executable

from ..schema import jobs
from .statements import (
    MYSQL_PROGRESS_MERGE,
    PG_INSERT_NEW,
    PG_PROGRESS_MERGE,
    mysql_activity_upsert,
    mysql_worker_upsert,
    pg_activity_upsert,
    pg_worker_upsert,
)

#: Key of the PostgreSQL advisory lock held while migrating ("pypepper" in ASCII, truncated).
_MIGRATION_LOCK = 0x7079706570706572


class Dialect:
    """The portable statements' choices, as MySQL and MariaDB run them.

    Attributes:
        progress_merge: ``write_progress``'s UPDATE, merging ``:patch`` into the state.
        insert_new: ``put_many``'s INSERT of new rows, executed with many rows.
        answers_each_new_row: whether ``insert_new`` returns the ids it inserted
            (skipping ids stored already); if not, an id stored already fails the
            whole insert.
    """

    progress_merge: TextClause = MYSQL_PROGRESS_MERGE
    insert_new: Executable = insert(jobs)
    answers_each_new_row = False

    def active_key(self, key: str) -> str | bytes:
        """``key`` as the ``active_key`` column compares it."""
        return key

    def worker_upsert(self, values: dict[str, Any], kept: tuple[str, ...]) -> Executable:
        """One statement writing a worker's row whether it exists or not; the
        columns ``kept`` keep the value first written."""
        return mysql_worker_upsert(values, kept)

    def activity_upsert(self, rows: Sequence[dict[str, Any]]) -> Executable:
        """One statement adding ``rows`` to the activity rollup, whether their minutes
        are stored or not (counts summed, the deeper depth kept)."""
        return mysql_activity_upsert(rows)

    def lock_migrations(self, connection: Connection) -> None:
        """Serialise concurrent migrators, where the database can (not here)."""

    def whole_seconds_since(self, column: Any, start: datetime) -> ColumnElement[Any]:
        """Whole seconds from ``start`` to the timestamp ``column`` (both UTC)."""
        return func.timestampdiff(literal_column("SECOND"), start, column)


class MySqlDialect(Dialect):
    """MySQL and MariaDB."""

    def active_key(self, key: str) -> str | bytes:
        # The column holds the key's utf8mb4 bytes (see schema.active_key_type).
        return key.encode()


class PostgresDialect(Dialect):
    """PostgreSQL, in its portable statements (a caller's transaction runs them too)."""

    progress_merge = PG_PROGRESS_MERGE
    insert_new = PG_INSERT_NEW
    answers_each_new_row = True

    def worker_upsert(self, values: dict[str, Any], kept: tuple[str, ...]) -> Executable:
        return pg_worker_upsert(values, kept)

    def activity_upsert(self, rows: Sequence[dict[str, Any]]) -> Executable:
        return pg_activity_upsert(rows)

    def whole_seconds_since(self, column: Any, start: datetime) -> ColumnElement[Any]:
        return func.floor(func.extract("epoch", column - start))

    def lock_migrations(self, connection: Connection) -> None:
        # PostgreSQL DDL is transactional, so the loser then finds the schema at
        # head and does nothing.
        connection.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))


_DIALECTS: dict[str, Dialect] = {
    "postgresql": PostgresDialect(),
    "mysql": MySqlDialect(),
    "mariadb": MySqlDialect(),
}
#: A backend named neither way: the portable statements as written for MySQL.
_PORTABLE = Dialect()


def dialect_named(name: str) -> Dialect:
    """The :class:`Dialect` of SQLAlchemy's dialect ``name``."""
    return _DIALECTS.get(name, _PORTABLE)
