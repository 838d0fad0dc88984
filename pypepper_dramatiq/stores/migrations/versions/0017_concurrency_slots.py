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
from pypepper_dramatiq.stores.migrations.postgres_only import postgresql_only
from pypepper_dramatiq.stores.schema import exact_text

revision: str = "0017"
down_revision: str | None = "0016"

SLOTS = "scheduler_concurrency_slots"

_ACQUIRE = """
CREATE FUNCTION pypepper_slots_acquire(
    p_keys text[], p_limits integer[], p_holder text, p_lease float8
)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
    v_now float8;
    i integer;
BEGIN
    FOR v_key IN SELECT k FROM unnest(p_keys) AS k ORDER BY k LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('pypepper_slots:' || v_key, 0));
    END LOOP;
    v_now := extract(epoch FROM clock_timestamp());
    DELETE FROM scheduler_concurrency_slots WHERE key = ANY(p_keys) AND expires_at <= v_now;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF NOT EXISTS (
            SELECT 1 FROM scheduler_concurrency_slots WHERE key = p_keys[i] AND holder = p_holder
        ) AND (
            SELECT count(*) FROM scheduler_concurrency_slots WHERE key = p_keys[i]
        ) >= p_limits[i] THEN
            RETURN false;
        END IF;
    END LOOP;
    INSERT INTO scheduler_concurrency_slots (key, holder, expires_at)
        SELECT k, p_holder, v_now + p_lease FROM unnest(p_keys) AS k
        ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at;
    RETURN true;
END
$$
"""


@postgresql_only
def upgrade() -> None:
    op.create_table(
        SLOTS,
        sa.Column("key", exact_text(limits.CONCURRENCY_SLOT_KEY_LENGTH), primary_key=True),
        sa.Column("holder", exact_text(limits.CONCURRENCY_HOLDER_LENGTH), primary_key=True),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.execute(_ACQUIRE)


@postgresql_only
def downgrade() -> None:
    op.execute("DROP FUNCTION pypepper_slots_acquire(text[], integer[], text, float8)")
    op.drop_table(SLOTS)
