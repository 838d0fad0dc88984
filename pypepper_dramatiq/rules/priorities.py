"""Job priorities: which values are one, and the order in which waiting jobs start.

A priority is a whole number from :data:`LOWEST` to :data:`HIGHEST`; within a channel a
waiting job of a higher priority starts before the lower ones, and equal priorities
keep their submit order. A job that names none has :data:`DEFAULT` (the lowest), so a
job that uses no priority is where every job was before priorities existed. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidPriorityError

#: The lowest priority, and a job's when neither it, its task nor the defaults say.
LOWEST = 0
#: The highest priority (RabbitMQ's queues are declared with ``x-max-priority`` of it).
HIGHEST = 9
#: The priority of a job that names none.
DEFAULT = LOWEST
#: Where a job's priority is kept in its state (absent: :data:`DEFAULT`, so a plain
#: job's row and messages are the bytes they were).
PRIORITY_KEY = "priority"


def queue_name(channel_id: str, priority: int) -> str:
    """The broker queue of a channel's jobs of ``priority`` where each priority has one
    (Redis): the channel's own queue for the lowest, ``<channel>.p<priority>`` above."""
    return channel_id if priority == LOWEST else f"{channel_id}.p{priority}"


def queue_names(channel_id: str) -> list[str]:
    """Every queue of a channel where each priority has one, highest priority first."""
    return [queue_name(channel_id, p) for p in range(HIGHEST, LOWEST - 1, -1)]


def channel_of_queue(queue_name: str) -> str:
    """The channel a queue of :func:`queue_name` serves: ``<channel>.p<n>`` (n from 1
    to 9) is ``<channel>``'s; any other name is a channel's own queue."""
    base, dot, suffix = queue_name.rpartition(".p")
    if dot and base and len(suffix) == 1 and suffix in "123456789":
        return base
    return queue_name


def priority_of_queue(queue_name: str) -> int:
    """The priority of the jobs a queue of :func:`queue_name` carries (a channel's own
    queue: the lowest; where one queue carries every priority, the lowest too)."""
    base, dot, suffix = queue_name.rpartition(".p")
    if dot and base and len(suffix) == 1 and suffix in "123456789":
        return int(suffix)
    return LOWEST


def check_priority(value: object, label: str = "priority") -> int:
    """``value`` as a priority; :class:`~pypepper_dramatiq.errors.InvalidPriorityError`
    naming ``label`` for anything but an int from 0 to 9 (a bool is no priority)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPriorityError(value, label)
    if not LOWEST <= value <= HIGHEST:
        raise InvalidPriorityError(value, label)
    return value


def priority_in(state: Mapping[str, Any] | None) -> int:
    """The priority a job's stored state records (a damaged value reads as the default:
    ordering is a preference, never a reason to drop a job)."""
    value = (state or {}).get(PRIORITY_KEY, DEFAULT)
    if isinstance(value, bool) or not isinstance(value, int) or not LOWEST <= value <= HIGHEST:
        return DEFAULT
    return value


def with_priority(state: Mapping[str, Any], priority: int) -> dict[str, Any]:
    """``state`` recording ``priority`` (the default recorded by absence)."""
    updated = {k: v for k, v in state.items() if k != PRIORITY_KEY}
    if priority != DEFAULT:
        updated[PRIORITY_KEY] = priority
    return updated
