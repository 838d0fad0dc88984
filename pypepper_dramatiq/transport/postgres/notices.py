"""Notices between processes by ``NOTIFY`` and ``LISTEN``: one PostgreSQL channel
per topic, a subscription on a connection of its own."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from ...errors import BrokerUnavailableError
from ...limits.storable import unstorable_in
from ..base import Notice, Subscribed, Subscription, Topic

#: The PostgreSQL channel of each topic.
CHANNELS = {
    Topic.CANCEL: "pypepper_cancel",
    Topic.ENDED: "pypepper_ended",
    Topic.LISTENING: "pypepper_listening",
}
_TOPICS = {name: topic for topic, name in CHANNELS.items()}

#: PostgreSQL refuses a NOTIFY payload of 8000 bytes or more.
MAX_PAYLOAD_BYTES = 7999


def check_payload(topic: Topic, text: str) -> str:
    """``text`` if a notice can carry it; else ``ValueError`` naming the topic."""
    bad = unstorable_in(text)
    if bad is not None:
        raise ValueError(f"a {topic.value} notice holds {bad}, which PostgreSQL cannot carry")
    size = len(text.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"a {topic.value} notice is {size} bytes long; PostgreSQL carries at most"
            f" {MAX_PAYLOAD_BYTES}"
        )
    return text


class PostgresSubscription(Subscription):
    """``LISTEN`` on a connection of its own, read by one thread.

    A poll on a connection that was lost opens another and listens again once, as
    redis-py does: that poll answers :class:`Subscribed` (what was sent meanwhile
    is lost); if PostgreSQL cannot be reached it raises, and the caller
    subscribes again later.

    Args:
        connect: opens a new autocommit connection.
        topics: what it hears.

    Raises:
        BrokerUnavailableError: PostgreSQL could not be reached.
    """

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], topics: Collection[Topic]
    ) -> None:
        self._connect = connect
        self._topics: list[Topic] = []
        self._events: collections.deque[Notice | Subscribed] = collections.deque()
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._listen(topics)

    def _open(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = self._connect()
            for topic in self._topics:
                self._connection.execute(f"LISTEN {CHANNELS[topic]}")
        return self._connection

    def _listen(self, topics: Collection[Topic]) -> None:
        with self._lock:
            new = [topic for topic in topics if topic not in self._topics]
            try:
                connection = self._open()
                for topic in new:
                    connection.execute(f"LISTEN {CHANNELS[topic]}")
            except psycopg.Error as exc:
                self._drop()
                raise _unreachable(exc) from exc
            self._topics += new
            self._events.append(Subscribed(len(self._topics)))

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
        self._connection = None

    def poll(self, timeout: float) -> Notice | Subscribed | None:
        if self._closed:
            raise BrokerUnavailableError("the notice subscription was closed")
        if self._events:
            return self._events.popleft()
        try:
            connection = self._open()
            # Read to the generator's end: notices that came in the same packet as
            # the first are yielded too, and would be lost if it were left early.
            for notify in connection.notifies(timeout=timeout, stop_after=1):
                topic = _TOPICS.get(notify.channel)
                if topic is not None:
                    self._events.append(Notice(topic, notify.payload))
            return self._events.popleft() if self._events else None
        except psycopg.Error:
            self._drop()
        topics, self._topics = self._topics, []
        self._listen(topics)  # raises if PostgreSQL is down
        return self._events.popleft()

    def add(self, topics: Collection[Topic]) -> None:
        self._listen(topics)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    @property
    def backend_pid(self) -> int | None:
        """The server process of its connection now (None while it has none)."""
        connection = self._connection
        return None if connection is None or connection.closed else connection.info.backend_pid


def _unreachable(exc: BaseException) -> BrokerUnavailableError:
    return BrokerUnavailableError(f"PostgreSQL unreachable for the notices: {exc}")
