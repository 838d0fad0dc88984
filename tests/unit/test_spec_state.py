"""The stored forms of a task and of a job's progress: one definition each."""

from __future__ import annotations

from pypepper_dramatiq import CallableExecutor, RetryPolicy, Task
from pypepper_dramatiq.records.spec import TaskSpec
from pypepper_dramatiq.records.state import JobState
from pypepper_dramatiq.rules.steps import Position


def test_a_stored_task_missing_keys_takes_the_defaults_of_the_retry_table() -> None:
    spec = TaskSpec.from_dict({"name": "t", "executor_id": "x"})
    assert spec.policy == RetryPolicy()
    assert (spec.round_timeout, spec.round_timeout_join, spec.params) == (0.0, 0.0, {})


def test_a_task_round_trips_through_its_stored_form() -> None:
    task = Task(
        "c",
        "d",
        "f",
        "t",
        "cat",
        "desc",
        ["a", "b"],
        CallableExecutor(lambda t, c: 1),
        retry_count=2,
        retry_delay=0.5,
        retry_until_completed=True,
        retry_until_max=7,
        round_times=3,
        round_timeout=4,
        round_timeout_join=5,
        optional=True,
        executor_id="ex.id",
        params={"k": [1, 2]},
        retry_backoff=2.5,
        retry_delay_max=30,
        retry_jitter=True,
    )
    stored = task.to_dict()
    assert (stored["retry_backoff"], stored["retry_delay_max"], stored["retry_jitter"]) == (
        2.5,
        30,
        True,
    )
    assert TaskSpec.from_dict(stored) == task.spec()
    assert TaskSpec.from_dict(stored).to_dict() == stored
    assert TaskSpec.from_dict(stored).policy == task.policy


def test_a_task_stored_before_backoff_existed_keeps_its_fixed_retry_delay() -> None:
    """A row written by an older version has no backoff keys: it loads with the defaults."""
    older = {
        "name": "t",
        "executor_id": "x",
        "params": {},
        "retry_count": 3,
        "retry_delay": 1.5,
        "retry_until_completed": False,
        "retry_until_max": 1000,
        "round_times": 1,
        "round_timeout": 0.0,
        "round_timeout_join": 0.0,
        "optional": False,
    }
    spec = TaskSpec.from_dict(older)
    assert (spec.retry_backoff, spec.retry_delay_max, spec.retry_jitter) == (1.0, None, False)
    assert [spec.policy.delay_before(n) for n in range(4)] == [0.0, 1.5, 1.5, 1.5]
    # Written back, it says so explicitly; a null cap reads as no cap.
    assert TaskSpec.from_dict(spec.to_dict()) == spec
    assert TaskSpec.from_dict({**older, "retry_delay_max": None}).retry_delay_max is None


def test_job_state_round_trips_and_keeps_keys_it_does_not_know() -> None:
    stored = {
        "cursor": [0, 1, 0, 2],
        "results": {"0.0": {"n": 1}},
        "errors": {"0.1": "E: x"},
        "attempts": {"0.0": 1, "0.1": 3},
        "skipped": [],
        "history": {"0.0": [{"outcome": "succeeded"}]},
        "dispatch": {"queue": "q", "message_id": "m"},
        "written_by_a_newer_version": {"x": 1},
    }
    state = JobState.from_dict(stored)
    assert state.cursor == Position(0, 1, 0, 2)
    assert state.other == {"written_by_a_newer_version": {"x": 1}}
    assert state.to_dict() == stored
