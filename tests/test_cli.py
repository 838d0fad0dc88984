"""The ``pypepper-dramatiq`` command line, against the real PostgreSQL."""

from __future__ import annotations

import json

import pytest

from pypepper_dramatiq.cli import main
from pypepper_dramatiq.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore, head_revision, schema_revision

pytestmark = pytest.mark.postgres


def test_migrate_brings_an_empty_database_to_head(
    empty_postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert schema_revision(empty_postgres_uri) is None
    assert main(["migrate", "--uri", empty_postgres_uri]) == 0
    assert schema_revision(empty_postgres_uri) == head_revision()
    assert head_revision() in capsys.readouterr().out


def test_show_and_jobs_print_stored_records(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pg_store.put(JobRecord(id="job-a", channel_id="c", status=Status.FAILED, error="boom"))
    assert pg_store.put(JobRecord(id="job-b", channel_id="c", status=Status.COMPLETED))
    assert main(["show", "job-a", "--uri", postgres_uri]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == "job-a" and shown["status"] == "Failed" and shown["error"] == "boom"
    assert main(["jobs", "--uri", postgres_uri, "--status", "Completed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["job-b"]


def test_show_of_an_unknown_job_fails(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "no-such-job", "--uri", postgres_uri]) == 1
    assert "no-such-job" in capsys.readouterr().err


def test_an_unreachable_store_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["jobs", "--uri", "postgresql+psycopg://u:secret@127.0.0.1:1/db"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unavailable" in err and "127.0.0.1:1" in err
    assert "secret" not in err


def test_an_unmigrated_store_names_the_migrate_command(
    empty_postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "--uri", empty_postgres_uri]) == 2
    assert "pypepper-dramatiq migrate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["jobs", "--uri", "postgresql+psycopg://u@127.0.0.1:1/db", "--status", "Done"], "Done"),
        (["jobs", "--uri", "postgresql+psycopg://u@127.0.0.1:1/db", "--limit", "0"], "'0'"),
        (["jobs", "--uri", "postgresql+psycopg://u@127.0.0.1:1/db", "--limit", "ten"], "'ten'"),
    ],
)
def test_bad_arguments_are_refused_before_any_connection(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err
    assert named in err and "unavailable" not in err
