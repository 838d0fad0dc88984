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

revision: str = "0016"
down_revision: str | None = "0015"

#: The function of 0015 up to its lock, and this one's: the rest is the same.
_BEFORE = """
    INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)
        VALUES (p_key, '{}', 0, p_limit) ON CONFLICT (key) DO NOTHING;
    SELECT starts, tail_at INTO v_starts, v_tail
        FROM scheduler_rate_turns WHERE key = p_key FOR UPDATE;
"""
_AFTER = """
    LOOP
        SELECT starts, tail_at INTO v_starts, v_tail
            FROM scheduler_rate_turns WHERE key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)
            VALUES (p_key, '{}', 0, p_limit) ON CONFLICT (key) DO NOTHING;
    END LOOP;
"""

_ASK = """
CREATE OR REPLACE FUNCTION pypepper_rate_ask(
    p_key text, p_count integer, p_period float8, p_limit text
)
RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    v_now float8;
    v_starts float8[];
    v_tail float8;
    v_slot float8;
BEGIN
%s
    v_now := extract(epoch FROM clock_timestamp());
    v_starts := ARRAY(SELECT s FROM unnest(v_starts) AS s WHERE s > v_now - p_period ORDER BY s);
    IF coalesce(array_length(v_starts, 1), 0) < p_count THEN
        UPDATE scheduler_rate_turns SET starts = v_starts || v_now, rate_limit = p_limit
            WHERE key = p_key;
        RETURN 0;
    END IF;
    v_slot := greatest(v_tail, v_starts[1] + p_period);
    UPDATE scheduler_rate_turns
        SET starts = v_starts, tail_at = v_slot + p_period / p_count, rate_limit = p_limit
        WHERE key = p_key;
    RETURN v_slot - v_now;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_ASK % _AFTER)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_ASK % _BEFORE)
