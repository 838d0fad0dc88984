"""The paused channels and task types.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

* ``scheduler_paused``: one row per paused channel (``kind`` ``channel``, ``name``
  its name) or task type (``kind`` ``task``, ``name`` its executor id), with when it
  was paused. Every worker reads the table at most once a second
  (``engine.pausing.PausedSet``); ``pause_channel`` / ``pause_task`` insert a row,
  ``resume_channel`` / ``resume_task`` delete it and release the rows held for it.

A row held for a pause needs no column of its own: its ``release_at`` (Scheduled)
or its free lease's ``lease_expires`` (InProgress) is ``records.pauses.PAUSED_UNTIL``,
found by the ``(status, release_at)`` and ``(status, lease_expires)`` indexes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.limits import storable as limits
from pypepper_dramatiq.stores.schema import exact_text, timestamp_type

revision: str = "0013"
down_revision: str | None = "0012"

PAUSED = "scheduler_paused"


def upgrade() -> None:
    op.create_table(
        PAUSED,
        sa.Column("kind", sa.String(limits.CHOICE_LENGTH), primary_key=True),
        sa.Column("name", exact_text(limits.PAUSED_NAME_LENGTH), primary_key=True),
        sa.Column("paused_at", timestamp_type(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(PAUSED)
