"""Concurrency limits as people write them: a channel's ``max_running=3``, and the
limits of job keys by pattern (``setup(concurrency={"tenant-*": 3})``), checked once
at the boundary so that nothing malformed reaches a transport.

A limit of N lets at most N steps run at once, counted for every worker together on
the transport (:meth:`~pypepper_dramatiq.transport.base.Transport.acquire_slots`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidConcurrencyKeyError, InvalidConcurrencyLimitError
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


class KeyConcurrency:
    """The concurrency limits of job keys, by pattern (``{"tenant-*": 3}``, shell-style
    patterns as ``setup(rate_limits=...)`` takes; the first that matches a key in the
    order given applies)."""

    def __init__(self) -> None:
        self._limits: tuple[tuple[str, int], ...] = ()

    def configure(self, limits: Mapping[str, object] | None) -> None:
        """Replace the limits by ``limits`` (None: none), all checked before any applies.

        Raises:
            InvalidConcurrencyLimitError: naming the pattern of a bad limit; the limits
                in force are kept.
        """
        checked = tuple(
            (str(pattern), check_limit(limit, f"concurrency[{str(pattern)!r}]"))
            for pattern, limit in (limits or {}).items()
        )
        self._limits = checked

    def of(self, key: str | None) -> int | None:
        """The limit of job key ``key`` (None: no pattern matches, or no key)."""
        if key is None or not self._limits:
            return None
        for pattern, limit in self._limits:
            if fnmatch.fnmatchcase(key, pattern):
                return limit
        return None

    def items(self) -> tuple[tuple[str, int], ...]:
        """The patterns and their limits, in order (for people: the CLI, the dashboard)."""
        return self._limits


#: The job keys' concurrency limits of this process (``setup(concurrency=...)``).
key_concurrency = KeyConcurrency()
