"""Admission to a channel: decides "ok", "full" or "stopped" atomically.

A gate counts the jobs waiting in a channel (admitted, not yet taken by a
worker), holds its bound (``maxsize``, 0 = unbounded) and its stop flag.
:class:`LocalGate` does it under a lock for one process; :class:`RedisGate`
does it in Redis with Lua scripts, so that every producer on every machine
shares one bound and one stop flag.

The bound and the stop flag of a :class:`RedisGate` outlive the processes that
set them: a bound is changed by giving one explicitly (a ``maxsize`` when a
process creates the gate, or :meth:`Gate.resize`), a stop is lifted by
:meth:`Gate.resume`. ``pypepper-dramatiq channels`` does both from the shell.

Creating a :class:`RedisGate` does no Redis I/O: the bound it was given is
applied on its first call (or :meth:`RedisGate.connect`), so that a process
whose Redis is down at start (a ``dramatiq`` worker importing a module that
calls ``setup()``) starts anyway, like Dramatiq's own lazy connections.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from .. import redis_batch
from ..errors import BrokerUnavailableError
from ..logs import get_logger
from ..redis_layout import CHANNEL_KEY_PREFIX, WAITING_SUFFIX

SendResult = Literal["ok", "full", "stopped"]


logger = get_logger(__name__)


def _log_bound_change(channel_id: str, before: int, after: int) -> None:
    if before != after:
        logger.info(
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
        """``job_id`` left the channel (taken by a worker, or its enqueue failed)."""

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

    @property
    def connected(self) -> bool:
        """Whether the gate made its first call to the server holding its state.

        Always True for a process-local gate; see :attr:`RedisGate.connected`.
        """
        return True

    def connect(self) -> None:  # noqa: B027 - a no-op unless the state lives elsewhere
        """Reach the gate's state now instead of at its first call (no-op here)."""


class LocalGate(Gate):
    """A process-local gate.

    Args:
        maxsize: the bound (0 or None = unbounded).
        channel_id: the channel's name, for log messages.
    """

    def __init__(self, maxsize: int | None = 0, channel_id: str = "") -> None:
        self.channel_id = channel_id
        self._maxsize = int(maxsize or 0)
        self._waiting: set[str] = set()
        self._stopped = False
        self._lock = threading.Lock()

    def admit(self, job_id: str) -> SendResult:
        with self._lock:
            if self._stopped:
                return "stopped"
            if job_id in self._waiting:
                return "ok"
            if self._maxsize and len(self._waiting) >= self._maxsize:
                return "full"
            self._waiting.add(job_id)
            return "ok"

    def check(self) -> SendResult:
        with self._lock:
            if self._stopped:
                return "stopped"
            if self._maxsize and len(self._waiting) >= self._maxsize:
                return "full"
            return "ok"

    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        admitted = []
        with self._lock:
            for job_id in job_ids:
                room = not self._maxsize or len(self._waiting) < self._maxsize
                if job_id in self._waiting or room:
                    self._waiting.add(job_id)
                    admitted.append(True)
                else:
                    admitted.append(False)
        return admitted

    def release(self, job_id: str) -> None:
        with self._lock:
            self._waiting.discard(job_id)

    def request_stop(self) -> None:
        with self._lock:
            self._stopped = True

    def resume(self) -> None:
        with self._lock:
            self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def maxsize(self) -> int:
        return self._maxsize

    def resize(self, maxsize: int) -> int:
        with self._lock:
            before, self._maxsize = self._maxsize, int(maxsize)
        _log_bound_change(self.channel_id, before, int(maxsize))
        return before

    def waiting(self) -> int:
        return len(self._waiting)


# KEYS[1]: the channel's hash (maxsize, stopped); KEYS[2]: the set of waiting job ids.
_ADMIT = """
if redis.call('hget', KEYS[1], 'stopped') == '1' then return 'stopped' end
if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then return 'ok' end
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
if maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then return 'full' end
redis.call('sadd', KEYS[2], ARGV[1])
return 'ok'
"""

# Same keys, no change: what _ADMIT would answer a new job now.
_CHECK = """
if redis.call('hget', KEYS[1], 'stopped') == '1' then return 'stopped' end
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
if maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then return 'full' end
return 'ok'
"""

# Same keys; ARGV: job ids held until now. Admits each while the bound allows,
# whatever the stop flag; answers 1 (admitted or already counted) or 0 per id.
_ADMIT_RELEASED = """
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
local answers = {}
for i, job_id in ipairs(ARGV) do
  if redis.call('sismember', KEYS[2], job_id) == 1 then
    answers[i] = 1
  elseif maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then
    answers[i] = 0
  else
    redis.call('sadd', KEYS[2], job_id)
    answers[i] = 1
  end
end
return answers
"""

# _ADMIT and Dramatiq's enqueue in one step, for one or more jobs (of any channels).
# KEYS holds four keys per (channel, queue) pair the jobs use, each pair once: the
# channel's hash, its set of waiting job ids, the Dramatiq queue (a list of message
# ids) and its message hash. Per job i, ARGV[4i-3] to ARGV[4i]: its pair's number
# (1, 2...), the job id, the message's redis_message_id, the encoded message.
# Answers 'ok', 'full' or 'stopped' per job; for each 'ok' the job is counted
# waiting and its message queued as the broker's own "enqueue" command does. A
# channel's flag, bound and count are read once per call (nothing else runs
# meanwhile), then counted here.
_ADMIT_AND_ENQUEUE = """
local answers, channels = {}, {}
for i = 1, #ARGV / 4 do
  local base = 4 * tonumber(ARGV[4 * i - 3])
  local meta, waiting, job_id = KEYS[base - 3], KEYS[base - 2], ARGV[4 * i - 2]
  local channel = channels[meta]
  if channel == nil then
    local found = redis.call('hmget', meta, 'stopped', 'maxsize')
    channel = {
      stopped = found[1] == '1',
      maxsize = tonumber(found[2] or '0'),
      size = redis.call('scard', waiting),
    }
    channels[meta] = channel
  end
  local answer = 'ok'
  if channel.stopped then
    answer = 'stopped'
  elseif redis.call('sismember', waiting, job_id) == 0 then
    if channel.maxsize > 0 and channel.size >= channel.maxsize then
      answer = 'full'
    else
      redis.call('sadd', waiting, job_id)
      channel.size = channel.size + 1
    end
  end
  if answer == 'ok' then
    redis.call('hset', KEYS[base], ARGV[4 * i - 1], ARGV[4 * i])
    redis.call('rpush', KEYS[base - 1], ARGV[4 * i - 1])
  end
  answers[i] = answer
end
return answers
"""

# KEYS[1]: the channel's hash. Sets the bound to ARGV[1] and answers the bound it
# replaced (false when none was stored), in one step, so that the change logged is
# the change made even when two processes resize at once.
_SET_BOUND = """
local before = redis.call('hget', KEYS[1], 'maxsize')
redis.call('hset', KEYS[1], 'maxsize', ARGV[1])
return before
"""


F = TypeVar("F", bound=Callable[..., Any])


def _broker_errors(method: F) -> F:
    """Redis errors become :class:`BrokerUnavailableError`, naming the channel."""

    @functools.wraps(method)
    def wrapper(self: RedisGate, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            raise BrokerUnavailableError(
                f"Redis unreachable for channel {self.channel_id}: {exc}"
            ) from exc

    return cast(F, wrapper)


def _connected_first(method: F) -> F:
    """Apply the gate's pending bound (:meth:`RedisGate.connect`) before ``method``.

    Also turns Redis errors into :class:`BrokerUnavailableError`, for both.
    """

    @functools.wraps(method)
    def wrapper(self: RedisGate, *args: Any, **kwargs: Any) -> Any:
        if not self._connected:  # the common case is one attribute read
            self.connect()
        return method(self, *args, **kwargs)

    return cast(F, _broker_errors(wrapper))


def _is_redis_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("redis.")


class RedisGate(Gate):
    """A gate shared by every process through Redis.

    The bound lives in Redis and outlives every process. A process that
    creates its gate with an explicit ``maxsize`` (``setup(channels={"c": 5})``,
    YAML ``scheduler.channels``, ``manager.new("c", maxsize=5)``) writes it,
    replacing the stored one (logged at INFO when it changes: ``channel c:
    bound 2 -> 5``); without one (``maxsize=None``: a producer sending to a
    channel, ``setup(channels=["c"])``) the stored bound is kept, and a
    channel with none stored is unbounded. The stop flag likewise stays set
    until :meth:`resume`.

    Creating the gate does no Redis I/O (``register_script`` only hashes the
    scripts): the given bound is written by the gate's first call (admit,
    release, waiting, stopped, maxsize, resize, request_stop, resume) or by
    :meth:`connect`. While Redis is down that first call raises
    :class:`BrokerUnavailableError` and the next call tries again.

    Args:
        client: a ``redis.Redis`` client.
        channel_id: the channel's name.
        maxsize: the bound to store (0 = unbounded), or None to keep the stored one.
    """

    def __init__(self, client: Any, channel_id: str, maxsize: int | None = None) -> None:
        self.channel_id = channel_id
        self.client = client
        base = f"{CHANNEL_KEY_PREFIX}{channel_id}"
        self.meta_key = base
        self.waiting_key = f"{base}{WAITING_SUFFIX}"
        # Script objects only: the SHA is computed here, the script is sent to
        # Redis by its first call (EVALSHA, then SCRIPT LOAD if Redis lacks it).
        self._admit = client.register_script(_ADMIT)
        self._check = client.register_script(_CHECK)
        self._admit_released = client.register_script(_ADMIT_RELEASED)
        self._set_bound = client.register_script(_SET_BOUND)
        self._admit_and_enqueue = client.register_script(_ADMIT_AND_ENQUEUE)
        #: The bound to write on the first call; None: keep the stored one.
        self._bound = None if maxsize is None else int(maxsize)
        self._connected = False
        self._connect_lock = threading.Lock()

    @property
    def connected(self) -> bool:
        """Whether the bound given at creation was applied in Redis (a call succeeded)."""
        return self._connected

    @_broker_errors
    def connect(self) -> None:
        """Apply the bound given at creation, once; later calls return at once.

        Without a given bound the channel's hash is made to exist (the stored
        bound is left alone), so that ``pypepper-dramatiq channels`` lists
        channels nobody bounded. Every call of the gate does this first.

        Raises:
            BrokerUnavailableError: Redis could not be reached; the next call tries again.
        """
        # One thread applies the bound; the others wait for it rather than
        # writing it again (which would log the change twice). Calls check the
        # flag before coming here, so the lock is taken only until it worked.
        with self._connect_lock:
            if self._connected:
                return
            if self._bound is None:
                self.client.hsetnx(self.meta_key, "maxsize", 0)
            else:
                self._store_bound(self._bound)
            self._connected = True

    def _store_bound(self, maxsize: int) -> int:
        before = self._set_bound(keys=[self.meta_key], args=[maxsize])
        if before is None:  # nothing was stored: the channel was unbounded, silently
            return 0
        _log_bound_change(self.channel_id, int(before), maxsize)
        return int(before)

    @_connected_first
    def admit(self, job_id: str) -> SendResult:
        result = self._admit(keys=[self.meta_key, self.waiting_key], args=[job_id])
        if isinstance(result, bytes):
            result = result.decode()
        return cast(SendResult, result)

    @_connected_first
    def admit_and_enqueue(self, offer: Offer) -> SendResult:
        """:meth:`admit` ``offer``'s job and, if "ok", queue its message: one round trip."""
        return _run_offers(self._admit_and_enqueue, [offer])[0]

    @_connected_first
    def check(self) -> SendResult:
        result = self._check(keys=[self.meta_key, self.waiting_key])
        if isinstance(result, bytes):
            result = result.decode()
        return cast(SendResult, result)

    @_connected_first
    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        if not job_ids:
            return []
        answers = self._admit_released(keys=[self.meta_key, self.waiting_key], args=list(job_ids))
        return [bool(answer) for answer in answers]

    @_connected_first
    def release(self, job_id: str) -> None:
        # Coalesced with the other threads' releases and job-end notices.
        redis_batch.send(self.client, "SREM", self.waiting_key, job_id)

    @_connected_first
    def request_stop(self) -> None:
        self.client.hset(self.meta_key, "stopped", "1")

    @_connected_first
    def resume(self) -> None:
        self.client.hdel(self.meta_key, "stopped")

    @property
    @_connected_first
    def stopped(self) -> bool:
        value = self.client.hget(self.meta_key, "stopped")
        return value in (b"1", "1")

    @property
    @_connected_first
    def maxsize(self) -> int:
        """The bound stored in Redis now (one round trip: another process may resize it)."""
        return int(self.client.hget(self.meta_key, "maxsize") or 0)

    @_broker_errors
    def resize(self, maxsize: int) -> int:
        maxsize = int(maxsize)
        with self._connect_lock:
            if not self._connected:
                # A newer explicit bound: the one given at creation is never
                # written (it would be logged as a change, then undone). If
                # Redis is down, that one stays pending and this call raises.
                before = self._store_bound(maxsize)
                self._bound, self._connected = maxsize, True
                return before
        return self._store_bound(maxsize)

    @_connected_first
    def waiting(self) -> int:
        return int(self.client.scard(self.waiting_key))

    @_broker_errors
    def reset(self) -> None:
        """Forget the stop flag, the bound and the waiting set (tests, re-provisioning).

        A bound given at creation and not yet applied is forgotten too: the
        channel stays as reset (open, unbounded, empty) until someone bounds it.
        """
        self.client.delete(self.meta_key, self.waiting_key)
        with self._connect_lock:
            self._bound, self._connected = None, True


@dataclass(frozen=True)
class Offer:
    """A job offered to a channel with its first message, for one round trip.

    The message is ready as the Redis broker would store it
    (:func:`~pypepper_dramatiq.redis_layout.enqueue_options`): ``queue_key`` and
    ``messages_key`` are its queue's list and hash, ``message_id`` its
    ``redis_message_id``, ``data`` its encoded form.
    """

    gate: RedisGate
    job_id: str
    queue_key: str
    messages_key: str
    message_id: str
    data: bytes


def admit_and_enqueue(offers: Sequence[Offer]) -> list[SendResult]:
    """Admit each job of ``offers`` to its channel and queue the message of each one
    admitted, in order, in one Redis round trip (one Lua script): "ok", "full" or
    "stopped" per offer, as :meth:`Gate.admit` answers. The gates share the broker's
    client; each applies its pending bound first (:meth:`RedisGate.connect`, no
    I/O once done).

    Raises:
        BrokerUnavailableError: Redis could not be reached.
    """
    if not offers:
        return []
    gates = {id(offer.gate): offer.gate for offer in offers}
    for gate in gates.values():
        gate.connect()
    first = offers[0].gate
    try:
        return _run_offers(first._admit_and_enqueue, offers)
    except Exception as exc:
        if not _is_redis_error(exc):
            raise
        channels = ", ".join(sorted({gate.channel_id for gate in gates.values()}))
        raise BrokerUnavailableError(f"Redis unreachable for channel {channels}: {exc}") from exc


def _run_offers(script: Any, offers: Sequence[Offer]) -> list[SendResult]:
    # The keys of each (channel, queue) pair go once: a batch of one channel's jobs
    # sends four keys, and four arguments a job.
    keys: list[str] = []
    pairs: dict[tuple[str, str], str] = {}
    args: list[str | bytes] = []
    for offer in offers:
        pair = pairs.get((offer.gate.meta_key, offer.queue_key))
        if pair is None:
            pair = pairs[offer.gate.meta_key, offer.queue_key] = str(len(pairs) + 1)
            keys += [
                offer.gate.meta_key,
                offer.gate.waiting_key,
                offer.queue_key,
                offer.messages_key,
            ]
        args += [pair, offer.job_id, offer.message_id, offer.data]
    answers = script(keys=keys, args=args)
    return [
        cast(SendResult, answer.decode() if isinstance(answer, bytes) else answer)
        for answer in answers
    ]


@dataclass(frozen=True)
class ChannelState:
    """One channel as Redis holds it now."""

    name: str
    waiting: int
    maxsize: int
    stopped: bool


def channel_states(client: Any) -> list[ChannelState]:
    """Every channel with a key in Redis (its hash, or its set of waiting jobs), by
    name: one scan per kind of key, then one pipeline for all of them.

    A channel's hash exists once a process used it; the sets are looked at too, in
    case the hash was deleted by hand while jobs waited.
    """
    names: set[str] = set()
    for key in client.scan_iter(match=f"{CHANNEL_KEY_PREFIX}*", count=500, _type="hash"):
        names.add(key.decode()[len(CHANNEL_KEY_PREFIX) :])
    for key in client.scan_iter(
        match=f"{CHANNEL_KEY_PREFIX}*{WAITING_SUFFIX}", count=500, _type="set"
    ):
        names.add(key.decode()[len(CHANNEL_KEY_PREFIX) : -len(WAITING_SUFFIX)])
    ordered = sorted(names)
    if not ordered:
        return []
    pipe = client.pipeline(transaction=False)
    for name in ordered:
        pipe.scard(f"{CHANNEL_KEY_PREFIX}{name}{WAITING_SUFFIX}")
        pipe.hmget(f"{CHANNEL_KEY_PREFIX}{name}", "maxsize", "stopped")
    answers = pipe.execute()
    states = []
    for i, name in enumerate(ordered):
        waiting, (maxsize, stopped) = answers[2 * i], answers[2 * i + 1]
        states.append(ChannelState(name, int(waiting), int(maxsize or 0), stopped in (b"1", "1")))
    return states
