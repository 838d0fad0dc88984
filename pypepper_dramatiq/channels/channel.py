"""Channels: named, optionally bounded Dramatiq queues that carry jobs.

A channel's queue is a Dramatiq queue on the current broker (the in-memory
stub broker by default). Its :class:`~pypepper_dramatiq.transport.base.Gate` counts the
jobs waiting and decides "ok", "full" or "stopped" atomically (in Redis when
the broker is Redis), so a successful send and a stop never overlap.

With Redis, a channel's bound and stop flag are kept there for every process
and outlive them: :meth:`Channel.resize` / :meth:`ChannelManager.resize`
change the bound, :meth:`Channel.resume` / :meth:`ChannelManager.resume` lift a
stop (also from the shell: ``pypepper-dramatiq channels``).

Creating a channel does no Redis I/O, so ``setup(channels=...)`` succeeds
while Redis is down: the channel's first call to Redis applies its bound
(see :class:`~pypepper_dramatiq.transport.redis.gate.RedisGate`), or raises
:class:`~pypepper_dramatiq.errors.BrokerUnavailableError` and is tried again
by the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import dramatiq
from dramatiq.broker import Broker, Consumer
from dramatiq.middleware import Middleware

from ..config import count
from ..errors import BrokerUnavailableError, MessageError, StoreError
from ..limits.concurrency import check_limit
from ..limits.rates import Rate, parse_rate
from ..model.job import Job
from ..ops import observers
from ..ops.logs import get_logger
from ..ops.outage import broker_unreachable
from ..records.record import JobRecord, utcnow
from ..records.state import counting
from ..records.storable_job import check_job_record
from ..rules.events import FAIL, transition
from ..rules.priorities import channel_of_queue, queue_names
from ..rules.status import Status
from ..rules.steps import Position
from ..stores.registry import get_job_store
from ..transport import Admission, Gate, SendResult
from .broker import get_broker, priority_options, queue_for, transport_of
from .end_notices import publish_ended
from .messages import DISPATCH_KEY, StepMessage, dispatch_of, priority_of

logger = get_logger(__name__)

#: How long a blocked receive() sleeps between looks at the queue, in seconds.
POLL_INTERVAL = 0.5


class Channel:
    """A queue of jobs.

    Args:
        channel_id: the channel's name, also its Dramatiq queue name.
        maxsize: how many jobs may wait at once (0 = unbounded), or None for
            "not given". With Redis the bound is shared and outlives processes:
            a given ``maxsize`` replaces the stored one (logged at INFO when it
            changes) at the channel's first call to Redis, None keeps it
            (unbounded if none is stored). Without Redis, None is 0.
        broker: the Dramatiq broker; the package's broker by default.
        gate: admission state; shared through Redis when the broker is Redis,
            process-local otherwise.
        rate_limit: at most this many step starts per period on the channel, for
            every worker together (``"100/m"``, ``"50/s"``, ``"3/h"``): a start over
            it waits for its turn (:mod:`~pypepper_dramatiq.engine.rate_limits`).
            None: no limit, and no call to the limiter. Each process applies the one
            it declared; the turns are counted on the transport, shared.
        max_running: at most this many of the channel's steps run at once, on every
            worker together: a step over it waits, unstarted, for a slot
            (:mod:`~pypepper_dramatiq.engine.concurrency`). None: no limit, and no
            call to the transport. Each process applies the one it declared; the
            slots are counted on the transport, shared.

    Creating a channel does not talk to Redis (a process starts while Redis is
    down); its first admission, release or read does, or :meth:`connect`.

    Raises:
        ConfigError: ``maxsize`` is not a whole number >= 0.
        InvalidRateLimitError: ``rate_limit`` is malformed (a ``ConfigError``).
        InvalidConcurrencyLimitError: ``max_running`` is not a whole number of at
            least 1 (a ``ConfigError``).
    """

    def __init__(
        self,
        channel_id: str,
        maxsize: int | None = None,
        broker: Broker | None = None,
        gate: Gate | None = None,
        *,
        declare: bool = True,
        rate_limit: str | Rate | None = None,
        max_running: int | None = None,
    ) -> None:
        if maxsize is not None:
            maxsize = count("maxsize", maxsize)
        #: The channel's rate limit (None: none).
        self.rate_limit: Rate | None = _rate_of(channel_id, rate_limit)
        #: How many of its steps may run at once, on every worker together (None: any).
        self.max_running: int | None = _max_running_of(channel_id, max_running)
        self.id = channel_id
        self.broker = broker or get_broker()
        self.transport = transport_of(self.broker)
        self.gate = gate or self.transport.gate(channel_id, maxsize)
        # Redis takes messages for any queue, and a queue declared in a worker
        # process is consumed by it: a sender that does not serve the channel
        # leaves it undeclared. Other brokers need the queue declared.
        if declare or not self.transport.takes_undeclared_queues:
            # Where each priority has a queue of its own, the worker consumes them all.
            for queue in queue_names(channel_id) if self.transport.priority_queues else []:
                self.broker.declare_queue(queue)
            self.broker.declare_queue(channel_id)
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        # Jobs sent from this process, handed back as the same objects on receive:
        # held while this process takes from the channel (the in-memory broker's
        # only consumer, or an in-process worker on Redis), else only while the
        # caller holds them. A producer whose jobs dramatiq workers run elsewhere
        # never receives them: holding each would keep every job it ever sent.
        self._local: dict[str, Job] = {}
        self._sent: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()
        self._holds_sent = not self.transport.shared
        self._consumer: Consumer | None = None
        # Where each priority has a queue (Redis): their consumers, highest first, and
        # when to look at them again once all were empty (monotonic seconds): a channel
        # whose jobs name no priority pays a look at most every POLL_INTERVAL, not per job.
        self._band_consumers: list[Consumer] = []
        self._bands_due = 0.0
        # A queue only this process takes from (the in-memory broker) is read whole
        # into this heap, highest priority first, then submit order; a shared one is
        # ordered by its broker (one queue per priority on Redis, RabbitMQ's own).
        self._ready: list[tuple[int, int, Any]] = []
        self._arrivals = itertools.count()

    @property
    def maxsize(self) -> int:
        """The bound (0 = unbounded); with Redis, as stored there now."""
        return self.gate.maxsize

    def connect(self) -> None:
        """Talk to Redis now: apply the bound given at creation (no-op without Redis).

        Raises:
            BrokerUnavailableError: Redis could not be reached; the next call tries again.
        """
        self.gate.connect()

    @property
    def stop(self) -> bool:
        """Whether the channel is stopped: :meth:`request_stop`, not yet :meth:`resume`."""
        return self.gate.stopped

    def resize(self, maxsize: int) -> int:
        """Change the bound to ``maxsize`` (0 = unbounded); returns the bound it replaced.

        With Redis the new bound is stored there, for every process, now and
        later. Jobs already waiting stay, even beyond a smaller bound.

        Raises:
            ConfigError: ``maxsize`` is not a whole number >= 0.
        """
        return self.gate.resize(count("maxsize", maxsize))

    def resume(self) -> None:
        """Accept jobs again after :meth:`request_stop` (with Redis, in every process).

        A stop with Redis outlives the process that requested it: a restarted
        producer finds the channel stopped until someone resumes it.
        """
        with self._lock:
            self.gate.resume()
        logger.info(
            "channel %s: resumed",
            self.id,
            extra={"action": "resume_channel", "channel_id": self.id},
        )

    def length(self) -> int:
        """Jobs waiting in the channel."""
        return self.gate.waiting()

    def offer(self, job: Job, *, delay: float = 0.0, record: JobRecord | None = None) -> SendResult:
        """Enqueue ``job`` unless the channel is stopped or full (sync form of :meth:`send`).

        Args:
            delay: seconds the broker keeps the message before delivering it.
            record: the job's record as it is now, made by the caller (the message
                carries it on Redis); None: made here.

        On Redis the admission and the enqueue are one round trip (one Lua
        script); elsewhere the gate admits, then the broker enqueues.
        """
        if self.one_call:
            return self._offer_in_one_call(job, delay, record)
        with self._lock:
            result = self.gate.admit(job.id)
            if result != "ok":
                return result
            self._dispatch(job, delay, release_on_failure=True)
        return "ok"

    @property
    def one_call(self) -> bool:
        """Whether this channel admits a job and queues its message in one Redis
        round trip (:meth:`prepare`, then the transport's ``admit_and_enqueue``)."""
        return self.transport.enqueues_with(self.gate)

    def prepare(
        self,
        job: Job,
        delay: float = 0.0,
        record: JobRecord | None = None,
        *,
        hooks: bool = True,
    ) -> tuple[Admission, dramatiq.Message[Any]]:
        """``job``'s first message as the Redis broker would store it, and the offer
        that admits the job and queues the message in one round trip (only when
        :attr:`one_call`). The message carries ``record`` (default: the job's now).

        The broker's ``before_enqueue`` hooks run here, as its ``enqueue`` runs them;
        ``hooks=False`` when none of its middleware has one (:func:`hooks_enqueue`).
        """
        delay_ms = int(delay * 1000) or None
        step = StepMessage(job.id, Position(), record or job.to_record())
        # Built with the broker's options at once: one message, not a copy of one.
        queue = queue_for(self.id, step.record.state if step.record else None, self.broker)
        message = step.to_message(*self.transport.message_options(queue, delay_ms))
        if hooks:
            self.broker.emit_before("enqueue", message, delay_ms)
        return Admission(self.gate, job.id, message, message.encode()), message

    def sent(
        self,
        job: Job,
        message: dramatiq.Message[Any],
        delay: float = 0.0,
        *,
        hooks: bool = True,
    ) -> None:
        """``job`` was admitted and ``message`` queued by an offer (:meth:`prepare`
        with the same ``delay`` and ``hooks``): the broker's ``after_enqueue`` hooks
        run, and the job records its message."""
        if hooks:
            self.broker.emit_after("enqueue", message, int(delay * 1000) or None)
        with self._lock:
            self._remember(job)
        job.state = dict(job.state, **{DISPATCH_KEY: dispatch_of(message)})
        self._wakeup.set()

    def _offer_in_one_call(self, job: Job, delay: float, record: JobRecord | None) -> SendResult:
        offer, message = self.prepare(job, delay, record)
        result = self.transport.admit_and_enqueue([offer])[0]
        if result == "ok":
            self.sent(job, message, delay)
        return result

    def admit(self, job: Job) -> SendResult:
        """Count ``job`` as waiting unless stopped or full, sending nothing yet:
        :meth:`dispatch` sends its message once its row is stored."""
        with self._lock:
            return self.gate.admit(job.id)

    def check(self) -> SendResult:
        """Whether the channel would take a new job now, taking no slot.

        A job held in the store (a long delay, a wait for other jobs) is checked
        when it is scheduled and takes its slot only when it is released
        (:meth:`admit_released`), so that held jobs cost the channel nothing.
        """
        with self._lock:
            return self.gate.check()

    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        """Give held jobs, now due, their slots while the bound allows (not the stop
        flag: they were accepted before it); True per job admitted."""
        return self.gate.admit_released(job_ids)

    def dispatch(self, job: Job, *, delay: float = 0.0) -> None:
        """Send the first message of ``job``, already admitted (:meth:`admit`).

        Raises:
            BrokerUnavailableError: the broker did not take it (the admission stays).
        """
        with self._lock:
            self._dispatch(job, delay, release_on_failure=False)

    def _remember(self, job: Job) -> None:
        """Keep ``job`` to hand back on receive (called under the lock)."""
        if self._holds_sent:
            self._local[job.id] = job
        else:
            self._sent[job.id] = job

    def _recall(self, job_id: str) -> Job | None:
        """The job sent from here as ``job_id``, if still kept (called under the lock)."""
        job = self._local.pop(job_id, None)
        return job if job is not None else self._sent.pop(job_id, None)

    def _dispatch(self, job: Job, delay: float, *, release_on_failure: bool) -> None:
        self._remember(job)
        try:
            record = job.to_record()
            queue = queue_for(self.id, record.state, self.broker)
            options = priority_options(record.state, self.broker)
            message = StepMessage(job.id, Position(), record).to_message(queue, options)
            sent = self.broker.enqueue(message, delay=int(delay * 1000) or None)
        except BaseException as exc:
            self._recall(job.id)
            if release_on_failure:
                with contextlib.suppress(BrokerUnavailableError):
                    self.gate.release(job.id)
            if broker_unreachable(exc):
                raise BrokerUnavailableError(
                    f"the broker did not take job {job.id} for channel {self.id}: {exc}"
                ) from exc
            raise
        # The Scheduled write records which message carries the job, so that
        # recovery can tell a job waiting in a queue from one whose message is gone.
        job.state = dict(job.state, **{DISPATCH_KEY: dispatch_of(sent)})
        self._wakeup.set()

    async def send(self, job: Job) -> SendResult:
        """Enqueue ``job``: ``"ok"``, or ``"full"`` / ``"stopped"`` when rejected.

        Raises:
            ValueError, TypeError: the job row could not hold a value of ``job``
                (named); nothing was sent.
        """
        check_job_record(job.to_record())  # no message for a job whose row cannot be stored
        return self.offer(job)

    def put_back(self, job: Job) -> None:
        """Return ``job``, taken from this channel and not started, to it (its taker
        was cancelled: ``run_once`` under a timeout, an application's shutdown).

        Its message is sent again, at once (a planned start is kept by the job),
        and it counts as waiting again while the bound allows: a job that waited
        already is never refused, neither for the bound nor for a stop (a stopped
        channel still drains what it holds).

        Raises:
            BrokerUnavailableError: the broker did not take it.
        """
        with self._lock:
            self.gate.admit_released([job.id])
            self._dispatch(job, 0.0, release_on_failure=True)

    def request_stop(self) -> None:
        """Stop accepting jobs and wake a blocked :meth:`receive`. Queued jobs stay."""
        with self._lock:
            self.gate.request_stop()
        self._wakeup.set()

    def take(self) -> Job | None:
        """The next waiting job, without blocking; None if there is none."""
        while True:
            message = self._next_message()
            if message is None:
                return None
            job = self._decode(message)
            if job is not None:
                return job

    async def receive(self) -> Job | None:
        """The next job; waits while the channel is open and empty.

        Returns None only when the channel is stopped and empty, so stopped
        channels drain.
        """
        while True:
            self._wakeup.clear()
            stopped = self.stop  # read before looking: no send can follow a stop
            job = self.take()
            if job is not None:
                return job
            if stopped:
                return None
            await asyncio.to_thread(self._wakeup.wait, POLL_INTERVAL)

    def _next_message(self) -> Any:
        with self._lock:
            if self._consumer is None:
                self._consumer = self.broker.consume(self.id, prefetch=1 << 30, timeout=0)
                if self.transport.priority_queues:
                    self._band_consumers = [
                        self.broker.consume(queue, prefetch=1 << 30, timeout=0)
                        for queue in queue_names(self.id)
                        if queue != self.id
                    ]
                # Taking from the channel here: jobs sent from now on are held
                # until they come back, and those the caller still holds, too.
                self._holds_sent = True
                self._local.update(self._sent)
                self._sent.clear()
            consumer = self._consumer
        if self.transport.shared:
            if self._band_consumers and time.monotonic() >= self._bands_due:
                for band in self._band_consumers:  # highest priority first
                    message = next(band)
                    if message is not None:
                        band.ack(message)
                        return message
                self._bands_due = time.monotonic() + POLL_INTERVAL
            message = next(consumer)
            if message is not None:
                consumer.ack(message)
            return message
        with self._lock:
            while (message := next(consumer)) is not None:
                consumer.ack(message)
                order = (-priority_of(message), next(self._arrivals))
                heapq.heappush(self._ready, (*order, message))
            return heapq.heappop(self._ready)[2] if self._ready else None

    def _decode(self, message: Any) -> Job | None:
        try:
            step = StepMessage.from_message(message)
        except MessageError:
            logger.exception("dropping undecodable message on channel %s", self.id)
            return None
        self.gate.release(step.job_id)
        with self._lock:
            job = self._recall(step.job_id)
        if job is not None:
            return job
        if step.record is None:
            logger.error("message for job %s carries no record; dropped", step.job_id)
            return None
        try:
            job = Job.from_record(step.record)
        except ValueError as exc:
            # Its tasks' executors are not registered in this process: no attempt
            # here can run it, and the message is consumed. Fail it, visibly.
            logger.error("job %s cannot be rebuilt here (%s); marking it Failed", step.job_id, exc)
            _fail_stored(step.record, f"the job cannot be rebuilt by this worker: {exc}")
            return None
        job.restore_status(step.record.status)
        return job

    def __repr__(self) -> str:
        maxsize: object = "?"
        # A repr (in a log line, a traceback) neither raises nor makes the
        # channel's first call to Redis, which would apply its bound as a side
        # effect: the bound is shown once some real call has reached Redis.
        if self.gate.connected:
            with contextlib.suppress(BrokerUnavailableError):
                maxsize = self.maxsize
        return f"Channel({self.id!r}, maxsize={maxsize})"


def _rate_of(channel_id: str, rate_limit: str | Rate | None) -> Rate | None:
    """``rate_limit`` of channel ``channel_id`` parsed (None: none); InvalidRateLimitError."""
    return None if rate_limit is None else parse_rate(rate_limit, f"rate_limit of {channel_id!r}")


def _max_running_of(channel_id: str, max_running: object) -> int | None:
    """``max_running`` of channel ``channel_id`` checked (None: none);
    InvalidConcurrencyLimitError naming the channel."""
    return (
        None if max_running is None else check_limit(max_running, f"max_running of {channel_id!r}")
    )


def _fail_stored(record: JobRecord, error: str) -> None:
    """Store ``record``'s job as Failed with ``error``, unless it already moved on."""
    store = get_job_store()
    try:
        current = store.get(record.id)
        if current is None:
            current = record.evolve(version=0)
        elif current.status is not Status.SCHEDULED:
            return  # running, finished or cancelled elsewhere: leave it
        failed = current.evolve(
            status=transition(current.status, FAIL),
            error=error,
            updated=utcnow(),
            state=counting(current.state),
        )
        if store.put(failed):
            observers.job_ended(failed)
            publish_ended(record.id)
    except StoreError as exc:
        logger.warning("job %s: could not store it as Failed (%s)", record.id, exc)


def hooks_enqueue(broker: Broker) -> bool:
    """Whether some middleware of ``broker`` has an enqueue hook of its own.

    When none has, emitting ``before_enqueue`` and ``after_enqueue`` only calls
    ``Middleware``'s, which do nothing: a batch of messages may skip it.
    """
    return any(
        getattr(getattr(middleware, hook), "__func__", None) is not getattr(Middleware, hook)
        for middleware in broker.middleware
        for hook in ("before_enqueue", "after_enqueue")
    )


def gate_for(broker: Broker, channel_id: str, maxsize: int | None = None) -> Gate:
    """The admission gate of ``channel_id`` on ``broker`` (shared through Redis there),
    without declaring its queue: for a process that only needs to give a slot back."""
    return transport_of(broker).gate(channel_id, maxsize)


class ChannelManager:
    """The process's channels by id."""

    def __init__(self) -> None:
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()

    def new(
        self,
        channel_id: str,
        maxsize: int | None = None,
        *,
        rate_limit: str | Rate | None = None,
        max_running: int | None = None,
    ) -> Channel:
        """The channel ``channel_id``, created with ``maxsize`` if this process has none yet.

        Creating it with an explicit ``maxsize`` sets the bound (with Redis,
        replacing the one stored there for every process); ``maxsize=None``
        keeps the stored bound (unbounded when there is none). Once this
        process holds the channel, a later ``maxsize`` is ignored and the same
        object is returned: change the bound with :meth:`resize`. A given
        ``rate_limit`` (``"100/m"``: see :class:`Channel`) applies to the channel
        either way, from this process's next step start on; so does a given
        ``max_running`` (the most steps of the channel running at once on every
        worker together: see :class:`Channel`).

        Raises:
            ConfigError: ``maxsize`` is not a whole number >= 0.
            InvalidRateLimitError: ``rate_limit`` is malformed; nothing was declared.
            InvalidConcurrencyLimitError: ``max_running`` is not a whole number of at
                least 1; nothing was declared.
        """
        rate = (
            None if rate_limit is None else parse_rate(rate_limit, f"rate_limit of {channel_id!r}")
        )
        running = _max_running_of(channel_id, max_running)
        with self._lock:
            channel = self._channels.get(channel_id)
            if channel is None:
                channel = self._channels[channel_id] = Channel(
                    channel_id, maxsize, rate_limit=rate, max_running=running
                )
            else:
                if rate is not None:
                    channel.rate_limit = rate
                if running is not None:
                    channel.max_running = running
            return channel

    def max_running(self, channel_id: str) -> int | None:
        """The concurrency limit this process declared for ``channel_id`` (None: none)."""
        channel = self._channels.get(channel_id)
        return None if channel is None else channel.max_running

    def rate_limit(self, channel_id: str) -> Rate | None:
        """The rate limit this process declared for ``channel_id`` (None: none)."""
        channel = self._channels.get(channel_id)
        return None if channel is None else channel.rate_limit

    def available(self, channel_id: str, maxsize: int | None = None) -> Channel:
        """Same as :meth:`new`: get the channel, creating it on first use.

        Producers reach their channel this way (``Job.scheduled()``) without a
        bound, so they never change the one stored in Redis.
        """
        return self.new(channel_id, maxsize)

    def sender(self, channel_id: str) -> Channel:
        """A channel to send to without serving it: this process's own if it has one,
        else a new one that does not declare its queue on Redis (so a worker process
        sending to a channel it does not serve does not start consuming it)."""
        with self._lock:
            channel = self._channels.get(channel_id)
        return channel if channel is not None else Channel(channel_id, declare=False)

    def resize(self, channel_id: str, maxsize: int) -> int:
        """Set the bound of ``channel_id`` (creating the channel if new); returns the old bound.

        Raises:
            ConfigError: ``maxsize`` is not a whole number >= 0.
        """
        maxsize = count("maxsize", maxsize)  # refused before a channel is created
        return self.new(channel_id).resize(maxsize)

    def resume(self, channel_id: str) -> None:
        """Clear the stop flag of ``channel_id`` (creating the channel if new)."""
        self.new(channel_id).resume()

    def get(self, channel_id: str) -> Channel | None:
        return self._channels.get(channel_id)

    def release_slot(self, channel_id: str, job_id: str, broker: Broker | None = None) -> None:
        """``job_id`` left ``channel_id`` (taken by a worker, dropped, or cancelled
        unrun): give its slot back. Works for a channel this process does not serve
        (its queue is not declared for that); a failure is logged, not raised, as
        bookkeeping must not stop the work that follows it."""
        try:
            self._gate_of(channel_id, broker).release(job_id)
        except Exception:
            logger.warning(
                "channel %s: slot of job %s not given back", channel_id, job_id, exc_info=True
            )

    def release_slots(self, channel_id: str, job_ids: Sequence[str]) -> None:
        """The jobs ``job_ids`` left ``channel_id`` together: their slots given back in
        one call where the transport can (a failure is logged, as for one)."""
        try:
            self._gate_of(channel_id, None).release_many(job_ids)
        except Exception:
            logger.warning(
                "channel %s: slots of %d jobs not given back",
                channel_id,
                len(job_ids),
                exc_info=True,
            )

    def admit_released(
        self, channel_id: str, job_ids: Sequence[str], broker: Broker | None = None
    ) -> list[bool]:
        """Give held jobs of ``channel_id``, now due, their slots while its bound
        allows (see :meth:`Channel.admit_released`); works for a channel this
        process does not serve.

        Raises:
            BrokerUnavailableError: Redis could not be reached (nothing was admitted).
        """
        return self._gate_of(channel_id, broker).admit_released(job_ids)

    def gate_of(self, channel_id: str, broker: Broker | None = None) -> Gate:
        """The gate of ``channel_id``: its channel's here, else one made on ``broker``
        (no queue declared), for a channel this process does not serve."""
        return self._gate_of(channel_id, broker)

    def _gate_of(self, channel_id: str, broker: Broker | None) -> Gate:
        channel = self._channels.get(channel_id)
        return channel.gate if channel is not None else gate_for(broker or get_broker(), channel_id)

    def remove(self, channel_id: str) -> Channel | None:
        with self._lock:
            return self._channels.pop(channel_id, None)

    def clear(self) -> None:
        """Forget every channel (tests, re-configuration)."""
        with self._lock:
            self._channels.clear()

    def ids(self) -> list[str]:
        return sorted(self._channels)

    def connect_pending(self) -> list[str]:
        """Make the first Redis call of every channel that has not made it yet.

        That applies the bounds this process was given (see :meth:`Channel.connect`)
        as soon as Redis answers, instead of at each channel's first job.

        Returns:
            The ids of the channels still not connected (Redis unreachable),
            sorted; empty once every channel is.
        """
        with self._lock:
            channels = list(self._channels.values())
        pending = []
        for channel in channels:
            if channel.gate.connected:
                continue
            try:
                channel.connect()
            except BrokerUnavailableError as exc:
                # Quiet on purpose: the parts of the process that need Redis
                # log its outage; this only retries.
                logger.debug("channel %s not connected yet: %s", channel.id, exc)
                pending.append(channel.id)
        return sorted(pending)


class ChannelConnector(threading.Thread):
    """Applies the bounds of a process's channels once Redis answers, then ends.

    Meant for a worker process: its channels' first calls to Redis otherwise
    come with its first job, so a bound it was given would wait until then.
    Tries every ``interval`` seconds while Redis is down, logging nothing
    above DEBUG.

    Args:
        channels: the channels to connect (the process's :data:`manager`).
        interval: seconds between two tries.
    """

    def __init__(self, channels: ChannelManager, interval: float = 1.0) -> None:
        super().__init__(name="pypepper-channels", daemon=True)
        self.channels = channels
        self.interval = interval
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                if not self.channels.connect_pending():
                    return
            except Exception:  # a bug, not an outage: say it once and give up
                logger.exception("connecting the channels failed; each connects on first use")
                return
            self._stop_event.wait(self.interval)


#: The process-wide channel manager.
manager = ChannelManager()


def channel_of_step(queue_name: str, step: StepMessage) -> str:
    """The channel of ``step``, taken from the queue ``queue_name``: the one its record
    names (a first step), else the one the queue serves (a priority's queue,
    ``<channel>.p<n>``, is its channel's). Its limits and pauses are that channel's."""
    if step.record is not None:
        return step.record.channel_id
    return queue_name if manager.get(queue_name) is not None else channel_of_queue(queue_name)
