"""What runs in this process now: one registry of attempts and jobs in flight.

Both drivers register what they run here, so that a cancel heard in this
process (``Job.cancel_saved`` here, or the Redis cancel listener) sets the
running task's cancel event, whichever driver runs it. The Dramatiq driver's
lease keeper renews the leases of the registered steps that hold one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dramatiq.middleware import Interrupt
from dramatiq.middleware.threading import raise_thread_exception

from ..ops.logs import get_logger

logger = get_logger(__name__)


class StepCancelled(Interrupt):
    """Raised in a worker thread whose task ignored its job's cancel event past the grace period."""


class AttemptTimedOut(Interrupt):
    """Raised in a worker thread whose attempt ran past its task's ``round_timeout``.

    Dramatiq's ``TimeLimit`` does this for the attempt a message carries; an
    attempt continued in the same thread after it (no message of its own) is
    given a deadline here instead, which the lease keeper enforces.
    """


@dataclass
class Running:
    """One attempt (or, for the in-process driver, one job) in flight in this process."""

    job_id: str
    thread_id: int
    cancel_event: threading.Event = field(default_factory=threading.Event)
    #: Its step holds a lease that this process's lease keeper renews (the
    #: Dramatiq driver); the in-process driver holds its steps without one.
    leased: bool = True
    #: When the cancel was seen (monotonic), for the grace period.
    cancel_seen: float | None = None
    #: Its task runs, so it may be interrupted. False once the task returned: the
    #: lease is still renewed until the outcome is recorded and the entry dropped.
    running: bool = True
    interrupted: bool = False
    #: When an interrupt was sent to its thread (monotonic); it lands only when
    #: the thread next runs Python code, so a task blocked in C stops later.
    interrupted_at: float | None = None
    #: When the attempt must have ended (monotonic), or None: no limit here.
    deadline: float | None = None
    #: Its thread took it: False while a step claimed ahead of its thread (with the
    #: other messages of its fetch) waits for one, so that no interrupt is sent.
    started: bool = True


class InFlight:
    """Attempts running in this process, by job id: who to tell of a cancel."""

    def __init__(self) -> None:
        self._steps: dict[str, Running] = {}
        self._lock = threading.Lock()

    def start(
        self,
        job_id: str,
        cancel_event: threading.Event | None = None,
        *,
        leased: bool = True,
        timeout: float | None = None,
    ) -> Running:
        """Register the attempt running in this thread; with ``timeout`` (seconds), it
        is interrupted with :class:`AttemptTimedOut` by :meth:`interrupt_overdue` once
        that long has passed."""
        entry = Running(job_id, threading.get_ident(), leased=leased)
        if timeout is not None and timeout > 0:
            entry.deadline = time.monotonic() + timeout
        if cancel_event is not None:
            entry.cancel_event = cancel_event
        with self._lock:
            reserved = self._steps.get(job_id)
            if reserved is not None and not reserved.started and cancel_event is None:
                # Claimed ahead: a cancel heard while it waited is this attempt's.
                entry.cancel_event, entry.cancel_seen = reserved.cancel_event, reserved.cancel_seen
            self._steps[job_id] = entry
        return entry

    def reserve(self, job_id: str) -> Running:
        """Register a step claimed ahead of the thread that will run it: its lease is
        renewed and a cancel sets its event (so its thread does not start it), but
        it has no thread to interrupt until :meth:`start`."""
        entry = Running(job_id, 0, started=False)
        with self._lock:
            self._steps[job_id] = entry
        return entry

    @contextmanager
    def holding(self, job_id: str, cancel_event: threading.Event) -> Iterator[Running]:
        """Register a job the in-process driver runs (no lease) while the block runs."""
        entry = self.start(job_id, cancel_event, leased=False)
        try:
            yield entry
        finally:
            with self._lock:
                if self._steps.get(job_id) is entry:
                    del self._steps[job_id]

    def finish(self, job_id: str) -> None:
        """The attempt returned: it may no longer be interrupted. Its lease is renewed
        until :meth:`drop_finished` (its outcome recorded), so that a slow record
        never lets another worker run a task that finished."""
        with self._lock:
            entry = self._steps.get(job_id)
            if entry is not None:
                entry.running = False

    def drop_finished(self, job_id: str) -> None:
        """Forget ``job_id``'s attempt once its outcome is recorded (or left to its
        lease), unless the entry is no longer that finished attempt: a step of the job
        claimed ahead since then, or an attempt running now, stays."""
        with self._lock:
            entry = self._steps.get(job_id)
            if entry is not None and not entry.running and entry.started:
                del self._steps[job_id]

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._steps.pop(job_id, None)

    def ids(self) -> list[str]:
        """Jobs whose step holds a lease to renew: running, claimed ahead, or finished
        with its outcome not yet recorded."""
        with self._lock:
            return [job_id for job_id, entry in self._steps.items() if entry.leased]

    def get(self, job_id: str) -> Running | None:
        with self._lock:
            return self._steps.get(job_id)

    def cancel(self, job_id: str) -> bool:
        """Set the cancel event of ``job_id``'s running attempt; True if one runs here."""
        with self._lock:
            entry = self._steps.get(job_id)
            if entry is None or not entry.running:
                return False
            first = entry.cancel_seen is None
            if first:
                entry.cancel_seen = time.monotonic()
            entry.cancel_event.set()
        if first:  # the lease keeper repeats it at every renewal: say it once
            logger.info(
                "job %s: cancel event set",
                job_id,
                extra={"action": "cancel_seen", "job_id": job_id},
            )
        return True

    def interrupt_running(self, exc_type: type[BaseException]) -> list[str]:
        """Send ``exc_type`` to the thread of every attempt still running here."""
        sent = []
        with self._lock:
            for entry in self._steps.values():
                if entry.running and entry.started and not entry.interrupted:
                    self._interrupt(entry, exc_type)
                    sent.append(entry.job_id)
        return sent

    @staticmethod
    def _interrupt(entry: Running, exc_type: type[BaseException]) -> None:
        entry.interrupted = True
        entry.interrupted_at = time.monotonic()
        raise_thread_exception(entry.thread_id, exc_type)  # type: ignore[no-untyped-call]

    def interrupt_overdue(self, grace: float) -> list[str]:
        """Interrupt attempts still running ``grace`` seconds after their cancel, and
        attempts past their deadline (:class:`AttemptTimedOut`)."""
        now = time.monotonic()
        interrupted = []
        late = []
        with self._lock:
            for entry in self._steps.values():
                if not entry.running or not entry.started or entry.interrupted:
                    continue
                if entry.cancel_seen is not None and now - entry.cancel_seen >= grace:
                    self._interrupt(entry, StepCancelled)
                    interrupted.append(entry.job_id)
                elif entry.deadline is not None and now >= entry.deadline:
                    self._interrupt(entry, AttemptTimedOut)
                    late.append(entry.job_id)
        for job_id in late:
            logger.info(
                "job %s: attempt past its round_timeout; interrupt sent (it lands when the "
                "task next runs Python code)",
                job_id,
                extra={"action": "timeout_interrupt", "job_id": job_id},
            )
        for job_id in interrupted:
            logger.warning(
                "job %s: task ignored its cancel for %.1fs; interrupt sent (it lands when the "
                "task next runs Python code: a call blocked in C finishes first)",
                job_id,
                grace,
                extra={"action": "cancel_interrupt", "job_id": job_id},
            )
        return interrupted + late


#: The registry of this process.
running_here = InFlight()
