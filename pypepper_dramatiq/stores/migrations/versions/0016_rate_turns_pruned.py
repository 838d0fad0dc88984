"""The rate limits' rows may be deleted while a start asks: it asks again on a new row.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04

The recovery sweep's leader deletes the rows of ``scheduler_rate_turns`` idle for
long (``PostgresTransport.prune_rate_keys``): a key of many (a tenant's) must not stay
for ever. ``pypepper_rate_ask`` of 0015 inserted the key's row (doing nothing when it
existed), then locked it: a row deleted in between was not found, and the start was
granted uncounted. Here it locks the row first and inserts it only when missing,
then locks it again, until it holds one; the common case (the row exists) is one
statement fewer.

PostgreSQL only, as 0015.
"""

from __future__ import annotations

from alembic import op

from pypepper_dramatiq.stores.migrations.postgres_only import (
    RATE_ASK_LOCK_ROW,
    postgresql_only,
    rate_ask_function,
)

revision: str = "0016"
down_revision: str | None = "0015"

#: ``pypepper_rate_ask``'s head, for a function that exists.
_REPLACE = """
CREATE OR REPLACE FUNCTION pypepper_rate_ask(
    p_key text, p_count integer, p_period float8, p_limit text
)
"""
#: How 0015's function locks the key's row, and how this one does: the rest is the
#: same (the blank lines around them are in the text this migration always sent).
_BEFORE = """
    INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)
        VALUES (p_key, '{}', 0, p_limit) ON CONFLICT (key) DO NOTHING;
    SELECT starts, tail_at INTO v_starts, v_tail
        FROM scheduler_rate_turns WHERE key = p_key FOR UPDATE;

"""
_AFTER = "\n" + RATE_ASK_LOCK_ROW + "\n"


@postgresql_only
def upgrade() -> None:
    op.execute(rate_ask_function(_REPLACE, _AFTER))


@postgresql_only
def downgrade() -> None:
    op.execute(rate_ask_function(_REPLACE, _BEFORE))
