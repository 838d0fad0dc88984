"""The completion thread: the outcomes of many steps recorded, then acknowledged, together.

With ``claim_fetched`` on, a worker thread whose step ended need not record the
outcome itself: it leaves it here (:meth:`Completions.stash`) and, when
Dramatiq acknowledges the message through the consumer wrapper
(:class:`~pypepper_dramatiq.drivers.dramatiq.fetch_claims.ClaimingConsumer`),
the acknowledgement becomes a hand-over (:meth:`Completions.hand_over`): the
worker thread goes on to its next message with no blocking call of ours.

One completion thread per worker process takes what piled up meanwhile, has the
middleware record the outcomes in one store call and send the steps that follow,
and only then acknowledges the messages (a Redis pipeline for a Redis consumer,
one by one otherwise). A crash between the record and the acknowledgement
redelivers a message whose claim finds its step done (acknowledged unrun); a
crash before the record redelivers it as if its worker had died running it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...channels.broker import transport_of
from ...engine.outcomes import Verdict
from ...engine.step_io import Claim, Outcome
from ...ops.logs import get_logger

logger = get_logger(__name__)

#: The most outcomes one round of the completion thread records together.
MAX_COMPLETIONS = 100
#: How long a worker's shutdown waits for the outcomes handed over to be recorded.
DRAIN_SECONDS = 30.0
#: Wait between two tries of an acknowledgement the broker could not take.
ACK_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Finished:
    """A step whose attempt ended, waiting to be recorded and its message acknowledged."""

    claim: Claim
    outcome: Outcome
    #: What the outcome decides (decided in the worker thread, which chose this path by it).
    verdict: Verdict
    message: Any


class Completions:
    """The steps this worker process's threads handed over, and the thread completing them.

    Args:
        complete: records the outcomes of a batch and sends the steps that follow
            (the middleware's); never raises for one step's failure.
    """

    def __init__(self, complete: Callable[[list[Finished]], None]) -> None:
        self._complete = complete
        self._lock = threading.Lock()
        #: Steps ended, by message id, until Dramatiq acknowledges their message.
        self._stashed: dict[str, Finished] = {}
        self._queue: queue.SimpleQueue[tuple[Finished, Any] | None] = queue.SimpleQueue()
        #: Handed over and not yet acknowledged.
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- the worker threads --------------------------------------------------------------

    def stash(self, finished: Finished) -> None:
        """Keep ``finished`` until its message's acknowledgement hands it over."""
        with self._lock:
            self._stashed[finished.message.message_id] = finished

    def hand_over(self, message: Any, consumer: Any) -> bool:
        """The acknowledgement of ``message`` by ``consumer`` (the broker's own) as a
        hand-over to the completion thread; False: nothing was stashed for it (the
        caller acknowledges it itself)."""
        with self._lock:
            finished = self._stashed.pop(message.message_id, None)
            if finished is None:
                return False
            self._pending += 1
            self._ensure_thread()
        self._queue.put((finished, consumer))
        return True

    # -- the thread ----------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        """Start the completion thread if it does not run (called with the lock held)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="pypepper-completion", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_COMPLETIONS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(more)
            try:
                self._round(batch)
            except BaseException:  # the thread must outlive a bug
                logger.exception("completion of %d steps failed", len(batch))
            finally:
                with self._lock:
                    self._pending -= len(batch)
                    self._idle.notify_all()

    def _round(self, batch: list[tuple[Finished, Any]]) -> None:
        """Record the batch's outcomes and send what follows, then acknowledge."""
        try:
            self._complete([finished for finished, _ in batch])
        except Exception:
            # A bug: the messages are acknowledged all the same, as a worker thread
            # acknowledges one whose outcome could not be recorded (its lease recovers it).
            logger.exception(
                "outcomes of %d steps not recorded; their leases recover them", len(batch)
            )
        by_consumer: dict[int, tuple[Any, list[Any]]] = {}
        for finished, consumer in batch:
            by_consumer.setdefault(id(consumer), (consumer, []))[1].append(finished.message)
        for consumer, messages in by_consumer.values():
            self._acknowledge(consumer, messages)

    def _acknowledge(self, consumer: Any, messages: list[Any]) -> None:
        """Acknowledge ``messages`` (nack those failed meanwhile): a Redis consumer's
        in one pipeline, others one by one, retried while the broker cannot take them
        (until shutdown: then their redelivery finds their steps done)."""
        acks = [message for message in messages if not message.failed]
        broker = getattr(consumer, "broker", None)
        if len(acks) > 1 and transport_of(broker).ack_fetched(consumer, acks):
            messages = [message for message in messages if message.failed]
        for message in messages:
            while True:
                try:
                    if message.failed:
                        consumer.nack(message)
                    else:
                        consumer.ack(message)
                    break
                except Exception as exc:  # Dramatiq retries the same way
                    if self._stopping.is_set():
                        logger.warning(
                            "message %s not acknowledged (%s); its redelivery finds its step done",
                            message.message_id,
                            exc,
                        )
                        break
                    logger.warning(
                        "message %s not acknowledged (%s); retrying", message.message_id, exc
                    )
                    time.sleep(ACK_RETRY_SECONDS)

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait until every step handed over is recorded and acknowledged; False if
        ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self, timeout: float = DRAIN_SECONDS) -> None:
        """Complete what was handed over (within ``timeout``), then end the thread."""
        if not self.drain(timeout):
            logger.warning(
                "outcomes still queued after %.0fs of shutdown; their messages come back",
                timeout,
            )
        self._stopping.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout=5)
