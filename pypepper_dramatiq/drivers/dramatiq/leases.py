"""Leases of the steps this worker process runs, renewed in one statement per interval;
and the process's heartbeat row (:mod:`~pypepper_dramatiq.records.workers`), one statement per
heartbeat."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import dramatiq

from ...channels.channel import manager
from ...engine.running import InFlight
from ...errors import StoreUnavailableError
from ...ops.logs import get_logger
from ...ops.outage import JOB_STORE, shared_outage
from ...records.record import utcnow
from ...records.workers import (
    PRUNE_SECONDS,
    SweepHealth,
    WorkerInfo,
    forget_before,
    heartbeat_seconds,
)
from ...rules.status import Status
from ...stores.registry import get_job_store

logger = get_logger(__name__)


class LeaseKeeper(threading.Thread):
    """Renews the leases of this process's attempts; notices cancels and lost leases.

    One statement per interval for all attempts in flight. An attempt whose
    job turned Cancelled, or whose lease was taken over, gets its cancel event.

    It also keeps this process's row of the workers' listing: written when it
    starts and then once per ``heartbeat`` seconds (default
    :func:`~pypepper_dramatiq.records.workers.heartbeat_seconds` of the renewal interval),
    never by a step, with the recovery sweep's health (``sweep_health``); deleted
    when it is stopped (a clean shutdown). Rows of
    workers not seen for an hour are deleted at its start and every ten minutes.
    A store that cannot be reached is logged as an outage and tried again at the
    next heartbeat.
    """

    def __init__(
        self,
        inflight: InFlight,
        owner: str,
        lease_seconds: float,
        cancel_grace: float,
        interval: float | None = None,
        heartbeat: float | None = None,
        sweep_health: Callable[[], SweepHealth] | None = None,
    ) -> None:
        super().__init__(name="pypepper-leases", daemon=True)
        #: Reads the recovery sweep's health, written with each heartbeat (None: none).
        self.sweep_health = sweep_health
        self.inflight = inflight
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.cancel_grace = cancel_grace
        self.interval = interval if interval is not None else max(0.2, lease_seconds / 3)
        self.heartbeat = heartbeat if heartbeat is not None else heartbeat_seconds(self.interval)
        self._stop_event = threading.Event()
        self._outage = shared_outage(JOB_STORE)
        self._serving_since: datetime | None = None
        self._last_prune: float | None = None

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        last_renewal = 0.0
        self._serving_since = utcnow()
        last_beat = time.monotonic()
        self._beat_safely()
        while not self._stop_event.wait(min(self.interval, 0.25)):
            try:
                self.inflight.interrupt_overdue(self.cancel_grace)
                if time.monotonic() - last_renewal >= self.interval:
                    last_renewal = time.monotonic()
                    if self.renew():  # an idle keeper asked nothing: it cannot tell
                        self._outage.ok()
            except StoreUnavailableError as exc:
                self._outage.failed(exc)
            except Exception:
                logger.exception("lease renewal failed; retrying")
            if time.monotonic() - last_beat >= self.heartbeat:
                last_beat = time.monotonic()
                self._beat_safely()
        self._forget_safely()

    def renew(self) -> bool:
        """Renew the leases of the attempts in flight; False when there were none
        (the store was not asked)."""
        ids = self.inflight.ids()
        if not ids:
            return False
        until = utcnow() + timedelta(seconds=self.lease_seconds)
        held = get_job_store().renew_leases(self.owner, ids, until)
        for job_id in ids:
            status = held.get(job_id)
            if status is None or status is Status.CANCELLED:
                self.inflight.cancel(job_id)
        return True

    # -- the heartbeat row ----------------------------------------------------------------

    def info(self) -> WorkerInfo:
        """This process's row, as of now."""
        now = utcnow()
        return WorkerInfo(
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self._serving_since or now,
            last_seen=now,
            heartbeat=self.heartbeat,
            channels=tuple(sorted(manager.ids())),
            dramatiq_version=dramatiq.__version__,
            sweep=None if self.sweep_health is None else self.sweep_health(),
        )

    def beat(self) -> None:
        """Write this process's row (one statement); at the first beat and every
        :data:`~pypepper_dramatiq.records.workers.PRUNE_SECONDS` after, also delete the rows
        of workers not seen for an hour."""
        store = get_job_store()
        worker = self.info()
        store.beat_worker(worker)
        if self._last_prune is None or time.monotonic() - self._last_prune >= PRUNE_SECONDS:
            self._last_prune = time.monotonic()
            store.prune_workers(forget_before(worker.last_seen))

    def _beat_safely(self) -> None:
        try:
            self.beat()
            self._outage.ok()
        except StoreUnavailableError as exc:
            self._outage.failed(exc)
        except Exception:
            logger.exception("worker heartbeat failed; retrying at the next one")

    def _forget_safely(self) -> None:
        """Delete this process's row: it stops (a store that cannot be reached leaves
        the row, which the listing calls gone after a few heartbeats)."""
        try:
            get_job_store().forget_worker(self.owner)
        except StoreUnavailableError as exc:
            self._outage.failed(exc)
        except Exception:
            logger.exception("could not delete this worker's heartbeat row")
