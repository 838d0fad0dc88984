"""``pypepper-dramatiq retry``: a Failed or Cancelled job taken up by a new job from the shell,
against the real PostgreSQL and Redis (no worker: the new job's row and message are checked)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_state import clean_process_state

from pypepper_dramatiq import Context, Job, Task, Workflow, workflow_task
from pypepper_dramatiq.cli.commands import BROKER_ENV, main
from pypepper_dramatiq.records.links import RETRY_OF_KEY
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

CHANNEL = "cli-retry"


@workflow_task(name="cli-retry.step")
def step(task: Task, context: Context) -> str:
    return task.name


def stored_failed(store: SqlJobStore, job_id: str, **changes: Any) -> JobRecord:
    """A three-task job stored Failed at its second task, the first one's result kept."""
    job = Job(category="cli", channel_id=CHANNEL, id=job_id)
    job.workflows.append(Workflow([step.task(name=name) for name in ("a", "b", "c")]))
    changes.setdefault("status", Status.FAILED)
    record = job.to_record().evolve(
        state={"cursor": [0, 1, 0, 0], "results": {"0.0": "a"}, "errors": {"0.1": "E: x"}},
        error="task b failed: E: x",
        **changes,
    )
    assert store.put(record)
    stored = store.get(job_id)
    assert stored is not None
    return stored


def retry(*argv: str) -> int:
    with clean_process_state():
        return main(["retry", *argv])


@pytest.fixture
def no_broker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BROKER_ENV, raising=False)


def test_retry_prints_the_new_job_scheduled_where_the_job_stopped(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    original = stored_failed(pg_store, "cli-failed")

    assert retry("cli-failed", "--uri", postgres_uri, "--broker-url", redis_url) == 0

    out, err = capsys.readouterr()
    new_id = out.strip()
    assert "job cli-failed is retried by job" in err and new_id in err
    record = pg_store.get(new_id)
    assert record is not None and record.status is Status.SCHEDULED
    assert record.payload is not None and record.payload[RETRY_OF_KEY] == "cli-failed"
    assert (record.channel_id, record.category) == (CHANNEL, "cli")
    assert record.state["cursor"] == [0, 1, 0, 0] and record.state["results"] == {"0.0": "a"}
    assert record.state["dispatch"]  # its message went to Redis
    assert pg_store.get("cli-failed") == original  # untouched
    [link] = pg_store.links("cli-failed")  # the store keeps the link from retry_of
    assert (link.parent, link.child, link.kind) == ("cli-failed", new_id, "retry")


def test_from_task_starts_earlier(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stored_failed(pg_store, "cli-from", status=Status.CANCELLED)
    code = retry("cli-from", "--from-task", "a", "--uri", postgres_uri, "--broker-url", redis_url)
    assert code == 0
    record = pg_store.get(capsys.readouterr().out.strip())
    assert record is not None and record.state["cursor"] == [0, 0, 0, 0]
    assert record.state["results"] == {}


@pytest.mark.parametrize(
    ("job_id", "changes", "extra", "said"),
    [
        ("cli-none", None, [], "no job 'cli-none' is stored"),
        (
            "cli-done",
            {"status": Status.COMPLETED},
            [],
            "job 'cli-done' is Completed: only a Failed or Cancelled job can be retried",
        ),
        (
            "cli-task",
            {},
            ["--from-task", "nope"],
            "job 'cli-task' has no task 'nope'; its tasks (workflow.task name): "
            "0.0 a, 0.1 b, 0.2 c",
        ),
        (
            "cli-later",
            {},
            ["--from-task", "c"],
            "job 'cli-later' stopped at task 0.1 (workflow.task); it cannot be retried from 'c'",
        ),
        ("cli-bare", {"payload": None}, [], "cannot be retried from the store"),
    ],
)
def test_a_job_that_cannot_be_retried_is_exit_2_with_one_line(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    job_id: str,
    changes: dict[str, Any] | None,
    extra: list[str],
    said: str,
) -> None:
    if changes is not None:
        stored_failed(pg_store, job_id, **changes)
    before = [record.id for record in pg_store.list()]

    assert retry(job_id, *extra, "--uri", postgres_uri, "--broker-url", redis_url) == 2

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("pypepper-dramatiq: ") and err.count("\n") == 1
    assert said in err
    assert [record.id for record in pg_store.list()] == before  # nothing stored


def test_retry_needs_a_broker_url(
    postgres_uri: str, no_broker_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["retry", "some-job", "--uri", postgres_uri])
    assert exited.value.code == 2
    assert "retry needs --broker-url" in capsys.readouterr().err


@pytest.fixture
def tasks_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of tasks in the current directory that this process has not imported."""
    name = "cli_retry_elsewhere_tasks"
    (tmp_path / f"{name}.py").write_text(
        "from pypepper_dramatiq import workflow_task\n\n\n"
        '@workflow_task(name="cli-retry.elsewhere")\n'
        "def elsewhere(task, context):\n"
        "    return 1\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the directory
    yield name
    sys.modules.pop(name, None)


def test_the_tasks_code_is_imported_with_import(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    tasks_module: str,
) -> None:
    task = {"name": "elsewhere", "executor_id": "cli-retry.elsewhere", "params": {}}
    assert pg_store.put(
        JobRecord(
            id="cli-elsewhere",
            channel_id=CHANNEL,
            status=Status.FAILED,
            payload={"workflows": [{"tasks": [task]}]},
            state={"cursor": [0, 0, 0, 0]},
        )
    )
    argv = ["cli-elsewhere", "--uri", postgres_uri, "--broker-url", redis_url]

    assert retry(*argv) == 2
    err = capsys.readouterr().err
    assert "'cli-retry.elsewhere'" in err and "--import MODULE, or $PYPEPPER_IMPORT)" in err

    assert retry(*argv, "--import", tasks_module) == 0
    record = pg_store.get(capsys.readouterr().out.strip())
    assert record is not None and record.status is Status.SCHEDULED
    assert record.payload is not None and record.payload[RETRY_OF_KEY] == "cli-elsewhere"

    assert retry(*argv, "--import", "no_such_module_here") == 2
    assert "--import: No module named 'no_such_module_here'" in capsys.readouterr().err
