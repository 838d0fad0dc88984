"""An application's defaults on both drivers, given to ``setup(defaults=...)`` or in the
YAML's ``scheduler.defaults`` (each test runs with each).

A job and tasks that do not say take them: the job's channel and start deadline, the
tasks' retry count and ``round_timeout``. What a job or a task says itself wins, and so
does a handler class's attribute: the order is the job's own > the task's own > the
handler class's > the defaults > the built-in default.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pypepper_dramatiq import (
    Context,
    IExecutor,
    Job,
    JobRecord,
    Status,
    Task,
    Workflow,
    executor_registry,
    executor_task,
    get_job_store,
    workflow_task,
)

from .drivers import CHANNEL, Driver

#: The defaults, as ``setup()`` takes them.
DEFAULTS = {
    "channel_id": CHANNEL,
    "retry_count": 2,
    "retry_delay": 0,
    "round_timeout": "1s",
    "max_start_delay": "1h",
}
#: The same defaults in the YAML file.
DEFAULTS_YAML = f"""\
scheduler:
  defaults:
    channelId: {CHANNEL}
    retryCount: 2
    retryDelay: 0
    roundTimeout: 1s
    maxStartDelay: 1h
"""
HANDLER_ID = "defaults.declines"

# Named here too, so that each test runs with each way of giving the defaults (the
# ``driver`` fixture asks for the broker, and so for ``setup_options``, only at run time).
pytestmark = pytest.mark.usefixtures("setup_options")


@pytest.fixture(params=["setup", "yaml"])
def setup_options(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """``setup()``'s defaults given as an argument, or by its YAML file."""
    if request.param == "setup":
        return {"defaults": DEFAULTS}
    path = tmp_path / "app.yaml"
    path.write_text(DEFAULTS_YAML, encoding="utf-8")
    return {"config_path": path}


@workflow_task(name="defaults.fails")
def fails(task: Task, context: Context) -> None:
    raise RuntimeError("declined")


@workflow_task(name="defaults.quick")
def quick(task: Task, context: Context) -> str:
    return "done"


@workflow_task(name="defaults.dawdles")
async def dawdles(task: Task, context: Context) -> None:
    await asyncio.sleep(30)  # cancelled by round_timeout


class Declines(IExecutor):
    """A handler whose class says how often it is retried."""

    retry_count = 1

    def execute(self, task: Task, context: Context) -> Any:
        raise RuntimeError("declined")


@pytest.fixture
def handler() -> None:
    executor_registry.register(HANDLER_ID, Declines())


def job_of(*tasks: Task, channel_id: str | None = None) -> Job:
    """A one-workflow job of ``tasks``, on ``channel_id`` (None: naming no channel)."""
    job = Job(category="defaults", channel_id=channel_id)
    job.workflows.append(Workflow(list(tasks)))
    return job


def run_all(driver: Driver, *scheduled: tuple[Job, dict[str, Any]]) -> list[JobRecord]:
    """Schedule each job with its options, run them all, their rows."""
    for job, options in scheduled:
        job.scheduled(**options)
        if "delay" in options:
            WINDOWS[job.id] = start_window(get_job_store().get(job.id))
    driver.start()
    return driver.wait(*(job for job, _ in scheduled))


#: The start window as stored when a job was scheduled with a delay (a start clears it;
#: a job to start at once stores its deadline only).
WINDOWS: dict[str, float] = {}


def stored_task(record: JobRecord) -> dict[str, Any]:
    task: dict[str, Any] = record.payload["workflows"][0]["tasks"][0]
    return task


def start_window(record: JobRecord | None) -> float:
    """Seconds between the planned start and the start deadline."""
    assert record is not None
    assert record.not_before is not None and record.start_deadline is not None
    return (record.start_deadline - record.not_before).total_seconds()


def test_the_defaults_apply_to_a_job_and_tasks_that_do_not_say(driver: Driver) -> None:
    failing = job_of(fails.task(name="fails"))
    slow = job_of(dawdles.options(retry_count=0).task(name="dawdles"))
    plain = job_of(quick.task(name="quick"))

    failed, timed_out, done = run_all(driver, (failing, {}), (slow, {}), (plain, {"delay": 0.05}))

    assert failing.channel_id == CHANNEL and failed.channel_id == CHANNEL  # its default channel
    assert failed.status is Status.FAILED
    assert failed.state["attempts"] == {"0.0": 3}  # retry_count 2 by default
    assert timed_out.status is Status.FAILED
    assert timed_out.error is not None and "TaskTimeoutError" in timed_out.error
    assert stored_task(timed_out)["round_timeout"] == 1.0
    assert done.status is Status.COMPLETED, done.error
    assert WINDOWS[done.id] == 3600.0  # max_start_delay 1h by default


def test_what_a_job_a_task_or_a_handler_class_says_wins_over_the_defaults(
    driver: Driver, handler: None
) -> None:
    own = job_of(
        Task(CHANNEL, "", "", "fails", None, "", None, None, 0, executor_id="defaults.fails"),
        channel_id=CHANNEL,
    )
    decorated = job_of(fails.options(retry_count=1, round_timeout=30).task(name="fails"))
    handled = job_of(executor_task(HANDLER_ID, name="declines"))
    deadline = job_of(quick.task(name="quick"))

    by_task, by_decorator, by_handler, by_job = run_all(
        driver,
        (own, {}),
        (decorated, {}),
        (handled, {}),
        (deadline, {"delay": 0.05, "max_start_delay": 60}),
    )

    assert by_task.state["attempts"] == {"0.0": 1}  # the task's own retry_count
    assert by_decorator.state["attempts"] == {"0.0": 2}  # @workflow_task's options
    assert stored_task(by_decorator)["round_timeout"] == 30.0
    assert by_handler.state["attempts"] == {"0.0": 2}  # Declines.retry_count
    assert stored_task(by_handler)["round_timeout"] == 1.0  # not the class's: the default
    assert by_job.status is Status.COMPLETED, by_job.error
    assert WINDOWS[by_job.id] == 60.0  # scheduled()'s own max_start_delay
