"""Concurrency limits as people write them: a channel's ``max_running=3``, and the
limits of job keys by pattern (``setup(concurrency={"tenant-*": 3})``), checked once
at the boundary so that nothing malformed reaches a transport.

A limit of N lets at most N steps run at once, counted for every worker together on
the transport (:meth:`~pypepper_dramatiq.transport.base.Transport.acquire_slots`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidConcurrencyKeyError, InvalidConcurrencyLimitError
from .patterns import KeyPatterns
from .storable import CONCURRENCY_KEY_TEXT_LENGTH, unstorable_in

#: The highest limit accepted: far above any worker pool, low enough to be a typo's bound.
MAX_RUNNING = 100_000
#: Where a job's concurrency key is kept in its payload (``scheduled(concurrency_key=)``).
CONCURRENCY_KEY_KEY = "concurrency_key"


def check_limit(value: object, where: str = "max_running") -> int:
    """``value`` as a concurrency limit.

    Raises:
        InvalidConcurrencyLimitError: naming ``where`` and ``value``: not an int (a
            bool is none), or below 1, or above :data:`MAX_RUNNING`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConcurrencyLimitError(where, value, "a whole number is expected")
    if not 1 <= value <= MAX_RUNNING:
        raise InvalidConcurrencyLimitError(where, value, f"it must be 1 to {MAX_RUNNING}")
    return value


def check_concurrency_key(value: object) -> str:
    """``value`` as a job's concurrency key.

    Raises:
        InvalidConcurrencyKeyError: not a text, an empty one, one longer than
            :data:`~pypepper_dramatiq.limits.storable.CONCURRENCY_KEY_TEXT_LENGTH`, or
            one holding what no store keeps.
    """
    if not isinstance(value, str):
        raise InvalidConcurrencyKeyError(value, "a text is expected")
    if not value:
        raise InvalidConcurrencyKeyError(value, "it is empty")
    if len(value) > CONCURRENCY_KEY_TEXT_LENGTH:
        raise InvalidConcurrencyKeyError(
            value, f"{len(value)} characters; at most {CONCURRENCY_KEY_TEXT_LENGTH} are stored"
        )
    bad = unstorable_in(value)
    if bad is not None:
        raise InvalidConcurrencyKeyError(value, f"it holds {bad}, which the job store cannot keep")
    return value


def concurrency_key_of(payload: Mapping[str, Any] | None) -> str | None:
    """The concurrency key a job's payload names (None: none)."""
    key = (payload or {}).get(CONCURRENCY_KEY_KEY)
    return key if isinstance(key, str) else None


#: The job keys' concurrency limits of this process (``setup(concurrency=...)``).
key_concurrency: KeyPatterns[int] = KeyPatterns("concurrency", check_limit)
