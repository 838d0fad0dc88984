"""Which ended jobs the retention purge may delete, and which another job still needs.

Pure: every store's ``purge`` (:meth:`~pypepper_dramatiq.stores.base.IJobStore.purge`)
asks :func:`still_needed` of each candidate, so that the rule has one definition.
How long jobs are kept is a setting (:attr:`~pypepper_dramatiq.settings.Settings.retention`);
how long the purge keeps the tombstones of the jobs it deleted is :data:`TOMBSTONE_KEEP`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from .status import TERMINAL, Status
from .waits import Waits

__all__ = [
    "BATCH",
    "HOOKS_KEY",
    "TOMBSTONE_KEEP",
    "awaited",
    "ended_status",
    "has_hook_due",
    "still_needed",
    "tombstones_expire_before",
]

#: Rows deleted per purge statement (the sweep and ``pypepper-dramatiq purge``).
BATCH = 1000

#: Where a job's ``state`` holds its ``on_final_failure`` hooks due and not run yet,
#: as the hooks' engine writes them (``state["hooks"]``: task key -> entry, "pending"
#: or "running"; the key is absent once every hook ran).
HOOKS_KEY = "hooks"

#: How long a purged job's tombstone is kept (its id, and when the purge deleted it):
#: a message of the job that comes back within it is dropped
#: (:meth:`~pypepper_dramatiq.stores.base.IJobStore.was_purged`); one that comes back
#: later finds neither row nor tombstone, and is taken for a job not stored yet. The
#: purge itself deletes the older tombstones.
TOMBSTONE_KEEP = timedelta(days=7)


class _Ended(Protocol):
    """What :func:`still_needed` reads of a candidate row."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> Mapping[str, Any]: ...


def ended_status(status: Status | str) -> Status:
    """``status`` if it is a final status (an exact value name), else a ValueError."""
    found = next((s for s in TERMINAL if s.value == status), None)
    if found is None:
        ended = ", ".join(sorted(s.value for s in TERMINAL))
        raise ValueError(
            f"only ended jobs are purged: status must be one of {ended}, got {status!r}"
        )
    return found


def awaited(waits: Iterable[Mapping[str, Any] | None]) -> set[str]:
    """Every job id that the given ``waits`` (of waiting rows) wait for: parents and key holders."""
    return {job_id for data in waits if data for job_id in Waits.from_dict(data).awaited}


def has_hook_due(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` holds an ``on_final_failure`` hook not run yet (an entry
    under :data:`HOOKS_KEY`, pending or running: the job's row is what runs it)."""
    return bool(state.get(HOOKS_KEY))


def still_needed(record: _Ended, waited_for: Collection[str]) -> bool:
    """Whether the ended job ``record`` must be kept although its retention passed.

    Args:
        record: the candidate (its id and state).
        waited_for: the ids that Scheduled jobs still wait for (:func:`awaited`):
            a child reads its parents' outcomes and results when its wait ends.
    """
    return record.id in waited_for or has_hook_due(record.state)


def tombstones_expire_before(now: datetime) -> datetime:
    """The cutoff of a purge at ``now``: the tombstones written before it are deleted."""
    return now - TOMBSTONE_KEEP
