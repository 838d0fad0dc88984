"""Step messages stranded in a live worker's Dramatiq ack sets, sent again.

Dramatiq's Redis broker moves each fetched message into a per-worker "ack
set" until the worker acknowledges it; if the worker dies, the broker's
maintenance puts the message back. A *live* worker can strand messages too:
its consumer of a delay queue (``<queue>.DQ``) keeps the delayed messages it
fetched in memory until they are due, and on a Redis connection error it
drops that memory and starts over, leaving those messages in its ack set,
where nothing ever looks at them while the worker lives.

:class:`AckKeeper` runs in each worker process: it compares the process's own
delay-queue ack sets with what its consumers hold in memory, and puts a step
message back on its delay queue once it has been missing from memory for a
while. Only our step messages are touched: running one twice is harmless
(the job row decides), which is not true of a plain actor's message.

This reads Dramatiq worker internals (``Worker.consumers``, a consumer
thread's ``delay_queue`` and its consumer's ``message_cache``); where they are
missing it turns itself off with a warning.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dramatiq import Message

from ...channels.broker import transport_of
from ...channels.messages import STEP_ACTOR
from ...ops.logs import get_logger
from ...ops.outage import broker_unreachable, shared_outage

logger = get_logger(__name__)

#: Seconds a message must be missing from memory before it counts as stranded:
#: a message passes through a consumer's hands (fetched, then kept or sent on)
#: in far less, so this never takes one that is merely in transit.
MIN_MISSING_SECONDS = 2.0


class AckKeeper(threading.Thread):
    """Every ``interval`` seconds, re-sends this process's stranded delayed step messages.

    Args:
        broker: the Redis broker (anything else: the keeper does nothing).
        worker: the :class:`dramatiq.Worker` of this process.
        interval: seconds between checks.
    """

    def __init__(self, broker: Any, worker: Any, interval: float) -> None:
        super().__init__(name="pypepper-acks", daemon=True)
        self.broker = broker
        self.transport = transport_of(broker)
        self.worker = worker
        self.interval = interval
        self._missing_since: dict[tuple[str, str], float] = {}
        self._stop_event = threading.Event()
        self._outage = shared_outage(self.transport.where)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.check()
                self._outage.ok()
            except Exception as exc:
                if not broker_unreachable(exc):
                    logger.exception("stranded-message check failed; retrying")
                else:
                    self._outage.failed(exc)

    def check(self) -> int:
        """One pass; returns how many messages were put back."""
        consumers = getattr(self.worker, "consumers", None)
        if not isinstance(consumers, dict):
            return 0
        sent = 0
        now = time.monotonic()
        missing_now: dict[tuple[str, str], float] = {}
        for queue_name, thread in list(consumers.items()):
            if not queue_name.endswith(".DQ"):
                continue  # a regular queue's prefetch survives a reconnect
            members = self.transport.fetched_ids(queue_name)
            if not members:
                continue
            held = _held_by(thread)
            if held is None:
                logger.warning("cannot see what the consumer of %s holds; check off", queue_name)
                continue
            due = []
            for message_id in members - held:
                since = self._missing_since.get((queue_name, message_id), now)
                missing_now[(queue_name, message_id)] = since
                if now - since >= MIN_MISSING_SECONDS:
                    due.append(message_id)
            sent += self._put_back(queue_name, due)
        self._missing_since = missing_now
        return sent

    def _put_back(self, queue_name: str, message_ids: list[str]) -> int:
        if not message_ids:
            return 0
        data = self.transport.stored_messages(queue_name, message_ids)
        steps = []
        for message_id, raw in zip(message_ids, data, strict=True):
            if raw is None:
                continue
            try:
                if Message.decode(raw).actor_name == STEP_ACTOR:
                    steps.append(message_id)
            except Exception:  # not ours to judge
                continue
        if steps:
            # Dramatiq's own "requeue": out of this worker's ack set, back on the queue.
            self.transport.requeue(queue_name, steps)
            logger.warning(
                "%d delayed step message(s) of %s were held by no consumer of this worker "
                "(dropped on a Redis reconnect); put back on the queue",
                len(steps),
                queue_name,
                extra={"action": "requeue_stranded", "queue": queue_name},
            )
        return len(steps)


def _held_by(thread: Any) -> set[str] | None:
    """The Redis message ids a consumer thread holds in memory, or None if it cannot tell."""
    delay_queue = getattr(thread, "delay_queue", None)
    if delay_queue is None or not hasattr(delay_queue, "mutex"):
        return None
    with delay_queue.mutex:
        items = list(delay_queue.queue)
    held = {str(item.message.options.get("redis_message_id")) for item in items}
    consumer = getattr(thread, "consumer", None)
    for raw in list(getattr(consumer, "message_cache", None) or []):
        try:
            held.add(str(Message.decode(raw).options.get("redis_message_id")))
        except Exception:
            continue
    return held
