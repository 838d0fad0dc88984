"""What the PostgreSQL-only migrations share: the dialect guard, the rate limit's
function that three of them write, and the concurrency slots' functions' parts.

Where the broker is not Redis, PostgreSQL coordinates the processes (channel
admission, rate limits, concurrency slots, the purge's trigger): those migrations
create their tables and functions on PostgreSQL and nothing on MySQL or MariaDB.

The migrations of past releases import these: nothing here may change what they
send to the server. A new version of a function goes in a migration of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from alembic import op


def postgresql_only(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` (a migration's ``upgrade`` or ``downgrade``), run on PostgreSQL only:
    on MySQL and MariaDB it does nothing."""

    @functools.wraps(step)
    def on_postgresql() -> None:
        if op.get_bind().dialect.name == "postgresql":
            step()

    return on_postgresql


#: ``pypepper_rate_ask``'s declarations, up to the statements that lock the key's row.
_RATE_ASK_DECLARE = """RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    v_now float8;
    v_starts float8[];
    v_tail float8;
    v_slot float8;
BEGIN
"""

#: ``pypepper_rate_ask``'s lock of the key's row since 0016: lock it first, insert it
#: only when missing, then lock it again, until it holds one.
RATE_ASK_LOCK_ROW = """    LOOP
        SELECT starts, tail_at INTO v_starts, v_tail
            FROM scheduler_rate_turns WHERE key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)
            VALUES (p_key, '{}', 0, p_limit) ON CONFLICT (key) DO NOTHING;
    END LOOP;
"""

#: ``pypepper_rate_ask`` once the key's row is locked: the window, a start granted
#: while it has room.
_RATE_ASK_GRANT = """    v_now := extract(epoch FROM clock_timestamp());
    v_starts := ARRAY(SELECT s FROM unnest(v_starts) AS s WHERE s > v_now - p_period ORDER BY s);
    IF coalesce(array_length(v_starts, 1), 0) < p_count THEN
        UPDATE scheduler_rate_turns SET starts = v_starts || v_now, rate_limit = p_limit
            WHERE key = p_key;
        RETURN 0;
    END IF;
"""

#: ``pypepper_rate_ask``'s refusal of 0015 and 0016: the start is told the later of the
#: line's tail and when the oldest start leaves the window.
_RATE_ASK_REFUSE = """    v_slot := greatest(v_tail, v_starts[1] + p_period);
    UPDATE scheduler_rate_turns
        SET starts = v_starts, tail_at = v_slot + p_period / p_count, rate_limit = p_limit
        WHERE key = p_key;
    RETURN v_slot - v_now;
END
$$
"""


def rate_ask_function(create: str, lock: str, refuse: str = _RATE_ASK_REFUSE) -> str:
    """The statement that writes ``pypepper_rate_ask`` (0015 creates it, 0016 replaces
    it, 0019 adds its five-argument form): ``create`` its head up to the arguments,
    ``lock`` the statements that lock the key's row (what 0016 changed), ``refuse``
    those that answer a start refused, to the function's end (what 0019 changed); the
    rest is the one rule of a rate's window."""
    return create + _RATE_ASK_DECLARE + lock + _RATE_ASK_GRANT + refuse


#: ``pypepper_slots_acquire`` and ``pypepper_slots_release`` once their keys are known:
#: a transaction lock per key, in the keys' order (two callers never wait on each
#: other in a cycle), then the clock, read under the locks.
SLOTS_LOCK_KEYS = """    FOR v_key IN SELECT k FROM unnest(p_keys) AS k ORDER BY k LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('pypepper_slots:' || v_key, 0));
    END LOOP;
    v_now := extract(epoch FROM clock_timestamp());
"""

#: ``pypepper_slots_acquire``'s drop of the keys' slots whose lease lapsed (a dead
#: worker's), before it counts them.
SLOTS_DROP_LAPSED = (
    "    DELETE FROM scheduler_concurrency_slots WHERE key = ANY(p_keys) AND expires_at <= v_now;\n"
)

#: ``pypepper_slots_acquire``'s end, every key having room: ``p_holder`` takes (or
#: renews) a slot of each.
SLOTS_TAKE = """    INSERT INTO scheduler_concurrency_slots (key, holder, expires_at)
        SELECT k, p_holder, v_now + p_lease FROM unnest(p_keys) AS k
        ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at;
    RETURN true;
END
$$
"""

#: Migration 0017's ``pypepper_slots_acquire`` (four arguments, no line of held
#: starts): 0017 creates it, and 0019's downgrade creates it again.
SLOTS_ACQUIRE_0017 = (
    """
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
"""
    + SLOTS_LOCK_KEYS
    + SLOTS_DROP_LAPSED
    + """    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF NOT EXISTS (
            SELECT 1 FROM scheduler_concurrency_slots WHERE key = p_keys[i] AND holder = p_holder
        ) AND (
            SELECT count(*) FROM scheduler_concurrency_slots WHERE key = p_keys[i]
        ) >= p_limits[i] THEN
            RETURN false;
        END IF;
    END LOOP;
"""
    + SLOTS_TAKE
)
