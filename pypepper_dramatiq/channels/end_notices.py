"""Waiting for a job's end: the notices its end sends, and ``Job.wait()``.

Whoever writes a job's end calls :func:`publish_ended` after the write: it
wakes the waiters of this process and publishes the job id on Redis
(:attr:`~pypepper_dramatiq.transport.Topic.ENDED`; nothing without
Redis): one PUBLISH per job end, none per step, and none while nobody listens
(:class:`EndPublishing`): a worker process whose PUBLISH reached no subscriber
stops publishing ends for :data:`QUIET_SECONDS`, or until a listener announces
itself on :attr:`~pypepper_dramatiq.transport.Topic.LISTENING`, which
the worker's cancel listener hears. A process that hears no announcements
(no cancel listener) publishes every end. A cancel by a call
(``Job.cancel()``, ``cancel_saved``, a replaced key holder, a task cancelling
its job) is announced on the cancel channel already (``publish_cancel``, which
also calls :func:`wake`): waiters listen to both channels.

A waiter (:func:`wait_for`, :func:`wait_for_async`) reads the row once; a job
that has ended is returned at once. Otherwise it registers, makes sure this
process's one listener (on the notice loop, started by the first wait) is
subscribed, reads the row again, and sleeps until a notice for its job, or
:data:`POLL_SECONDS`, whichever comes first, then reads again. The poll bounds
what a lost notice costs (Redis restarted, a publisher that died between its
write and its PUBLISH, a write by hand): the row is the truth, the notice only
says when to look. After each (re)subscription the listener wakes every waiter
of the process, since notices sent while it was not subscribed are lost; it then
announces itself, and wakes them all once more :data:`SETTLE_SECONDS` later,
for the ends a quiet worker wrote before it heard the announcement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from ..errors import StoreUnavailableError, UnknownJobError, WaitInsideJobError, WaitTimeoutError
from ..model.executor import running_job
from ..ops.logs import get_logger
from ..ops.outage import broker_unreachable, shared_outage
from ..records.record import JobRecord
from ..rules.start_times import duration
from ..stores.registry import get_job_store
from ..transport import Notice, Topic, Transport
from ..transport.listening import Listener
from ..transport.listening import listen as join_notices
from ..transport.listening import stop_listening as leave_notices
from .broker import get_transport

logger = get_logger(__name__)

#: How often a waiter reads its job's row when no notice comes (a lost notice
#: costs at most this). One primary-key read per waiting caller per period.
POLL_SECONDS = 2.0
#: How long a wait waits for this process's listener to be subscribed before it
#: reads the row (only when the listener is not subscribed: the first wait of a
#: process, or Redis down; the poll covers a notice missed meanwhile).
SUBSCRIBE_WAIT_SECONDS = 1.0
#: Pause of the listener before it subscribes again after a Redis error.
RECONNECT_SECONDS = 1.0
#: How long a worker process publishes no job ends after one reached no
#: subscriber (then one PUBLISH asks again), unless a listener announces itself.
QUIET_SECONDS = 5.0
#: After announcing itself, how long a listener waits before waking its waiters
#: again: the workers that were quiet have heard the announcement by then.
SETTLE_SECONDS = 0.2

Waker = Callable[[], None]


class Waiters:
    """The wake-up callbacks of this process's waiters, by job id."""

    def __init__(self) -> None:
        self._by_job: dict[str, set[Waker]] = {}
        self._lock = threading.Lock()

    def add(self, job_id: str, wake: Waker) -> None:
        with self._lock:
            self._by_job.setdefault(job_id, set()).add(wake)

    def discard(self, job_id: str, wake: Waker) -> None:
        with self._lock:
            wakers = self._by_job.get(job_id)
            if wakers is not None:
                wakers.discard(wake)
                if not wakers:
                    del self._by_job[job_id]

    def wake(self, job_id: str) -> None:
        with self._lock:
            wakers = list(self._by_job.get(job_id, ()))
        for wake in wakers:
            wake()

    def wake_all(self) -> None:
        with self._lock:
            wakers = [wake for wakers in self._by_job.values() for wake in wakers]
        for wake in wakers:
            wake()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_job)


#: The waiters of this process.
waiters = Waiters()


class EndPublishing:
    """Whether this process publishes job ends: not while nobody listens.

    A PUBLISH answers how many subscribers got it. One that reached none makes
    the process quiet for :data:`QUIET_SECONDS` (a PUBLISH per job end is a round
    trip of its own, for nobody), but only while it hears the listeners'
    announcements (:meth:`hearing`, set by the worker's cancel listener while it is
    subscribed): an announcement (:meth:`heard`) ends the quiet at once. A process
    that hears nothing publishes every end, as does one whose hearing failed.
    """

    def __init__(self, quiet_seconds: float = QUIET_SECONDS) -> None:
        self.quiet_seconds = quiet_seconds
        self._lock = threading.Lock()
        self._hearing = False
        self._quiet_until = 0.0
        #: Moves at each announcement heard: an answer of "nobody" to a PUBLISH
        #: sent before it is stale and silences nothing.
        self._epoch = 0

    def hearing(self, on: bool) -> None:
        """Announcements are heard from now on (True), or no longer (False). Either
        way the process publishes until a PUBLISH reaches nobody again: one made
        while nobody heard may have been missed."""
        with self._lock:
            self._hearing = on
            self._quiet_until = 0.0
            self._epoch += 1

    def heard(self) -> None:
        """A listener announced itself: publish again."""
        with self._lock:
            self._quiet_until = 0.0
            self._epoch += 1

    def ask(self, now: float) -> int | None:
        """Whether to publish at ``now`` (monotonic): the epoch to give
        :meth:`answered`, or None to stay quiet."""
        with self._lock:
            if self._hearing and now < self._quiet_until:
                return None
            return self._epoch

    def answered(self, receivers: int, epoch: int, now: float) -> None:
        """A PUBLISH sent at ``epoch`` reached ``receivers`` subscribers."""
        with self._lock:
            if receivers == 0 and self._hearing and epoch == self._epoch:
                self._quiet_until = now + self.quiet_seconds

    @property
    def quiet(self) -> bool:
        """Whether job ends are not published now."""
        return self.ask(time.monotonic()) is None


#: Whether this process publishes job ends now.
audience = EndPublishing()


def wake(job_id: str) -> None:
    """Wake this process's waiters of ``job_id``: they read its row again."""
    waiters.wake(job_id)


def publish_ended(job_id: str, transport: Transport | None = None) -> bool:
    """Tell every waiter that job ``job_id`` ended; call it after the write that ended it.

    Wakes this process's waiters, then publishes the id over ``transport``
    (default: the broker's) unless nobody listens (:class:`EndPublishing`).
    Never raises: a notice that cannot be sent is logged (DEBUG when Redis is
    unreachable, which other parts report) and costs a waiter elsewhere at most
    :data:`POLL_SECONDS`. True once published.
    """
    try:
        waiters.wake(job_id)
        if transport is None:
            transport = get_transport()
        if not transport.carries_notices:
            return False
        epoch = audience.ask(time.monotonic())
        if epoch is None:
            return False
        receivers = transport.publish(Topic.ENDED, job_id)
        if receivers is not None:  # None: the transport cannot tell (keep publishing)
            audience.answered(receivers, epoch, time.monotonic())
    except Exception as exc:
        level = logging.DEBUG if broker_unreachable(exc) else logging.WARNING
        logger.log(
            level,
            "job %s: its end was not published (%s); waiters elsewhere see it within %gs",
            job_id,
            exc,
            POLL_SECONDS,
        )
        return False
    return True


class EndedListener(Listener):
    """One per process: hears the ended and cancel topics, wakes the job's waiters.

    It is one listener of the process's notice loop
    (:mod:`pypepper_dramatiq.transport.listening`, shared with a worker's cancel
    listener), which subscribes again after a Redis error (every
    :data:`RECONNECT_SECONDS`). It ends when told to (:func:`stop_listening`, or
    another broker was installed), or at an error while no one waits (the next
    wait starts a new one).
    """

    def __init__(self, transport: Transport, reconnect_delay: float = RECONNECT_SECONDS) -> None:
        super().__init__(frozenset({Topic.ENDED, Topic.CANCEL}), reconnect_delay)
        self.transport = transport
        #: Set while the subscription to both topics is confirmed.
        self.ready = threading.Event()
        #: When to wake every waiter again after announcing (monotonic), if due.
        self._settle_at: float | None = None
        self._started = False
        self._stop_event = threading.Event()
        self._outage = shared_outage(transport.where)

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def start(self) -> None:
        """Join the process's notice loop (started if none runs)."""
        self._started = True
        join_notices(self.transport, self)

    def stop(self) -> None:
        self._stop_event.set()
        leave_notices(self.transport, self)

    def is_alive(self) -> bool:
        """Whether it hears notices (started, not stopped)."""
        return self._started and not self.stopping

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for: the loop calls a stopped listener no more."""

    def subscribed(self) -> None:
        if self.stopping:
            return
        # Both topics confirmed (also after the client reconnected by itself):
        # what was published while we were not subscribed is lost, so every
        # waiter reads its row again. Quiet workers are told someone listens;
        # what they ended before they heard it, the waiters read again later.
        self.ready.set()
        self._outage.ok()
        waiters.wake_all()
        self.transport.publish(Topic.LISTENING, "1")
        self._settle_at = time.monotonic() + SETTLE_SECONDS

    def heard(self, notice: Notice) -> None:
        waiters.wake(notice.text)

    def lost(self, exc: Exception) -> bool:
        self.ready.clear()
        if _retire(self):
            return False
        self._outage.failed(exc)
        return True

    def next_wait(self) -> float:
        """How long to wait for a notice: until the settle wake-up, at most 0.5 s."""
        if self._settle_at is None:
            return 0.5
        return max(0.0, min(0.5, self._settle_at - time.monotonic()))

    def tick(self) -> None:
        """Wake every waiter once more, :data:`SETTLE_SECONDS` after announcing."""
        if self._settle_at is not None and time.monotonic() >= self._settle_at:
            self._settle_at = None
            waiters.wake_all()


class _Listening:
    """This process's one listener (None: not started, or notices stay in the process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.listener: EndedListener | None = None


_listening = _Listening()


def listening() -> EndedListener | None:
    """This process's listener on the current broker's transport (started if needed);
    None when notices do not leave the process (no Redis)."""
    transport = get_transport()
    with _listening.lock:
        current = _listening.listener
        if not transport.carries_notices:
            if current is not None:
                current.stop()
                _listening.listener = None
            return None
        if (
            current is not None
            and current.transport.connection is transport.connection
            and current.is_alive()
            and not current.stopping
        ):
            return current
        if current is not None:
            current.stop()
        _listening.listener = EndedListener(transport)
        _listening.listener.start()
        return _listening.listener


def stop_listening() -> None:
    """Stop this process's listener (tests; a process that waits no more)."""
    with _listening.lock:
        if _listening.listener is not None:
            _listening.listener.stop()
            _listening.listener = None


def _retire(listener: EndedListener) -> bool:
    """At an error: end ``listener`` if no one waits (True), under the lock
    :func:`listening` takes, so that a waiter arriving now starts a new one."""
    with _listening.lock:
        if len(waiters) and not listener.stopping:
            return False
        listener.stop()
        if _listening.listener is listener:
            _listening.listener = None
        return True


# -- waiting ------------------------------------------------------------------------------


def _check(job_id: str, timeout: float | timedelta | None) -> float | None:
    """The timeout in seconds (None: none); refuses a wait for the caller's own job."""
    if running_job() == job_id:
        raise WaitInsideJobError(job_id)
    return None if timeout is None else duration("timeout", timeout)


def _read(job_id: str, *, first: bool) -> JobRecord | None:
    """The row of ``job_id``; UnknownJobError when there is none.

    None (read again later) when the store is unreachable during the wait: a
    store restart does not end a wait. The first read raises it.
    """
    try:
        record = get_job_store().get(job_id)
    except StoreUnavailableError as exc:
        if first:
            raise
        logger.info("job %s: waiting, but its row cannot be read now (%s)", job_id, exc)
        return None
    if record is None:
        raise UnknownJobError(job_id)
    return record


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _timed_out(job_id: str, limit: float | None, deadline: float | None, record: JobRecord) -> None:
    remaining = _remaining(deadline)
    if limit is not None and remaining is not None and remaining <= 0:
        raise WaitTimeoutError(job_id, limit, record.status.value)


def _sleep_for(deadline: float | None) -> float:
    remaining = _remaining(deadline)
    return POLL_SECONDS if remaining is None else max(0.0, min(POLL_SECONDS, remaining))


def wait_for(job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
    """Block until job ``job_id`` is Completed, Failed or Cancelled; its row then.

    See ``Job.wait()``. Refused inside a running event loop (it would block
    it): use :func:`wait_for_async` there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "Job.wait() blocks: from async code use await job.wait_async() "
            "(or Job.wait_saved_async(job_id))"
        )
    limit = _check(job_id, timeout)
    deadline = None if limit is None else time.monotonic() + limit
    record = _read(job_id, first=True)
    assert record is not None
    if record.status.is_terminal:
        return record
    _timed_out(job_id, limit, deadline, record)
    woken = threading.Event()
    wake_me = woken.set
    waiters.add(job_id, wake_me)
    try:
        listener = listening()
        if listener is not None and not listener.ready.is_set():
            listener.ready.wait(min(SUBSCRIBE_WAIT_SECONDS, _sleep_for(deadline)))
        while True:
            woken.clear()  # before the read: a notice after it wakes the wait below
            found = _read(job_id, first=False)
            if found is not None:
                record = found
                if record.status.is_terminal:
                    return record
            _timed_out(job_id, limit, deadline, record)
            woken.wait(_sleep_for(deadline))
    finally:
        waiters.discard(job_id, wake_me)


async def wait_for_async(job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
    """:func:`wait_for` for async code: the wait holds no thread and does not block
    the event loop (each read of the row runs on a worker thread)."""
    limit = _check(job_id, timeout)
    deadline = None if limit is None else time.monotonic() + limit
    record = await asyncio.to_thread(_read, job_id, first=True)
    assert record is not None
    if record.status.is_terminal:
        return record
    _timed_out(job_id, limit, deadline, record)
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake_me() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the waiter is gone
            loop.call_soon_threadsafe(woken.set)

    waiters.add(job_id, wake_me)
    try:
        listener = listening()
        if listener is not None and not listener.ready.is_set():
            await asyncio.to_thread(
                listener.ready.wait, min(SUBSCRIBE_WAIT_SECONDS, _sleep_for(deadline))
            )
        while True:
            woken.clear()
            found = await asyncio.to_thread(_read, job_id, first=False)
            if found is not None:
                record = found
                if record.status.is_terminal:
                    return record
            _timed_out(job_id, limit, deadline, record)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(woken.wait(), _sleep_for(deadline))
    finally:
        waiters.discard(job_id, wake_me)
