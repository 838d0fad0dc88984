"""Index the listing queries: by status, and by channel and status, in created order.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

``list(status=..., limit=N)`` sorted every matching row before taking N; with
these indexes it reads the first N in order.
"""

from __future__ import annotations

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"

BY_STATUS = "ix_scheduler_jobs_status_created"
BY_CHANNEL = "ix_scheduler_jobs_channel_status_created"
OLD_BY_CHANNEL = "ix_scheduler_jobs_channel_status"


def upgrade() -> None:
    op.create_index(BY_STATUS, "scheduler_jobs", ["status", "created", "id"])
    op.create_index(BY_CHANNEL, "scheduler_jobs", ["channel_id", "status", "created", "id"])
    # The wider index serves every query the old one did.
    op.drop_index(OLD_BY_CHANNEL, table_name="scheduler_jobs")


def downgrade() -> None:
    op.create_index(OLD_BY_CHANNEL, "scheduler_jobs", ["channel_id", "status"])
    op.drop_index(BY_CHANNEL, table_name="scheduler_jobs")
    op.drop_index(BY_STATUS, table_name="scheduler_jobs")
