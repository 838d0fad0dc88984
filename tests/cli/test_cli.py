"""The ``pypepper-dramatiq`` command line, against the real PostgreSQL."""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import datetime, timedelta, timezone

import pytest
import redis

import pypepper_dramatiq
from pypepper_dramatiq.cli.commands import BROKER_ENV, URI_ENV, decode_cursor, encode_cursor, main
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore, head_revision, schema_revision
from pypepper_dramatiq.transport.redis.layout import CANCEL_CHANNEL

pytestmark = pytest.mark.postgres

T0 = datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc)


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
    assert main(["jobs", "--uri", postgres_uri, "--status", "Completed", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["job-b"]


def test_show_prints_the_progress_of_the_tasks(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"progress": {"0.1": {"task": "load", "done": 40, "total": 100, "failed": 2}}}
    assert pg_store.put(JobRecord(id="job-p", status=Status.IN_PROGRESS, state=state))
    assert main(["show", "job-p", "--uri", postgres_uri]) == 0
    progress = json.loads(capsys.readouterr().out)["progress"]["0.1"]
    assert (progress["task"], progress["done"], progress["total"]) == ("load", 40, 100)
    assert progress["note"] is None  # every field, filled


@pytest.mark.parametrize("command", ["show", "cancel"])
def test_show_and_cancel_of_an_unknown_job_say_the_same(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main([command, "no-such-job", "--uri", postgres_uri]) == 1
    assert capsys.readouterr().err == "pypepper-dramatiq: no job 'no-such-job' is stored\n"


def test_show_json_prints_the_record_on_one_line(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pg_store.put(JobRecord(id="job-j", channel_id="c", status=Status.SCHEDULED))
    assert main(["show", "job-j", "--uri", postgres_uri, "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["id"] == "job-j"


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"pypepper-dramatiq {pypepper_dramatiq.__version__}"


# -- jobs: newest first, a page at a time --------------------------------------------------


def put_jobs(store: SqlJobStore, count: int, **fields: object) -> list[str]:
    """``count`` jobs created a second apart (job-000 oldest); their ids, oldest first."""
    ids = []
    for n in range(count):
        job_id = f"job-{n:03d}"
        created = T0 + timedelta(seconds=n)
        assert store.put(JobRecord(id=job_id, created=created, updated=created, **fields))  # type: ignore[arg-type]
        ids.append(job_id)
    return ids


def jobs_page(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str | None]:
    """Run ``jobs --json`` + argv: the ids printed and the next-page cursor, if any."""
    assert main(["jobs", "--json", *argv]) == 0
    out, err = capsys.readouterr()
    ids = [json.loads(line)["id"] for line in out.splitlines()]
    match = re.search(r"next page: --before (\S+)", err)
    return ids, match.group(1) if match else None


def test_jobs_pages_newest_first_through_every_job(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = put_jobs(pg_store, 150, channel_id="c", status=Status.COMPLETED)

    first, cursor = jobs_page(["--uri", postgres_uri], capsys)  # --limit 100 by default
    assert first == ids[::-1][:100]  # the newest is shown, first
    assert cursor is not None
    second, last_cursor = jobs_page(["--uri", postgres_uri, "--before", cursor], capsys)
    assert second == ids[::-1][100:]
    assert last_cursor is None  # the last page says no more

    exact, more = jobs_page(["--uri", postgres_uri, "--limit", "150"], capsys)
    assert len(exact) == 150 and more is None  # a full last page is not "more"


def test_jobs_filters_by_category_status_and_channel(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    put_jobs(pg_store, 3, channel_id="c", category="mail", status=Status.FAILED)
    assert pg_store.put(
        JobRecord(id="other", channel_id="d", category="report", status=Status.FAILED)
    )

    assert jobs_page(
        [
            "--uri",
            postgres_uri,
            "--category",
            "mail",
            "--limit",
            "2",
            "--status",
            "Failed",
            "--channel",
            "c",
        ],
        capsys,
    )[0] == ["job-002", "job-001"]
    assert jobs_page(["--uri", postgres_uri, "--category", "report"], capsys) == (["other"], None)


def test_jobs_prints_a_compact_table_by_default(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    long_error = "ValueError: " + "x" * 200 + "\nTraceback follows"
    assert pg_store.put(
        JobRecord(
            id="job-t",
            channel_id="etl",
            category="nightly",
            status=Status.FAILED,
            error=long_error,
            created=T0,
            updated=T0 + timedelta(minutes=1),
        )
    )
    assert pg_store.put(
        JobRecord(
            id="job-u",
            channel_id="etl",
            status=Status.SCHEDULED,
            created=T0 - timedelta(days=1),
            updated=T0,
        )
    )

    assert main(["jobs", "--uri", postgres_uri]) == 0
    header, newest, older = capsys.readouterr().out.splitlines()

    assert header.split() == ["ID", "STATUS", "CHANNEL", "CATEGORY", "CREATED", "UPDATED", "ERROR"]
    assert newest.split()[:7] == [
        "job-t",
        "Failed",
        "etl",
        "nightly",
        "2024-01-01",
        "12:00:00Z",
        "2024-01-01",
    ]
    assert newest.endswith("...") and "x" * 50 not in newest and "Traceback" not in newest
    assert older.split() == [
        "job-u",
        "Scheduled",
        "etl",
        "-",
        "2023-12-31",
        "12:00:00Z",
        "2024-01-01",
        "12:00:00Z",
    ]


def test_jobs_with_nothing_to_list_says_so(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "--uri", postgres_uri, "--status", "Failed"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no stored job matches" in err


@pytest.mark.parametrize("cursor", ["nonsense!", "bm8tYmFy", encode_cursor(T0, "x")[:-3]])
def test_a_cursor_the_command_did_not_print_is_refused(
    cursor: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["jobs", "--uri", "postgresql+psycopg://u@127.0.0.1:1/db", "--before", cursor])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "not a cursor" in err and "unavailable" not in err


def test_a_cursor_round_trips() -> None:
    created = T0 + timedelta(microseconds=123456)
    assert decode_cursor(encode_cursor(created, "job|with|bars")) == (created, "job|with|bars")


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


def test_cancel_marks_a_stored_job_cancelled_and_tells_redis(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert pg_store.put(
        JobRecord(
            id="job-c", channel_id="c", status=Status.IN_PROGRESS, state={"results": {"0.0": 1}}
        )
    )
    listener = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(CANCEL_CHANNEL)
    try:
        listener.get_message(timeout=1)  # the subscription is confirmed (and skipped)
        assert main(["cancel", "job-c", "--uri", postgres_uri, "--broker-url", redis_url]) == 0
        assert "running tasks were told" in capsys.readouterr().out
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            message = listener.get_message(timeout=0.5)
    finally:
        listener.close()
    assert message is not None and message["data"] == b"job-c"
    record = pg_store.get("job-c")
    assert record is not None and record.status is Status.CANCELLED
    by = record.state.pop("cancelled_by")
    assert record.state == {"results": {"0.0": 1}}  # the progress is kept
    assert by["by"] == "cli" and by["host"] == socket.gethostname()


def test_cancel_without_a_broker_url_still_writes_the_cancel(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pg_store.put(JobRecord(id="job-q", channel_id="c", status=Status.SCHEDULED))
    assert main(["cancel", "job-q", "--uri", postgres_uri]) == 0
    assert "lease renewal" in capsys.readouterr().out
    record = pg_store.get("job-q")
    assert record is not None and record.status is Status.CANCELLED


@pytest.mark.parametrize(
    ("job_id", "status", "said"),
    [
        ("job-none", None, "no job 'job-none'"),
        ("job-done", Status.COMPLETED, "job job-done has already ended (Completed)"),
        ("job-gone", Status.CANCELLED, "job job-gone has already ended (Cancelled)"),
    ],
)
def test_cancel_of_an_unknown_or_finished_job_fails_and_changes_nothing(
    pg_store: SqlJobStore,
    postgres_uri: str,
    capsys: pytest.CaptureFixture[str],
    job_id: str,
    status: Status | None,
    said: str,
) -> None:
    if status is not None:
        assert pg_store.put(JobRecord(id=job_id, channel_id="c", status=status))
    assert main(["cancel", job_id, "--uri", postgres_uri]) == 1
    assert said in capsys.readouterr().err
    record = pg_store.get(job_id)
    assert (record.status if record else None) is status


def test_cancel_refuses_a_broker_url_before_writing(
    pg_store: SqlJobStore, postgres_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pg_store.put(JobRecord(id="job-b", channel_id="c", status=Status.SCHEDULED))
    assert main(["cancel", "job-b", "--uri", postgres_uri, "--broker-url", "http://x"]) == 2
    assert "redis" in capsys.readouterr().err.lower()
    record = pg_store.get("job-b")
    assert record is not None and record.status is Status.SCHEDULED


@pytest.mark.mysql
def test_cancel_with_rabbitmq_refuses_a_store_not_on_postgresql_before_writing(
    mysql_store: SqlJobStore, mysql_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # With RabbitMQ, running tasks hear a cancel by NOTIFY on the store's PostgreSQL.
    assert mysql_store.put(JobRecord(id="job-m", channel_id="c", status=Status.SCHEDULED))
    url = "amqp://guest:secret@127.0.0.1:1/%2F"
    assert main(["cancel", "job-m", "--uri", mysql_uri, "--broker-url", url]) == 2
    assert "not on PostgreSQL" in capsys.readouterr().err
    record = mysql_store.get("job-m")
    assert record is not None and record.status is Status.SCHEDULED


def test_the_uri_and_broker_url_may_come_from_the_environment(
    pg_store: SqlJobStore,
    postgres_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert pg_store.put(JobRecord(id="job-env", channel_id="c", status=Status.SCHEDULED))
    monkeypatch.setenv(URI_ENV, postgres_uri)
    monkeypatch.setenv(BROKER_ENV, redis_url)
    assert main(["show", "job-env"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "job-env"
    assert main(["cancel", "job-env"]) == 0
    assert "running tasks were told" in capsys.readouterr().out
    record = pg_store.get("job-env")
    assert record is not None and record.status is Status.CANCELLED


def test_without_uri_nor_environment_the_usage_names_the_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(URI_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["jobs"])
    assert exited.value.code == 2
    assert "--uri" in capsys.readouterr().err
