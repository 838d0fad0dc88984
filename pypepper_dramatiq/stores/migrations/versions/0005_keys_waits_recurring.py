"""Unique keys, waits (parents, key holders) and recurring schedules.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

The new job columns are nullable, so existing rows need no backfill: they hold
no key and wait for nothing.

* ``unique_key``: the key a job holds while Scheduled or InProgress;
  ``active_key`` (generated: the key while active, else NULL) carries the
  unique index that refuses a second active job per key (on MySQL as bytes,
  so keys differing in case, accents or trailing spaces are different keys);
* ``waits`` and ``waiting_since``: what a Scheduled job waits for, and since
  when (indexed: the recovery sweep settles waits oldest first);
* ``scheduler_recurring``: the recurring schedules.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from pypepper_dramatiq.stores.schema import exact_text, json_type, timestamp_type

revision: str = "0005"
down_revision: str | None = "0004"

ACTIVE_KEY = "CASE WHEN status IN ('Scheduled', 'InProgress') THEN unique_key END"
BY_KEY = "ux_scheduler_jobs_active_key"
BY_WAIT = "ix_scheduler_jobs_waiting_since"


def upgrade() -> None:
    timestamp = timestamp_type()
    json = json_type()
    op.add_column("scheduler_jobs", sa.Column("unique_key", exact_text(191), nullable=True))
    op.add_column("scheduler_jobs", sa.Column("waits", json, nullable=True))
    op.add_column("scheduler_jobs", sa.Column("waiting_since", timestamp, nullable=True))
    op.add_column(
        "scheduler_jobs",
        sa.Column(
            "active_key",
            sa.String(191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb"),
            sa.Computed(ACTIVE_KEY, persisted=True),
            nullable=True,
        ),
    )
    op.create_index(BY_WAIT, "scheduler_jobs", ["waiting_since", "id"])
    op.create_index(
        BY_KEY,
        "scheduler_jobs",
        ["active_key"],
        unique=True,
        postgresql_where=sa.text("active_key IS NOT NULL"),
    )
    op.create_table(
        "scheduler_recurring",
        sa.Column("name", exact_text(128), primary_key=True),
        sa.Column("cron", sa.String(255), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("template", json, nullable=False),
        sa.Column("max_start_delay", sa.Double, nullable=True),
        sa.Column("overlap", sa.String(8), nullable=False),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("next_slot", timestamp, nullable=False),
        sa.Column("last_slot", timestamp, nullable=True),
        sa.Column("last_job_id", sa.String(64), nullable=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created", timestamp, nullable=False),
        sa.Column("updated", timestamp, nullable=False),
    )
    op.create_index("ix_scheduler_recurring_next_slot", "scheduler_recurring", ["next_slot"])


def downgrade() -> None:
    op.drop_index("ix_scheduler_recurring_next_slot", table_name="scheduler_recurring")
    op.drop_table("scheduler_recurring")
    op.drop_index(BY_KEY, table_name="scheduler_jobs")
    op.drop_index(BY_WAIT, table_name="scheduler_jobs")
    for column in ("active_key", "waiting_since", "waits", "unique_key"):
        op.drop_column("scheduler_jobs", column)
