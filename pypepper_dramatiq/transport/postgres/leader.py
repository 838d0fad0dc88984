"""The recovery sweep's leader lock: a PostgreSQL session advisory lock, held on a
connection of its own.

The lock is the session's: it goes when the connection does. A leader killed
(SIGKILL) closes its socket and the server ends the session at once; one whose
host vanished is found by TCP keepalives. A leader that hangs (alive, its sweep
stuck) stops renewing: its session is idle, and ``idle_session_timeout``, set to
the lock's TTL, makes the server end it once the TTL has passed since its last
renewal, which frees the lock for another process (PostgreSQL 14 and later;
before, a hung leader keeps the lock until its connection goes).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from ...errors import BrokerUnavailableError

#: The first server version with ``idle_session_timeout`` (14).
IDLE_TIMEOUT_SINCE = 140000

#: The advisory lock's key ("pypswep" in ASCII): one leader per database.
LEADER_LOCK_KEY = 0x7079707377657000


class LeaderLock:
    """The leader lock of one process (one connection, opened at the first try).

    Args:
        connect: opens a new autocommit connection.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self._connection: psycopg.Connection[Any] | None = None
        self._ttl_ms: int | None = None
        self._owner: str | None = None
        self._lock = threading.Lock()

    def lead(self, owner: str, ttl_seconds: float) -> bool:
        """Take the lock for ``owner`` or renew it (see the module's docstring).

        Raises:
            BrokerUnavailableError: PostgreSQL could not be reached.
        """
        ttl_ms = max(1, int(ttl_seconds * 1000))
        with self._lock:
            if self._owner is not None and self._owner != owner:
                return False  # held here by another owner
            try:
                return self._lead(owner, ttl_ms)
            except psycopg.Error as exc:
                self._drop()
                raise BrokerUnavailableError(
                    f"PostgreSQL unreachable for the sweep's leader lock: {exc}"
                ) from exc

    def _lead(self, owner: str, ttl_ms: int) -> bool:
        connection = self._connection
        if connection is not None and self._owner == owner:
            try:
                self._renew(connection, ttl_ms)
                return True
            except psycopg.Error:
                self._drop()  # the session ended: the lock went with it; take it again
        connection = self._session(ttl_ms)
        row = connection.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_KEY,)).fetchone()
        if row is not None and row[0]:
            self._owner = owner
            return True
        return False

    def _session(self, ttl_ms: int) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection, self._ttl_ms = self._connect(), None
        if self._ttl_ms != ttl_ms:
            self._set_ttl(self._connection, ttl_ms)
        return self._connection

    def _renew(self, connection: psycopg.Connection[Any], ttl_ms: int) -> None:
        if self._ttl_ms != ttl_ms:
            self._set_ttl(connection, ttl_ms)  # a statement: renews too
        else:
            connection.execute("SELECT 1")

    def _set_ttl(self, connection: psycopg.Connection[Any], ttl_ms: int) -> None:
        """Have the server end the session ``ttl_ms`` after its last statement; before
        PostgreSQL 14 (no ``idle_session_timeout``) only a lost connection frees it."""
        if connection.info.server_version >= IDLE_TIMEOUT_SINCE:
            connection.execute(f"SET idle_session_timeout = {int(ttl_ms)}")
        else:
            connection.execute("SELECT 1")
        self._ttl_ms = ttl_ms

    def _drop(self) -> None:
        self._owner = None
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
        self._connection = None

    def release(self) -> None:
        """Give the lock up (close its connection)."""
        with self._lock:
            self._drop()

    @property
    def backend_pid(self) -> int | None:
        """The server process of its connection now (None while it has none)."""
        connection = self._connection
        return None if connection is None or connection.closed else connection.info.backend_pid
