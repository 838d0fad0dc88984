"""``pypepper-dramatiq channels pause|resume`` and ``tasks [list|pause|resume]``: the
paused set in a real PostgreSQL job store, as every worker reads it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from process_state import clean_process_state

from pypepper_dramatiq import Context, Job, Task, Workflow, workflow_task
from pypepper_dramatiq.cli.commands import BROKER_ENV, URI_ENV, main
from pypepper_dramatiq.records.pauses import CHANNEL, PAUSED_UNTIL, TASK
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres


@workflow_task(name="cli-pauses.noop")
def noop(task: Task, context: Context) -> None:
    return None


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(URI_ENV, raising=False)
    monkeypatch.delenv(BROKER_ENV, raising=False)
    with clean_process_state():
        yield


def held_job(store: SqlJobStore, channel: str) -> str:
    """A Scheduled job of ``channel`` as a worker held it while the channel was paused."""
    job = Job(category="cli", channel_id=channel)
    job.workflows.append(Workflow([noop.task(name="noop")]))
    record = job.to_record().evolve(status=Status.SCHEDULED, release_at=PAUSED_UNTIL)
    assert store.put(record)
    return job.id


def test_pause_and_resume_a_channel_some_job_uses(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = f"cli-{uuid.uuid4().hex[:8]}"
    job_id = held_job(pg_store, channel)

    assert main(["channels", "pause", channel, "--uri", postgres_uri]) == 0
    assert "paused" in capsys.readouterr().out
    assert pg_store.paused() == frozenset({(CHANNEL, channel)})
    assert main(["channels", "pause", channel, "--uri", postgres_uri]) == 0
    assert "paused already" in capsys.readouterr().out

    assert main(["channels", "resume", channel, "--uri", postgres_uri]) == 0
    assert "resumed" in capsys.readouterr().out
    assert pg_store.paused() == frozenset()
    row = pg_store.get(job_id)
    assert row is not None and row.release_at == row.created  # due: the sweep sends it

    assert main(["channels", "resume", channel, "--uri", postgres_uri]) == 1
    assert "not paused" in capsys.readouterr().err


def test_an_unknown_channel_is_refused_and_nothing_stored(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["channels", "pause", "nobody-uses-it", "--uri", postgres_uri]) == 1
    assert "'nobody-uses-it'" in capsys.readouterr().err
    assert pg_store.paused() == frozenset()


def test_pause_needs_the_store(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["channels", "pause", "emails"])
    assert exit_.value.code == 2
    assert "--uri" in capsys.readouterr().err


def test_pause_list_and_resume_a_task_type(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "--uri", postgres_uri]) == 0
    assert "no task type is paused" in capsys.readouterr().err

    assert main(["tasks", "pause", "cli-pauses.noop", "--uri", postgres_uri]) == 0
    assert "paused" in capsys.readouterr().out
    assert pg_store.paused() == frozenset({(TASK, "cli-pauses.noop")})
    assert main(["tasks", "list", "--uri", postgres_uri, "--json"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [
        {"task": "cli-pauses.noop"}
    ]

    assert main(["tasks", "resume", "cli-pauses.noop", "--uri", postgres_uri]) == 0
    assert pg_store.paused() == frozenset()
    assert main(["tasks", "resume", "cli-pauses.noop", "--uri", postgres_uri]) == 1


def test_an_unknown_task_id_names_it_and_the_import_option(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "pause", "no.such.task", "--uri", postgres_uri]) == 1
    err = capsys.readouterr().err
    assert "'no.such.task'" in err and "--import" in err
    assert pg_store.paused() == frozenset()
