"""Recovering the steps of dead workers, within a bounded time.

Two ways a step can be stranded when a worker dies:

* it was claimed (InProgress) and its lease lapses: :meth:`RecoverySweeper.sweep`
  hands it back in the store (one caller wins each row) and enqueues a
  fresh message for its cursor;
* its message sat unacknowledged in the dead worker's prefetch: Dramatiq's
  Redis broker returns such messages only in a random maintenance pass, so
  the sweeper runs that pass itself for each queue, every interval.

One process at a time sweeps (a Redis lock with a TTL; always this process
on a broker without Redis).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import current_millis, dq_name

from .cancellation import redis_client_of
from .errors import StoreError, StoreUnavailableError
from .gates import KEY_PREFIX
from .messages import StepMessage
from .outage import OutageLog, broker_unreachable
from .rules import Position
from .steps import cursor_of
from .store import get_job_store
from .stores.base import utcnow

logger = logging.getLogger(__name__)

LEADER_KEY = f"{KEY_PREFIX}:recovery:leader"


def requeue_dead_workers(broker: Broker, queue_name: str) -> None:
    """Run the Redis broker's maintenance for ``queue_name`` now.

    It moves messages fetched by workers whose heartbeat is older than the
    broker's ``heartbeat_timeout`` back onto the queue.
    """
    scripts = getattr(broker, "scripts", None)
    if not scripts or "dispatch" not in scripts:
        return
    b: Any = broker
    scripts["dispatch"](
        args=[
            "qsize", current_millis(), queue_name, b.broker_id,
            b.heartbeat_timeout, b.dead_message_ttl, 1, b._max_unpack_size(),
        ],
        keys=[b.namespace],
    )


class RecoverySweeper(threading.Thread):
    """Every ``interval`` seconds, if leader: recover lapsed steps and requeue dead prefetch."""

    def __init__(
        self,
        broker: Broker,
        owner: str,
        lease_seconds: float,
        interval: float,
        batch: int = 500,
        dispatch_seconds: float | None = None,
    ) -> None:
        super().__init__(name="pypepper-recovery", daemon=True)
        self.broker = broker
        self.owner = owner
        self.lease_seconds = lease_seconds
        #: How long a re-sent step may wait in its queue before it is sent again.
        self.dispatch_seconds = dispatch_seconds if dispatch_seconds is not None else lease_seconds
        self.interval = interval
        self.batch = batch
        self._stop_event = threading.Event()
        self._store_outage = OutageLog(logger, "job store (recovery sweep)")
        self._broker_outage = OutageLog(logger, "broker (recovery sweep)")

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.run_once()

    def run_once(self) -> None:
        """One interval's work; an outage is logged once, not at every sweep."""
        try:
            leader = self.lead()
        except Exception as exc:
            self._report(exc, self._broker_outage)
            return
        self._broker_outage.ok()
        if not leader:
            return
        try:
            self.sweep()
        except StoreError as exc:
            self._report(exc, self._store_outage)
            return
        except Exception as exc:
            self._report(exc, self._broker_outage)
            return
        self._store_outage.ok()
        self._broker_outage.ok()

    @staticmethod
    def _report(exc: Exception, outage: OutageLog) -> None:
        if isinstance(exc, StoreUnavailableError) or broker_unreachable(exc):
            outage.failed(exc)
        else:
            logger.exception("recovery sweep failed; retrying next interval")

    def lead(self) -> bool:
        """Take or keep the sweeper lock; True if this process sweeps now."""
        client = redis_client_of(self.broker)
        if client is None:
            return True
        ttl = int(self.interval * 2000)
        if client.set(LEADER_KEY, self.owner, nx=True, px=ttl):
            return True
        holder = client.get(LEADER_KEY)
        if holder in (self.owner, self.owner.encode()):
            client.pexpire(LEADER_KEY, ttl)
            return True
        return False

    def sweep(self) -> int:
        """One pass; returns how many steps were re-enqueued."""
        for queue_name in sorted(self.broker.get_declared_queues()):
            requeue_dead_workers(self.broker, queue_name)
            requeue_dead_workers(self.broker, dq_name(queue_name))
        now = utcnow()
        until = now + timedelta(seconds=self.dispatch_seconds)
        recovered = get_job_store().recover_expired(now, until, self.batch)
        for record in recovered:
            position = cursor_of(record) or Position()
            if record.channel_id not in self.broker.get_declared_queues():
                self.broker.declare_queue(record.channel_id)
            self.broker.enqueue(StepMessage(record.id, position).to_message(record.channel_id))
            logger.warning(
                "job %s: lease lapsed at %s; step re-enqueued", record.id, position.key(),
                extra={"action": "recover", "job_id": record.id},
            )
        return len(recovered)
