"""Index the ended jobs by when they ended.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

* ``ix_scheduler_jobs_status_updated`` on ``(status, updated, id)``: the recovery
  sweep reads the Cancelled rows updated since its watermark, oldest first
  (``IJobStore.ended_since``), to count the ends no process counted. Without it
  each look would scan every row of the status.
"""

from __future__ import annotations

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"

BY_UPDATE = "ix_scheduler_jobs_status_updated"


def upgrade() -> None:
    op.create_index(BY_UPDATE, "scheduler_jobs", ["status", "updated", "id"])


def downgrade() -> None:
    op.drop_index(BY_UPDATE, table_name="scheduler_jobs")
