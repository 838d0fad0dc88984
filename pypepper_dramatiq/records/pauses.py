"""What can be paused, and how a row held for a pause is told from others.

A pause names a channel (``channel``) or a task type by its executor id (``task``).
The paused set is kept in the job store (:meth:`~pypepper_dramatiq.stores.base.IJobStore.paused`),
so every process sees it. A step a worker picks up while its channel or task is
paused is held in the store, unrun and with no attempt counted: a Scheduled row's
``release_at``, or an InProgress row's free lease's ``lease_expires``, is set to
:data:`PAUSED_UNTIL`, a time no sweep reaches. Resuming sets it to the row's
``created``, which is past: the sweep then sends the rows again, oldest first.
"""

from __future__ import annotations

from datetime import datetime, timezone

#: A pause of a channel, by its name.
CHANNEL = "channel"
#: A pause of a task type, by its executor id.
TASK = "task"
#: The kinds of pause, as stored.
KINDS = (CHANNEL, TASK)

#: The ``release_at`` (Scheduled) or ``lease_expires`` (InProgress, no owner) of a row
#: held for a pause: later than any time a sweep asks about, within every backend's range.
PAUSED_UNTIL = datetime(9999, 1, 1, tzinfo=timezone.utc)


def held_for_pause(when: datetime | None) -> bool:
    """Whether a row's ``release_at`` or ``lease_expires`` of ``when`` holds it for a pause."""
    return when is not None and when >= PAUSED_UNTIL


def check_kind(kind: str) -> None:
    """Refuse (ValueError) a kind of pause that is neither :data:`CHANNEL` nor :data:`TASK`."""
    if kind not in KINDS:
        raise ValueError(f"a pause is of a {' or a '.join(KINDS)}, not {kind!r}")
