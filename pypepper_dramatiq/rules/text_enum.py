"""An enum of strings that reads as its value, as Python 3.11's ``StrEnum`` does.

The statuses and the lifecycle events are stored, logged and shown as their
values (``Scheduled``, ``RUN``): ``str()`` and f-strings give the value, never
``Status.SCHEDULED``, on Python 3.10 too.
"""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A string enum whose ``str()`` is its value."""

    def __str__(self) -> str:
        return str(self.value)
