"""The context a task's executor sees."""

from __future__ import annotations

import threading
from typing import Any

from ..records.progress import ProgressBar, ProgressReporter

#: Key of the job's cancel :class:`threading.Event` in a context.
CANCEL_EVENT_KEY = "cancel_event"
#: Key of the job id in a task's context.
JOB_ID_KEY = "job_id"
#: Key of the results of the job's finished tasks (name -> result).
RESULTS_KEY = "results"
#: Key of the results of the jobs this one waited for (parent id -> task name -> result).
PARENT_RESULTS_KEY = "parent_results"
#: Key of the running attempt's position ``[workflow, task, round, attempt]`` (both drivers).
POSITION_KEY = "position"
#: Key of the running attempt's :class:`~pypepper_dramatiq.records.progress.ProgressReporter`.
PROGRESS_REPORTER_KEY = "progress_reporter"


class Context:
    """A dict of values shared with executors, as ``context.context``.

    Executors poll ``context.context.get(CANCEL_EVENT_KEY)`` (or
    :attr:`cancelled`) to stop cooperatively.
    """

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self.context: dict[str, Any] = dict(values or {})

    def get(self, key: str, default: Any = None) -> Any:
        return self.context.get(key, default)

    @property
    def cancel_event(self) -> threading.Event | None:
        event = self.context.get(CANCEL_EVENT_KEY)
        return event if isinstance(event, threading.Event) else None

    @property
    def cancelled(self) -> bool:
        """Whether the job this context belongs to was cancelled."""
        event = self.cancel_event
        return event is not None and event.is_set()

    @property
    def job_id(self) -> str | None:
        value = self.context.get(JOB_ID_KEY)
        return None if value is None else str(value)

    @property
    def idempotency_key(self) -> str | None:
        """The same for every attempt of one task of one job (``job_id:workflow.task``)."""
        position = self.context.get(POSITION_KEY)
        if self.job_id is None or not position:
            return None
        return f"{self.job_id}:{position[0]}.{position[1]}"

    @property
    def results(self) -> dict[str, Any]:
        """Results of the tasks of this job that finished before this one, by task name."""
        results = self.context.setdefault(RESULTS_KEY, {})
        assert isinstance(results, dict)
        return results

    @property
    def parent_results(self) -> dict[str, dict[str, Any]]:
        """The results of the jobs this one was scheduled ``after=``, by parent job
        id, then task name (``context.parent_results[parent_id]["fetch"]``).
        Empty for a job without parents. A parent that failed or was cancelled
        (``on_parent_failure="ignore"``) has the results of its tasks that finished."""
        results = self.context.setdefault(PARENT_RESULTS_KEY, {})
        assert isinstance(results, dict)
        return results

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report the running task's progress: ``done`` of ``total`` items, a note.

        Readable from any process as ``Job.get_saved(id).progress[task_key]``
        (and ``pypepper-dramatiq show``). The store sees at most one write per
        second per running task, and the last value when the attempt ends, so
        calling this in a tight loop is cheap. Outside a driver (a task run by
        hand) the value is kept in the context only.

        Raises:
            ValueError: a count that is not a number, is negative, or passes ``total``.
        """
        self.progress_reporter.report(done, total, 0, note)

    def progress_bar(self, total: float, note: str | None = None) -> ProgressBar:
        """A counter of ``total`` items: ``bar.succeeded(n=1)``, ``bar.failed(n=1)``
        (stored as ``done``, both counted, and ``failed``). Written like :meth:`progress`.

        Raises:
            ValueError: ``total`` is not a number >= 0.
        """
        return ProgressBar(self.progress_reporter, total, note)

    @property
    def progress_reporter(self) -> ProgressReporter:
        """Where this task's progress goes (the driver's, or one kept here)."""
        reporter = self.context.get(PROGRESS_REPORTER_KEY)
        if not isinstance(reporter, ProgressReporter):
            reporter = self.context[PROGRESS_REPORTER_KEY] = ProgressReporter("-")
        return reporter

    def __repr__(self) -> str:
        return f"Context({self.context!r})"
