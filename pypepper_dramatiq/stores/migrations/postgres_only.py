"""What the PostgreSQL-only migrations share: the dialect guard, and the rate limit's
function that two of them write.

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

#: ``pypepper_rate_ask`` once the key's row is locked: the window, then the answer.
_RATE_ASK_DECIDE = """    v_now := extract(epoch FROM clock_timestamp());
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


def rate_ask_function(create: str, lock: str) -> str:
    """The statement that writes ``pypepper_rate_ask`` (0015 creates it, 0016 replaces
    it): ``create`` its head up to the arguments, ``lock`` the statements that lock
    the key's row (what 0016 changed); the rest is the one rule of a rate's window."""
    return create + _RATE_ASK_DECLARE + lock + _RATE_ASK_DECIDE
