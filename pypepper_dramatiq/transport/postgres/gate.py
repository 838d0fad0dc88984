"""Admission to a channel shared by every process through PostgreSQL.

The state is two tables (migration 0012): ``scheduler_channels`` (bound, stop
flag) and ``scheduler_channel_slots`` (one row per waiting job). Admissions are
one call of a PL/pgSQL function that locks the channel's row first, so that no
two processes admit past the bound. The waiting jobs are rows rather than a
count on the job rows: a plain job is admitted before its row exists (admit,
enqueue, then persist), and a count kept beside the rows would drift from them;
counting a bounded channel's rows under its lock costs an index scan of at most
``maxsize`` entries (unbounded channels count nothing).

Creating a :class:`PostgresGate` does no I/O; the bound given at creation is
written by its first call (or :meth:`PostgresGate.connect`), as with Redis.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import Engine, text

from ...limits.storable import CHANNEL_ID_LENGTH, ID_LENGTH, check_text
from ..base import ChannelState, Gate, SendResult, log_bound_change
from . import batch
from .outage import run

F = TypeVar("F", bound=Callable[..., Any])

_ADMIT = text("SELECT pypepper_channel_admit(:channel, :job)")
_ADMIT_RELEASED = text("SELECT pypepper_channel_admit_released(:channel, :jobs)")
_CHECK = text(
    "SELECT stopped, maxsize > 0 AND (SELECT count(*) FROM scheduler_channel_slots"
    " WHERE channel = :channel) >= maxsize FROM scheduler_channels WHERE name = :channel"
)
_ENSURE = text(
    "INSERT INTO scheduler_channels (name, maxsize, stopped) VALUES (:channel, 0, false)"
    " ON CONFLICT (name) DO NOTHING"
)
#: Sets the bound; answers the one it replaced (NULL: no row was stored).
#: ``before`` is read (and its row locked) as the INSERT reads its source, before
#: the row changes; RETURNING reads what it stored.
_SET_BOUND = text(
    "WITH before AS (SELECT maxsize FROM scheduler_channels WHERE name = :channel FOR UPDATE)"
    " INSERT INTO scheduler_channels (name, maxsize, stopped)"
    " SELECT :channel, :maxsize, false FROM (VALUES (1)) AS one LEFT JOIN before ON true"
    " ON CONFLICT (name) DO UPDATE SET maxsize = EXCLUDED.maxsize"
    " RETURNING (SELECT maxsize FROM before)"
)
_SET_STOPPED = text(
    "INSERT INTO scheduler_channels (name, maxsize, stopped) VALUES (:channel, 0, :stopped)"
    " ON CONFLICT (name) DO UPDATE SET stopped = EXCLUDED.stopped"
)
_STOPPED = text("SELECT stopped FROM scheduler_channels WHERE name = :channel")
_MAXSIZE = text("SELECT maxsize FROM scheduler_channels WHERE name = :channel")
_WAITING = text("SELECT count(*) FROM scheduler_channel_slots WHERE channel = :channel")
_WAITING_IDS = text(
    "SELECT seq, job_id FROM scheduler_channel_slots WHERE channel = :channel AND seq > :after"
    " ORDER BY seq LIMIT :count"
)
_RESET = text("DELETE FROM scheduler_channels WHERE name = :channel")
_KNOWN = text("SELECT EXISTS (SELECT 1 FROM scheduler_channels WHERE name = :channel)")
#: Every channel: its waiting jobs, bound, stop flag, the rate limit and the
#: concurrency limit a worker last applied, and the slots of that limit held now.
_STATES = text(
    "SELECT c.name, count(s.job_id), c.maxsize, c.stopped, t.rate_limit, c.max_running,"
    " CASE WHEN c.max_running IS NOT NULL THEN (SELECT count(*)"
    " FROM scheduler_concurrency_slots r WHERE r.key = 'channel:' || c.name"
    " AND r.expires_at > extract(epoch FROM clock_timestamp())) END"
    " FROM scheduler_channels c"
    " LEFT JOIN scheduler_channel_slots s ON s.channel = c.name"
    " LEFT JOIN scheduler_rate_turns t ON t.key = 'channel:' || c.name"
    " GROUP BY c.name, c.maxsize, c.stopped, t.rate_limit, c.max_running ORDER BY c.name"
)


def _connected_first(method: F) -> F:
    """Apply the gate's pending bound (:meth:`PostgresGate.connect`) before ``method``."""

    @functools.wraps(method)
    def wrapper(self: PostgresGate, *args: Any, **kwargs: Any) -> Any:
        if not self._connected:  # the common case is one attribute read
            self.connect()
        return method(self, *args, **kwargs)

    return cast(F, wrapper)


class PostgresGate(Gate):
    """A gate shared by every process through PostgreSQL (see the module's docstring).

    Args:
        engine: a SQLAlchemy engine on the PostgreSQL database (psycopg 3) at schema 0012
            or later.
        channel_id: the channel's name.
        maxsize: the bound to store (0 = unbounded), or None to keep the stored one.

    Raises:
        ValueError: ``channel_id`` is no name the table can hold.
    """

    def __init__(self, engine: Engine, channel_id: str, maxsize: int | None = None) -> None:
        self.channel_id = check_text("channel_id", channel_id, CHANNEL_ID_LENGTH)
        self.engine = engine
        self._doing = f"channel {channel_id}"
        self._bound = None if maxsize is None else int(maxsize)
        self._connected = False
        self._connect_lock = threading.Lock()

    def _run(self, statement: Any, **params: Any) -> list[Any]:
        return run(self.engine, self._doing, statement, channel=self.channel_id, **params)

    @property
    def connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        """Apply the bound given at creation, once (without one, make the channel's row
        exist, so that it is listed).

        Raises:
            BrokerUnavailableError: PostgreSQL could not be reached; the next call tries again.
        """
        with self._connect_lock:
            if self._connected:
                return
            if self._bound is None:
                self._run(_ENSURE)
            else:
                self._store_bound(self._bound)
            self._connected = True

    def _store_bound(self, maxsize: int) -> int:
        [(before,)] = self._run(_SET_BOUND, maxsize=maxsize)
        if before is None:
            return 0
        log_bound_change(self.channel_id, int(before), maxsize)
        return int(before)

    @_connected_first
    def admit(self, job_id: str) -> SendResult:
        job = check_text("job_id", job_id, ID_LENGTH)
        [(answer,)] = self._run(_ADMIT, job=job)
        return cast(SendResult, answer)

    @_connected_first
    def check(self) -> SendResult:
        rows = self._run(_CHECK)
        if not rows:
            return "ok"
        stopped, full = rows[0]
        return "stopped" if stopped else "full" if full else "ok"

    @_connected_first
    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        if not job_ids:
            return []
        jobs = [check_text("job_id", job_id, ID_LENGTH) for job_id in job_ids]
        [(answers,)] = self._run(_ADMIT_RELEASED, jobs=jobs)
        return [bool(answer) for answer in answers]

    @_connected_first
    def release(self, job_id: str) -> None:
        if len(job_id) > ID_LENGTH:
            return  # no row holds it
        # Coalesced with the other threads' releases and job-end notices.
        batch.send(self.engine, ("release", self.channel_id, job_id))

    @_connected_first
    def request_stop(self) -> None:
        self._run(_SET_STOPPED, stopped=True)

    @_connected_first
    def resume(self) -> None:
        self._run(_SET_STOPPED, stopped=False)

    @property
    @_connected_first
    def stopped(self) -> bool:
        rows = self._run(_STOPPED)
        return bool(rows and rows[0][0])

    @property
    @_connected_first
    def maxsize(self) -> int:
        """The bound stored now (one round trip: another process may resize it)."""
        rows = self._run(_MAXSIZE)
        return int(rows[0][0]) if rows else 0

    def resize(self, maxsize: int) -> int:
        maxsize = int(maxsize)
        with self._connect_lock:
            if not self._connected:
                before = self._store_bound(maxsize)  # the bound given at creation is dropped
                self._bound, self._connected = maxsize, True
                return before
        return self._store_bound(maxsize)

    @_connected_first
    def waiting(self) -> int:
        [(count,)] = self._run(_WAITING)
        return int(count)

    @_connected_first
    def waiting_ids(self, cursor: int, count: int) -> tuple[int, list[str]]:
        """One page in admission order; the cursor is the last row's ``seq``: every id
        waiting throughout a walk from 0 to 0 comes once."""
        count = max(1, count)
        rows = self._run(_WAITING_IDS, after=cursor, count=count)
        after = int(rows[-1][0]) if len(rows) == count else 0
        return after, [str(job_id) for _, job_id in rows]

    def reset(self) -> None:
        """Forget the stop flag, the bound and the waiting jobs (tests, re-provisioning)."""
        self._run(_RESET)
        with self._connect_lock:
            self._bound, self._connected = None, True

    def known(self) -> bool:
        [(found,)] = self._run(_KNOWN)
        return bool(found)


def channel_states(engine: Engine) -> list[ChannelState]:
    """Every channel with a row, by name (one statement)."""
    rows = run(engine, "the channels", _STATES)
    return [
        ChannelState(
            str(name),
            int(waiting),
            int(maxsize),
            bool(stopped),
            rate_limit,
            None if max_running is None else int(max_running),
            None if running is None else int(running),
        )
        for name, waiting, maxsize, stopped, rate_limit, max_running, running in rows
    ]
