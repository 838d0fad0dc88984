"""The in-process transport: the embedded default (Dramatiq's in-memory stub broker).

Every channel's state lives in this process, under a lock; no notice leaves the
process (its own waiters are woken directly), and this process sweeps alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

from ..limits.rates import IDLE_KEEP_SECONDS, Rate
from .base import (
    RESERVED_PREFIX,
    ChannelState,
    Gate,
    HeldStart,
    SendResult,
    SlotLimits,
    Subscription,
    Topic,
    Transport,
    log_bound_change,
)


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
        log_bound_change(self.channel_id, before, int(maxsize))
        return before

    def waiting(self) -> int:
        return len(self._waiting)

    def waiting_ids(self, cursor: int, count: int) -> tuple[int, list[str]]:
        # The ids in order, the cursor an offset: ids released meanwhile shift the
        # rest back, so one may be skipped until the next round (it is still there).
        with self._lock:
            ordered = sorted(self._waiting)
        end = cursor + max(1, count)
        return (end if end < len(ordered) else 0), ordered[cursor:end]


class LocalTransport(Transport):
    """Coordination within one process: what the package does without a server."""

    where = "this process"

    shared = False
    takes_undeclared_queues = False

    def gate(self, channel_id: str, maxsize: int | None = None) -> Gate:
        return LocalGate(maxsize, channel_id)

    def enqueues_with(self, gate: Gate) -> bool:
        return False

    def channel_states(self) -> list[ChannelState] | None:
        return None

    def __init__(self) -> None:
        #: Rate limit key -> the starts granted within its last period, oldest first,
        #: and the last retry time told (``time.monotonic()``).
        self._starts: dict[str, deque[float]] = {}
        self._tails: dict[str, float] = {}
        self._starts_lock = threading.Lock()
        #: Concurrency limit key -> holder -> when its lease lapses (``time.monotonic()``).
        self._slots: dict[str, dict[str, float]] = {}
        #: Concurrency limit key -> the starts waiting in its line, by job id, with
        #: their place ((-priority, order first held)).
        self._lines: dict[str, dict[str, tuple[tuple[int, int], HeldStart]]] = {}
        self._held_count = 0

    def ask_start(self, key: str, rate: Rate, told: bool = False) -> float:
        with self._starts_lock:
            now = time.monotonic()
            starts = self._starts.setdefault(key, deque())
            while starts and starts[0] <= now - rate.period:
                starts.popleft()
            if len(starts) < rate.count:
                starts.append(now)
                return 0.0
            tail = self._tails.get(key, 0.0)
            if told:  # its place in line is kept: the line behind it does not move
                slot = starts[0] + rate.period
                self._tails[key] = max(tail, slot + rate.interval)
            else:
                slot = max(tail, starts[0] + rate.period)
                self._tails[key] = slot + rate.interval
            return slot - now

    def prune_rate_keys(self, idle_seconds: float = IDLE_KEEP_SECONDS, limit: int = 1000) -> int:
        with self._starts_lock:
            before = time.monotonic() - idle_seconds
            idle = [
                key
                for key, starts in self._starts.items()
                if max(starts[-1] if starts else 0.0, self._tails.get(key, 0.0)) < before
            ][:limit]
            for key in idle:
                del self._starts[key]
                self._tails.pop(key, None)
            return len(idle)

    def acquire_slots(
        self, limits: SlotLimits, holder: str, lease_seconds: float, held: HeldStart | None = None
    ) -> bool:
        with self._starts_lock:
            now = time.monotonic()
            kept = None if held is None else RESERVED_PREFIX + held.job_id
            full = []
            for key, limit in limits:
                holders = self._live(key, now)
                if holder not in holders and kept not in holders and len(holders) >= limit:
                    full.append(key)
            if full:
                if held is not None:
                    for key in full:
                        line = self._lines.setdefault(key, {})
                        if held.job_id in line:  # it keeps its place
                            line[held.job_id] = (line[held.job_id][0], held)
                        else:
                            self._held_count += 1
                            line[held.job_id] = ((-held.priority, self._held_count), held)
                return False
            for key, _ in limits:
                holders = self._slots.setdefault(key, {})
                if held is not None:
                    holders.pop(RESERVED_PREFIX + held.job_id, None)
                    self._lines.get(key, {}).pop(held.job_id, None)
                holders[holder] = now + lease_seconds
            return True

    def release_slots(
        self, keys: Sequence[str], holder: str, reserve_seconds: float = 0.0
    ) -> list[HeldStart]:
        woken: dict[str, HeldStart] = {}
        with self._starts_lock:
            now = time.monotonic()
            for key in keys:
                holders = self._slots.get(key)
                if holders is None or holders.pop(holder, None) is None:
                    continue
                line = self._lines.get(key)
                if reserve_seconds > 0 and line:
                    job_id = min(line, key=lambda job: line[job][0])
                    _, start = line.pop(job_id)
                    holders[RESERVED_PREFIX + job_id] = now + reserve_seconds
                    woken[job_id] = start
                if not holders:
                    del self._slots[key]
        return list(woken.values())

    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        with self._starts_lock:
            now = time.monotonic()
            for key, holder in held:
                holders = self._live(key, now)
                if holder in holders:
                    holders[holder] = now + lease_seconds

    def slots_held(self, key: str) -> list[str]:
        with self._starts_lock:
            return sorted(self._live(key, time.monotonic()))

    def _live(self, key: str, now: float) -> dict[str, float]:
        """``key``'s holders, those whose lease lapsed dropped (under the lock)."""
        holders = self._slots.get(key, {})
        for lapsed in [h for h, until in holders.items() if until <= now]:
            del holders[lapsed]
        return holders

    def publish(self, topic: Topic, text: str) -> int | None:
        return None

    @property
    def carries_notices(self) -> bool:
        return False

    def subscribe(self, topics: Collection[Topic]) -> Subscription:
        raise NotImplementedError("notices do not leave this process")

    @property
    def connection(self) -> Any:
        return None

    def lead(self, owner: str, ttl_seconds: float) -> bool:
        return True  # one process: it leads

    def requeue_dead_workers(self, queue_name: str) -> None:
        return None

    def queues_held_by_dead_workers(self) -> set[str]:
        return set()

    def messages_exist(self, messages: Sequence[tuple[str, str | None]]) -> list[bool] | None:
        return None
