"""The ``scheduler_jobs`` table, shared by :mod:`.sql` and the migrations."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.types import TypeEngine

#: Alembic's bookkeeping table; ours, so we never touch a user's ``alembic_version``.
VERSION_TABLE = "pypepper_alembic_version"

metadata = MetaData()


def json_type() -> TypeEngine[Any]:
    """JSON where SQL NULL stays NULL; JSONB on PostgreSQL."""
    return JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def timestamp_type() -> TypeEngine[datetime]:
    """A timestamp with microseconds; MySQL's DATETIME has none unless asked."""
    return DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


class UtcDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, whatever the backend keeps."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(timestamp_type())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # Naive values are taken as UTC, as MySQL hands them back naive.
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name in ("mysql", "mariadb") else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


jobs = Table(
    "scheduler_jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("channel_id", String(128), nullable=False),
    Column("category", String(128), nullable=True),
    Column("status", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("created", UtcDateTime(), nullable=False),
    Column("updated", UtcDateTime(), nullable=False),
    Column("payload", json_type(), nullable=True),
    Column("state", json_type(), nullable=False, default=dict),
    Column("error", Text, nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires", UtcDateTime(), nullable=True),
    Column("not_before", UtcDateTime(), nullable=True),
    Column("release_at", UtcDateTime(), nullable=True),
    Column("start_deadline", UtcDateTime(), nullable=True),
    Index("ix_scheduler_jobs_status_created", "status", "created", "id"),
    Index("ix_scheduler_jobs_channel_status_created", "channel_id", "status", "created", "id"),
    # The recovery query: InProgress rows whose lease lapsed, oldest first.
    Index("ix_scheduler_jobs_status_lease_expires", "status", "lease_expires"),
    # The sweep's queries: held jobs due for release, Scheduled jobs past their deadline.
    Index("ix_scheduler_jobs_status_release_at", "status", "release_at"),
    Index("ix_scheduler_jobs_status_start_deadline", "status", "start_deadline"),
)
