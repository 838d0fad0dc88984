"""When a job may start, when its message is due to be sent, and its start deadline.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

All three columns are nullable, so existing rows need no backfill: they may
start at once, have their message already, and have no deadline.

* ``not_before``: the planned start (``scheduled(delay=..., eta=...)``); no
  step is claimed before it.
* ``release_at``: a job held in the store (a long delay) whose first message the
  recovery sweep sends when this time comes near; NULL once sent.
* ``start_deadline``: the latest permitted start; a Scheduled job past it is
  cancelled, by the worker that picks it up or by the recovery sweep.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import timestamp_type

revision: str = "0004"
down_revision: str | None = "0003"

#: Serves ``WHERE status = 'Scheduled' AND release_at <= :until ORDER BY release_at``.
BY_RELEASE = "ix_scheduler_jobs_status_release_at"
#: Serves ``WHERE status = 'Scheduled' AND start_deadline < :now ORDER BY start_deadline``.
BY_DEADLINE = "ix_scheduler_jobs_status_start_deadline"


def upgrade() -> None:
    timestamp = timestamp_type()
    for column in ("not_before", "release_at", "start_deadline"):
        op.add_column("scheduler_jobs", sa.Column(column, timestamp, nullable=True))
    op.create_index(BY_RELEASE, "scheduler_jobs", ["status", "release_at"])
    op.create_index(BY_DEADLINE, "scheduler_jobs", ["status", "start_deadline"])


def downgrade() -> None:
    op.drop_index(BY_DEADLINE, table_name="scheduler_jobs")
    op.drop_index(BY_RELEASE, table_name="scheduler_jobs")
    for column in ("start_deadline", "release_at", "not_before"):
        op.drop_column("scheduler_jobs", column)
