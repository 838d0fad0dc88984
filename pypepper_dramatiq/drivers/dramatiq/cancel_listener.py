"""Hearing, in each worker process, that a job was cancelled (the transport's notices).

The job row is the truth (``Job.cancel()`` writes Cancelled first); the
message only makes running attempts see it at once instead of at the next
lease renewal. The same subscription hears the listeners of job ends announce
themselves, so that a worker that stopped publishing ends because nobody
listened publishes them again (:class:`~pypepper_dramatiq.channels.end_notices.EndPublishing`).
"""

from __future__ import annotations

import threading

from ...channels.end_notices import audience
from ...engine.running import InFlight
from ...ops.logs import get_logger
from ...ops.outage import shared_outage
from ...transport import Notice, Topic, Transport
from ...transport.listening import Listener, listen, stop_listening

logger = get_logger(__name__)


class CancelListener(Listener):
    """Sets the cancel event of attempts in this process when their job is cancelled.

    One listener of the process's notice loop
    (:mod:`pypepper_dramatiq.transport.listening`), which subscribes again after
    a Redis error (every ``reconnect_delay`` seconds).
    """

    def __init__(
        self, transport: Transport, inflight: InFlight, reconnect_delay: float = 1.0
    ) -> None:
        super().__init__(frozenset({Topic.CANCEL, Topic.LISTENING}), reconnect_delay)
        self.transport = transport
        self.inflight = inflight
        self.ready = threading.Event()
        self._started = False
        self._stop_event = threading.Event()
        # Held by the loop's calls and by stop(): no hearing(True) after a stop.
        self._lock = threading.Lock()
        self._outage = shared_outage(transport.where)

    def start(self) -> None:
        """Join the process's notice loop (started if none runs)."""
        self._started = True
        listen(self.transport, self)

    def stop(self) -> None:
        with self._lock:
            self._stop_event.set()
            stop_listening(self.transport, self)
            audience.hearing(False)

    def is_alive(self) -> bool:
        """Whether it hears cancels (started, not stopped)."""
        return self._started and not self._stop_event.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for: the loop calls a stopped listener no more."""

    def subscribing(self) -> None:
        with self._lock:
            if self._stop_event.is_set():
                return
            self.ready.set()
            self._outage.ok()
            audience.hearing(True)

    def heard(self, notice: Notice) -> None:
        if notice.topic is Topic.LISTENING:
            audience.heard()
            return
        self.inflight.cancel(notice.text)

    def lost(self, exc: Exception) -> bool:
        with self._lock:
            self.ready.clear()
            audience.hearing(False)
            self._outage.failed(exc)
        return True
