"""A running task's progress: what a task reports, and how often it reaches the store.

A task calls ``context.progress(done, total, note)`` or counts with
``context.progress_bar(total)``. The driver running the attempt puts a
:class:`ProgressReporter` in the task's context whose ``sink`` writes to the
job store; writes are throttled to one per :data:`THROTTLE_SECONDS` per
running task, the last value is flushed by the write that records the attempt,
so a tight loop of calls costs memory operations, not round trips.

The stored form, one definition (``state["progress"]`` of a job row, by task
key ``"workflow.task"``)::

    {"task": <name>, "done": <number>, "total": <number> | null,
     "failed": <number>, "note": <str> | null, "updated": <ISO time>}

The note is stored as ``storable.storable_text`` makes it (NUL and lone
surrogates escaped).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ..limits.storable import storable_text
from ..ops.logs import get_logger

logger = get_logger(__name__)

#: Key of the progress of a job's tasks in its row's ``state`` (task key -> entry).
PROGRESS_KEY = "progress"
#: The fields of a stored entry.
ENTRY_FIELDS = ("task", "done", "total", "failed", "note", "updated")
#: At most one store write per running task in this many seconds.
THROTTLE_SECONDS = 1.0

#: Writes one entry of the task at ``key`` to the store: ``sink(key, entry)``.
Sink = Callable[[str, dict[str, Any]], object]


def _count(name: str, value: object) -> float:
    """A number of items >= 0 (int or float, not bool, finite), or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"progress {name} must be a number, got {value!r}")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"progress {name} must be a finite number >= 0, got {value!r}")
    return value


def check(
    done: float, total: float | None = None, failed: float = 0, note: str | None = None
) -> None:
    """Check one progress value.

    Raises:
        ValueError: a count that is not a number, negative, or beyond ``total``
            (``failed`` beyond ``done``); a note that is not a string.
    """
    _count("done", done)
    _count("failed", failed)
    if total is not None:
        _count("total", total)
        if done > total:
            raise ValueError(f"progress done ({done:g}) is beyond total ({total:g})")
    if failed > done:
        raise ValueError(f"progress failed ({failed:g}) is beyond done ({done:g})")
    if note is not None and not isinstance(note, str):
        raise ValueError(f"progress note must be a string, got {note!r}")


def entry(
    task: str | None,
    done: float,
    total: float | None = None,
    failed: float = 0,
    note: str | None = None,
    updated: float | None = None,
) -> dict[str, Any]:
    """The stored form of one task's progress (``updated``: a POSIX time; default now).

    The note is the task's own text: what no store keeps in it (NUL, a lone
    surrogate) is escaped visibly here, so that the progress write and the
    outcome write that carries the last entry never fail on it.
    """
    when = datetime.fromtimestamp(time.time() if updated is None else updated, timezone.utc)
    return {
        "task": task,
        "done": done,
        "total": total,
        "failed": failed,
        "note": None if note is None else storable_text(note),
        "updated": when.isoformat(),
    }


class ProgressReporter:
    """The progress of one attempt of one task, throttled on its way to the store.

    Args:
        key: the task's key, ``"workflow.task"``.
        task: the task's name (stored with the entry).
        sink: writes an entry to the store; None keeps it here only (a task run
            outside a driver). A sink that raises is logged, never raised.
        interval: at most one write per this many seconds.
    """

    def __init__(
        self,
        key: str,
        task: str | None = None,
        sink: Sink | None = None,
        interval: float = THROTTLE_SECONDS,
    ) -> None:
        self.key = key
        self.task = task
        self._sink = sink
        self._interval = interval
        self._lock = threading.Lock()
        #: The last value reported: (done, total, failed, note, POSIX time).
        self._latest: tuple[float, float | None, float, str | None, float] | None = None
        self._written: tuple[float, float | None, float, str | None, float] | None = None
        self._last_write = -math.inf
        self._timer: threading.Timer | None = None
        self._closed = False
        #: Store writes made (for the benchmark and tests).
        self.writes = 0

    @property
    def latest(self) -> dict[str, Any] | None:
        """The stored form of the last value reported (None: nothing yet)."""
        value = self._latest
        return None if value is None else entry(self.task, *value)

    def report(
        self, done: float, total: float | None = None, failed: float = 0, note: str | None = None
    ) -> None:
        """Record a new value; written now if the last write is old enough, else
        at the end of the throttle interval (or by the attempt's outcome write).

        Raises:
            ValueError: a bad value (see :func:`check`); nothing is recorded.
        """
        check(done, total, failed, note)
        with self._lock:
            self._latest = (done, total, failed, note, time.time())
            if self._closed or self._sink is None:
                return
            wait = self._last_write + self._interval - time.monotonic()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._write_pending)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self._write_pending()

    def _write_pending(self) -> None:
        with self._lock:
            self._timer = None
            value = self._latest
            if self._closed or value is None or value is self._written or self._sink is None:
                return
            self._written, self._last_write = value, time.monotonic()
            sink = self._sink
        try:
            sink(self.key, entry(self.task, *value))
            self.writes += 1
        except Exception as exc:  # progress must never break the task
            logger.debug("progress of %s not written: %s", self.key, exc)

    def close(self) -> dict[str, Any] | None:
        """Stop writing (the attempt ended); the last entry, for the outcome write."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return self.latest


class ProgressBar:
    """Counts finished items of a known total: ``bar.succeeded()``, ``bar.failed()``.

    ``done`` counts both; ``failed`` the failed ones. Each call reports to the
    task's :class:`ProgressReporter` (cheap: the store write is throttled).
    """

    def __init__(self, reporter: ProgressReporter, total: float, note: str | None = None) -> None:
        self._reporter = reporter
        self.total = _count("total", total)
        self.note = note
        self.done: float = 0
        self.failed_count: float = 0
        self._lock = threading.Lock()
        reporter.report(0, self.total, 0, note)

    def succeeded(self, n: float = 1) -> None:
        """``n`` more items done.

        Raises:
            ValueError: ``n`` is not a number >= 0, or the count passes the total.
        """
        self._add(_count("n", n), 0)

    def failed(self, n: float = 1) -> None:
        """``n`` more items done, and failed.

        Raises:
            ValueError: ``n`` is not a number >= 0, or the count passes the total.
        """
        n = _count("n", n)
        self._add(n, n)

    def _add(self, done: float, failed: float) -> None:
        with self._lock:
            if self.done + done > self.total:
                raise ValueError(
                    f"progress done ({self.done + done:g}) is beyond total ({self.total:g})"
                )
            self.done += done
            self.failed_count += failed
            self._reporter.report(self.done, self.total, self.failed_count, self.note)
