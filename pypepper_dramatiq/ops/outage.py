"""Logging an outage of the store or the broker as an operator wants to read it.

One WARNING when a service becomes unreachable, one line a minute while it
stays so, one INFO when it is back: not a traceback at every retry. The same
shape serves any part that keeps failing (a recovery sweep duty): there the
first line carries the traceback, and a new cause while it fails gets a new
first line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable

import dramatiq

from ..errors import BrokerUnavailableError, StoreUnavailableError
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
        state: the word for the trouble (``"unreachable"``, ``"failing"``).
        per_cause: log the first line with the traceback, and again (with its
            traceback) whenever the cause (:func:`cause_of`) changes while down:
            for a part of our own that fails, rather than a service that is away.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        reminder_seconds: float = REMINDER_SECONDS,
        *,
        state: str = "unreachable",
        per_cause: bool = False,
    ) -> None:
        self.logger = logger
        self.what = what
        self.reminder_seconds = reminder_seconds
        self.state = state
        self.per_cause = per_cause
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last_line = 0.0
        self._failures = 0
        self._cause: Hashable = None

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A call to the service failed with ``exc``."""
        now = time.monotonic()
        cause = cause_of(exc) if self.per_cause else None
        with self._lock:
            self._failures += 1
            if self._since is None or cause != self._cause:
                if self._since is None:
                    self._since = now
                self._last_line, self._cause = now, cause
                first = True
            elif now - self._last_line >= self.reminder_seconds:
                self._last_line = now
                first = False
            else:
                return
            since, failures = self._since, self._failures
        if first:
            self.logger.warning(
                "%s %s: %s",
                self.what,
                self.state,
                exc,
                exc_info=exc if self.per_cause else None,
                extra={"action": "outage", "service": self.what},
            )
        else:
            self.logger.warning(
                "%s still %s after %.1fs (%d failed calls): %s",
                self.what,
                self.state,
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
            self._cause = None
        if since is not None:
            self.logger.info(
                "%s is back after %.1fs (%d failed calls)",
                self.what,
                time.monotonic() - since,
                failures,
                extra={"action": "outage_over", "service": self.what},
            )


#: The job store's shared outage log; the transport's and the broker's are named after
#: their servers ("Redis", "PostgreSQL", "RabbitMQ").
JOB_STORE = "job store"

_shared: dict[str, OutageLog] = {}
_shared_lock = threading.Lock()


def shared_outage(service: str) -> OutageLog:
    """The process's one :class:`OutageLog` for ``service`` ("job store", "Redis", "PostgreSQL").

    Several threads notice the same outage (the recovery sweep, the cancel
    listener, the lease keeper...): the first to fail logs it, the others
    only count, and the first to succeed says it is back.
    """
    with _shared_lock:
        log = _shared.get(service)
        if log is None:
            log = _shared[service] = OutageLog(logger, service)
        return log


def cause_of(exc: BaseException) -> Hashable:
    """What makes two failures "the same cause": the exception's type and the line that
    raised it (not its message, which may name a row or a time)."""
    frame = None
    tb = exc.__traceback__
    while tb is not None:
        frame, tb = tb, tb.tb_next
    where = (frame.tb_frame.f_code.co_filename, frame.tb_lineno) if frame is not None else None
    return (type(exc).__module__, type(exc).__qualname__, where)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store or the broker is away (logged as an outage, once
    for the process), rather than that one part of the work went wrong."""
    return isinstance(exc, StoreUnavailableError | BrokerUnavailableError) or broker_unreachable(
        exc
    )


def broker_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the broker could not be reached (ours, Dramatiq's,
    redis-py's or the OS's word for it), as opposed to a bug or a refusal."""
    if isinstance(exc, BrokerUnavailableError | dramatiq.errors.BrokerConnectionError | OSError):
        return True
    return type(exc).__module__.startswith("redis.") and (
        "Connection" in type(exc).__name__ or "Timeout" in type(exc).__name__
    )
