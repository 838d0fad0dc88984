"""The worker processes' heartbeat rows (the workers page and command).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

* ``scheduler_workers``: one row per live ``dramatiq`` worker process, keyed by
  the lease owner id it writes into the jobs it holds; refreshed by its lease
  keeper once per heartbeat and deleted when it stops cleanly
  (:mod:`pypepper_dramatiq.records.workers`). Indexed by ``last_seen``, for the
  listing's cutoff and the delete of rows not refreshed for an hour.

Workers of an older release write no row: they are not listed until upgraded.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import json_type, timestamp_type

revision: str = "0007"
down_revision: str | None = "0006"

WORKERS = "scheduler_workers"
BY_LAST_SEEN = "ix_scheduler_workers_last_seen"


def upgrade() -> None:
    timestamp = timestamp_type()
    json = json_type()
    op.create_table(
        WORKERS,
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started", timestamp, nullable=False),
        sa.Column("last_seen", timestamp, nullable=False),
        sa.Column("heartbeat", sa.Double, nullable=False),
        sa.Column("channels", json, nullable=True),
        sa.Column("dramatiq_version", sa.String(32), nullable=True),
    )
    op.create_index(BY_LAST_SEEN, WORKERS, ["last_seen"])


def downgrade() -> None:
    op.drop_index(BY_LAST_SEEN, table_name=WORKERS)
    op.drop_table(WORKERS)
