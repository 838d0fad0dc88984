"""A step start under its channel's rate limit: may it start now?

A channel declared with ``rate_limit="100/m"`` (``manager.new``, ``setup(channels=...)``,
YAML), or a job scheduled with a ``rate_key`` that ``setup(rate_limits=...)`` limits,
has its step starts counted for every worker together: each start asks the transport
(Redis, PostgreSQL, or this process), atomically, at the moment it would start,
and is granted while fewer than ``count`` were granted within the last period (a
sliding window), however late a message arrives. A start refused is not failed and
counts no attempt: the driver holds it, its thread free, until the time the limiter
told it (the Dramatiq driver acknowledges its message and sends it again, due then;
the in-process Worker awaits it), and it asks again then. The limiter tells each
start it refuses a time of its own, ``period / count`` after the last one it told, so
that a backlog comes back spread out rather than all at once.

A channel without a rate limit asks nothing: one dictionary lookup per step, no
round trip.
"""

from __future__ import annotations

from ..channels.broker import get_transport
from ..channels.channel import manager
from ..limits.rates import key_limits
from ..transport.base import channel_rate_key

#: The prefix of a job key's rate limit key on the transport.
KEY_PREFIX = "key:"


def start_or_wait(channel_id: str, rate_key: str | None = None, told: bool = False) -> float:
    """Ask to start a step on ``channel_id`` of a job keyed ``rate_key`` now: 0.0 when
    it may (counted), else the seconds after which to ask again. 0.0 at once, with no
    call, when this process declared no rate limit for the channel nor the key.

    The channel's limit is asked first, then the key's: a start the key's limit
    refuses has used its channel's turn (the channel then starts fewer, never more).

    Raises:
        BrokerUnavailableError: the transport could not be reached (nothing counted):
            the caller holds the step and asks again later.
    """
    channel = manager.get(channel_id)
    if channel is not None and channel.rate_limit is not None:
        wait = channel.transport.ask_start(channel_rate_key(channel_id), channel.rate_limit, told)
        if wait > 0.0:
            return wait
    rate = key_limits.of(rate_key)
    if rate is None or rate_key is None:
        return 0.0
    return get_transport().ask_start(KEY_PREFIX + rate_key, rate, told)


def limited(channel_id: str, rate_key: str | None = None) -> bool:
    """Whether this process declared a rate limit for ``channel_id`` or for the job key
    ``rate_key`` (no I/O)."""
    channel = manager.get(channel_id)
    if channel is not None and channel.rate_limit is not None:
        return True
    return key_limits.of(rate_key) is not None
