"""Links between jobs (retries, ``after=``), and the category filter's index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

* ``scheduler_job_links``: one row per link from a job to a job it came from
  (:mod:`pypepper_dramatiq.records.links`), inserted with the child and deleted with it,
  so that a job's page finds its children by index. Rows stored before this
  revision have none: their children are not listed.
* ``ix_scheduler_jobs_category_status_created``: the dashboard's category filter
  reads it in created order, as the status and channel filters read theirs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"

BY_CATEGORY = "ix_scheduler_jobs_category_status_created"
LINKS = "scheduler_job_links"
BY_CHILD = "ix_scheduler_job_links_child"


def upgrade() -> None:
    op.create_index(BY_CATEGORY, "scheduler_jobs", ["category", "status", "created", "id"])
    op.create_table(
        LINKS,
        sa.Column("parent_id", sa.String(64), nullable=False),
        sa.Column("child_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.PrimaryKeyConstraint("parent_id", "child_id"),
        sa.ForeignKeyConstraint(
            ["child_id"],
            ["scheduler_jobs.id"],
            ondelete="CASCADE",
            name="fk_scheduler_job_links_child",
        ),
    )
    op.create_index(BY_CHILD, LINKS, ["child_id"])


def downgrade() -> None:
    # The table's indexes go with it; MySQL refuses to drop the child index alone while
    # the foreign key needs it.
    op.drop_table(LINKS)
    op.drop_index(BY_CATEGORY, table_name="scheduler_jobs")
