"""What the engine needs from the server that coordinates its processes, besides the
job store: one :class:`Transport`.

A transport admits jobs to channels (:class:`Gate`: a bound and a stop flag every
process shares), queues a job's first message with its admission when it can
(:meth:`Transport.admit_and_enqueue`), carries the notices between processes
(cancels, job ends, the announcement of a listener: :class:`Topic`), holds the
recovery sweep's leader lock, and finds what dead workers left. The package
holds one, chosen with the broker (``pypepper_dramatiq.channels.broker``): the
in-process one by default (:mod:`.local`), Redis's with Dramatiq's Redis broker
(:mod:`.redis`). Nothing in these signatures names a key, a script or a pipeline:
another server (PostgreSQL's LISTEN/NOTIFY and advisory locks next to RabbitMQ)
implements the same methods.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

import dramatiq

from ..limits.rates import IDLE_KEEP_SECONDS, Rate
from ..ops.logs import get_logger

SendResult = Literal["ok", "full", "stopped"]

#: The logger of admissions (its name predates this package: kept for log filters).
admission_logger = get_logger("pypepper_dramatiq.channels.admission")


def log_bound_change(channel_id: str, before: int, after: int) -> None:
    """Log at INFO that the bound of ``channel_id`` changed (nothing if it did not)."""
    if before != after:
        admission_logger.info(
            "channel %s: bound %d -> %d",
            channel_id,
            before,
            after,
            extra={
                "action": "resize_channel",
                "channel_id": channel_id,
                "from": before,
                "to": after,
            },
        )


class Gate(abc.ABC):
    """Admission state of one channel: waiting jobs, bound and stop flag."""

    channel_id: str

    @abc.abstractmethod
    def admit(self, job_id: str) -> SendResult:
        """Count ``job_id`` as waiting unless stopped or full. Re-admitting is "ok"."""

    @abc.abstractmethod
    def check(self) -> SendResult:
        """What :meth:`admit` would answer a new job now, admitting nothing."""

    @abc.abstractmethod
    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        """Admit jobs accepted earlier and held until now, unless the bound is reached.

        The stop flag does not apply: these jobs were accepted before it (a stop
        refuses new jobs; accepted ones still run). True for each job admitted
        (or already counted); one call (one round trip) for all of them.
        """

    @abc.abstractmethod
    def release(self, job_id: str) -> None:
        """``job_id`` left the channel (taken by a worker, or its enqueue failed).

        Called by every thread that ends a job: a transport may send the releases
        of concurrent callers together."""

    def release_many(self, job_ids: Sequence[str]) -> None:
        """The jobs ``job_ids`` left the channel together (the first steps of one
        fetch, claimed ahead): a transport may give their slots back in one call."""
        for job_id in job_ids:
            self.release(job_id)

    @abc.abstractmethod
    def request_stop(self) -> None:
        """Refuse every later admission, until :meth:`resume`."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Clear the stop flag: admissions are decided by the bound again."""

    @property
    @abc.abstractmethod
    def stopped(self) -> bool:
        """Whether a stop was requested (and not resumed)."""

    @property
    @abc.abstractmethod
    def maxsize(self) -> int:
        """How many jobs may wait at once (0 = unbounded)."""

    @abc.abstractmethod
    def resize(self, maxsize: int) -> int:
        """Set the bound to ``maxsize`` (0 = unbounded); returns the bound it replaced.

        Jobs already waiting stay, even beyond a smaller bound: admissions are
        refused until enough of them have left.
        """

    @abc.abstractmethod
    def waiting(self) -> int:
        """How many jobs wait."""

    @abc.abstractmethod
    def waiting_ids(self, cursor: int, count: int) -> tuple[int, list[str]]:
        """Some of the ids counted waiting, from ``cursor`` (0: the start): the cursor
        to go on from (0: the end was reached) and about ``count`` ids.

        For the recovery sweep, which gives back the slots of jobs that left the
        channel while their release could not be made. Going from 0 to 0 returns
        every id waiting throughout (an id may come twice).
        """

    @property
    def connected(self) -> bool:
        """Whether the gate made its first call to the server holding its state.

        Always True for a process-local gate.
        """
        return True

    def connect(self) -> None:  # noqa: B027 - a no-op unless the state lives elsewhere
        """Reach the gate's state now instead of at its first call (no-op here)."""

    def known(self) -> bool:
        """Whether the server holds some state of this channel (always, in-process)."""
        return True


@dataclass(frozen=True)
class Admission:
    """A job offered to its channel's gate with its first message, for one call
    (:meth:`Transport.admit_and_enqueue`).

    The message carries the options its transport gives a message as the broker
    enqueues it (:meth:`Transport.message_options`); ``data`` is its encoded form.
    """

    gate: Gate
    job_id: str
    message: dramatiq.Message[Any]
    data: bytes


@dataclass(frozen=True)
class ChannelState:
    """One channel as the coordinating server holds it now."""

    name: str
    waiting: int
    maxsize: int
    stopped: bool
    #: The rate limit a worker last applied to the channel's starts (``"5/s"``); None:
    #: none asked yet.
    rate_limit: str | None = None
    #: The concurrency limit a worker last applied to the channel's steps
    #: (``max_running``); None: none asked yet.
    max_running: int | None = None
    #: The slots of that limit held now, on every worker (None: no limit known).
    running: int | None = None


#: The prefix of a channel's concurrency limit key (:func:`channel_slot_key`).
CHANNEL_SLOT_PREFIX = "channel:"
#: The prefix of the holder of a slot kept for a held start woken by a release
#: (:meth:`Transport.release_slots`): ``held:<job id>``.
RESERVED_PREFIX = "held:"


@dataclass(frozen=True)
class HeldStart:
    """A step start a concurrency limit refused, waiting on the transport for a slot of
    it (:meth:`Transport.acquire_slots`), one per job: in line by priority (highest
    first), then by when it was first held."""

    job_id: str
    #: The job's priority (0 to 9).
    priority: int = 0
    #: The step's message to send again when a slot frees (Dramatiq's encoded form);
    #: empty for a start the in-process Worker awaits (it is woken in its process).
    data: str = ""


#: The concurrency limits a start asks a slot of (:meth:`Transport.acquire_slots`): each
#: limit's key, and how many may hold a slot of it at once.
SlotLimits: TypeAlias = Sequence[tuple[str, int]]


def channel_slot_key(channel_id: str) -> str:
    """The concurrency limit key of a channel's running steps (:meth:`Transport.acquire_slots`)."""
    return f"{CHANNEL_SLOT_PREFIX}{channel_id}"


def channel_rate_key(channel_id: str) -> str:
    """The rate limit key of a channel's step starts (:meth:`Transport.ask_start`)."""
    return f"channel:{channel_id}"


class Topic(enum.Enum):
    """What a notice between processes is about; each carries one text (a job id)."""

    #: A job was cancelled by a call: running attempts stop, waiters read its row.
    CANCEL = "cancel"
    #: A job ended (Completed, Failed, or Cancelled other than by a call): waiters read it.
    ENDED = "ended"
    #: A process started listening for job ends: quiet workers publish them again.
    LISTENING = "listening"


@dataclass(frozen=True)
class Notice:
    """One notice heard on a :class:`Subscription`."""

    topic: Topic
    text: str


@dataclass(frozen=True)
class Subscribed:
    """A :class:`Subscription` was confirmed for ``count`` of its topics (again, after
    a reconnection): what was published while it was not is lost."""

    count: int


class Subscription(abc.ABC):
    """A subscription to some topics, read by one thread."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> Notice | Subscribed | None:
        """The next event, waiting up to ``timeout`` seconds; None if none came.

        Raises:
            Exception: the connection was lost (the caller subscribes again).
        """

    @abc.abstractmethod
    def add(self, topics: Collection[Topic]) -> None:
        """Subscribe to ``topics`` too (confirmed by a later poll).

        Raises:
            Exception: the connection was lost.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """End the subscription."""


class Transport(abc.ABC):
    """The coordination a broker's processes share (see the module's docstring)."""

    #: Where the channels' state is read, for people ("Redis", "this process").
    where: str

    #: Whether other processes share this state: workers elsewhere take the jobs,
    #: the broker keeps a message's delay, and the workers' recovery sweep releases
    #: the jobs held in the store (a long delay, a wait, a transaction). False
    #: in-process: the message goes at once, and this process holds the jobs it sent
    #: until it takes them.
    shared: ClassVar[bool]

    #: Whether the broker takes a message for a queue this process never declared
    #: (declaring one in a worker process makes it consume that queue).
    takes_undeclared_queues: ClassVar[bool]

    #: Whether a job of a priority above the lowest goes to a queue of its own
    #: (``<channel>.p<priority>``, :func:`~pypepper_dramatiq.rules.priorities.queue_name`):
    #: a broker that pops each queue in order (Redis) would otherwise keep it behind
    #: the backlog. False: the broker orders the messages (or this process does).
    priority_queues: ClassVar[bool] = False

    # -- admission -----------------------------------------------------------------------

    @abc.abstractmethod
    def gate(self, channel_id: str, maxsize: int | None = None) -> Gate:
        """The admission gate of ``channel_id``; ``maxsize`` None keeps the stored bound.

        Creating a gate does no I/O: its first call does (or :meth:`Gate.connect`)."""

    @abc.abstractmethod
    def enqueues_with(self, gate: Gate) -> bool:
        """Whether :meth:`admit_and_enqueue` admits jobs through ``gate`` and queues
        their messages in one call; when not, a channel admits, then the broker
        enqueues."""

    def message_options(
        self, queue_name: str, delay: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The queue and the options the broker gives a message for ``queue_name``
        (delayed ``delay`` ms) as it enqueues it: for a message queued by
        :meth:`admit_and_enqueue` instead of the broker."""
        return queue_name, {}

    def admit_and_enqueue(self, offers: Sequence[Admission]) -> list[SendResult]:
        """Admit each job of ``offers`` and queue the message of each one admitted, in
        order, in one call: "ok", "full" or "stopped" per offer.

        Raises:
            BrokerUnavailableError: the server could not be reached.
            NotImplementedError: this transport does not (:meth:`enqueues_with`).
        """
        raise NotImplementedError(f"{type(self).__name__} admits and enqueues apart")

    @abc.abstractmethod
    def channel_states(self) -> list[ChannelState] | None:
        """Every channel the server knows, by name; None when the state lives in
        each process (the caller lists its own channels).

        Raises:
            Exception: the server could not be read.
        """

    # -- rate limits ---------------------------------------------------------------------

    @abc.abstractmethod
    def ask_start(self, key: str, rate: Rate, told: bool = False) -> float:
        """Ask to start now under rate limit ``key`` (``rate`` written down with it, for
        people), counted for every process:
        0.0 when granted (counted), else the seconds after which to ask again (nothing
        counted).

        A start is granted while fewer than ``rate.count`` were granted within the last
        ``rate.period`` (a sliding window, on the server's clock): at most N starts in
        any window of one period, measured when they ask. The starts refused are each
        told a time of their own, no earlier than when the oldest start leaves the
        window and one ``rate.interval`` after the last one told, so that they come
        back one by one rather than all at once. A start ``told`` a time already (it
        comes back at it) and refused again keeps its place in line: it is told when the
        oldest start leaves the window, and the line behind it does not move (pushed
        behind the line, each such start would leave its turn unused: the limit's rate
        would not be reached). One round trip, atomic on the server.

        Raises:
            BrokerUnavailableError: the server could not be reached (nothing counted).
        """

    def prune_rate_keys(self, idle_seconds: float = IDLE_KEEP_SECONDS, limit: int = 1000) -> int:
        """Forget at most ``limit`` rate limit keys unused for ``idle_seconds`` (see
        :data:`~pypepper_dramatiq.limits.rates.IDLE_KEEP_SECONDS`): a key of many (a
        tenant's) must not be kept for ever. Returns how many were forgotten. The
        recovery sweep's leader calls it; a transport whose keys expire by themselves
        (Redis: ``PEXPIRE`` at each start) forgets nothing here.

        Raises:
            BrokerUnavailableError: the server could not be reached.
        """
        return 0

    # -- concurrency limits --------------------------------------------------------------

    @abc.abstractmethod
    def acquire_slots(
        self, limits: SlotLimits, holder: str, lease_seconds: float, held: HeldStart | None = None
    ) -> bool:
        """Take one slot of each limit of ``limits`` (key, how many may be held at once)
        for ``holder``, all or none, counted for every process: True when taken.

        A key's slots are its holders whose lease has not lapsed: a holder that
        neither released nor renewed its slot within ``lease_seconds`` (on the
        server's clock; a dead worker) no longer counts. A holder already counted
        under a key keeps its slot (its lease renewed). One round trip, atomic on the
        server.

        ``held``: the start asking (its job). A slot a release kept for that job
        (:meth:`release_slots`) is taken over by ``holder``. Refused, the start waits
        in line under each key that was full (where it waits already, it keeps its
        place); taken, it leaves every line of ``limits``.

        Raises:
            BrokerUnavailableError: the server could not be reached (nothing taken).
        """

    @abc.abstractmethod
    def release_slots(
        self, keys: Sequence[str], holder: str, reserve_seconds: float = 0.0
    ) -> list[HeldStart]:
        """Give back ``holder``'s slot of each of ``keys`` (one it does not hold: nothing).

        With ``reserve_seconds``, for each key given back, the first start waiting in its
        line (:meth:`acquire_slots`) leaves it and the slot is kept for its job that
        long (holder ``held:<job id>``): the starts to send again now, which the caller
        sends (a start not sent is not lost: its own delayed message asks again, and
        the kept slot lapses). One round trip, atomic on the server.

        Raises:
            BrokerUnavailableError: the server could not be reached (the slots lapse
                with their lease).
        """

    def send_first(self, broker: Any, message: dramatiq.Message[Any]) -> None:
        """Send ``message`` (a held start a release woke) so that its queue gives it
        before the messages waiting there, where the broker allows (Redis: at the head
        of the list); elsewhere enqueue it as any (RabbitMQ orders by priority).

        Raises:
            Exception: the broker's, when it was not sent.
        """
        broker.enqueue(message)

    def ack_fetched(self, consumer: Any, messages: Sequence[Any]) -> bool:
        """Acknowledge ``messages`` that Dramatiq's ``consumer`` fetched in one round
        trip, where the broker allows it: True when done. False (here: always) leaves
        them to the caller, which acknowledges them one by one (idempotent, so also
        after a failed batch)."""
        return False

    @abc.abstractmethod
    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        """Push the lease of each (key, holder) of ``held`` to ``lease_seconds`` from
        now; a slot that lapsed already is not taken again. One round trip.

        Raises:
            BrokerUnavailableError: the server could not be reached.
        """

    @abc.abstractmethod
    def slots_held(self, key: str) -> list[str]:
        """The holders of ``key``'s slots whose lease has not lapsed (for people and tests).

        Raises:
            BrokerUnavailableError: the server could not be reached.
        """

    # -- notices -------------------------------------------------------------------------

    @abc.abstractmethod
    def publish(self, topic: Topic, text: str) -> int | None:
        """Send ``text`` on ``topic`` to every subscriber of every process: how many
        heard it (None: this transport cannot tell, or reaches no other process).
        Job ends come from many threads at once: a transport may send those
        of concurrent callers together.

        Raises:
            Exception: it could not be sent.
        """

    @property
    @abc.abstractmethod
    def carries_notices(self) -> bool:
        """Whether notices reach other processes (:meth:`subscribe` can hear them)."""

    @abc.abstractmethod
    def subscribe(self, topics: Collection[Topic]) -> Subscription:
        """A new subscription to ``topics``, asked for now (confirmed by a poll).

        Raises:
            NotImplementedError: no notices here (:attr:`carries_notices`).
        """

    @property
    @abc.abstractmethod
    def connection(self) -> Any:
        """An identity of the connection notices travel on: a subscriber made for
        another one (another broker was installed) is replaced."""

    # -- the recovery sweep --------------------------------------------------------------

    @abc.abstractmethod
    def lead(self, owner: str, ttl_seconds: float) -> bool:
        """Take the sweep leader's lock for ``owner``, or keep it: True while ``owner``
        holds it. The lock lapses ``ttl_seconds`` after its last renewal."""

    @abc.abstractmethod
    def requeue_dead_workers(self, queue_name: str) -> None:
        """Put back on ``queue_name`` the messages dead workers fetched and never
        acknowledged (a no-op where the broker does it by itself)."""

    @abc.abstractmethod
    def queues_held_by_dead_workers(self) -> set[str]:
        """The queues some dead worker holds messages of, whatever it served."""

    @abc.abstractmethod
    def messages_exist(self, messages: Sequence[tuple[str, str | None]]) -> list[bool] | None:
        """Whether each message (queue, id recorded when it was sent) still waits, is
        delayed or is held by a worker; None when this transport cannot tell
        (nothing is lost here)."""

    # -- what a worker's consumers hold --------------------------------------------------

    #: The option naming a message's copy in the broker (checked on what a worker
    #: fetches), or None when messages carry none.
    message_id_option: str | None = None

    def find_fetched(self, queue_name: str, data: bytes | str) -> list[str]:
        """The ids, among those this worker fetched from ``queue_name`` and did not
        acknowledge, of the messages stored as ``data`` (none where messages carry
        no id)."""
        return []

    def fetched_ids(self, queue_name: str) -> set[str] | None:
        """The ids of the messages this worker fetched from ``queue_name`` and did not
        acknowledge; None where that is not kept."""
        return None

    def stored_messages(self, queue_name: str, message_ids: Sequence[str]) -> list[Any]:
        """The encoded messages ``message_ids`` of ``queue_name`` (None per id gone)."""
        return [None] * len(message_ids)

    def requeue(self, queue_name: str, message_ids: Sequence[str]) -> None:  # noqa: B027
        """Put messages this worker fetched back on ``queue_name`` (no-op here)."""
