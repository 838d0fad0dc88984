"""Hearing, in each worker process, that a job was cancelled (Redis pub/sub).

The job row is the truth (``Job.cancel()`` writes Cancelled first); the
message only makes running attempts see it at once instead of at the next
lease renewal.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..engine.running import InFlight
from ..outage import REDIS, shared_outage
from ..redis_layout import CANCEL_CHANNEL

logger = logging.getLogger(__name__)


class CancelListener(threading.Thread):
    """Sets the cancel event of attempts in this process when their job is cancelled."""

    def __init__(self, client: Any, inflight: InFlight, reconnect_delay: float = 1.0) -> None:
        super().__init__(name="pypepper-cancel", daemon=True)
        self.client = client
        self.inflight = inflight
        self.reconnect_delay = reconnect_delay
        self.ready = threading.Event()
        self._stop_event = threading.Event()
        self._outage = shared_outage(REDIS)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CANCEL_CHANNEL)
                self.ready.set()
                self._outage.ok()
                while not self._stop_event.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") == "message":
                        data = message["data"]
                        job_id = data.decode() if isinstance(data, bytes) else str(data)
                        self.inflight.cancel(job_id)
            except Exception as exc:
                self.ready.clear()
                self._outage.failed(exc)
                self._stop_event.wait(self.reconnect_delay)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        logger.debug("closing the cancel subscription failed", exc_info=True)
