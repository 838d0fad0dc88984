"""The Redis transport: every Redis call and key of the package (see :mod:`.transport`)."""

from .gate import RedisGate
from .transport import RedisTransport

__all__ = ["RedisGate", "RedisTransport"]
