"""Coordination through PostgreSQL, next to a broker that is not Redis (RabbitMQ):
gates as guarded statements, notices by ``NOTIFY``/``LISTEN``, the sweep leader's
lock as a session advisory lock."""

from .gate import PostgresGate
from .transport import PostgresTransport

__all__ = ["PostgresGate", "PostgresTransport"]
