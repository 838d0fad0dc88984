"""Which Dramatiq broker carries our messages."""

from __future__ import annotations

import threading

import dramatiq
from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker

_lock = threading.Lock()
_broker: Broker | None = None


def get_broker() -> Broker:
    """The broker channels use.

    The one installed with :func:`set_broker`, else Dramatiq's global broker
    if one was set, else a new in-memory :class:`StubBroker` (the embedded
    default), which also becomes Dramatiq's global broker.
    """
    global _broker
    with _lock:
        if _broker is None:
            existing = dramatiq.broker.global_broker
            if existing is None:
                existing = StubBroker()
                dramatiq.set_broker(existing)
            _broker = existing
        return _broker


def set_broker(broker: Broker | None) -> None:
    """Install ``broker`` for channels (and as Dramatiq's global broker); None forgets it."""
    global _broker
    with _lock:
        _broker = broker
        if broker is not None:
            dramatiq.set_broker(broker)
