"""Admission to a channel shared by every process through Redis (Lua scripts).

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

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from ...errors import BrokerUnavailableError
from ..base import (
    Admission,
    ChannelState,
    Gate,
    SendResult,
    channel_rate_key,
    channel_slot_key,
    log_bound_change,
)
from . import batch
from .layout import (
    CHANNEL_KEY_PREFIX,
    RATE_KEY_PREFIX,
    SLOTS_KEY_PREFIX,
    WAITING_SUFFIX,
    messages_key,
    queue_key,
)
from .scripts import call_script, scripts_of

F = TypeVar("F", bound=Callable[..., Any])


def _broker_errors(method: F) -> F:
    """Redis errors become :class:`BrokerUnavailableError`, naming the channel."""

    @functools.wraps(method)
    def wrapper(self: RedisGate, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not is_redis_error(exc):
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


def is_redis_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of redis-py's."""
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

    Creating the gate does no Redis I/O (the scripts are registered once per
    client, which only hashes them): the given bound is written by the gate's
    first call (admit, release, waiting, stopped, maxsize, resize, request_stop,
    resume) or by :meth:`connect`. While Redis is down that first call raises
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
        self._scripts = scripts_of(client)
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
        before = self._scripts.set_bound(keys=[self.meta_key], args=[maxsize])
        if before is None:  # nothing was stored: the channel was unbounded, silently
            return 0
        log_bound_change(self.channel_id, int(before), maxsize)
        return int(before)

    @_connected_first
    def admit(self, job_id: str) -> SendResult:
        result = self._scripts.admit(keys=[self.meta_key, self.waiting_key], args=[job_id])
        if isinstance(result, bytes):
            result = result.decode()
        return cast(SendResult, result)

    @_connected_first
    def check(self) -> SendResult:
        result = self._scripts.check(keys=[self.meta_key, self.waiting_key])
        if isinstance(result, bytes):
            result = result.decode()
        return cast(SendResult, result)

    @_connected_first
    def admit_released(self, job_ids: Sequence[str]) -> list[bool]:
        if not job_ids:
            return []
        answers = self._scripts.admit_released(
            keys=[self.meta_key, self.waiting_key], args=list(job_ids)
        )
        return [bool(answer) for answer in answers]

    @_connected_first
    def release(self, job_id: str) -> None:
        # Coalesced with the other threads' releases and job-end notices.
        batch.send(self.client, "SREM", self.waiting_key, job_id)

    @_connected_first
    def release_many(self, job_ids: Sequence[str]) -> None:
        if job_ids:  # one SREM for all of them
            batch.send(self.client, "SREM", self.waiting_key, *job_ids)

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

    @_connected_first
    def waiting_ids(self, cursor: int, count: int) -> tuple[int, list[str]]:
        """One SSCAN of the waiting set (``count`` is Redis's hint: a small set comes
        whole)."""
        after, members = self.client.sscan(self.waiting_key, cursor, count=count)
        return int(after), [_text(member) for member in members]

    @_broker_errors
    def reset(self) -> None:
        """Forget the stop flag, the bound and the waiting set (tests, re-provisioning).

        A bound given at creation and not yet applied is forgotten too: the
        channel stays as reset (open, unbounded, empty) until someone bounds it.
        """
        self.client.delete(self.meta_key, self.waiting_key)
        with self._connect_lock:
            self._bound, self._connected = None, True

    def known(self) -> bool:
        """Whether Redis holds a key of this channel (its hash or its waiting set)."""
        return bool(self.client.exists(self.meta_key, self.waiting_key))


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def admit_and_enqueue(broker: Any, offers: Sequence[Admission]) -> list[SendResult]:
    """Admit each job of ``offers`` to its channel and queue the message of each one
    admitted on ``broker`` (Dramatiq's Redis broker), in order, in one Redis round
    trip (one Lua script): "ok", "full" or "stopped" per offer. The gates share
    the broker's client; each applies its pending bound first
    (:meth:`RedisGate.connect`, no I/O once done).

    Raises:
        BrokerUnavailableError: Redis could not be reached.
    """
    if not offers:
        return []
    gates = {id(offer.gate): cast(RedisGate, offer.gate) for offer in offers}
    for gate in gates.values():
        gate.connect()
    first = cast(RedisGate, offers[0].gate)
    try:
        return run_offers(first._scripts.admit_and_enqueue, offers, broker)
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        channels = ", ".join(sorted({gate.channel_id for gate in gates.values()}))
        raise BrokerUnavailableError(f"Redis unreachable for channel {channels}: {exc}") from exc


def run_offers(script: Any, offers: Sequence[Admission], broker: Any) -> list[SendResult]:
    """Run ``script`` (admit_and_enqueue.lua) for ``offers`` on ``broker``'s queues."""
    # The keys of each (channel, queue) pair go once: a batch of one channel's jobs
    # sends four keys, and four arguments a job.
    keys: list[str] = []
    pairs: dict[tuple[str, str], str] = {}
    args: list[str | bytes] = []
    for offer in offers:
        gate = cast(RedisGate, offer.gate)
        queue = offer.message.queue_name
        pair = pairs.get((gate.meta_key, queue))
        if pair is None:
            pair = pairs[gate.meta_key, queue] = str(len(pairs) + 1)
            keys += [
                gate.meta_key,
                gate.waiting_key,
                queue_key(broker, queue),
                messages_key(broker, queue),
            ]
        args += [pair, offer.job_id, offer.message.options["redis_message_id"], offer.data]
    answers = call_script(script, keys, args)
    if isinstance(answers, str):  # a client that decodes its replies
        answers = answers.encode()
    return [_ANSWERS[letter] for letter in answers]


#: The script's answer per job: one letter (its byte) of its one string.
_ANSWERS: dict[int, SendResult] = {ord("o"): "ok", ord("f"): "full", ord("s"): "stopped"}


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
        pipe.hmget(f"{CHANNEL_KEY_PREFIX}{name}", "maxsize", "stopped", "max_running")
        pipe.hget(RATE_KEY_PREFIX + channel_rate_key(name), "limit")
    answers = pipe.execute()
    states = []
    for i, name in enumerate(ordered):
        waiting, (maxsize, stopped, max_running), rate = answers[3 * i : 3 * i + 3]
        states.append(
            ChannelState(
                name,
                int(waiting),
                int(maxsize or 0),
                stopped in (b"1", "1"),
                None if rate is None else _text(rate),
                None if max_running is None else int(max_running),
                None if max_running is None else _running(client, name),
            )
        )
    return states


def _running(client: Any, channel_id: str) -> int:
    """How many slots of ``channel_id``'s concurrency limit are held now (leases not
    lapsed, on Redis's clock)."""
    key = SLOTS_KEY_PREFIX + channel_slot_key(channel_id)
    return len(scripts_of(client).slots_held(keys=[key]))
