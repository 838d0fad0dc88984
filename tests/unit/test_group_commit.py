"""The group commit combiner (:mod:`pypepper_dramatiq.ops.group_commit`): threads
that call while a batch runs go together in the next one, a lone call goes at
once, and no error or interruption leaves a caller waiting for good."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pypepper_dramatiq.ops.group_commit import Combiner, _Slot, in_rounds

pytestmark = pytest.mark.timeout(30)

#: Callers released together behind a running batch.
CALLERS = 8


class Gate:
    """A batch callable whose first batch blocks until the test opens it, so that
    callers can be lined up behind it; it records every batch it ran."""

    def __init__(self, answer: Callable[[list[int]], Sequence[Any]] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.answer = answer or (lambda requests: [r * 10 for r in requests])

    def __call__(self, requests: list[int]) -> Sequence[Any]:
        self.batches.append(list(requests))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.opened.wait(10)
        return self.answer(requests)


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def line_up(combiner: Combiner[int, Any], gate: Gate, pool: ThreadPoolExecutor) -> list[Any]:
    """Request 0 runs (and blocks) as the first batch; requests 1..CALLERS queue
    behind it, released together through a barrier. Futures of all of them."""
    first = pool.submit(combiner.submit, 0)
    assert gate.entered.wait(10)
    barrier = threading.Barrier(CALLERS)

    def call(n: int) -> Any:
        barrier.wait()
        return combiner.submit(n)

    rest = [pool.submit(call, n) for n in range(1, CALLERS + 1)]
    wait_until(lambda: combiner.pending == CALLERS)
    return [first, *rest]


def test_a_lone_call_goes_at_once_in_its_own_batch() -> None:
    seen: list[list[int]] = []

    def batch(requests: list[int]) -> list[int]:
        seen.append(requests)
        return [r + 1 for r in requests]

    combiner: Combiner[int, int] = Combiner(batch)
    assert combiner.submit(41) == 42  # no other thread: no wait for company
    assert combiner.submit(1) == 2
    assert seen == [[41], [1]]
    assert (combiner.stats.calls, combiner.stats.batches, combiner.pending) == (2, 2, 0)


def test_callers_released_together_share_batches_and_get_their_own_answers() -> None:
    gate = Gate()
    combiner: Combiner[int, int] = Combiner(gate)
    with ThreadPoolExecutor(CALLERS + 1) as pool:
        futures = line_up(combiner, gate, pool)
        gate.opened.set()
        answers = [f.result(10) for f in futures]
    assert answers == [n * 10 for n in range(CALLERS + 1)]
    assert gate.batches[0] == [0]
    assert sorted(gate.batches[1]) == list(range(1, CALLERS + 1))  # all in one batch
    stats = combiner.stats
    assert stats.calls == CALLERS + 1 and stats.batches == 2 < stats.calls
    assert stats.largest == CALLERS


def test_max_batch_splits_what_is_pending() -> None:
    gate = Gate()
    combiner: Combiner[int, int] = Combiner(gate, max_batch=3)
    with ThreadPoolExecutor(CALLERS + 1) as pool:
        futures = line_up(combiner, gate, pool)
        gate.opened.set()
        assert [f.result(10) for f in futures] == [n * 10 for n in range(CALLERS + 1)]
    assert [len(b) for b in gate.batches] == [1, 3, 3, 2]


def test_an_error_of_the_batch_reaches_every_caller_of_it_and_no_other() -> None:
    def answer(requests: list[int]) -> list[int]:
        if 0 not in requests:
            raise ConnectionError("the store went away")
        return [r * 10 for r in requests]

    gate = Gate(answer)
    combiner: Combiner[int, int] = Combiner(gate)
    with ThreadPoolExecutor(CALLERS + 1) as pool:
        futures = line_up(combiner, gate, pool)
        gate.opened.set()
        assert futures[0].result(10) == 0
        for future in futures[1:]:
            with pytest.raises(ConnectionError, match="went away"):
                future.result(10)
    assert combiner.submit(0) == 0  # and the combiner goes on


def test_an_answer_that_is_an_error_reaches_its_own_caller_only() -> None:
    def answer(requests: list[int]) -> list[Any]:
        return [KeyError(r) if r == 3 else r for r in requests]

    gate = Gate(answer)
    combiner: Combiner[int, Any] = Combiner(gate)
    with ThreadPoolExecutor(CALLERS + 1) as pool:
        futures = line_up(combiner, gate, pool)
        gate.opened.set()
        for n, future in enumerate(futures):
            if n == 3:
                with pytest.raises(KeyError):
                    future.result(10)
            else:
                assert future.result(10) == n


@pytest.mark.parametrize("error", [ValueError("bad batch"), KeyboardInterrupt()])
def test_a_raising_callback_never_stalls_the_combiner(error: BaseException) -> None:
    calls = 0

    def batch(requests: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise error
        return requests

    combiner: Combiner[int, int] = Combiner(batch)
    with pytest.raises(type(error)):
        combiner.submit(1)
    assert combiner.submit(2) == 2  # not left busy
    wrong: Combiner[int, int] = Combiner(lambda requests: [])  # answers missing
    with pytest.raises(RuntimeError, match="answered 0 times"):
        wrong.submit(1)
    with pytest.raises(RuntimeError, match="answered 0 times"):
        wrong.submit(1)


class Interrupted(Exception):
    pass


def test_an_interrupted_caller_promoted_to_lead_hands_the_lead_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Caller 1 is interrupted as its wait returns (Dramatiq's time limit raises in
    # the waiting thread when it runs Python again): that is when it was promoted.
    waits = _Slot.wait

    def wait(slot: _Slot[int]) -> None:
        waits(slot)
        if slot.request == 1:
            raise Interrupted

    monkeypatch.setattr(_Slot, "wait", wait)
    gate = Gate()
    combiner: Combiner[int, int] = Combiner(gate)
    results: dict[int, Any] = {}

    def call(n: int) -> None:
        try:
            results[n] = combiner.submit(n)
        except Interrupted as exc:
            results[n] = exc

    threads = [threading.Thread(target=call, args=(0,))]
    threads[0].start()
    assert gate.entered.wait(10)
    for n in (1, 2):  # 1 queues first: it is promoted when batch 0 ends
        threads.append(threading.Thread(target=call, args=(n,)))
        threads[-1].start()
        wait_until(lambda n=n: combiner.pending == n)  # type: ignore[misc]
    gate.opened.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert results[0] == 0 and results[2] == 20
    assert isinstance(results[1], Interrupted)
    assert [2] in gate.batches and combiner.pending == 0
    assert combiner.submit(5) == 50  # idle again: a new call leads at once


def test_in_rounds_decides_one_key_per_round_in_order() -> None:
    rounds: list[list[str]] = []

    def batch(requests: list[str]) -> list[str]:
        rounds.append(requests)
        if requests == ["a2"]:
            raise OSError("down")
        return [r.upper() for r in requests]

    answers = in_rounds(["a1", "b1", "a2", "c1", "a3"], lambda r: r[0], batch)
    assert rounds == [["a1", "b1", "c1"], ["a2"]]
    assert answers[:2] == ["A1", "B1"] and answers[3] == "C1"
    assert isinstance(answers[2], OSError) and isinstance(answers[4], OSError)  # not tried


def test_in_flight_lets_that_many_batches_run_at_once() -> None:
    running = threading.Semaphore(0)
    release = threading.Event()

    def batch(requests: list[int]) -> list[int]:
        running.release()
        assert release.wait(10)
        return requests

    combiner: Combiner[int, int] = Combiner(batch, in_flight=2)
    with ThreadPoolExecutor(3) as pool:
        first, second = pool.submit(combiner.submit, 1), pool.submit(combiner.submit, 2)
        assert running.acquire(timeout=10) and running.acquire(timeout=10)  # both run
        third = pool.submit(combiner.submit, 3)
        wait_until(lambda: combiner.pending == 1)  # the third waits for one of them
        release.set()
        assert (first.result(10), second.result(10), third.result(10)) == (1, 2, 3)
    assert combiner.stats.batches == 3 and combiner.pending == 0
    with pytest.raises(ValueError, match="in_flight"):
        Combiner(batch, in_flight=0)


class _RaisingOnRelease:
    """The combiner's lock, raising ``Interrupted`` once in the thread ``who`` as it
    releases the lock: an interrupt landing right after that thread queued its call."""

    def __init__(self) -> None:
        self._inner = threading.Lock()
        self.who: int | None = None
        self.raised = False

    def __enter__(self) -> _RaisingOnRelease:
        self._inner.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.release()
        if threading.get_ident() == self.who and not self.raised and exc[0] is None:
            self.raised = True
            raise Interrupted


def test_an_interrupt_right_after_queueing_takes_the_call_out_of_the_queue() -> None:
    gate = Gate()
    combiner: Combiner[int, int] = Combiner(gate)
    lock = _RaisingOnRelease()
    combiner._lock = lock  # type: ignore[assignment]
    results: dict[int, Any] = {}

    def call(n: int, interrupted: bool = False) -> None:
        if interrupted:
            lock.who = threading.get_ident()
        try:
            results[n] = combiner.submit(n)
        except Interrupted as exc:
            results[n] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert gate.entered.wait(10)
    second = threading.Thread(target=call, args=(1, True))
    second.start()
    second.join(10)
    assert isinstance(results[1], Interrupted) and combiner.pending == 0
    third = threading.Thread(target=call, args=(2,))
    third.start()
    wait_until(lambda: combiner.pending == 1)
    gate.opened.set()
    for thread in (first, third):
        thread.join(10)
        assert not thread.is_alive()
    assert results[0] == 0 and results[2] == 20 and [2] in gate.batches
