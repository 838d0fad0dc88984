"""``JobRecord.result(name)`` / ``results_by_name()``: results stored by position, read by name."""

from __future__ import annotations

from typing import Any

import pytest

from pypepper_dramatiq import AmbiguousTaskNameError, JobRecord, NoTaskResultError
from pypepper_dramatiq.errors import PypepperError


def record(*workflows: list[str], **state: Any) -> JobRecord:
    """A record whose workflows hold tasks of these names, with ``state``."""
    payload = {"workflows": [{"tasks": [{"name": n} for n in names]} for names in workflows]}
    return JobRecord(id="job-r", payload=payload, state=state)


def test_a_result_is_read_by_its_task_name() -> None:
    rec = record(
        ["fetch", "load"], ["notify"], results={"0.0": {"rows": 3}, "0.1": None, "1.0": "sent"}
    )

    assert rec.result("fetch") == {"rows": 3}
    assert rec.result("load") is None  # a task that returned None has a result: None
    assert rec.result("notify") == "sent"
    assert rec.result("notify", workflow=1) == "sent"


def test_a_name_in_several_workflows_needs_the_workflow() -> None:
    rec = record(["fetch"], ["fetch", "load"], results={"0.0": "first", "1.0": "second"})

    with pytest.raises(AmbiguousTaskNameError) as raised:
        rec.result("fetch")

    assert isinstance(raised.value, LookupError) and isinstance(raised.value, PypepperError)
    message = str(raised.value)
    assert "'fetch'" in message and "0.0, 1.0" in message and "workflow=" in message
    assert rec.result("fetch", workflow=0) == "first"
    assert rec.result("fetch", workflow=1) == "second"


def test_a_name_twice_in_one_workflow_is_ambiguous_even_with_the_workflow() -> None:
    rec = record(["step", "step"], results={"0.0": 1, "0.1": 2})

    with pytest.raises(AmbiguousTaskNameError, match=r"0\.0, 0\.1.*by position"):
        rec.result("step", workflow=0)


def test_no_such_task_is_told_apart_from_no_result_yet() -> None:
    rec = record(["fetch", "load"], ["notify"], results={"0.0": 1})

    with pytest.raises(NoTaskResultError) as missing:
        rec.result("lod")
    with pytest.raises(KeyError) as pending:  # NoTaskResultError is a KeyError
        rec.result("load")

    assert str(missing.value) == "job job-r has no task named 'lod'"
    assert str(pending.value) == "task 'load' (0.1) of job job-r has not produced a result yet"
    with pytest.raises(NoTaskResultError, match="workflow 1 of job job-r has no task named 'load'"):
        rec.result("load", workflow=1)
    with pytest.raises(NoTaskResultError, match="has no workflow 2"):
        rec.result("fetch", workflow=2)


def test_a_failed_or_skipped_task_says_so() -> None:
    rec = record(["fetch", "extra"], errors={"0.0": "RuntimeError: boom"}, skipped=["0.1"])

    with pytest.raises(NoTaskResultError, match=r"it failed \(RuntimeError: boom\)"):
        rec.result("fetch")
    with pytest.raises(NoTaskResultError, match="it was skipped"):
        rec.result("extra")


def test_a_record_without_workflows_cannot_be_read_by_name() -> None:
    rec = JobRecord(id="job-x", payload=None, state={"results": {"0.0": 1}})

    with pytest.raises(NoTaskResultError, match="without its workflows"):
        rec.result("fetch")
    with pytest.raises(NoTaskResultError, match="without its workflows"):
        rec.results_by_name()


def test_results_by_name_keys_ambiguous_names_by_workflow() -> None:
    rec = record(
        ["fetch", "load", "twice", "twice"],
        ["fetch", "notify", "pending"],
        results={"0.0": "f0", "0.1": "l0", "0.2": "t1", "0.3": "t2", "1.0": "f1", "1.1": "n1"},
    )

    assert rec.results_by_name() == {
        "0.fetch": "f0",
        "1.fetch": "f1",  # in two workflows: "<workflow>.<name>"
        "load": "l0",
        "notify": "n1",  # unique names: the name
        "0.2": "t1",
        "0.3": "t2",  # twice in one workflow: the position
    }  # "pending" has no result: left out


def test_results_by_name_of_a_record_with_nothing_run() -> None:
    assert record(["fetch"]).results_by_name() == {}
