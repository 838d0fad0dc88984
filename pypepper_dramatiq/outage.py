"""Logging an outage of the store or the broker as an operator wants to read it.

One WARNING when a service becomes unreachable, one line a minute while it
stays so, one INFO when it is back: not a traceback at every retry.
"""

from __future__ import annotations

import logging
import threading
import time

import dramatiq

from .logs import get_logger

logger = get_logger(__name__)

#: Seconds between the reminder lines of a lasting outage.
REMINDER_SECONDS = 60.0


class OutageLog:
    """The state of one service as one part of a process sees it.

    Args:
        logger: where the lines go.
        what: the service and who noticed, e.g. ``"job store (recovery sweep)"``.
        reminder_seconds: seconds between the lines of a lasting outage.
    """

    def __init__(
        self, logger: logging.Logger, what: str, reminder_seconds: float = REMINDER_SECONDS
    ) -> None:
        self.logger = logger
        self.what = what
        self.reminder_seconds = reminder_seconds
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last_line = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A call to the service failed with ``exc``."""
        now = time.monotonic()
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since, self._last_line = now, now
                first = True
            elif now - self._last_line >= self.reminder_seconds:
                self._last_line = now
                first = False
            else:
                return
            since, failures = self._since, self._failures
        if first:
            self.logger.warning(
                "%s unreachable: %s",
                self.what,
                exc,
                extra={"action": "outage", "service": self.what},
            )
        else:
            self.logger.warning(
                "%s still unreachable after %.1fs (%d failed calls): %s",
                self.what,
                now - since,
                failures,
                exc,
                extra={"action": "outage", "service": self.what},
            )

    def ok(self) -> None:
        """A call to the service succeeded."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._since = self._since, None
            failures, self._failures = self._failures, 0
        if since is not None:
            self.logger.info(
                "%s is back after %.1fs (%d failed calls)",
                self.what,
                time.monotonic() - since,
                failures,
                extra={"action": "outage_over", "service": self.what},
            )


#: The services shared outage logs are kept for.
REDIS, JOB_STORE = "Redis", "job store"

_shared: dict[str, OutageLog] = {}
_shared_lock = threading.Lock()


def shared_outage(service: str) -> OutageLog:
    """The process's one :class:`OutageLog` for ``service`` ("Redis", "job store").

    Several threads notice the same outage (the recovery sweep, the cancel
    listener, the lease keeper...): the first to fail logs it, the others
    only count, and the first to succeed says it is back.
    """
    with _shared_lock:
        log = _shared.get(service)
        if log is None:
            log = _shared[service] = OutageLog(logger, service)
        return log


def broker_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the broker could not be reached (Dramatiq's, redis-py's
    or the OS's word for it), as opposed to a bug or a refusal."""
    if isinstance(exc, dramatiq.errors.BrokerConnectionError | OSError):
        return True
    return type(exc).__module__.startswith("redis.") and (
        "Connection" in type(exc).__name__ or "Timeout" in type(exc).__name__
    )
