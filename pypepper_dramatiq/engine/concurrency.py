"""A step start under its channel's or its key's concurrency limit: may it run now?

A channel declared with ``max_running=3`` (``manager.new``, ``setup(channels=...)``,
YAML), or a job scheduled with a ``concurrency_key`` that ``setup(concurrency=...)``
limits, has its running steps counted for every worker together: before a step is
claimed, the driver takes a slot of each limit on the transport (Redis, PostgreSQL,
or this process), all or none, atomically, and gives them back once the step's
outcome is recorded (or the step was not run after all). A start refused is not
failed and counts no attempt: the driver holds it, its thread free. It waits in its
limit's line on the transport (highest priority first, then the first held), and the
release of a slot of that limit keeps the slot for the first start in line and sends
it again at once (:func:`give_back`): the Dramatiq driver's message (Dramatiq's
encoded form, kept in the line), the in-process Worker's wake (:data:`woken`). Its
own delayed copy stays the fallback: it asks again after :func:`hold_seconds` (the
Dramatiq driver acknowledges the message and sends it again, due then), so a start
whose release was never made (its worker died) or never sent is not lost. A second
copy of a step is harmless: the first to take the slot claims the step, the other's
claim is refused (the step is claimed already, or ran) and it gives its slot back.

A slot is a lease: this process renews the leases of the slots it holds
(:class:`HeldSlots`, a thread of its own while any is held); a worker that dies
holding one stops renewing it, and the slot lapses ``lease_seconds`` later, never
leaked.

A job of a channel without a limit, and without a limited key, asks nothing: one
dictionary lookup per step, no round trip.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import dramatiq

from ..channels.broker import get_broker, get_transport
from ..channels.channel import manager
from ..errors import BrokerUnavailableError
from ..limits.concurrency import key_concurrency
from ..ops.logs import get_logger
from ..transport.base import HeldStart, Transport, channel_slot_key

logger = get_logger(__name__)

#: The prefix of a job key's concurrency limit key on the transport.
KEY_PREFIX = "key:"
#: How long a start refused the first time waits before it asks again (seconds): short,
#: as a slot frees when a step ends, which no notice announces.
HOLD_SECONDS = 0.25
#: The longest wait between two asks of a start held many times (seconds): a backlog
#: of N held steps costs about N asks a second, not 4 N.
MAX_HOLD_SECONDS = 1.0


def hold_seconds(holds: int) -> float:
    """How long a start refused after ``holds`` earlier refusals waits before it asks
    again: :data:`HOLD_SECONDS`, doubling, at most :data:`MAX_HOLD_SECONDS`."""
    return min(MAX_HOLD_SECONDS, HOLD_SECONDS * float(1 << min(holds, 8)))


#: How long a slot released is kept for the start woken in its line (seconds): its
#: message goes to the back of its queue and may wait there behind the queue's backlog;
#: the slot is then free for anyone, and the woken start asks as any start.
RESERVE_SECONDS = 5.0


#: The shortest interval between two renewals of the slots held here (seconds).
MIN_RENEW_SECONDS = 0.2


@dataclass
class Slots:
    """The slots one step start took: given back once, by :meth:`release`."""

    #: Where the slots are counted (None: no slot was taken).
    transport: Transport | None
    keys: tuple[str, ...]
    holder: str
    lease_seconds: float
    released: bool = field(default=False)

    def release(self) -> None:
        """Give the slots back (once; later calls do nothing). A transport out of reach
        is logged: the slots then lapse with their lease."""
        if self.released or self.transport is None:
            return
        self.released = True
        held_here.forget(self)
        try:
            give_back(self.transport, self.keys, self.holder)
        except BrokerUnavailableError as exc:
            logger.warning(
                "concurrency slots %s of %s not given back (%s); they lapse in %.0fs",
                ", ".join(self.keys),
                self.holder,
                exc,
                self.lease_seconds,
            )


def give_back(transport: Transport, keys: Sequence[str], holder: str) -> list[HeldStart]:
    """Give back ``holder``'s slots of ``keys`` and send again at once the first start
    waiting in each one's line, its slot kept for it :data:`RESERVE_SECONDS`
    (:meth:`~pypepper_dramatiq.transport.base.Transport.release_slots`): the starts
    woken.

    Raises:
        BrokerUnavailableError: the transport could not be reached (the slots lapse
            with their lease; the starts in line ask again by their own messages).
    """
    starts = transport.release_slots(keys, holder, RESERVE_SECONDS)
    for start in starts:
        send_again(start)
    return starts


def send_again(start: HeldStart) -> None:
    """Send a woken start again: its message, due now (a broker that refuses it is
    logged: its own delayed copy asks again), or the in-process Worker's wake."""
    if not start.data:
        woken.wake(start.job_id)
        return
    try:
        message = dramatiq.Message.decode(start.data.encode("utf-8"))
        get_transport().send_first(get_broker(), message)
    except Exception as exc:  # a broker down, a message damaged: the delayed copy asks
        logger.warning(
            "job %s: its start woken by a released slot was not sent again (%s); its "
            "delayed message asks again",
            start.job_id,
            exc,
        )
        return
    logger.debug(
        "job %s: sent again, a slot of its concurrency limit freed",
        start.job_id,
        extra={"action": "concurrency_wake", "job_id": start.job_id},
    )


class Wakes:
    """The starts the in-process Worker awaits that a released slot woke, by job id."""

    def __init__(self) -> None:
        self._woken: set[str] = set()
        self._changed = threading.Condition()

    def wake(self, job_id: str) -> None:
        """``job_id``'s start may take its slot now."""
        with self._changed:
            self._woken.add(job_id)
            self._changed.notify_all()

    def take(self, job_id: str) -> bool:
        """Whether ``job_id``'s start was woken (forgotten once told)."""
        with self._changed:
            if job_id in self._woken:
                self._woken.discard(job_id)
                return True
            return False

    def wait(self, job_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``job_id``'s start to be woken."""
        with self._changed:
            self._changed.wait_for(lambda: job_id in self._woken, timeout)
            if job_id in self._woken:
                self._woken.discard(job_id)
                return True
            return False


#: The in-process Worker's starts woken by a released slot.
woken = Wakes()


#: The slots of a step under no limit: nothing taken, nothing to give back.
NO_SLOTS = Slots(None, (), "", 0.0, released=True)


def limits_of(channel_id: str, concurrency_key: str | None = None) -> list[tuple[str, int]]:
    """The limits a step of ``channel_id`` keyed ``concurrency_key`` runs under, as
    (transport key, limit); empty when this process declared none (no I/O)."""
    limits: list[tuple[str, int]] = []
    channel = manager.get(channel_id)
    if channel is not None and channel.max_running is not None:
        limits.append((channel_slot_key(channel_id), channel.max_running))
    limit = key_concurrency.of(concurrency_key)
    if limit is not None and concurrency_key is not None:
        limits.append((KEY_PREFIX + concurrency_key, limit))
    return limits


def limited(channel_id: str, concurrency_key: str | None = None) -> bool:
    """Whether this process declared a concurrency limit for ``channel_id`` or for the
    job key ``concurrency_key`` (no I/O)."""
    channel = manager.get(channel_id)
    if channel is not None and channel.max_running is not None:
        return True
    return key_concurrency.of(concurrency_key) is not None


def try_start(
    channel_id: str,
    concurrency_key: str | None,
    job_id: str,
    owner: str,
    lease_seconds: float,
    held: HeldStart | None = None,
) -> Slots | None:
    """Take a slot of each limit of a step of job ``job_id`` (run by ``owner``) now:
    the slots, renewed from now on until released; None when a limit is reached
    (nothing taken: the start waits in line, as ``held`` says it is sent again). A step
    under no limit gets empty slots, without a call.

    Raises:
        BrokerUnavailableError: the transport could not be reached (nothing taken):
            the caller holds the step and asks again later.
    """
    limits = limits_of(channel_id, concurrency_key)
    if not limits:
        return NO_SLOTS
    channel = manager.get(channel_id)
    transport = channel.transport if channel is not None else get_transport()
    holder = f"{job_id}@{owner}#{uuid.uuid4().hex[:8]}"
    slots = Slots(transport, tuple(key for key, _ in limits), holder, lease_seconds)
    if held is None:
        held = HeldStart(job_id)
    if not transport.acquire_slots(limits, holder, lease_seconds, held):
        return None
    held_here.keep(slots)
    return slots


class HeldSlots:
    """The slots this process holds, their leases renewed by a thread of their own
    while any is held (it ends once none is, and starts again with the next)."""

    def __init__(self) -> None:
        self._held: dict[str, Slots] = {}
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._wake = threading.Event()

    def keep(self, slots: Slots) -> None:
        """Renew ``slots`` until :meth:`forget`."""
        with self._lock:
            self._held[slots.holder] = slots
            if self._keeper is None:
                self._keeper = threading.Thread(
                    target=self._renew_while_held, name="pypepper-slots", daemon=True
                )
                self._keeper.start()

    def forget(self, slots: Slots) -> None:
        """Stop renewing ``slots`` (released)."""
        with self._lock:
            self._held.pop(slots.holder, None)

    def holders(self) -> list[str]:
        """The holders of the slots held here."""
        with self._lock:
            return list(self._held)

    def renew(self) -> None:
        """Renew every slot held here: one call per transport. A transport out of
        reach is logged; the next renewal tries again."""
        with self._lock:
            held = list(self._held.values())
        by_transport: dict[int, list[Slots]] = {}
        for slots in held:
            if slots.transport is None:
                continue
            by_transport.setdefault(id(slots.transport), []).append(slots)
        for group in by_transport.values():
            pairs: Sequence[tuple[str, str]] = [(k, s.holder) for s in group for k in s.keys]
            lease = min(s.lease_seconds for s in group)
            transport = group[0].transport
            assert transport is not None
            try:
                transport.renew_slots(pairs, lease)
            except BrokerUnavailableError as exc:
                logger.warning("concurrency slots not renewed (%s); trying again", exc)

    def _renew_while_held(self) -> None:
        while True:
            with self._lock:
                if not self._held:
                    self._keeper = None
                    return
                interval = max(
                    MIN_RENEW_SECONDS, min(s.lease_seconds for s in self._held.values()) / 3
                )
            self._wake.wait(interval)
            try:
                self.renew()
            except Exception:  # a bug: keep renewing the others
                logger.exception("concurrency slots not renewed; trying again")


#: The slots this process holds.
held_here = HeldSlots()
