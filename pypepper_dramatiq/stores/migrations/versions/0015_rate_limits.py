"""The rate limits' windows, where PostgreSQL coordinates the processes.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04

With a broker that is not Redis (RabbitMQ), a rate limit's window lives in
PostgreSQL (:meth:`pypepper_dramatiq.transport.postgres.PostgresTransport.ask_start`):

* ``scheduler_rate_turns``: one row per rate limit key (``channel:<name>``,
  ``key:<job key>``): the starts granted within its last period (``starts``, epoch
  seconds of the server's clock, oldest first), the last retry time told a start it
  refused (``tail_at``), and the limit as written (``rate_limit``, for people);
* ``pypepper_rate_ask``: asking as one call. It locks the key's row first, then reads
  the clock, so that no two processes grant past the limit (each reads the starts
  the other one committed).

PostgreSQL only: on MySQL and MariaDB Redis coordinates the processes, and this
migration creates nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from pypepper_dramatiq.limits import storable as limits
from pypepper_dramatiq.stores.migrations.postgres_only import postgresql_only, rate_ask_function
from pypepper_dramatiq.stores.schema import exact_text

revision: str = "0015"
down_revision: str | None = "0014"

TURNS = "scheduler_rate_turns"

#: ``pypepper_rate_ask``'s head, and the statements that lock the key's row (0016
#: changed them).
_CREATE = """
CREATE FUNCTION pypepper_rate_ask(p_key text, p_count integer, p_period float8, p_limit text)
"""
_LOCK = """    INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)
        VALUES (p_key, '{}', 0, p_limit) ON CONFLICT (key) DO NOTHING;
    SELECT starts, tail_at INTO v_starts, v_tail
        FROM scheduler_rate_turns WHERE key = p_key FOR UPDATE;
"""


@postgresql_only
def upgrade() -> None:
    op.create_table(
        TURNS,
        sa.Column("key", exact_text(limits.RATE_KEY_LENGTH), primary_key=True),
        sa.Column("starts", postgresql.ARRAY(sa.Double()), nullable=False),
        sa.Column("tail_at", sa.Double(), nullable=False),
        sa.Column("rate_limit", sa.String(limits.RATE_TEXT_LENGTH), nullable=False),
    )
    op.execute(rate_ask_function(_CREATE, _LOCK))


@postgresql_only
def downgrade() -> None:
    op.execute("DROP FUNCTION pypepper_rate_ask(text, integer, float8, text)")
    op.drop_table(TURNS)
