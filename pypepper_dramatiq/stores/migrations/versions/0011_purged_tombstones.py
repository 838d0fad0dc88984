"""Tombstones of the jobs the retention purge deleted.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

* ``scheduler_purged``: one row per job id the purge deleted, with when
  (``purged_at``), written in the purge's own transaction. A message of such a
  job that comes back later (a dead worker's copy requeued, a Redis restarted
  from its append-only file) finds no row: the tombstone tells the worker to drop
  it rather than store the job again from the message and run it a second time
  (``IJobStore.was_purged``). The purge deletes the tombstones older than
  ``rules.retention.TOMBSTONE_KEEP``, by the ``purged_at`` index.

Jobs purged before this revision have no tombstone: their messages are handled
as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.schema import timestamp_type

revision: str = "0011"
down_revision: str | None = "0010"

PURGED = "scheduler_purged"
BY_PURGED_AT = "ix_scheduler_purged_purged_at"


def upgrade() -> None:
    timestamp = timestamp_type()
    op.create_table(
        PURGED,
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("purged_at", timestamp, nullable=False),
    )
    op.create_index(BY_PURGED_AT, PURGED, ["purged_at"])


def downgrade() -> None:
    op.drop_index(BY_PURGED_AT, table_name=PURGED)
    op.drop_table(PURGED)
