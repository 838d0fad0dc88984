"""``pypepper-dramatiq recurring`` and what ``show`` says a Scheduled job waits for."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from process_state import clean_process_state

from pypepper_dramatiq import Context, Job, Task, Workflow, workflow_task
from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

NEXT = datetime(2030, 1, 1, 6, 0, tzinfo=timezone.utc)


@workflow_task(name="cli-recurring.noop")
def noop(task: Task, context: Context) -> None:
    return None


def _template() -> dict[str, object]:
    job = Job(category="nightly", channel_id="cli-recurring")
    job.workflows.append(Workflow([noop.task(name="noop")]))
    record = job.to_record()
    return {"channel_id": job.channel_id, "category": job.category, "payload": record.payload}


def _store_schedule(store: SqlJobStore, name: str = "nightly") -> RecurringSchedule:
    return store.save_recurring(
        RecurringSchedule(
            name=name,
            cron="0 6 * * *",
            timezone="Europe/Paris",
            template=_template(),
            next_slot=NEXT,
        )
    )


def test_list_prints_each_schedule_with_its_next_firing(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_schedule(pg_store)
    assert main(["recurring", "--uri", postgres_uri]) == 0
    out = capsys.readouterr().out
    assert "nightly" in out and "0 6 * * *" in out and "Europe/Paris" in out
    assert "2030-01-01" in out
    assert main(["recurring", "list", "--uri", postgres_uri, "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    shown = json.loads(line)
    assert shown["name"] == "nightly" and shown["next_slot"] == NEXT.isoformat()
    assert shown["channel_id"] == "cli-recurring" and shown["paused"] is False


def test_list_with_nothing_stored_says_so(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recurring", "list", "--uri", postgres_uri]) == 0
    assert "no recurring schedule" in capsys.readouterr().err


def test_remove_deletes_and_an_unknown_name_is_exit_1(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_schedule(pg_store)
    assert main(["recurring", "remove", "nightly", "--uri", postgres_uri]) == 0
    assert pg_store.get_recurring("nightly") is None
    assert main(["recurring", "remove", "nightly", "--uri", postgres_uri]) == 1
    assert "no recurring schedule 'nightly'" in capsys.readouterr().err


def test_trigger_fires_a_job_now(
    pg_store: SqlJobStore, postgres_uri: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_schedule(pg_store)
    with clean_process_state():
        code = main(
            ["recurring", "trigger", "nightly", "--uri", postgres_uri, "--broker-url", redis_url]
        )
    assert code == 0
    job_id = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    record = pg_store.get(job_id)
    assert record is not None and record.status is Status.SCHEDULED
    assert record.category == "nightly" and record.unique_key == "recurring:nightly"


@pytest.mark.parametrize(
    "argv",
    [
        ["recurring", "remove"],
        ["recurring", "list", "nightly"],
        ["recurring", "trigger", "nightly"],
        ["recurring", "pause", "nightly"],
    ],
)
def test_bad_recurring_arguments_are_usage_errors(
    argv: list[str], postgres_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYPEPPER_BROKER_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--uri", postgres_uri])
    assert exited.value.code == 2


def test_show_says_what_a_scheduled_job_waits_for(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert pg_store.put(JobRecord(id="parent", status=Status.IN_PROGRESS))
    assert pg_store.put(
        JobRecord(
            id="child",
            status=Status.SCHEDULED,
            not_before=later,
            waits={"parents": ["parent"], "on_parent_failure": "cancel", "key": "k", "holder": "h"},
        )
    )
    assert main(["show", "child", "--uri", postgres_uri]) == 0
    waiting_for = json.loads(capsys.readouterr().out)["waiting_for"]
    text = " | ".join(waiting_for)
    assert later.isoformat() in text
    assert "parents parent (on failure: cancel)" in text
    assert "the holder h of key 'k'" in text
    assert main(["show", "parent", "--uri", postgres_uri]) == 0
    assert "waiting_for" not in json.loads(capsys.readouterr().out)
