"""Create the scheduler_jobs table.

Revision ID: 0001
Revises:
Create Date: 2024-11-29

The column types are spelled out here, not imported from ``schema.py``, so that
this revision keeps creating the same table whatever later revisions change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import json_type, timestamp_type

revision: str = "0001"
down_revision: str | None = None


def upgrade() -> None:
    timestamp = timestamp_type()
    json = json_type()
    # MySQL only accepts an expression default on JSON columns from 8.0.13; the
    # store always writes ``state``, so the server default is a PostgreSQL nicety.
    is_postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "scheduler_jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("channel_id", sa.String(128), nullable=False),
        sa.Column("category", sa.String(128), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created", timestamp, nullable=False),
        sa.Column("updated", timestamp, nullable=False),
        sa.Column("payload", json, nullable=True),
        sa.Column(
            "state",
            json,
            nullable=False,
            server_default=sa.text("'{}'::jsonb") if is_postgres else None,
        ),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_scheduler_jobs_channel_status", "scheduler_jobs", ["channel_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_scheduler_jobs_channel_status", table_name="scheduler_jobs")
    op.drop_table("scheduler_jobs")
