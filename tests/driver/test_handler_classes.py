"""Handler classes on both drivers: an ``IExecutor`` subclass registered once, with its
dependency, its retry policy and its own ``on_final_failure`` method.

Its hook runs once when the task fails for good (never on a cancel) with the
dependency its constructor was given; its policy applies to every task built
from it, by :func:`executor_task` or ``Task(executor_id=...)``; a task's own
option wins. The handler is registered per test (the fixtures unregister it).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pypepper_dramatiq import (
    Context,
    ExecutorError,
    IExecutor,
    JobCancellationError,
    Status,
    Task,
    executor_registry,
    executor_task,
    workflow_task,
)

from .drivers import Driver, make_job, run

HANDLER_ID = "handlers.charge"


class Pager:
    """The dependency a handler is given: notes what it was asked to page."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pages: list[tuple[str, str | None, str]] = []

    def page(self, task_name: str, job_id: str | None, error: str) -> None:
        with self._lock:
            self.pages.append((task_name, job_id, error))


class ChargeCard(IExecutor):
    """Charges a card (every attempt is declined); pages on a final failure."""

    retry_count = 2

    def __init__(self, pager: Pager) -> None:
        self.pager = pager
        self.calls = 0
        self._lock = threading.Lock()

    def execute(self, task: Task, context: Context) -> Any:
        with self._lock:
            self.calls += 1
        if task.params.get("cancel"):
            raise JobCancellationError("the order was withdrawn")
        raise RuntimeError(f"card {task.params['card']} declined")

    def on_final_failure(self, task: Task, context: Context, error: str) -> None:
        self.pager.page(task.name, context.job_id, error)


@pytest.fixture
def handler() -> ChargeCard:
    registered = executor_registry.register(HANDLER_ID, ChargeCard(Pager()))
    assert isinstance(registered, ChargeCard)
    return registered


def test_a_handlers_own_hook_runs_once_with_its_dependency_and_its_policy_applies(
    driver: Driver, handler: ChargeCard
) -> None:
    job = make_job([executor_task(HANDLER_ID, name="charge", card="4242")])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert record.state["attempts"] == {"0.0": 3}  # retry_count = 2, from the class
    assert handler.calls == 3
    assert handler.pager.pages == [("charge", job.id, "RuntimeError: card 4242 declined")]


def test_a_handlers_hook_does_not_run_on_a_cancel(driver: Driver, handler: ChargeCard) -> None:
    job = make_job([executor_task(HANDLER_ID, name="charge", card="4242", cancel=True)])

    [record] = run(driver, job)

    assert record.status is Status.CANCELLED
    assert handler.calls == 1
    assert handler.pager.pages == []


def test_a_tasks_own_option_wins_over_the_handlers_policy(
    driver: Driver, handler: ChargeCard
) -> None:
    by_helper = make_job([executor_task(HANDLER_ID, name="charge", card="1", retry_count=0)])
    by_id = make_job(
        [
            Task(
                None,
                "",
                HANDLER_ID,
                "charge",
                None,
                "",
                [],
                None,
                executor_id=HANDLER_ID,
                params={"card": "2"},
                retry_count=1,
            )
        ]
    )

    records = run(driver, by_helper, by_id)

    assert [r.state["attempts"] for r in records] == [{"0.0": 1}, {"0.0": 2}]
    assert sorted(handler.pager.pages) == sorted(
        [
            ("charge", by_helper.id, "RuntimeError: card 1 declined"),
            ("charge", by_id.id, "RuntimeError: card 2 declined"),
        ]
    )


def test_a_task_built_by_id_takes_the_registered_handlers_policy_and_hook(
    handler: ChargeCard,
) -> None:
    task = Task(None, "", HANDLER_ID, "charge", None, "", [], None, executor_id=HANDLER_ID)

    spec = task.spec()

    assert spec.retry_count == 2 and spec.on_final_failure is True
    assert task.on_final_failure == handler.on_final_failure


def test_a_tasks_own_hook_wins_over_the_handlers(handler: ChargeCard) -> None:
    def other(task: Task, context: Context, error: str) -> None:
        """Another hook."""

    task = executor_task(HANDLER_ID)
    task_with_own = Task(
        None, "", HANDLER_ID, "charge", None, "", [], handler, on_final_failure=other
    )

    assert task.on_final_failure == handler.on_final_failure
    assert task_with_own.on_final_failure is other


def test_a_misspelt_retry_option_on_a_handler_class_is_refused() -> None:
    with pytest.raises(ExecutorError, match="'retry_cont' is not a retry option"):

        class Misspelt(IExecutor):
            retry_cont = 3

            def execute(self, task: Task, context: Context) -> Any:
                return None


def test_executor_task_names_an_unknown_executor() -> None:
    with pytest.raises(ExecutorError, match=r"handlers\.nobody"):
        executor_task("handlers.nobody")


class _Impatient(IExecutor):
    def execute(self, task: Task, context: Context) -> Any:
        return None


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("retry_count", "3", "retry_count must be an int"),
        ("retry_delay", -1.0, "retry_delay"),
        ("round_timeout", -2.0, "round_timeout must be >= 0"),
        ("round_timeout", float("nan"), "round_timeout must be >= 0"),
    ],
)
def test_a_handler_policy_no_task_could_take_is_refused_at_registration(
    option: str, value: Any, why: str
) -> None:
    handler = _Impatient()
    setattr(handler, option, value)  # as an __init__ setting it on the instance would

    with pytest.raises(ExecutorError, match=rf"executor 'handlers\.bad': {why}"):
        executor_registry.register("handlers.bad", handler)

    assert "handlers.bad" not in executor_registry


def test_a_misspelt_name_that_is_a_method_or_property_is_not_a_retry_option() -> None:
    class Helpful(IExecutor):
        def retry_note(self) -> str:
            return "fine"

        @property
        def round_label(self) -> str:
            return "fine"

        def execute(self, task: Task, context: Context) -> Any:
            return None

    assert executor_registry.register("handlers.helpful", Helpful()).execute is not None


def test_workflow_task_on_a_class_points_to_the_handler_form() -> None:
    with pytest.raises(
        ExecutorError, match="not the class Charge: make it a subclass of IExecutor"
    ):

        @workflow_task(name="handlers.decorated")
        class Charge:
            def __init__(self, task: Task, context: Context) -> None:
                self.task = task

    assert "handlers.decorated" not in executor_registry
