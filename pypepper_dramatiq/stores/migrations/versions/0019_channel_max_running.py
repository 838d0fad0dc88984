"""Concurrency limits' lines of held starts; a channel's concurrency limit, as the
workers last applied it, for people; a rate limit's start that comes back at its time
keeps its place in line.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05

A start a concurrency limit refused waits in the limit's line, so that a release
sends it again at once instead of leaving it to ask again later:

* ``scheduler_concurrency_waits``: one row per start waiting under a key: its job,
  priority, place (``seq``, when first held) and message (Dramatiq's encoded form;
  empty for the in-process Worker's);
* ``pypepper_slots_acquire`` with the start asking (seven arguments): a slot kept for
  its job (holder ``held:<job id>``) is taken over; refused, the start is put in line
  under each full key (keeping its place); taken, it leaves its lines. The four-
  argument form of 0017 calls it with no start;
* ``pypepper_slots_release``: a holder's slots given back, and for each, the first
  start in line (highest priority, then first held) taken out of it, the slot kept
  for its job ``p_reserve`` seconds: the starts to send again, as rows. Under the
  same transaction locks per key as the acquire.

``pypepper-dramatiq channels`` runs in a process that declared no channel: it lists
a channel's concurrency limit (``max_running``) and the slots held under it from what
the workers record. ``scheduler_channels.max_running`` holds the limit a worker last
applied: ``pypepper_slots_acquire`` writes it when it differs (a read of the
channel's row, no write otherwise), as ``pypepper_rate_ask`` records a rate limit.

``pypepper_rate_ask`` takes ``p_told``: a start told a time already (its message came
back at it) and refused again, because a start of the period before it was granted a
moment late, is told when the oldest start leaves the window, and the line behind it
does not move. Before, it went behind the line, and its turn went unused: a backlog
under a limit of 50/s started about 47 a second.

PostgreSQL only: on MySQL and MariaDB Redis coordinates the processes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.limits import storable as limits
from pypepper_dramatiq.stores.migrations.postgres_only import (
    RATE_ASK_LOCK_ROW,
    SLOTS_ACQUIRE_0017,
    SLOTS_DROP_LAPSED,
    SLOTS_LOCK_KEYS,
    SLOTS_TAKE,
    postgresql_only,
    rate_ask_function,
)
from pypepper_dramatiq.stores.schema import exact_text

revision: str = "0019"
down_revision: str | None = "0018"

WAITS = "scheduler_concurrency_waits"

#: Taking slots with the start asking: migration 0017's function, which also records
#: the limits of channel keys and keeps the lines.
_ACQUIRE_HELD = (
    """
CREATE FUNCTION pypepper_slots_acquire(
    p_keys text[], p_limits integer[], p_holder text, p_lease float8,
    p_job text, p_priority integer, p_data text
)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
    v_now float8;
    v_kept text;
    v_full text[] := '{}';
    i integer;
BEGIN
    UPDATE scheduler_channels AS c SET max_running = u.l
        FROM unnest(p_keys, p_limits) AS u(k, l)
        WHERE u.k LIKE 'channel:%' AND c.name = substr(u.k, 9)
        AND c.max_running IS DISTINCT FROM u.l;
"""
    + SLOTS_LOCK_KEYS
    + """    v_kept := 'held:' || p_job;
"""
    + SLOTS_DROP_LAPSED
    + """    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF NOT EXISTS (
            SELECT 1 FROM scheduler_concurrency_slots WHERE key = p_keys[i]
            AND (holder = p_holder OR holder = v_kept)
        ) AND (
            SELECT count(*) FROM scheduler_concurrency_slots WHERE key = p_keys[i]
        ) >= p_limits[i] THEN
            v_full := v_full || p_keys[i];
        END IF;
    END LOOP;
    IF coalesce(array_length(v_full, 1), 0) > 0 THEN
        IF p_job IS NOT NULL THEN
            INSERT INTO scheduler_concurrency_waits (key, job_id, priority, data)
                SELECT k, p_job, p_priority, p_data FROM unnest(v_full) AS k
                ON CONFLICT (key, job_id) DO UPDATE SET data = excluded.data;
        END IF;
        RETURN false;
    END IF;
    IF p_job IS NOT NULL THEN
        DELETE FROM scheduler_concurrency_slots WHERE key = ANY(p_keys) AND holder = v_kept;
        DELETE FROM scheduler_concurrency_waits WHERE key = ANY(p_keys) AND job_id = p_job;
    END IF;
"""
    + SLOTS_TAKE
)

#: Migration 0017's four-argument form: no start asking.
_ACQUIRE = """
CREATE OR REPLACE FUNCTION pypepper_slots_acquire(
    p_keys text[], p_limits integer[], p_holder text, p_lease float8
)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT pypepper_slots_acquire(p_keys, p_limits, p_holder, p_lease, NULL, 0, NULL)
$$
"""

#: Giving slots back, waking the first start in each one's line.
_RELEASE = (
    """
CREATE FUNCTION pypepper_slots_release(p_keys text[], p_holder text, p_reserve float8)
RETURNS TABLE (woken_job text, woken_priority integer, woken_data text)
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
    v_now float8;
BEGIN
"""
    + SLOTS_LOCK_KEYS
    + """    FOR v_key IN SELECT k FROM unnest(p_keys) AS k ORDER BY k LOOP
        DELETE FROM scheduler_concurrency_slots AS s WHERE s.key = v_key AND s.holder = p_holder;
        IF FOUND AND p_reserve > 0 THEN
            DELETE FROM scheduler_concurrency_waits AS w WHERE w.key = v_key AND w.job_id = (
                SELECT f.job_id FROM scheduler_concurrency_waits AS f WHERE f.key = v_key
                ORDER BY f.priority DESC, f.seq LIMIT 1
            ) RETURNING w.job_id, w.priority, w.data INTO woken_job, woken_priority, woken_data;
            IF FOUND THEN
                INSERT INTO scheduler_concurrency_slots AS s (key, holder, expires_at)
                    VALUES (v_key, 'held:' || woken_job, v_now + p_reserve)
                    ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at;
                RETURN NEXT;
            END IF;
        END IF;
    END LOOP;
END
$$
"""
)


#: Migration 0016's function with ``p_told`` (a function of its own: five arguments).
_ASK = rate_ask_function(
    """
CREATE FUNCTION pypepper_rate_ask(
    p_key text, p_count integer, p_period float8, p_limit text, p_told boolean
)
""",
    RATE_ASK_LOCK_ROW,
    """    IF p_told THEN
        v_slot := v_starts[1] + p_period;
        v_tail := greatest(v_tail, v_slot + p_period / p_count);
    ELSE
        v_slot := greatest(v_tail, v_starts[1] + p_period);
        v_tail := v_slot + p_period / p_count;
    END IF;
    UPDATE scheduler_rate_turns SET starts = v_starts, tail_at = v_tail, rate_limit = p_limit
        WHERE key = p_key;
    RETURN v_slot - v_now;
END
$$
""",
)


@postgresql_only
def upgrade() -> None:
    op.add_column("scheduler_channels", sa.Column("max_running", sa.Integer(), nullable=True))
    op.create_table(
        WAITS,
        sa.Column("key", exact_text(limits.CONCURRENCY_SLOT_KEY_LENGTH), primary_key=True),
        sa.Column("job_id", exact_text(limits.ID_LENGTH), primary_key=True),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_index("ix_scheduler_concurrency_waits_line", WAITS, ["key", "priority", "seq"])
    op.execute(_ACQUIRE_HELD)
    op.execute(_ACQUIRE)
    op.execute(_RELEASE)
    op.execute(_ASK)


@postgresql_only
def downgrade() -> None:
    op.execute("DROP FUNCTION pypepper_rate_ask(text, integer, float8, text, boolean)")
    op.execute("DROP FUNCTION pypepper_slots_release(text[], text, float8)")
    op.execute("DROP FUNCTION pypepper_slots_acquire(text[], integer[], text, float8)")
    op.execute(
        "DROP FUNCTION pypepper_slots_acquire(text[], integer[], text, float8, text, integer, text)"
    )
    op.execute(SLOTS_ACQUIRE_0017)
    op.drop_table(WAITS)
    op.drop_column("scheduler_channels", "max_running")
