"""The steps this worker process is running: their cancel events and leases."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from dramatiq.middleware import Interrupt
from dramatiq.middleware.threading import raise_thread_exception

from .errors import StoreUnavailableError
from .outage import JOB_STORE, shared_outage
from .status import Status
from .store import get_job_store
from .stores.base import utcnow

logger = logging.getLogger(__name__)


class StepCancelled(Interrupt):
    """Raised in a worker thread whose task ignored its job's cancel event past the grace period."""


@dataclass
class Running:
    """One attempt in flight in this process."""

    job_id: str
    thread_id: int
    cancel_event: threading.Event = field(default_factory=threading.Event)
    #: When the cancel was seen (monotonic), for the grace period.
    cancel_seen: float | None = None
    running: bool = True
    interrupted: bool = False
    #: When an interrupt was sent to its thread (monotonic); it lands only when
    #: the thread next runs Python code, so a task blocked in C stops later.
    interrupted_at: float | None = None


class InFlight:
    """Attempts running in this process, by job id."""

    def __init__(self) -> None:
        self._steps: dict[str, Running] = {}
        self._lock = threading.Lock()

    def start(self, job_id: str) -> Running:
        entry = Running(job_id, threading.get_ident())
        with self._lock:
            self._steps[job_id] = entry
        return entry

    def finish(self, job_id: str) -> None:
        """The attempt returned: it may no longer be interrupted."""
        with self._lock:
            entry = self._steps.get(job_id)
            if entry is not None:
                entry.running = False

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._steps.pop(job_id, None)

    def ids(self) -> list[str]:
        with self._lock:
            return [job_id for job_id, entry in self._steps.items() if entry.running]

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
                if entry.running and not entry.interrupted:
                    self._interrupt(entry, exc_type)
                    sent.append(entry.job_id)
        return sent

    @staticmethod
    def _interrupt(entry: Running, exc_type: type[BaseException]) -> None:
        entry.interrupted = True
        entry.interrupted_at = time.monotonic()
        raise_thread_exception(entry.thread_id, exc_type)  # type: ignore[no-untyped-call]

    def interrupt_overdue(self, grace: float) -> list[str]:
        """Interrupt attempts still running ``grace`` seconds after their cancel."""
        now = time.monotonic()
        interrupted = []
        with self._lock:
            for entry in self._steps.values():
                if (
                    entry.running
                    and not entry.interrupted
                    and entry.cancel_seen is not None
                    and now - entry.cancel_seen >= grace
                ):
                    self._interrupt(entry, StepCancelled)
                    interrupted.append(entry.job_id)
        for job_id in interrupted:
            logger.warning(
                "job %s: task ignored its cancel for %.1fs; interrupt sent (it lands when the "
                "task next runs Python code: a call blocked in C finishes first)",
                job_id,
                grace,
                extra={"action": "cancel_interrupt", "job_id": job_id},
            )
        return interrupted


class LeaseKeeper(threading.Thread):
    """Renews the leases of this process's attempts; notices cancels and lost leases.

    One statement per interval for all attempts in flight. An attempt whose
    job turned Cancelled, or whose lease was taken over, gets its cancel event.
    """

    def __init__(
        self,
        inflight: InFlight,
        owner: str,
        lease_seconds: float,
        cancel_grace: float,
        interval: float | None = None,
    ) -> None:
        super().__init__(name="pypepper-leases", daemon=True)
        self.inflight = inflight
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.cancel_grace = cancel_grace
        self.interval = interval if interval is not None else max(0.2, lease_seconds / 3)
        self._stop_event = threading.Event()
        self._outage = shared_outage(JOB_STORE)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        last_renewal = 0.0
        while not self._stop_event.wait(min(self.interval, 0.25)):
            try:
                self.inflight.interrupt_overdue(self.cancel_grace)
                if time.monotonic() - last_renewal >= self.interval:
                    last_renewal = time.monotonic()
                    self.renew()
                    self._outage.ok()
            except StoreUnavailableError as exc:
                self._outage.failed(exc)
            except Exception:
                logger.exception("lease renewal failed; retrying")

    def renew(self) -> None:
        ids = self.inflight.ids()
        if not ids:
            return
        until = utcnow() + timedelta(seconds=self.lease_seconds)
        held = get_job_store().renew_leases(self.owner, ids, until)
        for job_id in ids:
            status = held.get(job_id)
            if status is None or status is Status.CANCELLED:
                self.inflight.cancel(job_id)
