"""Group commit: the calls of many threads to one store statement, coalesced.

A :class:`Combiner` wraps a *batch* callable (a list of requests in, one answer
per request out, in order). A thread that calls :meth:`Combiner.submit` while no
batch runs (fewer than ``in_flight``, one by default) becomes a *leader*: it runs
a batch at once with whatever is pending, its own request included. A thread
that calls while a batch runs queues its request and waits; when the batch
ends, its leader hands out the answers and promotes the first queued thread,
which runs everything queued meanwhile as the next batch. Nothing waits for a
batch to fill and there is no timer: a lone call goes at once, as a direct call
would, and under load each batch holds what piled up during the one before.

The combiner knows nothing of stores: an answer that is an exception is raised
to its own caller, and an exception of the batch itself is raised to every
caller of that batch (their fate is unknown to them). A caller whose wait is
interrupted (Dramatiq's time limit raises in the waiting thread) leaves the
queue, or hands the leadership on if it had just been given it, so the
combiner never stalls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

__all__ = ["BatchStats", "Combiner", "in_rounds", "rounds_of"]

T = TypeVar("T")
R = TypeVar("R")

#: The most requests one batch takes (the rest go in the next one).
MAX_BATCH = 100


@dataclass(frozen=True)
class BatchStats:
    """What a combiner did so far: calls, batches run, and the largest batch."""

    calls: int = 0
    batches: int = 0
    largest: int = 0

    @property
    def per_batch(self) -> float:
        """Requests per batch on average (0 before the first batch)."""
        return self.calls / self.batches if self.batches else 0.0


class _Slot(Generic[T]):
    """One caller's request, and where its answer (or leadership) is handed over.

    The hand-over is a plain lock, taken when the slot is made and released
    once: a ``threading.Event`` (a condition, a waiter list and a lock per wait)
    cost a tenth of a worker's time under the GIL.
    """

    __slots__ = ("_gate", "answer", "has_answer", "lead", "request", "started")

    def __init__(self, request: T) -> None:
        self.request = request
        self._gate = threading.Lock()
        self._gate.acquire()
        #: This caller runs the next batch (the first, or promoted by the leader before).
        self.lead = False
        #: Its batch began: the leader hands the leadership on whatever happens.
        self.started = False
        self.has_answer = False
        self.answer: object = None

    def wait(self) -> None:
        """Block until :meth:`give` or :meth:`promote`."""
        self._gate.acquire()

    def give(self, answer: object) -> None:
        self.answer, self.has_answer = answer, True
        self._gate.release()

    def promote(self) -> None:
        self.lead = True
        self._gate.release()


class Combiner(Generic[T, R]):
    """Coalesces concurrent calls into batches, at most ``in_flight`` batches at a time.

    Args:
        batch: runs requests together; returns one answer per request, in
            order. An answer that is an exception is raised to that request's
            caller; an exception raised by ``batch`` reaches every caller of
            the batch.
        max_batch: the most requests one batch takes.
        in_flight: how many batches may run at once (each is a store round
            trip on a connection of its own). 1 makes the biggest batches; more
            shortens the wait of the calls that queue behind a running batch.
    """

    def __init__(
        self,
        batch: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_batch: int = MAX_BATCH,
        in_flight: int = 1,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self._batch = batch
        self._max = max_batch
        self._in_flight = in_flight
        self._lock = threading.Lock()
        #: Callers waiting for a batch to take them (leaders are not in it).
        self._queue: list[_Slot[T]] = []
        #: Leaders running a batch, or promoted to run one.
        self._leaders = 0
        self._stats = BatchStats()

    @property
    def stats(self) -> BatchStats:
        """Calls, batches and the largest batch since this combiner was made."""
        with self._lock:
            return self._stats

    @property
    def pending(self) -> int:
        """How many calls wait for a batch to take them."""
        with self._lock:
            return len(self._queue)

    def submit(self, request: T) -> R:
        """Run ``request`` in a batch and return its answer (or raise its error)."""
        slot: _Slot[T] = _Slot(request)
        try:
            # Inside the try: an interrupt landing right after the slot queued (or
            # took the lead) must take it out again, or the next promotion would
            # go to a caller that left, and the combiner would stall.
            with self._lock:
                if self._leaders < self._in_flight:
                    slot.lead = True
                    self._leaders += 1
                else:
                    self._queue.append(slot)
            if not slot.lead:
                slot.wait()
            if not slot.has_answer:  # the leader, first or promoted
                self._lead(slot)
        except BaseException:
            self._abandon(slot)
            raise
        answer = slot.answer
        if isinstance(answer, BaseException):
            raise answer
        return cast(R, answer)

    def _abandon(self, slot: _Slot[T]) -> None:
        """A caller interrupted (Dramatiq's time limit raises in the waiting thread)
        leaves the queue, and hands the leadership on if it held it unused."""
        with self._lock:
            if slot in self._queue:
                self._queue.remove(slot)
            elif slot.lead and not slot.started:
                self._hand_over()

    def _lead(self, me: _Slot[T]) -> None:
        """Run one batch: the leader's own request and what the queue holds; answer
        each caller, then promote the next queued caller or step down."""
        slots: list[_Slot[T]] = [me]
        try:
            me.started = True
            with self._lock:
                slots += self._queue[: self._max - 1]
                del self._queue[: self._max - 1]
                calls, batches = self._stats.calls + len(slots), self._stats.batches + 1
                self._stats = BatchStats(calls, batches, max(self._stats.largest, len(slots)))
            answers: Sequence[object]
            try:
                answers = self._batch([slot.request for slot in slots])
                if len(answers) != len(slots):
                    raise RuntimeError(
                        f"a batch of {len(slots)} requests answered {len(answers)} times"
                    )
            except BaseException as exc:  # every caller of the batch is told
                answers = [exc] * len(slots)
            for slot, answer in zip(slots, answers, strict=True):
                slot.give(answer)
        finally:
            for slot in slots:  # interrupted while answering: nobody is left waiting
                if not slot.has_answer:
                    slot.give(RuntimeError("the batch was interrupted"))
            with self._lock:
                self._hand_over()

    def _hand_over(self) -> None:
        """Promote the first queued caller to lead the next batch, or step down
        (called with the lock held)."""
        if self._queue:
            self._queue.pop(0).promote()
        else:
            self._leaders -= 1


def rounds_of(keys: Sequence[object]) -> list[list[int]]:
    """The positions of ``keys`` in rounds where each key appears once, each in the
    first round that does not hold it yet (the order of ``keys`` kept in each)."""
    rounds: list[list[int]] = []
    taken: list[set[object]] = []
    for n, key in enumerate(keys):
        for chosen, held in zip(rounds, taken, strict=True):
            if key not in held:
                chosen.append(n)
                held.add(key)
                break
        else:
            rounds.append([n])
            taken.append({key})
    return rounds


def in_rounds(
    requests: Sequence[T],
    key: Callable[[T], object],
    batch: Callable[[list[T]], Sequence[R | BaseException]],
) -> list[R | BaseException]:
    """``batch`` run on rounds of ``requests`` in which each ``key`` appears once, the
    answers back in the order of ``requests``.

    Two requests on one row in one statement would be decided together (a
    multi-row UPDATE applies one of them); in two rounds the second sees the
    first's write, as two calls would. An exception of a round is the answer of
    its requests and of those of later rounds (not tried); earlier rounds keep
    theirs.
    """
    rounds = rounds_of([key(request) for request in requests])
    answers: list[R | BaseException] = [RuntimeError("not answered")] * len(requests)
    for done, chosen in enumerate(rounds):
        try:
            got = batch([requests[n] for n in chosen])
            if len(got) != len(chosen):
                raise RuntimeError(f"a batch of {len(chosen)} requests answered {len(got)} times")
        except Exception as exc:
            for later in rounds[done:]:
                for n in later:
                    answers[n] = exc
            break
        for n, answer in zip(chosen, got, strict=True):
            answers[n] = answer
    return answers
