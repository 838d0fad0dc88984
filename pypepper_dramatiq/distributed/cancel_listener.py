"""Hearing, in each worker process, that a job was cancelled (Redis pub/sub).

The job row is the truth (``Job.cancel()`` writes Cancelled first); the
message only makes running attempts see it at once instead of at the next
lease renewal. The same subscription hears the listeners of job ends announce
themselves, so that a worker that stopped publishing ends because nobody
listened publishes them again (:class:`~pypepper_dramatiq.notices.EndAudience`).
"""

from __future__ import annotations

import threading
from typing import Any

from ..engine.running import InFlight
from ..logs import get_logger
from ..notices import audience
from ..outage import REDIS, shared_outage
from ..redis_layout import CANCEL_CHANNEL, LISTENING_CHANNEL

logger = get_logger(__name__)


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
                pubsub.subscribe(CANCEL_CHANNEL, LISTENING_CHANNEL)
                self.ready.set()
                self._outage.ok()
                audience.hearing(True)
                while not self._stop_event.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") == "message":
                        self._dispatch(message)
            except Exception as exc:
                self.ready.clear()
                audience.hearing(False)
                self._outage.failed(exc)
                self._stop_event.wait(self.reconnect_delay)
            finally:
                if self._stop_event.is_set():
                    audience.hearing(False)
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        logger.debug("closing the cancel subscription failed", exc_info=True)

    def _dispatch(self, message: dict[str, Any]) -> None:
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode()
        if channel == LISTENING_CHANNEL:
            audience.heard()
            return
        data = message["data"]
        job_id = data.decode() if isinstance(data, bytes) else str(data)
        self.inflight.cancel(job_id)
