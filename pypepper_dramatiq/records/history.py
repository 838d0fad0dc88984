"""The attempt history a job row keeps for each task: what ran, where, and how it ended.

Both drivers append one entry per attempt to ``state["history"][task_key]``
(``task_key`` is ``"workflow.task"``), in the write that already records the
attempt, so keeping it costs no extra round trip. The list is bounded: the
first attempt of a task and its most recent ones are kept, older ones in
between are dropped and counted in ``state["history_dropped"]``.
"""

from __future__ import annotations

import traceback as traceback_module
from datetime import datetime
from typing import Any

from ..errors import TaskCancelledError, TaskTimeoutError, cancels_job
from ..limits.storable import clipped, storable_text
from .state import JobState

#: Entries kept per task: the first attempt and the latest ``HISTORY_LIMIT - 1``.
HISTORY_LIMIT = 10
#: Longest error message stored in an entry, in characters.
MESSAGE_LIMIT = 1_000
#: Longest traceback text stored in an entry (its end is kept: the raising frame).
TRACEBACK_LIMIT = 4_000

#: Outcomes an entry may record.
SUCCEEDED, FAILED, TIMED_OUT, CANCELLED = "succeeded", "failed", "timed_out", "cancelled"


def kind_of(exc: BaseException) -> str:
    """The outcome an attempt that raised ``exc`` is recorded with."""
    if isinstance(exc, TaskTimeoutError):
        return TIMED_OUT
    if isinstance(exc, TaskCancelledError) or cancels_job(exc):
        return CANCELLED
    return FAILED


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback of ``exc``, clipped to :data:`TRACEBACK_LIMIT`."""
    text = "".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__))
    return clipped(text, TRACEBACK_LIMIT, keep_end=True)


def entry(
    *,
    started: datetime,
    ended: datetime,
    worker: str | None,
    outcome: str,
    error_type: str | None = None,
    message: str | None = None,
    traceback: str | None = None,
    position: list[int] | None = None,
) -> dict[str, Any]:
    """One attempt as stored (JSON-ready).

    The error's type, message and traceback are text the task chose (an
    exception's message, a frame's source line): what no store keeps in them
    is escaped visibly here (``storable.storable_text``), for every entry.
    """
    item: dict[str, Any] = {
        "started": started.isoformat(),
        "ended": ended.isoformat(),
        "worker": worker,
        "outcome": outcome,
    }
    if position is not None:
        item["round"], item["attempt"] = position[2], position[3]
    if error_type is not None:
        item["error_type"] = storable_text(error_type)
    if message is not None:
        item["message"] = clipped(storable_text(message), MESSAGE_LIMIT)
    if traceback is not None:
        item["traceback"] = clipped(storable_text(traceback), TRACEBACK_LIMIT, keep_end=True)
    return item


def append(state: JobState, key: str, item: dict[str, Any]) -> None:
    """Add ``item`` to the history of task ``key`` in ``state`` (bounded)."""
    entries = state.history.setdefault(key, [])
    entries.append(item)
    if len(entries) > HISTORY_LIMIT:
        # Keep the first attempt (how it all began) and the latest ones.
        del entries[1]
        state.history_dropped[key] = state.history_dropped.get(key, 0) + 1
