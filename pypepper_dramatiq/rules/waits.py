"""What a Scheduled job waits for besides time, and what happens when the wait ends.

Pure: the ``scheduled(after=..., on_parent_failure=..., unique_key=...,
on_conflict=...)`` options are checked here (a bad one is a ``ValueError`` or
``TypeError`` naming it, before anything is queued or stored), and
:func:`verdict` decides, from the parents' rows, whether a waiting job waits
on, runs, fails or is cancelled. Both drivers apply that one decision.
"""

from __future__ import annotations

__all__ = [
    "ON_CONFLICT",
    "ON_PARENT_FAILURE",
    "Action",
    "Verdict",
    "Waits",
    "check_choice",
    "check_unique_key",
    "describe",
    "parent_ids",
    "verdict",
]

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ..config import check_choice
from ..limits.storable import ID_LENGTH, UNIQUE_KEY_LENGTH, check_text
from .status import Status

#: What ``on_parent_failure`` may say.
ON_PARENT_FAILURE = ("propagate", "cancel", "ignore")
#: What ``on_conflict`` may say.
ON_CONFLICT = ("skip", "replace", "after", "raise")
#: Longest unique key the stores index.
MAX_KEY_LENGTH = UNIQUE_KEY_LENGTH


class _Parent(Protocol):
    """What :func:`verdict` reads of a parent's row."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def error(self) -> str | None: ...


def check_unique_key(key: object) -> str | None:
    """A unique key: None, or a string of 1 to :data:`MAX_KEY_LENGTH` characters."""
    if key is None:
        return None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        raise ValueError(f"unique_key must be 1 to {MAX_KEY_LENGTH} characters, got {key!r}")
    return check_text("unique_key", key)


def parent_ids(after: object) -> tuple[str, ...]:
    """The ids of ``after`` (jobs or ids, or one of them), in order, without repeats.

    Raises:
        TypeError: an item that is neither a job nor an id string.
        ValueError: an empty id, or one no job row can hold (too long, a NUL).
    """
    if after is None:
        return ()
    items: Iterable[object] = (
        after if isinstance(after, Iterable) and not isinstance(after, str) else [after]
    )
    ids: list[str] = []
    for item in items:
        job_id = item if isinstance(item, str) else getattr(item, "id", None)
        if not isinstance(job_id, str):
            raise TypeError(f"after must be jobs or job ids, got {item!r}")
        if not job_id:
            raise ValueError("after holds an empty job id")
        check_text("a job id of after", job_id, ID_LENGTH)
        if job_id not in ids:
            ids.append(job_id)
    return tuple(ids)


@dataclass(frozen=True)
class Waits:
    """What a job waits for: its parents, and (``on_conflict="after"``) a key's holder.

    Stored in the job row as :meth:`to_dict` while the job waits.
    """

    parents: tuple[str, ...] = ()
    on_parent_failure: str = "propagate"
    #: The key the job takes when its wait ends (it waited for the holder).
    key: str | None = None
    #: The job holding ``key`` when this one was stored; any outcome of it will do.
    holder: str | None = None
    #: No message was sent for the job: the sweep sends one when the wait ends.
    held: bool = False

    def __post_init__(self) -> None:
        check_choice("on_parent_failure", self.on_parent_failure, ON_PARENT_FAILURE)

    @property
    def awaited(self) -> tuple[str, ...]:
        """Every job whose end this one waits for."""
        return self.parents + ((self.holder,) if self.holder else ())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"on_parent_failure": self.on_parent_failure}
        if self.parents:
            data["parents"] = list(self.parents)
        if self.key is not None:
            data["key"] = self.key
        if self.holder is not None:
            data["holder"] = self.holder
        if self.held:
            data["held"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Waits:
        return cls(
            parents=tuple(data.get("parents") or ()),
            on_parent_failure=str(data.get("on_parent_failure") or "propagate"),
            key=data.get("key"),
            holder=data.get("holder"),
            held=bool(data.get("held")),
        )


class Action(str, Enum):
    """What happens to a waiting job."""

    WAIT = "wait"
    RUN = "run"
    FAIL = "fail"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Verdict:
    action: Action
    #: Why the job fails or is cancelled (names the parent).
    error: str | None = None


def verdict(waits: Waits, rows: Mapping[str, _Parent | None]) -> Verdict:
    """Decide a waiting job from the rows of the jobs it waits for (None: not stored).

    It waits while any of them has not ended. Then, if a parent ended Failed
    or Cancelled (or is no longer stored: its outcome is unknown, so it counts
    as failed), ``on_parent_failure`` decides: ``propagate`` fails the job,
    ``cancel`` cancels it, ``ignore`` runs it; otherwise it runs. A key
    holder's outcome never matters.
    """
    for job_id in waits.awaited:
        row = rows.get(job_id)
        if row is not None and not row.status.is_terminal:
            return Verdict(Action.WAIT)
    if waits.on_parent_failure == "ignore":
        return Verdict(Action.RUN)
    for job_id in waits.parents:
        row = rows.get(job_id)
        if row is None:
            why = f"parent job {job_id} is no longer stored (its outcome is unknown)"
        elif row.status is Status.COMPLETED:
            continue
        else:
            ended = row.status.value
            why = f"parent job {job_id} ended {ended}" + (f": {row.error}" if row.error else "")
        if waits.on_parent_failure == "cancel":
            return Verdict(Action.CANCEL, why)
        return Verdict(Action.FAIL, why)
    return Verdict(Action.RUN)


def describe(waits: Waits) -> str:
    """One line saying what the job waits for (for ``show`` and logs)."""
    parts = []
    if waits.parents:
        parts.append(f"parents {', '.join(waits.parents)} (on failure: {waits.on_parent_failure})")
    if waits.holder:
        parts.append(f"the holder {waits.holder} of key {waits.key!r}")
    return " and ".join(parts) or "nothing"
