"""Add job leases: the worker holding a job's current step, and until when.

Revision ID: 0002
Revises: 0001
Create Date: 2024-12-06

Both columns are nullable, so existing rows need no backfill: a job with no
lease is free (or dispatched) and is never picked up by the recovery query.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import timestamp_type

revision: str = "0002"
down_revision: str | None = "0001"

#: Serves ``WHERE status = 'InProgress' AND lease_expires < :now ORDER BY lease_expires``.
INDEX = "ix_scheduler_jobs_status_lease_expires"


def upgrade() -> None:
    timestamp = timestamp_type()
    op.add_column("scheduler_jobs", sa.Column("lease_owner", sa.String(128), nullable=True))
    op.add_column("scheduler_jobs", sa.Column("lease_expires", timestamp, nullable=True))
    op.create_index(INDEX, "scheduler_jobs", ["status", "lease_expires"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="scheduler_jobs")
    op.drop_column("scheduler_jobs", "lease_expires")
    op.drop_column("scheduler_jobs", "lease_owner")
