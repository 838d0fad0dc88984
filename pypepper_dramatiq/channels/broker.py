"""Which Dramatiq broker carries our messages, and the transport that coordinates
its processes (:mod:`pypepper_dramatiq.transport`): both are held here, together."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker

from ..rules.priorities import priority_in, queue_name
from ..stores.registry import installed_job_store
from ..transport import Transport, transport_for


class _Installed:
    """The installed broker and its transport (set together, under the lock), and
    the transports of brokers other than the installed one (a test's, a tool's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.broker: Broker | None = None
        self.transport: Transport | None = None
        self.others: weakref.WeakKeyDictionary[Broker, Transport] = weakref.WeakKeyDictionary()


_current = _Installed()


def _made_for(broker: Broker) -> Transport:
    """A new transport for ``broker``, next to the job store installed now (PostgreSQL's
    coordinates a RabbitMQ broker's processes)."""
    return transport_for(broker, installed_job_store())


def get_broker() -> Broker:
    """The broker channels use.

    The one installed with :func:`set_broker`, else Dramatiq's global broker
    if one was set, else a new in-memory :class:`StubBroker` (the embedded
    default), which also becomes Dramatiq's global broker.
    """
    return _installed()[0]


def get_transport() -> Transport:
    """The transport of :func:`get_broker`'s broker, chosen when it was installed."""
    return _installed()[1]


def _installed() -> tuple[Broker, Transport]:
    with _current.lock:
        if _current.broker is None or _current.transport is None:
            existing = dramatiq.broker.global_broker
            if existing is None:
                existing = StubBroker()
                dramatiq.set_broker(existing)
            _current.broker, _current.transport = (
                existing,
                _current.others.pop(existing, None) or _made_for(existing),
            )
        return _current.broker, _current.transport


def transport_of(broker: Broker | None) -> Transport:
    """The transport of ``broker``: the installed one's for the installed broker (or
    None), else the one made for it on its first use."""
    if broker is None:
        return get_transport()
    with _current.lock:
        if broker is _current.broker and _current.transport is not None:
            return _current.transport
        found = _current.others.get(broker)
        if found is None:
            found = _current.others[broker] = _made_for(broker)
        return found


def queue_for(
    channel_id: str, state: Mapping[str, Any] | None, broker: Broker | None = None
) -> str:
    """The queue a step of the job whose state is ``state`` goes to on ``channel_id``:
    the band of its priority where the transport keeps one per priority (Redis), else
    the channel's queue."""
    if not transport_of(broker).priority_queues:
        return channel_id
    return queue_name(channel_id, priority_in(state))


def priority_options(
    state: Mapping[str, Any] | None, broker: Broker | None = None
) -> dict[str, Any] | None:
    """The message options that carry a job's priority to a broker that orders its
    queues by it: RabbitMQ's ``broker_priority`` when its broker was built with
    ``max_priority`` (its queues declared with ``x-max-priority``); None elsewhere and
    for priority 0, so a plain job's messages are the bytes they were."""
    priority = priority_in(state)
    most = getattr(broker or get_broker(), "max_priority", None)
    if not priority or not isinstance(most, int) or most <= 0:
        return None
    return {"broker_priority": min(priority, most)}


def set_broker(broker: Broker | None, transport: Transport | None = None) -> None:
    """Install ``broker`` for channels (and as Dramatiq's global broker) with
    ``transport`` (default: the one :func:`~pypepper_dramatiq.transport.transport_for`
    gives it with the job store installed now); None forgets both."""
    with _current.lock:
        if broker is not None and transport is None:
            if broker is _current.broker and _current.transport is not None:
                transport = _current.transport
            else:
                transport = _current.others.pop(broker, None) or _made_for(broker)
        _current.broker, _current.transport = broker, transport if broker is not None else None
        if broker is not None:
            dramatiq.set_broker(broker)
