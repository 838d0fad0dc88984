"""The transport: what the engine needs from the coordination server besides the job
store (:class:`~.base.Transport`), and which one a broker gets.

:func:`transport_for` is the one place that looks at which broker carries the
messages; everything else asks the transport held with the broker
(``pypepper_dramatiq.channels.broker.get_transport``).
"""

from __future__ import annotations

from typing import Any

from .base import (
    Admission,
    ChannelState,
    Gate,
    Notice,
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
    "Admission",
    "SendResult",
    "Subscribed",
    "Subscription",
    "Topic",
    "Transport",
    "broker_name",
    "is_rabbitmq_broker",
    "transport_for",
]


def transport_for(broker: Any, store: Any = None) -> Transport:
    """The transport of ``broker``: Redis's for Dramatiq's Redis broker; PostgreSQL's
    for Dramatiq's RabbitMQ broker when ``store`` (the job store) is a SQL store on
    PostgreSQL; else the in-process one (the stub broker, or a broker of another kind).

    The brokers are told apart by their class, named: neither the Redis client nor
    pika is imported unless its broker is the one given.
    """
    if type(broker).__name__ == "RedisBroker" and getattr(broker, "client", None) is not None:
        from .redis import RedisTransport  # the Redis client is loaded only when used

        return RedisTransport(broker.client, broker)
    if is_rabbitmq_broker(broker):
        engine = getattr(store, "engine", None)
        if engine is not None and getattr(engine.dialect, "name", None) == "postgresql":
            from .postgres import PostgresTransport  # psycopg is loaded only when used

            return PostgresTransport(engine, broker)
    return LocalTransport()


def is_rabbitmq_broker(broker: Any) -> bool:
    """Whether ``broker`` is Dramatiq's ``RabbitmqBroker`` (or a subclass of it),
    looked at without importing pika."""
    return any(
        cls.__name__ == "RabbitmqBroker" and cls.__module__ == "dramatiq.brokers.rabbitmq"
        for cls in type(broker).__mro__
    )


def broker_name(broker: Any) -> str:
    """What people call ``broker``'s server in a log line: "Redis", "RabbitMQ", else
    the broker's class name."""
    if type(broker).__name__ == "RedisBroker":
        return "Redis"
    if is_rabbitmq_broker(broker):
        return "RabbitMQ"
    return type(broker).__name__
