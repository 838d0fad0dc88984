"""Pausing a channel or a task type: ``pause_channel`` / ``resume_channel``,
``pause_task`` / ``resume_task``, and what a worker reads of them.

The paused set lives in the job store (every process sees it, whichever
transport carries the messages). While a channel or task is paused, new jobs are
still accepted (unlike a channel's stop flag), and nothing of it starts: a worker
that picks up one of its steps holds it in the store unrun, with no attempt
counted (:mod:`~pypepper_dramatiq.records.pauses`), and resuming releases the held
rows, which the sweep sends again oldest first. A step already running is not
interrupted: a pause only keeps steps from starting.

A worker reads the paused set at most once per :data:`PAUSE_READ_SECONDS` per
process (:class:`PausedSet`), never per step: a pause takes effect in every worker
within about a second, and a job that uses none costs no store call more per step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..channels.broker import get_transport
from ..channels.channel import manager
from ..errors import StoreError, UnknownChannelError
from ..limits.storable import PAUSED_NAME_LENGTH, check_text
from ..model.executor import executor_registry
from ..ops.logs import get_logger
from ..records.pauses import CHANNEL, TASK, check_kind
from ..records.record import utcnow
from ..stores.base import IJobStore
from ..stores.registry import get_job_store

logger = get_logger(__name__)

#: How stale a worker process's copy of the paused set may be, at most (seconds): a
#: pause or resume takes effect in every worker within this (plus a running step).
PAUSE_READ_SECONDS = 1.0


class PausedSet:
    """This process's copy of the store's paused set, read again when older than
    ``every`` seconds, by the first caller that finds it so (callers meanwhile wait
    for its answer: no caller gets a copy older than ``every``).

    A store that fails the read leaves the last copy in use (logged once per
    outage): a worker whose store is down cannot claim steps either.
    """

    def __init__(
        self,
        store: Callable[[], IJobStore],
        every: float = PAUSE_READ_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._every = every
        self._clock = clock
        self._pairs: frozenset[tuple[str, str]] = frozenset()
        self._read_at: float | None = None
        self._lock = threading.Lock()
        self._failing = False

    def current(self) -> frozenset[tuple[str, str]]:
        """The paused ``(kind, name)`` pairs, as last read (read now if stale)."""
        if self._fresh(self._clock()):
            return self._pairs
        with self._lock:  # one thread reads; the others wait for its answer, not older
            now = self._clock()
            if self._fresh(now):
                return self._pairs
            try:
                self._pairs = self._store().paused()
                self._failing = False
            except StoreError as exc:
                if not self._failing:
                    logger.warning("the paused channels and tasks could not be read: %s", exc)
                self._failing = True
            self._read_at = now
            return self._pairs

    def _fresh(self, now: float) -> bool:
        read_at = self._read_at
        return read_at is not None and now - read_at < self._every

    def holds(self, channel_id: str, executor_id: str | None) -> str | None:
        """Why a step of task ``executor_id`` on ``channel_id`` may not start now
        ("channel X is paused"); None when it may."""
        pairs = self.current()
        if not pairs:
            return None
        return why_held(pairs, channel_id, executor_id)

    def forget(self) -> None:
        """Read the store again at the next question (this process paused or resumed)."""
        self._read_at = None


def why_held(
    pairs: frozenset[tuple[str, str]], channel_id: str, executor_id: str | None
) -> str | None:
    """Why ``pairs`` hold a step of task ``executor_id`` on ``channel_id``; None: they don't."""
    if (CHANNEL, channel_id) in pairs:
        return f"channel {channel_id} is paused"
    if executor_id is not None and (TASK, executor_id) in pairs:
        return f"task {executor_id} is paused"
    return None


#: The paused set as this process's workers see it (both drivers).
paused_here = PausedSet(get_job_store)


def pause_channel(name: str) -> bool:
    """Pause channel ``name`` for every process: its jobs are still accepted, none of
    their steps starts until :func:`resume_channel`. True if it was not paused.

    Raises:
        UnknownChannelError: no channel ``name`` is declared here and no stored job uses it.
        PausingUnsupportedError: the job store keeps no paused set.
    """
    return pause_in(get_job_store(), CHANNEL, name)


def resume_channel(name: str) -> bool:
    """Resume channel ``name``: its held jobs are released, oldest first. True if it
    was paused.

    Raises:
        UnknownChannelError: it is not paused, nor declared here, nor used by a stored job.
    """
    return resume_in(get_job_store(), CHANNEL, name)


def pause_task(executor_id: str) -> bool:
    """Pause the task type ``executor_id`` for every process, on every channel: its
    jobs are accepted, none of its steps starts until :func:`resume_task`. True if it
    was not paused.

    Raises:
        UnknownExecutorError: no executor is registered here under ``executor_id``
            (the command line imports the task modules with ``--import``).
        PausingUnsupportedError: the job store keeps no paused set.
    """
    return pause_in(get_job_store(), TASK, executor_id)


def resume_task(executor_id: str) -> bool:
    """Resume the task type ``executor_id``: its held steps are released, oldest
    first. True if it was paused.

    Raises:
        UnknownExecutorError: it is not paused, nor registered here.
    """
    return resume_in(get_job_store(), TASK, executor_id)


def list_paused() -> list[tuple[str, str]]:
    """The paused ``(kind, name)`` pairs (``kind``: ``"channel"`` or ``"task"``), sorted."""
    return sorted(get_job_store().paused())


def pause_in(store: IJobStore, kind: str, name: str, *, known: bool = False) -> bool:
    """Pause ``kind`` (``"channel"`` or ``"task"``) ``name`` in ``store`` (the command
    line's and the dashboard's own store); see :func:`pause_channel`, :func:`pause_task`.
    ``known``: the caller knows it exists (the dashboard lists the channel): not checked.
    """
    check_kind(kind)
    if not known:
        _check_known(store, kind, name)
    return _pause(store, kind, name)


def resume_in(store: IJobStore, kind: str, name: str) -> bool:
    """Resume ``kind`` ``name`` in ``store``; see :func:`resume_channel`, :func:`resume_task`."""
    check_kind(kind)
    if (kind, name) not in store.paused():
        _check_known(store, kind, name)
    return _resume(store, kind, name)


def _check_known(store: IJobStore, kind: str, name: str) -> None:
    if kind == CHANNEL:
        _check_channel(store, name)
    else:
        _check_task(name)


def _pause(store: IJobStore, kind: str, name: str) -> bool:
    changed = store.pause(kind, name, utcnow())
    paused_here.forget()
    logger.info(
        "%s %s %s",
        kind,
        name,
        "paused" if changed else "was paused already",
        extra={"action": "pause", "kind": kind, "paused": name},
    )
    return changed


def _resume(store: IJobStore, kind: str, name: str) -> bool:
    changed = store.resume(kind, name)
    # Every held row but those of a channel still paused: a row still held by a
    # paused task is held again when a worker picks it up (one more message).
    still = {n for k, n in store.paused() if k == CHANNEL}
    released = store.release_paused(utcnow(), keep_channels=still)
    paused_here.forget()
    logger.info(
        "%s %s %s; %d held jobs released",
        kind,
        name,
        "resumed" if changed else "was not paused",
        released,
        extra={"action": "resume", "kind": kind, "paused": name},
    )
    return changed


def _check_channel(store: IJobStore, name: str) -> None:
    """A channel is known when this process declared it, the shared transport holds its
    state (some process used it), or a stored job uses it."""
    check_text("channel", name, PAUSED_NAME_LENGTH)
    if manager.get(name) is not None or _shared_gate_knows(name):
        return
    if not store.list(channel_id=name, limit=1):
        raise UnknownChannelError(name)


def _shared_gate_knows(name: str) -> bool:
    """Whether the shared transport (Redis, PostgreSQL) holds state of channel ``name``;
    False in process, or when it cannot be asked (the store is asked next)."""
    try:
        return get_transport().shared and manager.gate_of(name).known()
    except Exception as exc:
        logger.debug("channel %s: the transport could not say it knows it (%s)", name, exc)
        return False


def _check_task(executor_id: str) -> None:
    check_text("executor_id", executor_id, PAUSED_NAME_LENGTH)
    executor_registry.get(executor_id)  # UnknownExecutorError names it
