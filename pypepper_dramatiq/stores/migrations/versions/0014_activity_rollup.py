"""The activity rollup the dashboard's charts read.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

* ``scheduler_activity``: per minute, quarter of an hour and hour (``span_minutes``)
  and channel, the jobs that ended by status,
  histograms of the time they waited and ran (a column per fixed bucket, 21 each)
  and the deepest the channel's queue was seen; added to by the recovery sweep's
  leader (duty ``roll_up_activity``), rows older than eight days deleted by it.
* ``scheduler_activity_mark``: one row, how far the rollup holds every end; moved
  by compare-and-set with the rows it adds.

Nothing is filled in for the ends before this revision: the charts count those
from the jobs table as before, until they are older than a week.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import timestamp_type

# A plain string: renumbered freely if another 0013 lands first.
revision: str = "0014"
down_revision: str | None = "0013"

ACTIVITY = "scheduler_activity"
MARK = "scheduler_activity_mark"
#: Columns per histogram (records.activity.TIME_BUCKETS when this was written).
BUCKETS = 21


def upgrade() -> None:
    timestamp = timestamp_type()
    counts = [
        sa.Column(name, sa.Integer, nullable=False)
        for name in (
            ["completed", "failed", "cancelled"]
            + [f"wait_{i:02d}" for i in range(BUCKETS)]
            + [f"run_{i:02d}" for i in range(BUCKETS)]
        )
    ]
    op.create_table(
        ACTIVITY,
        sa.Column("span_minutes", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("at_minute", timestamp, primary_key=True),
        sa.Column("channel_id", sa.String(128), primary_key=True),
        *counts,
        sa.Column("depth", sa.Integer, nullable=True),
    )
    op.create_table(
        MARK,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("first_minute", timestamp, nullable=False),
        sa.Column("next_minute", timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table(MARK)
    op.drop_table(ACTIVITY)
