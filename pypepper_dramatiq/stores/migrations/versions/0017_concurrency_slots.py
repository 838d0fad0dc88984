"""The concurrency limits' slots, where PostgreSQL coordinates the processes.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

With a broker that is not Redis (RabbitMQ), a concurrency limit's slots live in
PostgreSQL (:meth:`pypepper_dramatiq.transport.postgres.PostgresTransport.acquire_slots`):

* ``scheduler_concurrency_slots``: one row per slot held: the limit's key
  (``channel:<name>``, ``key:<job key>``), its holder (a step on a worker), and when
  its lease lapses (``expires_at``, epoch seconds of the server's clock);
* ``pypepper_slots_acquire``: taking a slot of each of some limits, all or none, as
  one call. It takes a transaction lock per key, in the keys' order (two callers never
  wait on each other in a cycle), then reads the clock, drops the lapsed slots and
  counts, so that no two processes take a key past its limit.

PostgreSQL only: on MySQL and MariaDB Redis coordinates the processes, and this
migration creates nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.limits import storable as limits
from pypepper_dramatiq.stores.migrations.postgres_only import SLOTS_ACQUIRE_0017, postgresql_only
from pypepper_dramatiq.stores.schema import exact_text

revision: str = "0017"
down_revision: str | None = "0016"

SLOTS = "scheduler_concurrency_slots"


@postgresql_only
def upgrade() -> None:
    op.create_table(
        SLOTS,
        sa.Column("key", exact_text(limits.CONCURRENCY_SLOT_KEY_LENGTH), primary_key=True),
        sa.Column("holder", exact_text(limits.CONCURRENCY_HOLDER_LENGTH), primary_key=True),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.execute(SLOTS_ACQUIRE_0017)


@postgresql_only
def downgrade() -> None:
    op.execute("DROP FUNCTION pypepper_slots_acquire(text[], integer[], text, float8)")
    op.drop_table(SLOTS)
