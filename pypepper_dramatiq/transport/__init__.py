"""The transport: what the engine needs from the coordination server besides the job
store (:class:`~.base.Transport`), and which one a broker gets.

:func:`transport_for` is the one place that looks at which broker carries the
messages; everything else asks the transport held with the broker
(``pypepper_dramatiq.channels.broker.get_transport``).
"""

from __future__ import annotations

from typing import Any

from .base import (
    ChannelState,
    Gate,
    Notice,
    Offer,
    SendResult,
    Subscribed,
    Subscription,
    Topic,
    Transport,
)
from .local import LocalGate, LocalTransport

__all__ = [
    "ChannelState",
    "Gate",
    "LocalGate",
    "LocalTransport",
    "Notice",
    "Offer",
    "SendResult",
    "Subscribed",
    "Subscription",
    "Topic",
    "Transport",
    "transport_for",
]


def transport_for(broker: Any) -> Transport:
    """The transport of ``broker``: Redis's for Dramatiq's Redis broker, else the
    in-process one (the stub broker, or a broker of another kind)."""
    if type(broker).__name__ == "RedisBroker" and getattr(broker, "client", None) is not None:
        from .redis import RedisTransport  # the Redis client is loaded only when used

        return RedisTransport(broker.client, broker)
    return LocalTransport()
