"""Hearing, in each worker process, that a job was cancelled (the transport's notices).

The job row is the truth (``Job.cancel()`` writes Cancelled first); the
message only makes running attempts see it at once instead of at the next
lease renewal. The same subscription hears the listeners of job ends announce
themselves, so that a worker that stopped publishing ends because nobody
listened publishes them again (:class:`~pypepper_dramatiq.notices.EndAudience`).
"""

from __future__ import annotations

import threading

from ..engine.running import InFlight
from ..logs import get_logger
from ..notices import audience
from ..outage import REDIS, shared_outage
from ..transport import Notice, Topic, Transport

logger = get_logger(__name__)


class CancelListener(threading.Thread):
    """Sets the cancel event of attempts in this process when their job is cancelled."""

    def __init__(
        self, transport: Transport, inflight: InFlight, reconnect_delay: float = 1.0
    ) -> None:
        super().__init__(name="pypepper-cancel", daemon=True)
        self.transport = transport
        self.inflight = inflight
        self.reconnect_delay = reconnect_delay
        self.ready = threading.Event()
        self._stop_event = threading.Event()
        self._outage = shared_outage(REDIS)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            subscription = None
            try:
                subscription = self.transport.subscribe((Topic.CANCEL, Topic.LISTENING))
                self.ready.set()
                self._outage.ok()
                audience.hearing(True)
                while not self._stop_event.is_set():
                    event = subscription.poll(0.5)
                    if isinstance(event, Notice):
                        self._dispatch(event)
            except Exception as exc:
                self.ready.clear()
                audience.hearing(False)
                self._outage.failed(exc)
                self._stop_event.wait(self.reconnect_delay)
            finally:
                if self._stop_event.is_set():
                    audience.hearing(False)
                if subscription is not None:
                    try:
                        subscription.close()
                    except Exception:
                        logger.debug("closing the cancel subscription failed", exc_info=True)

    def _dispatch(self, notice: Notice) -> None:
        if notice.topic is Topic.LISTENING:
            audience.heard()
            return
        self.inflight.cancel(notice.text)
