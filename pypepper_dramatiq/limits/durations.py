"""The longest duration any option may give: one bound for every delay, timeout and grace.

Dates are computed from durations (``now + delay``, ``eta + max_start_delay``,
``now - retention``, ``now + lease_seconds``); a duration too long makes that date
overflow Python's ``datetime`` (years 1 to 9999) or the stores' timestamps
(MySQL's ``DATETIME`` also ends in 9999), in the middle of a write or a sweep.
Each option is checked against :data:`MAX_SECONDS` where it is given instead.
"""

from __future__ import annotations

import math

#: 100 years (of 365.25 days), in seconds. Far beyond any delay, retention or timeout
#: anyone means, yet two of them added to now (a far ``eta`` plus a long
#: ``max_start_delay``) stay well inside the year 9999 (and ``now - 100 years``
#: well after the year 1) for the next seven millennia. A float this size keeps
#: sub-microsecond precision, so the dates computed from it are exact.
MAX_SECONDS = 100 * 365.25 * 86_400.0
#: :data:`MAX_SECONDS` as people say it, for error messages.
MAX_SHOWN = "100 years"


def over_bound(seconds: float) -> bool:
    """Whether ``seconds`` is NaN, infinite, or longer than :data:`MAX_SECONDS`."""
    try:
        return not (math.isfinite(seconds) and abs(seconds) <= MAX_SECONDS)
    except OverflowError:  # an int beyond floats
        return True


def bounded(name: str, seconds: float, error: type[ValueError] = ValueError) -> float:
    """``seconds`` if it is finite and at most :data:`MAX_SECONDS`; else ``error``
    naming the option ``name`` and the bound."""
    if over_bound(seconds):
        raise error(
            f"{name} must be finite and at most {MAX_SECONDS:.0f} seconds ({MAX_SHOWN}), "
            f"got {seconds!r}"
        )
    return seconds


def timeout_seconds(name: str, seconds: float) -> float:
    """``seconds`` as a float if it is a timeout an option may give: at least 0 (not
    NaN) and :func:`bounded`; else ``ValueError`` naming the option ``name``."""
    if not seconds >= 0:  # refuses NaN too
        raise ValueError(f"{name} must be >= 0, got {seconds}")
    return float(bounded(name, seconds))


def whole_milliseconds(name: str, seconds: float, error: type[ValueError] = ValueError) -> float:
    """``seconds`` (finite, see :func:`bounded`) as a whole number of milliseconds
    (``0.25``, not ``0.0005``); else ``error`` naming the option ``name``.

    Float seconds rarely hold a decimal fraction exactly: a value within a
    microsecond of a whole millisecond (``1.001``) counts as one, and is
    answered as that millisecond.
    """
    milliseconds = seconds * 1000.0
    whole = round(milliseconds)
    if abs(milliseconds - whole) > 1e-3:
        raise error(f"{name} must be a whole number of milliseconds, got {seconds!r} seconds")
    return whole / 1000.0
