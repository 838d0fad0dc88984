"""Keeping one bad row from stopping the rest of its batch (the recovery sweep's duties).

A row that cannot be read (a listing's placeholder, ``record.damaged``) or whose
handling raises is skipped: logged once per row and cause, counted
(:func:`~pypepper_dramatiq.ops.observers.sweep_failed`, by duty), and kept as the
duty's latest problem for its health; the rest of the batch goes on. An
outage (:func:`~pypepper_dramatiq.ops.outage.is_outage`) is not one row's fault:
it is raised on, for the caller to log once as an outage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

from ..errors import describe
from . import observers
from .display import printable
from .outage import cause_of, is_outage

#: Keys a :class:`OnceEach` remembers before it starts afresh (and logs again).
REMEMBERED = 10_000


class OnceEach:
    """Says True the first time it sees each key (a bounded memory: after
    :data:`REMEMBERED` keys it forgets them all, and logs again rather than grow)."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self.remembered = remembered
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, key: Hashable) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= self.remembered:
                self._seen.clear()
            self._seen.add(key)
            return True


class Row(Protocol):
    """What the guard reads of a row: its id, and why it could not be read (if so)."""

    @property
    def id(self) -> str: ...

    @property
    def damaged(self) -> str | None: ...


R = TypeVar("R", bound=Row)


class RowGuard:
    """Per-row isolation for the duties of one sweeper.

    Args:
        logger: where the once-per-cause lines go.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._once = OnceEach()
        self._lock = threading.Lock()
        #: Per duty: rows skipped since the last :meth:`take`, and the latest problem.
        self._problems: dict[str, tuple[int, str]] = {}

    def readable(self, duty: str, rows: Iterable[R]) -> list[R]:
        """The rows of ``rows`` that could be read; each damaged one is skipped."""
        kept: list[R] = []
        for row in rows:
            if row.damaged is None:
                kept.append(row)
            else:
                self.damaged(duty, row.id, row.damaged)
        return kept

    def damaged(self, duty: str, row_id: str, reason: str) -> None:
        """Skip the row ``row_id``, which cannot be read (logged once per row id)."""
        self.skip(duty, row_id, f"its row cannot be read: {reason}", "damaged")

    def skip(self, duty: str, row_id: str, reason: str, key: Hashable) -> None:
        """Skip job ``row_id`` for ``reason`` (logged once per row and ``key``)."""
        self._note(duty, f"job {row_id}: {reason}")
        if self._once.first((duty, row_id, key)):
            self.logger.warning(
                "recovery sweep (%s): job %s skipped: %s",
                duty,
                printable(row_id),
                printable(reason),
                extra={"action": "sweep_row_skipped", "duty": duty, "job_id": row_id},
            )

    def failed(self, duty: str, row_id: str, exc: BaseException, what: str = "job") -> None:
        """Skip ``what`` ``row_id``, whose handling raised ``exc`` (logged with its
        traceback once per row and cause)."""
        self._note(duty, f"{what} {row_id}: {describe(exc)}")
        if self._once.first((duty, what, row_id, cause_of(exc))):
            self.logger.warning(
                "recovery sweep (%s): %s %s skipped, the rest goes on: %s",
                duty,
                what,
                printable(row_id),
                printable(str(exc)),
                exc_info=exc,
                extra={"action": "sweep_row_failed", "duty": duty, "row": row_id},
            )

    @contextmanager
    def row(self, duty: str, row_id: str, what: str = "job") -> Iterator[None]:
        """Run the block for one row: what it raises (but an outage) skips the row."""
        try:
            yield
        except Exception as exc:
            if is_outage(exc):
                raise
            self.failed(duty, row_id, exc, what)

    def take(self, duty: str) -> tuple[int, str] | None:
        """How many rows ``duty`` skipped since the last call, and the latest
        problem; None if it skipped none."""
        with self._lock:
            return self._problems.pop(duty, None)

    def _note(self, duty: str, problem: str) -> None:
        with self._lock:
            count, _ = self._problems.get(duty, (0, ""))
            self._problems[duty] = (count + 1, problem)
        observers.sweep_failed(duty)
