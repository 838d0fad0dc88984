"""The recovery sweep's health on the workers' rows (the workers page).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

* ``scheduler_workers.sweep``: JSON, nullable. Written with each heartbeat by the
  worker process: whether it leads the recovery sweep, when its latest full pass
  ended, and the sweep duties failing now with their latest error
  (:class:`pypepper_dramatiq.records.workers.SweepHealth`).

Workers of an older release leave it empty: the page shows no sweep health for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import json_type

revision: str = "0009"
down_revision: str | None = "0008"

WORKERS = "scheduler_workers"


def upgrade() -> None:
    json = json_type()
    op.add_column(WORKERS, sa.Column("sweep", json, nullable=True))


def downgrade() -> None:
    op.drop_column(WORKERS, "sweep")
