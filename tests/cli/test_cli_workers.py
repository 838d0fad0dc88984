"""``pypepper-dramatiq workers``: the worker processes and the steps they run, on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.workers import WorkerInfo
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

FAR_FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)
PAYLOAD = {"workflows": [{"tasks": [{"name": "fetch"}, {"name": "load"}]}]}


@pytest.fixture
def store(pg_store: SqlJobStore) -> Iterator[SqlJobStore]:
    """The session's PostgreSQL store without worker rows, and some workers in it: one live
    (running one step), one idle, one gone (its heartbeats stopped a minute ago)."""
    pg_store.prune_workers(FAR_FUTURE)
    now = utcnow()
    started = now - timedelta(minutes=10)
    for owner, host, pid, seen in [
        ("alpha:101:aaaa0001", "alpha", 101, now - timedelta(seconds=1)),
        ("alpha:102:aaaa0002", "alpha", 102, now - timedelta(seconds=2)),
        ("beta:201:bbbb0001", "beta", 201, now - timedelta(seconds=60)),
    ]:
        pg_store.beat_worker(
            WorkerInfo(owner, host, pid, started, seen, heartbeat=5.0, channels=("etl", "mail"))
        )
    lease = now + timedelta(seconds=30)
    for job_id, owner, cursor in [
        ("job-running", "alpha:101:aaaa0001", [0, 1, 0, 2]),
        ("job-stranded", "beta:201:bbbb0001", [0, 0, 0, 0]),
    ]:
        assert pg_store.put(
            JobRecord(
                id=job_id,
                channel_id="etl",
                status=Status.IN_PROGRESS,
                payload=PAYLOAD,
                state={"cursor": cursor},
                lease_owner=owner,
                lease_expires=lease,
            )
        )
    assert pg_store.put(JobRecord(id="job-done", status=Status.COMPLETED, lease_owner=None))
    yield pg_store
    pg_store.prune_workers(FAR_FUTURE)


def test_workers_prints_each_worker_live_or_gone_and_the_steps_they_run(
    store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["workers", "--uri", postgres_uri]) == 0
    out = capsys.readouterr().out
    table, steps = out.split("\n\n")
    rows = [line.split() for line in table.splitlines()]
    assert rows[0][:3] == ["HOST", "PID", "STATE"]
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [
        ("alpha", "101", "live"),
        ("alpha", "102", "live"),
        ("beta", "201", "gone"),
    ]
    assert "alpha:101:aaaa0001" in rows[1] and "etl,mail" in rows[1]
    assert rows[3][3].startswith("(") and rows[3][3].endswith("s)")  # silent for ~60s
    step_rows = [line.split() for line in steps.splitlines()]
    assert step_rows[0][:4] == ["HOST", "PID", "JOB", "TASK"]
    assert step_rows[1][:6] == ["alpha", "101", "job-running", "load", "(0.1)", "1"]
    assert step_rows[1][6] == "3"  # attempts counted from 1
    assert step_rows[2][:4] == ["beta", "201", "job-stranded", "fetch"]


def test_workers_json_is_one_object_per_worker_with_its_steps(
    store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["workers", "--uri", postgres_uri, "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(w["host"], w["pid"], w["state"]) for w in shown] == [
        ("alpha", 101, "live"),
        ("alpha", 102, "live"),
        ("beta", 201, "gone"),
    ]
    first = shown[0]
    assert first["owner"] == "alpha:101:aaaa0001"
    assert first["channels"] == ["etl", "mail"] and first["heartbeat"] == 5.0
    assert datetime.fromisoformat(first["last_seen"]) > datetime.fromisoformat(first["started"])
    assert 0 <= first["silent_for"] < 30
    [step] = first["steps"]
    assert step["job_id"] == "job-running" and step["channel_id"] == "etl"
    assert (step["key"], step["task"], step["round"], step["attempt"]) == ("0.1", "load", 0, 2)
    assert shown[1]["steps"] == []
    assert shown[2]["silent_for"] >= 60
    assert [s["job_id"] for s in shown[2]["steps"]] == ["job-stranded"]


def test_a_worker_stopped_cleanly_or_silent_for_an_hour_is_not_listed(
    store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert store.forget_worker("alpha:102:aaaa0002")
    long_ago = utcnow() - timedelta(hours=1, seconds=1)
    store.beat_worker(WorkerInfo("gamma:301:cccc0001", "gamma", 301, long_ago, long_ago))
    assert main(["workers", "--uri", postgres_uri, "--json"]) == 0
    shown = [json.loads(line)["owner"] for line in capsys.readouterr().out.splitlines()]
    assert shown == ["alpha:101:aaaa0001", "beta:201:bbbb0001"]


def test_no_worker_says_so_on_stderr(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pg_store.prune_workers(FAR_FUTURE)
    assert main(["workers", "--uri", postgres_uri]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no worker process is known" in captured.err
    assert main(["workers", "--uri", postgres_uri, "--json"]) == 0
    assert capsys.readouterr().out == ""
