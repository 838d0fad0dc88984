"""``pypepper-dramatiq purge``: delete the jobs that ended long ago, from the shell."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.rules import retention
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

NOW = datetime.now(timezone.utc)
OLD = NOW - timedelta(days=10)


def _row(job_id: str, status: Status, ended: datetime = OLD, **fields: object) -> JobRecord:
    return JobRecord(id=job_id, status=status, created=ended, updated=ended, **fields)  # type: ignore[arg-type]


def _ids(store: SqlJobStore) -> set[str]:
    return {row.id for row in store.list()}


@pytest.fixture
def seeded(pg_store: SqlJobStore) -> SqlJobStore:
    for i in range(3):
        assert pg_store.put(_row(f"old-{i}", Status.COMPLETED))
    assert pg_store.put(_row("recent", Status.COMPLETED, NOW - timedelta(days=2)))
    assert pg_store.put(_row("old-failed", Status.FAILED))
    assert pg_store.put(_row("old-running", Status.IN_PROGRESS))
    assert pg_store.put(_row("parent", Status.COMPLETED))
    assert pg_store.put(
        _row("child", Status.SCHEDULED, NOW, waits={"parents": ["parent"]})  # it waits
    )
    return pg_store


def test_purge_deletes_what_ended_before_the_cutoff_and_says_how_many(
    seeded: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["purge", "--uri", postgres_uri, "--status", "Completed", "--older-than", "7d"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted 3 Completed jobs that ended before ")
    assert _ids(seeded) == {"recent", "old-failed", "old-running", "parent", "child"}
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("deleted 0 Completed jobs")


def test_a_dry_run_counts_and_deletes_nothing(
    seeded: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _ids(seeded)
    argv = ["purge", "--uri", postgres_uri, "--status", "Completed", "--older-than", "168h"]
    assert main([*argv, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would delete 3 Completed jobs that ended before")
    assert _ids(seeded) == before
    called = datetime.now(timezone.utc)
    assert main([*argv, "--dry-run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["dry_run"], shown["count"]) == ("Completed", True, 3)
    ended_before = datetime.fromisoformat(shown["ended_before"])
    assert abs((called - timedelta(hours=168) - ended_before).total_seconds()) < 60
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 3
    assert main(["purge", "--uri", postgres_uri, "--status", "Failed", "--older-than", "1w"]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 Failed jobs")
    assert _ids(seeded) == {"recent", "old-running", "parent", "child"}


def test_more_than_a_batch_is_deleted_a_batch_per_statement(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    count = retention.BATCH * 2 + 5
    with pg_store.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO scheduler_jobs (id, channel_id, status, version, created, updated, state) "
            "SELECT 'bulk-' || n, 'c', 'Cancelled', 1, %(old)s, %(old)s, '{}' "
            "FROM generate_series(1, %(count)s) AS n",
            {"old": OLD, "count": count},
        )
    argv = ["purge", "--uri", postgres_uri, "--status", "Cancelled", "--older-than", "86400"]
    assert main([*argv, "--dry-run"]) == 0
    assert f"would delete {count} Cancelled" in capsys.readouterr().out
    assert main(argv) == 0
    assert f"deleted {count} Cancelled" in capsys.readouterr().out
    assert _ids(pg_store) == set()


@pytest.mark.parametrize("older_than", ["1 week", "7 days", "168 hours", "1week"])
def test_a_spelled_out_duration_is_accepted_as_people_type_it(
    seeded: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str], older_than: str
) -> None:
    argv = ["purge", "--uri", postgres_uri, "--status", "Completed", "--older-than", older_than]
    assert main([*argv, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would delete 3 Completed jobs that ended before")


@pytest.mark.parametrize("bad", ["7x", "7 fortnights", "0", "-1d", "d"])
def test_a_bad_duration_is_exit_2_naming_it(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    assert pg_store.put(_row("old", Status.COMPLETED))
    argv = ["purge", "--uri", postgres_uri, "--status", "Completed", f"--older-than={bad}"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --older-than: must be a duration" in err and repr(bad) in err
    assert _ids(pg_store) == {"old"}


@pytest.mark.parametrize("status", ["Scheduled", "InProgress", "completed"])
def test_only_a_final_status_may_be_purged(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str], status: str
) -> None:
    argv = ["purge", "--uri", postgres_uri, "--status", status, "--older-than", "7d"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
