"""The tables of the SQL stores (``scheduler_jobs`` and the rest), shared by :mod:`.sql`
and the migrations."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Computed,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.types import TypeEngine

from ..limits import storable as limits
from ..records.activity import TIME_BUCKETS as ACTIVITY_BUCKETS

#: Alembic's bookkeeping table; ours, so we never touch a user's ``alembic_version``.
VERSION_TABLE = "pypepper_alembic_version"

metadata = MetaData()

#: The expression of the ``active_key`` column (one definition for both dialects).
ACTIVE_KEY = "CASE WHEN status IN ('Scheduled', 'InProgress') THEN unique_key END"
#: The unique index the database refuses a second active job per key with.
ACTIVE_KEY_INDEX = "ux_scheduler_jobs_active_key"


def json_type() -> TypeEngine[Any]:
    """JSON where SQL NULL stays NULL; JSONB on PostgreSQL."""
    return JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def exact_text(length: int) -> TypeEngine[str]:
    """Text compared as written: MySQL's default collations ignore case and accents,
    so there it is utf8mb4 with a binary collation (trailing spaces still pad)."""
    return String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def active_key_type() -> TypeEngine[Any]:
    """The type of ``active_key``: on MySQL bytes, so that the unique index compares
    keys byte for byte (a binary collation would still ignore trailing spaces)."""
    return String(limits.UNIQUE_KEY_LENGTH).with_variant(
        mysql.VARBINARY(4 * limits.UNIQUE_KEY_LENGTH), "mysql", "mariadb"
    )


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

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):  # MariaDB's zero date comes back as text:
            return cast(datetime, value)  # the row's reader names the column (stores.rows)
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


jobs = Table(
    "scheduler_jobs",
    metadata,
    Column("id", String(limits.ID_LENGTH), primary_key=True),
    Column("channel_id", String(limits.CHANNEL_ID_LENGTH), nullable=False),
    Column("category", String(limits.CATEGORY_LENGTH), nullable=True),
    Column("status", String(limits.STATUS_LENGTH), nullable=False),
    Column("version", Integer, nullable=False),
    Column("created", UtcDateTime(), nullable=False),
    Column("updated", UtcDateTime(), nullable=False),
    Column("payload", json_type(), nullable=True),
    Column("state", json_type(), nullable=False, default=dict),
    Column("error", Text, nullable=True),
    Column("lease_owner", String(limits.LEASE_OWNER_LENGTH), nullable=True),
    Column("lease_expires", UtcDateTime(), nullable=True),
    Column("not_before", UtcDateTime(), nullable=True),
    Column("release_at", UtcDateTime(), nullable=True),
    Column("start_deadline", UtcDateTime(), nullable=True),
    Column("unique_key", exact_text(limits.UNIQUE_KEY_LENGTH), nullable=True),
    Column("waits", json_type(), nullable=True),
    Column("waiting_since", UtcDateTime(), nullable=True),
    # The key of an active (Scheduled or InProgress) job, NULL otherwise: its unique
    # index lets the database refuse a second active job per key, on both dialects.
    Column("active_key", active_key_type(), Computed(ACTIVE_KEY, persisted=True), nullable=True),
    Index("ix_scheduler_jobs_status_created", "status", "created", "id"),
    Index("ix_scheduler_jobs_channel_status_created", "channel_id", "status", "created", "id"),
    Index("ix_scheduler_jobs_category_status_created", "category", "status", "created", "id"),
    # The recovery query: InProgress rows whose lease lapsed, oldest first.
    Index("ix_scheduler_jobs_status_lease_expires", "status", "lease_expires"),
    # The sweep's queries: held jobs due for release, Scheduled jobs past their deadline.
    Index("ix_scheduler_jobs_status_release_at", "status", "release_at"),
    Index("ix_scheduler_jobs_status_start_deadline", "status", "start_deadline"),
    # The sweep's look at jobs waiting for parents or a key holder, oldest first.
    Index("ix_scheduler_jobs_waiting_since", "waiting_since", "id"),
    # The sweep's look at recent ends (the ends no process counted), by end time.
    Index("ix_scheduler_jobs_status_updated", "status", "updated", "id"),
    # At most one active job per unique key (on PostgreSQL only rows with a key
    # have an entry, so plain jobs pay nothing for it).
    Index(
        ACTIVE_KEY_INDEX,
        "active_key",
        unique=True,
        postgresql_where=text("active_key IS NOT NULL"),
    ),
)

#: Recurring schedules: one row per name; ``next_slot`` is the first slot not yet handled.
recurring = Table(
    "scheduler_recurring",
    metadata,
    Column("name", exact_text(limits.SCHEDULE_NAME_LENGTH), primary_key=True),
    Column("cron", String(limits.CRON_LENGTH), nullable=False),
    Column("timezone", String(limits.TIMEZONE_LENGTH), nullable=False),
    # The job each firing copies: channel, category, workflows (JobRecord.payload).
    Column("template", json_type(), nullable=False),
    Column("max_start_delay", Double, nullable=True),
    Column("overlap", String(limits.CHOICE_LENGTH), nullable=False),
    Column("catch_up", String(limits.CHOICE_LENGTH), nullable=False),
    Column("next_slot", UtcDateTime(), nullable=False),
    Column("last_slot", UtcDateTime(), nullable=True),
    Column("last_job_id", String(limits.ID_LENGTH), nullable=True),
    Column("paused", Boolean, nullable=False, default=False),
    Column("version", Integer, nullable=False),
    Column("created", UtcDateTime(), nullable=False),
    Column("updated", UtcDateTime(), nullable=False),
    Index("ix_scheduler_recurring_next_slot", "next_slot"),
)

#: Links from a job to the jobs it came from (:mod:`~pypepper_dramatiq.records.links`), written
#: with the child's row; deleted with it.
links = Table(
    "scheduler_job_links",
    metadata,
    Column("parent_id", String(limits.ID_LENGTH), primary_key=True),
    Column(
        "child_id",
        String(limits.ID_LENGTH),
        ForeignKey("scheduler_jobs.id", ondelete="CASCADE", name="fk_scheduler_job_links_child"),
        primary_key=True,
    ),
    Column("kind", String(limits.CHOICE_LENGTH), nullable=False),
    Index("ix_scheduler_job_links_child", "child_id"),
)

#: The worker processes (:mod:`~pypepper_dramatiq.records.workers`): one row per process,
#: refreshed by its lease keeper once per heartbeat, deleted when it stops cleanly.
workers = Table(
    "scheduler_workers",
    metadata,
    # The lease owner id the process writes into the jobs it holds.
    Column("owner", String(limits.LEASE_OWNER_LENGTH), primary_key=True),
    Column("host", String(limits.HOST_LENGTH), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started", UtcDateTime(), nullable=False),
    Column("last_seen", UtcDateTime(), nullable=False),
    # Seconds between two heartbeats: a row missing three of them is shown as gone.
    Column("heartbeat", Double, nullable=False),
    Column("channels", json_type(), nullable=True),
    Column("dramatiq_version", String(limits.VERSION_LENGTH), nullable=True),
    # Its recovery sweep's health (workers.SweepHealth.to_dict): leading, last full
    # pass, failing duties; written with the heartbeat.
    Column("sweep", json_type(), nullable=True),
    # The listing's cutoff and the keepers' delete of rows not seen for an hour.
    Index("ix_scheduler_workers_last_seen", "last_seen"),
)

#: Tombstones: the ids of the jobs the retention purge deleted, each with when, written
#: in the purge's transaction, so that a message of such a job that comes back later is
#: dropped rather than taken for a job whose row its producer could not store
#: (:meth:`~pypepper_dramatiq.stores.base.IJobStore.was_purged`). The purge deletes those
#: older than :data:`~pypepper_dramatiq.rules.retention.TOMBSTONE_KEEP`.
purged = Table(
    "scheduler_purged",
    metadata,
    Column("job_id", String(limits.ID_LENGTH), primary_key=True),
    Column("purged_at", UtcDateTime(), nullable=False),
    # The purge's delete of the tombstones past their keep.
    Index("ix_scheduler_purged_purged_at", "purged_at"),
)

#: The paused channels and task types (migration 0013), one row each: ``kind`` is
#: ``channel`` or ``task`` (:mod:`~pypepper_dramatiq.records.pauses`), ``name`` the
#: channel's name or the task's executor id. Every worker reads the whole table, at
#: most once a second (:class:`~pypepper_dramatiq.engine.pausing.PausedSet`).
paused = Table(
    "scheduler_paused",
    metadata,
    Column("kind", String(limits.CHOICE_LENGTH), primary_key=True),
    Column("name", exact_text(limits.PAUSED_NAME_LENGTH), primary_key=True),
    Column("paused_at", UtcDateTime(), nullable=False),
)

#: The channels' admission state where PostgreSQL coordinates the processes (created on
#: PostgreSQL only: migration 0012)
#: (:mod:`pypepper_dramatiq.transport.postgres`): one row per channel a process used.
channels = Table(
    "scheduler_channels",
    metadata,
    Column("name", exact_text(limits.CHANNEL_ID_LENGTH), primary_key=True),
    # How many jobs may wait at once; 0: unbounded.
    Column("maxsize", Integer, nullable=False, default=0),
    Column("stopped", Boolean, nullable=False, default=False),
    # The concurrency limit a worker last applied (migration 0019); NULL: none.
    Column("max_running", Integer, nullable=True),
)

#: The jobs admitted to a channel and not yet taken (its waiting jobs): one row each.
#: ``seq`` orders them for the sweep's paging (``Gate.waiting_ids``).
channel_slots = Table(
    "scheduler_channel_slots",
    metadata,
    Column(
        "channel",
        exact_text(limits.CHANNEL_ID_LENGTH),
        ForeignKey("scheduler_channels.name", ondelete="CASCADE", name="fk_channel_slots_channel"),
        primary_key=True,
    ),
    Column("job_id", exact_text(limits.ID_LENGTH), primary_key=True),
    Column("seq", BigInteger, Identity(), nullable=False),
    Index("ix_scheduler_channel_slots_channel_seq", "channel", "seq"),
)

#: The activity rollup (:mod:`~pypepper_dramatiq.records.activity`): one row per grain
#: (a minute, a quarter of an hour, an hour), its start and channel, added to by the
#: recovery sweep's leader; a histogram is a column per bucket, so that a chart adds its
#: rows up in one GROUP BY.
activity = Table(
    "scheduler_activity",
    metadata,
    # The row's grain, in minutes (records.activity.GRAINS): the key's first column, so
    # that a chart reads one grain's range of the key.
    Column("span_minutes", SmallInteger, primary_key=True, autoincrement=False),
    Column("at_minute", UtcDateTime(), primary_key=True),
    Column("channel_id", String(limits.CHANNEL_ID_LENGTH), primary_key=True),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("cancelled", Integer, nullable=False, default=0),
    *(Column(f"wait_{i:02d}", Integer, nullable=False, default=0) for i in range(ACTIVITY_BUCKETS)),
    *(Column(f"run_{i:02d}", Integer, nullable=False, default=0) for i in range(ACTIVITY_BUCKETS)),
    # The deepest the channel's queue was seen in the minute; NULL: not read.
    Column("depth", Integer, nullable=True),
)

#: How far the rollup holds every end (one row, ``id`` 1): moved by compare-and-set in
#: the transaction that adds the ends, so that two leaders never add one end twice.
activity_mark = Table(
    "scheduler_activity_mark",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("first_minute", UtcDateTime(), nullable=False),
    Column("next_minute", UtcDateTime(), nullable=False),
)

#: The rate limits' next turns where PostgreSQL coordinates the processes (created on
#: PostgreSQL only: migration 0015): one row per rate limit key, ``starts`` the
#: starts it granted within its last period (oldest first), ``tail_at`` the last retry
#: time it told a refused start, in epoch seconds of the server's clock
#: (:meth:`~pypepper_dramatiq.transport.postgres.PostgresTransport.ask_start`).
rate_turns = Table(
    "scheduler_rate_turns",
    metadata,
    Column("key", exact_text(limits.RATE_KEY_LENGTH), primary_key=True),
    Column("starts", postgresql.ARRAY(Double()), nullable=False),
    Column("tail_at", Double(), nullable=False),
    # The limit as written ("5/s"), for people: the channels list shows it.
    Column("rate_limit", String(limits.RATE_TEXT_LENGTH), nullable=False),
)

#: The concurrency limits' slots where PostgreSQL coordinates the processes (created
#: on PostgreSQL only: migration 0017): one row per slot held, ``expires_at`` when its
#: lease lapses, in epoch seconds of the server's clock
#: (:meth:`~pypepper_dramatiq.transport.postgres.PostgresTransport.acquire_slots`).
concurrency_slots = Table(
    "scheduler_concurrency_slots",
    metadata,
    Column("key", exact_text(limits.CONCURRENCY_SLOT_KEY_LENGTH), primary_key=True),
    Column("holder", exact_text(limits.CONCURRENCY_HOLDER_LENGTH), primary_key=True),
    Column("expires_at", Double(), nullable=False),
)

#: The starts a concurrency limit refused, waiting in its line for a slot (created on
#: PostgreSQL only: migration 0019): one row per key and job, its place by priority
#: (highest first), then ``seq`` (first held), and its message to send again.
concurrency_waits = Table(
    "scheduler_concurrency_waits",
    metadata,
    Column("key", exact_text(limits.CONCURRENCY_SLOT_KEY_LENGTH), primary_key=True),
    Column("job_id", exact_text(limits.ID_LENGTH), primary_key=True),
    Column("priority", SmallInteger, nullable=False),
    Column("seq", BigInteger, Identity(), nullable=False),
    Column("data", Text, nullable=False),
    Index("ix_scheduler_concurrency_waits_line", "key", "priority", "seq"),
)
