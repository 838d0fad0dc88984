"""Leases of the steps this worker process runs, renewed in one statement per interval."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from ..engine.running import InFlight
from ..errors import StoreUnavailableError
from ..outage import JOB_STORE, shared_outage
from ..record import utcnow
from ..status import Status
from ..stores.registry import get_job_store

logger = logging.getLogger(__name__)


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
