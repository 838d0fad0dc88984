"""A cron expression in words, for the Schedules page (cron-descriptor, when installed)."""

from __future__ import annotations

from typing import Any

try:
    from cron_descriptor import (
        ExpressionDescriptor,
        FormatError,
        MissingFieldError,
        Options,
        WrongArgumentError,
    )

    _LIBRARY: tuple[type[Exception], ...] = (FormatError, MissingFieldError, WrongArgumentError)
except ImportError:  # pragma: no cover - depends on the install
    ExpressionDescriptor = None
    Options = None
    _LIBRARY = ()


# -- a cron expression in words ------------------------------------------------------------------
#
# Read by cron-descriptor (part of the ``dashboard`` extra), in 24-hour time, with the
# 6-field form read seconds first as the package's schedules read it. Without the
# library, or for an expression it cannot read, there are no words and the page shows
# the expression alone.
#: What reading an expression may raise: the library's errors, and on odd text its
#: own parsing's.
_UNREAD: tuple[type[Exception], ...] = (*_LIBRARY, ValueError, KeyError, IndexError)

#: The aliases croniter reads and cron-descriptor does not, in words.
CRON_ALIASES = {
    "@yearly": "Once a year, at 00:00 on January 1",
    "@annually": "Once a year, at 00:00 on January 1",
    "@monthly": "Once a month, at 00:00 on day 1",
    "@weekly": "Once a week, at 00:00 on Sunday",
    "@daily": "Once a day, at 00:00",
    "@midnight": "Once a day, at 00:00",
    "@hourly": "Once an hour, at minute 0",
}


def in_words(expression: str) -> str | None:
    """``expression`` in English words; None when it cannot be said."""
    text = expression.strip()
    if text.lower() in CRON_ALIASES:
        return CRON_ALIASES[text.lower()]
    if ExpressionDescriptor is None or Options is None:
        return None
    options: Any = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    try:
        described = ExpressionDescriptor(text, options).get_description()
    except _UNREAD:
        return None
    return str(described) if described else None
