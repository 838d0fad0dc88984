"""Rate limits as people write them: ``"100/m"`` (also ``/s``, ``/h``), parsed once at
the boundary (``manager.new(..., rate_limit=)``, ``setup(channels=...)``, YAML) into a
:class:`Rate`, so that nothing malformed reaches a transport.

A rate of N per period is a sliding window: at most N starts are granted in any
window of one period, on the transport's clock; the starts refused come back spread
``period / N`` apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRateKeyError, InvalidRateLimitError
from .patterns import KeyPatterns
from .storable import RATE_KEY_TEXT_LENGTH, check_text

#: The periods a rate may name, in seconds.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: The most starts a rate may allow per period: the transport keeps the starts of the
#: last period (a sorted set in Redis, an array in PostgreSQL's row).
MAX_COUNT = 10_000
#: How long a rate limit key is kept past its last use (its newest start, or the
#: latest time it told a refused start): the longest period (past it no start of
#: the key is in any window, so forgetting it changes no answer), and an hour more, as
#: Redis keeps its keys (the channels list shows a limit applied within the hour).
IDLE_KEEP_SECONDS = max(PERIODS.values()) + 3600.0
#: Where a job's rate limit key is kept in its payload (``scheduled(rate_key=)``).
RATE_KEY_KEY = "rate_key"
#: ``<count>/<period>``, spaces around the parts allowed.
_FORM = re.compile(r"\s*(-?\d+)\s*/\s*([a-zA-Z]+)\s*")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``period`` seconds."""

    count: int
    period: float

    @property
    def interval(self) -> float:
        """The seconds between two starts the limiter grants."""
        return self.period / self.count

    def __str__(self) -> str:
        for unit, seconds in PERIODS.items():
            if seconds == self.period:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.period:g}s"


def parse_rate(value: object, where: str = "rate_limit") -> Rate:
    """``value`` (``"100/m"``, or a :class:`Rate`) as a :class:`Rate`.

    Raises:
        InvalidRateLimitError: naming ``where`` and ``value``: not a text of the form
            ``<count>/<s|m|h>``, or a count below 1 or above :data:`MAX_COUNT`.
    """
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise InvalidRateLimitError(where, value, 'a text such as "100/m" is expected')
    match = _FORM.fullmatch(value)
    if match is None:
        raise InvalidRateLimitError(where, value, "the form is <count>/<s|m|h>")
    count, unit = int(match.group(1)), match.group(2).lower()
    if unit not in PERIODS:
        raise InvalidRateLimitError(where, value, f"the period {unit!r} is not s, m or h")
    if not 1 <= count <= MAX_COUNT:
        raise InvalidRateLimitError(where, value, f"the count must be 1 to {MAX_COUNT}")
    return Rate(count, PERIODS[unit])


def check_rate_key(value: object, label: str = "rate_key") -> str:
    """``value`` if a job may be keyed by it for rate limits (``scheduled(rate_key=)``,
    ``schedule_many(rate_key=)``, ``recurring(rate_key=)``): a text of 1 to
    :data:`~pypepper_dramatiq.limits.storable.RATE_KEY_TEXT_LENGTH` characters a row
    can hold.

    Raises:
        InvalidRateKeyError: naming ``label`` and ``value``.
    """
    if not isinstance(value, str):
        raise InvalidRateKeyError(value, f"a text is expected, not {type(value).__name__}", label)
    if not value:
        raise InvalidRateKeyError(value, "an empty key names nothing to count", label)
    try:
        return check_text(label, value, RATE_KEY_TEXT_LENGTH)
    except ValueError as exc:
        raise InvalidRateKeyError(value, str(exc), label) from None


def rate_key_of(payload: Mapping[str, Any] | None) -> str | None:
    """The rate limit key a job's payload names (None: none)."""
    key = (payload or {}).get(RATE_KEY_KEY)
    return key if isinstance(key, str) else None


#: The job keys' rate limits of this process (``setup(rate_limits=...)``).
key_limits: KeyPatterns[Rate] = KeyPatterns("rate_limits", parse_rate)
