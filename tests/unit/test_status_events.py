"""Statuses, the job state machine and the lifecycle order stores enforce."""

from __future__ import annotations

import itertools
import threading

import pytest

from pypepper_dramatiq import InvalidTransitionError, PypepperError, Status
from pypepper_dramatiq.rules.events import (
    CANCEL,
    COMPLETE,
    FAIL,
    INIT,
    RUN,
    SCHEDULE,
    Event,
    build_scheduler_fsm,
)
from pypepper_dramatiq.rules.status import may_overwrite, overwritable_by

S = Status

#: The seed's table (FAIL also from the states a worker may fail a job in).
ALLOWED: dict[tuple[Status, Event], Status] = {
    (S.UNKNOWN, INIT): S.INITIALIZING,
    (S.INITIALIZING, SCHEDULE): S.SCHEDULED,
    (S.SCHEDULED, RUN): S.IN_PROGRESS,
    (S.IN_PROGRESS, COMPLETE): S.COMPLETED,
    (S.INITIALIZING, FAIL): S.FAILED,
    (S.SCHEDULED, FAIL): S.FAILED,
    (S.IN_PROGRESS, FAIL): S.FAILED,
    (S.SCHEDULED, CANCEL): S.CANCELLED,
    (S.IN_PROGRESS, CANCEL): S.CANCELLED,
}

EVENTS = [INIT, SCHEDULE, RUN, COMPLETE, FAIL, CANCEL]
PAIRS = list(itertools.product(list(Status), EVENTS))
INVALID = [pair for pair in PAIRS if pair not in ALLOWED]


# -- Status -----------------------------------------------------------------------------------


def test_status_has_exactly_the_seven_values() -> None:
    assert [s.value for s in Status] == [
        "Unknown",
        "Initializing",
        "Scheduled",
        "InProgress",
        "Completed",
        "Failed",
        "Cancelled",
    ]


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (S.UNKNOWN, "Unknown"),
        (S.INITIALIZING, "Initializing"),
        (S.SCHEDULED, "Scheduled"),
        (S.IN_PROGRESS, "InProgress"),
        (S.COMPLETED, "Completed"),
        (S.FAILED, "Failed"),
        (S.CANCELLED, "Cancelled"),
    ],
)
def test_status_compares_equal_to_its_string(status: Status, text: str) -> None:
    assert status == text
    assert str(status) == text
    assert Status(text) is status
    assert f"{status}" == text


def test_only_completed_failed_and_cancelled_are_terminal() -> None:
    assert {s for s in Status if s.is_terminal} == {S.COMPLETED, S.FAILED, S.CANCELLED}


# -- the state machine ------------------------------------------------------------------------


def test_a_new_fsm_starts_at_unknown() -> None:
    assert build_scheduler_fsm().state is S.UNKNOWN


def test_happy_path_init_schedule_run_complete() -> None:
    fsm = build_scheduler_fsm()
    assert fsm.apply(INIT) is S.INITIALIZING
    assert fsm.apply(SCHEDULE) is S.SCHEDULED
    assert fsm.apply(RUN) is S.IN_PROGRESS
    assert fsm.apply(COMPLETE) is S.COMPLETED
    assert fsm.state is S.COMPLETED


@pytest.mark.parametrize(("pair", "target"), list(ALLOWED.items()), ids=str)
def test_allowed_transitions(pair: tuple[Status, Event], target: Status) -> None:
    source, event = pair
    fsm = build_scheduler_fsm(source)
    assert fsm.can(event)
    assert fsm.apply(event) is target
    assert fsm.state is target


@pytest.mark.parametrize("pair", INVALID, ids=str)
def test_invalid_transitions_raise_and_leave_the_state(pair: tuple[Status, Event]) -> None:
    source, event = pair
    fsm = build_scheduler_fsm(source)
    assert not fsm.can(event)
    with pytest.raises(InvalidTransitionError) as info:
        fsm.apply(event)
    assert isinstance(info.value, PypepperError)
    assert fsm.state is source
    assert info.value.event == event.value
    assert info.value.status == source.value


@pytest.mark.parametrize("terminal", [S.COMPLETED, S.FAILED, S.CANCELLED])
def test_no_event_leaves_a_terminal_status(terminal: Status) -> None:
    fsm = build_scheduler_fsm(terminal)
    for event in EVENTS:
        with pytest.raises(InvalidTransitionError):
            fsm.apply(event)
    assert fsm.state is terminal


@pytest.mark.parametrize("source", [S.UNKNOWN, S.INITIALIZING, S.COMPLETED, S.FAILED])
def test_cancel_only_from_scheduled_or_in_progress(source: Status) -> None:
    with pytest.raises(InvalidTransitionError):
        build_scheduler_fsm(source).apply(CANCEL)


def test_events_accept_their_names() -> None:
    fsm = build_scheduler_fsm()
    assert fsm.apply("INIT") is S.INITIALIZING  # type: ignore[arg-type]
    assert str(SCHEDULE) == "SCHEDULE"


def test_concurrent_events_apply_exactly_once() -> None:
    fsm = build_scheduler_fsm(S.SCHEDULED)
    barrier = threading.Barrier(8)
    wins: list[Status] = []
    losses: list[InvalidTransitionError] = []
    lock = threading.Lock()

    def fire() -> None:
        barrier.wait()
        try:
            result = fsm.apply(RUN)
        except InvalidTransitionError as exc:
            with lock:
                losses.append(exc)
        else:
            with lock:
                wins.append(result)

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert wins == [S.IN_PROGRESS]
    assert len(losses) == 7


# -- what a store may overwrite ---------------------------------------------------------------

LIFECYCLE = {
    S.UNKNOWN: 0,
    S.INITIALIZING: 1,
    S.SCHEDULED: 2,
    S.IN_PROGRESS: 3,
    S.COMPLETED: 4,
    S.FAILED: 4,
    S.CANCELLED: 4,
}
TERMINALS = {S.COMPLETED, S.FAILED, S.CANCELLED}


def expected_may_overwrite(durable: Status, new: Status) -> bool:
    if durable in TERMINALS and new in TERMINALS:
        return durable is new
    return LIFECYCLE[new] >= LIFECYCLE[durable]


@pytest.mark.parametrize(
    ("durable", "new"), list(itertools.product(list(Status), list(Status))), ids=str
)
def test_may_overwrite_matches_the_lifecycle(durable: Status, new: Status) -> None:
    assert may_overwrite(durable, new) is expected_may_overwrite(durable, new)


def test_scheduled_cannot_overwrite_in_progress_or_terminals() -> None:
    for durable in (S.IN_PROGRESS, S.COMPLETED, S.FAILED, S.CANCELLED):
        assert not may_overwrite(durable, S.SCHEDULED)


def test_distinct_terminals_do_not_overwrite_each_other() -> None:
    for durable, new in itertools.permutations(TERMINALS, 2):
        assert not may_overwrite(durable, new)
    for terminal in TERMINALS:
        assert may_overwrite(terminal, terminal)


def test_later_statuses_overwrite_earlier_ones() -> None:
    assert may_overwrite(S.SCHEDULED, S.IN_PROGRESS)
    assert may_overwrite(S.IN_PROGRESS, S.CANCELLED)
    assert may_overwrite(S.SCHEDULED, S.SCHEDULED)


@pytest.mark.parametrize("new", list(Status))
def test_overwritable_by_lists_exactly_the_replaceable_statuses(new: Status) -> None:
    assert overwritable_by(new) == frozenset(d for d in Status if expected_may_overwrite(d, new))


def test_overwritable_by_examples() -> None:
    assert overwritable_by(S.SCHEDULED) == {S.UNKNOWN, S.INITIALIZING, S.SCHEDULED}
    assert overwritable_by(S.CANCELLED) == {
        S.UNKNOWN,
        S.INITIALIZING,
        S.SCHEDULED,
        S.IN_PROGRESS,
        S.CANCELLED,
    }
