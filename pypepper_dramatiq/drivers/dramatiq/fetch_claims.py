"""Claims ahead: the step messages of one Redis fetch claimed in one statement.

Dramatiq's consumer thread fetches up to ``prefetch`` messages at once and hands
them to the worker threads one by one; each thread then claims its step in the
job store before running it, a blocking round trip (or a share of a group
commit's) on a thread that shares its process's GIL with eight others. With
``claim_fetched`` on, :class:`FetchClaims` wraps the broker's consumer so that
the consumer thread claims every step message of a fetch in one store call
before handing them on, and releases their channel slots in one Redis command:
the worker thread then finds its claim ready.

A step claimed ahead is registered in this process's
:data:`~pypepper_dramatiq.engine.running.running_here` as not started: the lease
keeper renews its lease while it waits in the work queue, and a cancel (a notice, or
a renewal that finds the job Cancelled or the lease taken) sets its event, so its
thread acknowledges it unrun. A pause of its channel or task set while it waits
holds it all the same: its thread releases the claim and claims the step as it would
any message, a claim that holds it for the pause. A message skipped by another
middleware, requeued on shutdown, or passed on, has its claim released (the row
freed with an expiry, as a hand-back leaves it) so the next copy can claim it. A
SIGKILLed worker's claims ahead are recovered like its running steps: by their
leases' expiry.

The batches are the Redis broker's fetches (its consumer keeps a fetch in a
``message_cache`` the wrapper drains); the stub broker's consumer is wrapped all
the same, each message its own batch (the tests' broker: the path is the Redis
one). Another broker (RabbitMQ, whose consumer hands out one message at a time)
is not wrapped (:func:`fetches_in_batches`): its threads claim and record their
steps themselves, with the consumer thread left to fetch. A message whose claim
did not succeed in the batch takes the ordinary path in its thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import dramatiq.worker
from dramatiq.broker import Broker, Consumer, MessageProxy

from ...channels.channel import channel_of_step, manager
from ...channels.messages import STEP_ACTOR, StepMessage
from ...engine import concurrency, rate_limits
from ...engine.running import InFlight
from ...engine.step_io import Claim, StepIO
from ...errors import MessageError, StoreError
from ...ops.logs import get_logger
from ...records.record import utcnow
from .completion import Completions

logger = get_logger(__name__)

#: Messages a consumer prefetches per worker thread when ``claim_fetched`` is on and
#: the user set no ``dramatiq_queue_prefetch`` (Dramatiq's default is 2): a message
#: waiting for the completion thread still counts against the prefetch, and a
#: larger fetch is a larger claim batch (bench/README.md, "Per-job CPU, second pass").
PREFETCH_PER_THREAD = 6
#: The environment variable through which Dramatiq's user sets the prefetch.
PREFETCH_ENV = "dramatiq_queue_prefetch"


#: The brokers whose consumers are wrapped (module, class name; a subclass counts):
#: Redis fetches its messages in batches; the stub broker is the tests' stand-in for it.
BATCHING_BROKERS = (
    ("dramatiq.brokers.redis", "RedisBroker"),
    ("dramatiq.brokers.stub", "StubBroker"),
)


def fetches_in_batches(broker: Broker) -> bool:
    """Whether ``broker``'s consumers take the claims-ahead path (Redis, the stub):
    RabbitMQ's hands out one message at a time, and a claim per message on its
    consumer thread would only queue the steps behind one another's round trips."""
    return any(
        (kind.__module__, kind.__name__) in BATCHING_BROKERS for kind in type(broker).__mro__
    )


def raise_prefetch(worker: Any) -> None:
    """Give ``worker`` (a ``dramatiq.Worker`` before its consumers start) a prefetch of
    :data:`PREFETCH_PER_THREAD` messages per thread, unless its prefetch was chosen
    by its user (``dramatiq_queue_prefetch``, or an attribute set otherwise)."""
    if os.environ.get(PREFETCH_ENV) or dramatiq.worker.QUEUE_PREFETCH:
        return
    threads = getattr(worker, "worker_threads", None)
    if not isinstance(threads, int) or threads < 1:
        return
    if getattr(worker, "queue_prefetch", None) != min(threads * 2, 65535):
        return  # not Dramatiq's default: set by its user
    worker.queue_prefetch = min(threads * PREFETCH_PER_THREAD, 65535)


class FetchClaims:
    """The claims taken ahead by this process's consumer threads, by message id.

    Args:
        book: claims the steps (:meth:`StepIO.claim_ahead`) and releases them.
        inflight: where a step claimed ahead is registered until its thread runs it.
    """

    def __init__(self, book: StepIO, inflight: InFlight) -> None:
        self.book = book
        self.inflight = inflight
        #: The claims taken ahead, with their decoded messages (decoded once), by id.
        self._held: dict[str, tuple[Claim, StepMessage]] = {}
        #: The store outages met by the batch, by message id: its thread defers it.
        self._failed: dict[str, StoreError] = {}
        self._lock = threading.Lock()
        #: Where the worker threads leave the steps they ran, for the completion
        #: thread to record and acknowledge (None: each thread does it itself).
        self.completions: Completions | None = None

    # -- the consumer ------------------------------------------------------------------

    def wrap(self, broker: Broker) -> None:
        """Make ``broker.consume`` hand out consumers that claim each fetch ahead."""
        if getattr(broker.consume, "claims_ahead", None) is self:
            return  # wrapped at an earlier worker's boot
        consume = broker.consume

        def consuming(queue_name: str, prefetch: int = 1, timeout: int = 30000) -> Consumer:
            inner = consume(queue_name, prefetch=prefetch, timeout=timeout)
            if queue_name.endswith(".DQ"):
                return inner  # a delay queue: its messages wait, then go to their queue
            return ClaimingConsumer(inner, self)

        consuming.claims_ahead = self  # type: ignore[attr-defined]
        broker.consume = consuming  # type: ignore[method-assign]

    def claim(self, messages: list[Any]) -> None:
        """Claim the step messages among ``messages`` (one fetch) in one store call,
        and give back the channel slots of the first steps so taken."""
        steps: list[StepMessage] = []
        kept: list[Any] = []
        for message in messages:
            if message.actor_name != STEP_ACTOR or "eta" in message.options:
                continue
            try:
                step = StepMessage.from_message(message)
            except MessageError:
                continue  # dead-lettered by its thread
            channel_id = channel_of_step(message.queue_name, step)
            rate_key, concurrency_key = step.keys
            if rate_limits.limited(channel_id, rate_key) or concurrency.limited(
                channel_id, concurrency_key
            ):
                continue  # takes its turn, or its slot, in its thread
            steps.append(step)
            kept.append(message)
        if not steps:
            return
        claims = self.book.claim_ahead(steps)
        slots: dict[str, list[str]] = {}
        with self._lock:
            for message, step, claim in zip(kept, steps, claims, strict=True):
                if isinstance(claim, StoreError):
                    self._failed[message.message_id] = claim
                    continue
                if claim is None:
                    continue
                self.inflight.reserve(claim.record.id)
                self._held[message.message_id] = (claim, step)
                if step.record is not None:
                    slots.setdefault(step.record.channel_id, []).append(step.job_id)
        for channel_id, job_ids in slots.items():
            manager.release_slots(channel_id, job_ids)

    # -- the worker threads ---------------------------------------------------------------

    def take(self, message: Any) -> tuple[Claim, StepMessage] | None:
        """The claim taken ahead for ``message`` and the step its message was decoded
        into (None: none), no longer held here."""
        with self._lock:
            return self._held.pop(message.message_id, None)

    def outage(self, message: Any) -> StoreError | None:
        """The store outage that kept ``message``'s step from being claimed ahead
        (None: none), no longer held here."""
        with self._lock:
            return self._failed.pop(message.message_id, None)

    def cancelled(self, claim: Claim) -> bool:
        """Whether a cancel (or a lost lease) reached ``claim`` while it waited."""
        entry = self.inflight.get(claim.record.id)
        return entry is None or entry.cancel_event.is_set()

    def give_back(self, claim: Claim) -> None:
        """Release ``claim`` unrun: its row freed, with an expiry after which recovery
        sends the step again if no copy of its message comes through."""
        self.inflight.remove(claim.record.id)
        until = utcnow() + timedelta(seconds=self.book.dispatch_seconds)
        try:
            self.book.release(claim, until=until)
        except StoreError as exc:
            logger.warning(
                "job %s: step claimed ahead not released (%s); it runs again after its lease",
                claim.record.id,
                exc,
            )

    def give_back_messages(self, messages: Iterable[Any]) -> None:
        """Release the claims taken ahead for ``messages`` (requeued or skipped)."""
        for message in messages:
            self.outage(message)
            taken = self.take(message)
            if taken is not None:
                self.give_back(taken[0])


class ClaimingConsumer(Consumer):
    """A Redis consumer whose fetches are claimed ahead before they are handed out."""

    def __init__(self, inner: Any, claims: FetchClaims) -> None:
        self.inner = inner
        self.claims = claims
        self._ready: list[MessageProxy] = []

    def __next__(self) -> MessageProxy | None:
        if not self._ready:
            first = next(self.inner)
            if first is None:
                return None
            fetched = [first]
            # Redis's consumer keeps the rest of its fetch in a cache, decoded here with
            # no I/O; another broker's consumer hands out one message at a time.
            while getattr(self.inner, "message_cache", None):
                message = next(self.inner)
                if message is not None:
                    fetched.append(message)
            try:
                self.claims.claim(fetched)
            except Exception:  # a bug: the messages take the ordinary path
                logger.exception("claims ahead of a fetch failed; each is claimed in its thread")
            self._ready = fetched
        return self._ready.pop(0)

    def ack(self, message: MessageProxy) -> None:
        # A step whose outcome waits for the completion thread: acknowledged there,
        # after its record (Dramatiq acknowledges in the worker thread).
        completions = self.claims.completions
        if completions is not None and completions.hand_over(message, self.inner):
            return
        self.inner.ack(message)

    def nack(self, message: MessageProxy) -> None:
        completions = self.claims.completions
        if completions is not None and completions.hand_over(message, self.inner):
            return  # failed by another middleware after its step ran: nacked once recorded
        self.inner.nack(message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        messages = list(messages)
        self.claims.give_back_messages(messages)
        self.inner.requeue(messages)

    def close(self) -> None:
        ready, self._ready = self._ready, []
        if ready:  # fetched, not handed out: back to the queue, unclaimed
            self.requeue(ready)
        self.inner.close()
