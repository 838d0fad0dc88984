"""Bad arguments to the model are refused where they are given, with the culprit named."""

from __future__ import annotations

from typing import Any

import pytest

from pypepper_dramatiq import CallableExecutor, Job, RetryPolicy, Task, Workflow


def task(name: str = "t", **kw: Any) -> Task:
    executor = None if "executor_id" in kw else CallableExecutor(lambda task, context: None)
    return Task("c", "dag", "fp", name, "test", "", [], executor, **kw)


@pytest.mark.parametrize("job_id", ["", "x" * 65])
def test_a_job_id_out_of_bounds_is_refused_at_construction(job_id: str) -> None:
    with pytest.raises(ValueError, match="job id needs 1 to 64"):
        Job(id=job_id)


def test_a_job_id_of_64_characters_is_fine() -> None:
    assert Job(id="x" * 64).id == "x" * 64


@pytest.mark.parametrize("channel_id", ["", 3])
def test_a_job_needs_a_channel_id(channel_id: Any) -> None:
    # None is the default channel (tests/unit/test_defaults.py).
    with pytest.raises(ValueError, match="channel_id"):
        Job(channel_id=channel_id)


def test_a_workflow_refuses_what_is_not_a_task() -> None:
    with pytest.raises(TypeError, match="'oops'"):
        Workflow([task(), "oops"])  # type: ignore[list-item]
    workflow = Workflow([task("a")])
    with pytest.raises(TypeError, match="Task"):
        workflow.add_task(lambda task, context: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="None"):
        workflow.add_tasks([task("b"), None])  # type: ignore[list-item]
    # Nothing of a refused batch was added.
    assert [t.name for t in workflow.get_tasks()] == ["a"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_count", "2"),
        ("retry_count", 1.0),
        ("retry_until_max", None),
        ("round_times", True),
        ("retry_delay", "1s"),
    ],
)
def test_retry_options_of_the_wrong_type_name_the_option(option: str, value: Any) -> None:
    with pytest.raises(TypeError, match=option):
        task(**{option: value})
    with pytest.raises(TypeError, match=option):
        RetryPolicy(**{option: value})


def test_params_of_a_stored_task_must_survive_json() -> None:
    with pytest.raises(TypeError, match="params of task 'load'"):
        task("load", executor_id="tests.bad.x", params={"when": object()})


def test_params_of_an_in_process_task_may_be_any_object() -> None:
    marker = object()
    assert task("local", params={"when": marker}).params["when"] is marker
