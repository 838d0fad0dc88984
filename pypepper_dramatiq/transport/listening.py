"""One loop per process and connection hears every notice: cancels, job ends and the
announcements of listeners, for every subscriber (:class:`Listener`).

A worker's cancel listener and a waiter's ended listener share it: one
subscription, to the topics of all of them, read by one daemon thread that hands
each notice to the listeners of its topic. The loop runs while it has
listeners; after a lost connection it subscribes again, every ``reconnect_delay``
seconds (the shortest of its listeners'), and tells each listener what happened.
It works on any :class:`~.base.Transport` that carries notices.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..ops.logs import get_logger
from .base import Notice, Subscribed, Subscription, Topic, Transport

logger = get_logger(__name__)

#: How long a poll waits for a notice when no listener asks for less (seconds).
POLL_SECONDS = 0.5


class Listener:
    """A subscriber of the notice loop; each method is called on the loop's thread.

    Args:
        topics: what it hears.
        reconnect_delay: seconds between two subscriptions after a lost connection.
    """

    def __init__(self, topics: frozenset[Topic], reconnect_delay: float) -> None:
        self.topics = topics
        self.reconnect_delay = reconnect_delay

    def subscribing(self) -> None:
        """Its topics were asked for on a connection that answered."""

    def subscribed(self) -> None:
        """Every topic of the loop was confirmed (also after the client reconnected by
        itself): what was published while it was not subscribed is lost."""

    def heard(self, notice: Notice) -> None:
        """A notice of one of its topics."""

    def lost(self, exc: Exception) -> bool:
        """The connection failed with ``exc``; False to leave the loop."""
        return True

    def next_wait(self) -> float:
        """The longest the loop may wait for a notice before calling :meth:`tick`."""
        return POLL_SECONDS

    def tick(self) -> None:
        """Called after every poll."""


class NoticeLoop(threading.Thread):
    """The one subscription of a process on one transport connection."""

    def __init__(self, transport: Transport) -> None:
        super().__init__(name="pypepper-notices", daemon=True)
        self.transport = transport
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        #: Listeners that joined and were not told they are subscribed yet.
        self._joined: list[Listener] = []
        self._done = False

    def join_loop(self, listener: Listener) -> bool:
        """Add ``listener``; False if the loop has ended (make a new one)."""
        with self._lock:
            if self._done:
                return False
            if listener not in self._listeners:
                self._listeners.append(listener)
                self._joined.append(listener)
            return True

    def leave(self, listener: Listener) -> None:
        """Remove ``listener``; the loop ends with its last listener."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
            if listener in self._joined:
                self._joined.remove(listener)

    def _current(self) -> list[Listener] | None:
        """The listeners now, all to be covered by a new subscription; None (and the
        loop is done) when there is none."""
        with self._lock:
            if not self._listeners:
                self._done = True
                return None
            self._joined.clear()  # the subscription about to be made covers them all
            return list(self._listeners)

    def run(self) -> None:
        while True:
            listeners = self._current()
            if listeners is None:
                return
            subscription: Subscription | None = None
            try:
                topics = frozenset().union(*(listener.topics for listener in listeners))
                subscription = self.transport.subscribe(sorted(topics, key=lambda t: t.value))
                for listener in listeners:
                    listener.subscribing()
                self._serve(subscription, set(topics))
                return
            except Exception as exc:
                self._lost(exc)
            finally:
                if subscription is not None:
                    try:
                        subscription.close()
                    except Exception:
                        logger.debug("closing the notice subscription failed", exc_info=True)

    def _serve(self, subscription: Subscription, topics: set[Topic]) -> None:
        """Hand the notices to the listeners until none is left."""
        confirmed = False
        while True:
            with self._lock:
                listeners = list(self._listeners)
                joined, self._joined = self._joined, []
                if not listeners:
                    self._done = True
                    return
            for listener in joined:
                missing = listener.topics - topics
                if missing:
                    subscription.add(sorted(missing, key=lambda t: t.value))
                    topics |= missing
                    confirmed = False
                listener.subscribing()
                if confirmed:  # its topics are heard already: nothing published since is lost
                    listener.subscribed()
            event = subscription.poll(min(listener.next_wait() for listener in listeners))
            if isinstance(event, Notice):
                for listener in listeners:
                    if event.topic in listener.topics:
                        listener.heard(event)
            elif isinstance(event, Subscribed) and event.count == len(topics):
                confirmed = True
                for listener in listeners:
                    listener.subscribed()
            for listener in listeners:
                listener.tick()

    def _lost(self, exc: Exception) -> None:
        """Tell the listeners; those that stay wait for the next subscription."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            if not listener.lost(exc):
                self.leave(listener)
        with self._lock:
            staying = list(self._listeners)
        if staying:
            self._wait(min(listener.reconnect_delay for listener in staying))

    def _wait(self, seconds: float) -> None:
        threading.Event().wait(seconds)


_loops: weakref.WeakKeyDictionary[Any, NoticeLoop] = weakref.WeakKeyDictionary()
_loops_lock = threading.Lock()


def listen(transport: Transport, listener: Listener) -> None:
    """Have ``listener`` hear its topics on the loop of ``transport``'s connection
    (started if none runs)."""
    with _loops_lock:
        loop = _loops.get(transport.connection)
        if loop is None or not loop.join_loop(listener):
            loop = _loops[transport.connection] = NoticeLoop(transport)
            loop.join_loop(listener)
            loop.start()


def stop_listening(transport: Transport, listener: Listener) -> None:
    """``listener`` leaves the loop of ``transport``'s connection."""
    with _loops_lock:
        loop = _loops.get(transport.connection)
    if loop is not None:
        loop.leave(listener)
