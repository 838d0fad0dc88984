"""What an executor reads from its context."""

from __future__ import annotations

import threading
from typing import Any

from pypepper_dramatiq import CANCEL_EVENT_KEY, Context
from pypepper_dramatiq.model.context import JOB_ID_KEY, POSITION_KEY, RESULTS_KEY


def test_an_empty_context_has_no_job_no_event_and_is_not_cancelled() -> None:
    context = Context()
    assert context.cancel_event is None
    assert context.cancelled is False
    assert context.job_id is None
    assert context.idempotency_key is None


def test_cancelled_follows_the_shared_event() -> None:
    event = threading.Event()
    context = Context({CANCEL_EVENT_KEY: event})
    assert context.cancel_event is event
    assert context.cancelled is False
    event.set()
    assert context.cancelled is True


def test_something_else_under_the_cancel_key_is_not_an_event() -> None:
    context = Context({CANCEL_EVENT_KEY: "yes"})
    assert context.cancel_event is None
    assert context.cancelled is False


def test_job_id_is_a_string() -> None:
    assert Context({JOB_ID_KEY: 42}).job_id == "42"


def test_idempotency_key_names_job_workflow_and_task_but_not_the_attempt() -> None:
    first = Context({JOB_ID_KEY: "j1", POSITION_KEY: [2, 5, 0, 0]})
    retry = Context({JOB_ID_KEY: "j1", POSITION_KEY: [2, 5, 1, 3]})
    assert first.idempotency_key == "j1:2.5" == retry.idempotency_key
    assert Context({JOB_ID_KEY: "j1"}).idempotency_key is None  # no position: in-process
    assert Context({POSITION_KEY: [0, 0, 0, 0]}).idempotency_key is None


def test_results_are_shared_and_created_on_first_use() -> None:
    shared: dict[str, Any] = {"extract": 3}
    assert Context({RESULTS_KEY: shared}).results is shared
    context = Context()
    context.results["x"] = 1
    assert context.context[RESULTS_KEY] == {"x": 1}


def test_the_values_given_are_copied_not_aliased() -> None:
    values = {JOB_ID_KEY: "a"}
    context = Context(values)
    values[JOB_ID_KEY] = "b"
    assert context.job_id == "a"
    assert context.get("missing", "default") == "default"
