"""Admission to a channel: decides "ok", "full" or "stopped" atomically.

A gate counts the jobs waiting in a channel (admitted, not yet taken by a
worker) and holds its stop flag. :class:`LocalGate` does it under a lock for
one process; :class:`RedisGate` does it in Redis with Lua scripts, so that
every producer on every machine shares one bound and one stop flag.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from .errors import BrokerUnavailableError

SendResult = Literal["ok", "full", "stopped"]

#: Prefix of every Redis key this package writes.
KEY_PREFIX = "pypepper"


class Gate(abc.ABC):
    """Admission and stop state of one channel."""

    @abc.abstractmethod
    def admit(self, job_id: str) -> SendResult:
        """Count ``job_id`` as waiting unless stopped or full. Re-admitting is "ok"."""

    @abc.abstractmethod
    def release(self, job_id: str) -> None:
        """``job_id`` left the channel (taken by a worker, or its enqueue failed)."""

    @abc.abstractmethod
    def request_stop(self) -> None:
        """Refuse every later admission."""

    @property
    @abc.abstractmethod
    def stopped(self) -> bool:
        """Whether a stop was requested."""

    @abc.abstractmethod
    def waiting(self) -> int:
        """How many jobs wait."""


class LocalGate(Gate):
    """A process-local gate."""

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._waiting: set[str] = set()
        self._stopped = False
        self._lock = threading.Lock()

    def admit(self, job_id: str) -> SendResult:
        with self._lock:
            if self._stopped:
                return "stopped"
            if job_id in self._waiting:
                return "ok"
            if self.maxsize and len(self._waiting) >= self.maxsize:
                return "full"
            self._waiting.add(job_id)
            return "ok"

    def release(self, job_id: str) -> None:
        with self._lock:
            self._waiting.discard(job_id)

    def request_stop(self) -> None:
        with self._lock:
            self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

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


def _is_redis_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("redis.")


class RedisGate(Gate):
    """A gate shared by every process through Redis.

    The channel's maxsize is fixed by whichever process creates it first;
    later values are ignored, as for a local channel.
    """

    @_broker_errors
    def __init__(self, client: Any, channel_id: str, maxsize: int = 0) -> None:
        self.channel_id = channel_id
        self.client = client
        base = f"{KEY_PREFIX}:channel:{channel_id}"
        self.meta_key = base
        self.waiting_key = f"{base}:waiting"
        client.hsetnx(self.meta_key, "maxsize", int(maxsize))
        self.maxsize = int(client.hget(self.meta_key, "maxsize") or 0)
        self._admit = client.register_script(_ADMIT)

    @_broker_errors
    def admit(self, job_id: str) -> SendResult:
        result = self._admit(keys=[self.meta_key, self.waiting_key], args=[job_id])
        if isinstance(result, bytes):
            result = result.decode()
        return cast(SendResult, result)

    @_broker_errors
    def release(self, job_id: str) -> None:
        self.client.srem(self.waiting_key, job_id)

    @_broker_errors
    def request_stop(self) -> None:
        self.client.hset(self.meta_key, "stopped", "1")

    @property
    @_broker_errors
    def stopped(self) -> bool:
        value = self.client.hget(self.meta_key, "stopped")
        return value in (b"1", "1")

    @_broker_errors
    def waiting(self) -> int:
        return int(self.client.scard(self.waiting_key))

    @_broker_errors
    def reset(self) -> None:
        """Forget the stop flag, the bound and the waiting set (tests, re-provisioning)."""
        self.client.delete(self.meta_key, self.waiting_key)
