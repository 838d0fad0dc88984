"""The stored forms of a task and of a job's progress: one definition each."""

from __future__ import annotations

from pypepper_dramatiq import CallableExecutor, RetryPolicy, Task
from pypepper_dramatiq.rules import Position
from pypepper_dramatiq.spec import TaskSpec
from pypepper_dramatiq.state import JobState


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
    )
    stored = task.to_dict()
    assert TaskSpec.from_dict(stored) == task.spec()
    assert TaskSpec.from_dict(stored).to_dict() == stored


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
