"""The command line shows hostile stored text escaped, as a terminal receives it.

Each command runs as a subprocess (``python -m pypepper_dramatiq``) on the session's
PostgreSQL and Redis, so what is checked is the bytes written to the terminal: a job,
schedule, worker or channel whose text holds an escape sequence (retitle the window,
clear the screen), a carriage return or a bidi override comes out with each of them as
its visible escape, and ``--json`` still gives the exact stored text back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis

from pypepper_dramatiq.cli.commands import BROKER_ENV, URI_ENV
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.records.workers import WorkerInfo
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.transport.redis import RedisGate

pytestmark = pytest.mark.postgres

#: Retitles the terminal window, rings its bell and clears the screen; then a carriage
#: return (overwrites the line) and a right-to-left override (reverses what follows).
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\rrev\u202eesrever"
#: How it must be shown: every interpreted character as its escape.
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\rrev\\u202eesrever"
#: Bytes no output of the command may hold: ESC, BEL, CR and U+202E in UTF-8.
RAW = (b"\x1b", b"\x07", b"\r", "\u202e".encode())

FAR_FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)
NEXT = datetime(2030, 1, 1, 6, 0, tzinfo=timezone.utc)


def run(*argv: str, uri: str = "", broker_url: str = "") -> tuple[int, bytes, bytes]:
    """Run ``pypepper-dramatiq argv`` in a fresh interpreter: its status, stdout, stderr."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop(URI_ENV, None)
    env.pop(BROKER_ENV, None)
    if uri:
        env[URI_ENV] = uri
    if broker_url:
        env[BROKER_ENV] = broker_url
    done = subprocess.run(
        [sys.executable, "-m", "pypepper_dramatiq", *argv],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def assert_shown_escaped(output: bytes, *, times: int = 1) -> None:
    """``output`` holds no interpreted byte, and the hostile text escaped ``times`` times."""
    for raw in RAW:
        assert raw not in output, (raw, output)
    assert output.decode().count(ESCAPED) >= times, output


@pytest.fixture
def hostile_job(pg_store: SqlJobStore) -> JobRecord:
    record = JobRecord(
        id=f"job-{HOSTILE}",
        channel_id=f"channel-{HOSTILE}",
        category=f"category-{HOSTILE}",
        status=Status.FAILED,
        error=f"RuntimeError: {HOSTILE}",
        unique_key=f"key-{HOSTILE}",
    )
    assert pg_store.put(record)
    return record


def test_jobs_table_shows_id_channel_category_and_error_escaped(
    hostile_job: JobRecord, postgres_uri: str
) -> None:
    status, out, err = run("jobs", uri=postgres_uri)
    assert status == 0, err
    assert_shown_escaped(out, times=3)  # id, channel, category
    assert f"category-{ESCAPED}" in out.decode()
    # The error's first line (the CR ends it), escaped, then "..." for the rest.
    assert "RuntimeError: \\x1b]0;pwned\\x07\\x1b[2J..." in out.decode()
    assert_shown_escaped(err, times=0)


def test_jobs_json_and_show_give_the_exact_stored_text(
    hostile_job: JobRecord, postgres_uri: str
) -> None:
    status, out, _ = run("jobs", "--json", uri=postgres_uri)
    assert status == 0
    [line] = out.splitlines()
    for raw in RAW:  # json.dumps escapes controls and writes non-ASCII as \\uXXXX
        assert raw not in line
    shown = json.loads(line)
    assert (shown["id"], shown["channel_id"], shown["category"]) == (
        hostile_job.id,
        hostile_job.channel_id,
        hostile_job.category,
    )
    assert (shown["error"], shown["unique_key"]) == (hostile_job.error, hostile_job.unique_key)

    for flag in ((), ("--json",)):
        status, out, _ = run("show", hostile_job.id, *flag, uri=postgres_uri)
        assert status == 0
        assert not any(raw in out for raw in RAW)
        assert json.loads(out)["category"] == hostile_job.category


def test_an_error_quoting_a_typed_job_id_is_escaped(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    for command in ("show", "cancel"):
        status, out, err = run(command, f"no-{HOSTILE}", uri=postgres_uri)
        assert status == 1
        assert out == b""
        for raw in RAW:
            assert raw not in err
        assert b"pypepper-dramatiq: no job" in err


def test_a_usage_error_quoting_a_typed_argument_is_escaped(postgres_uri: str) -> None:
    status, out, err = run("jobs", f"stray-{HOSTILE}", uri=postgres_uri)
    assert (status, out) == (2, b"")
    assert_shown_escaped(err)  # "unrecognized arguments: stray-..."
    assert b"unrecognized arguments" in err


def test_recurring_shows_name_cron_timezone_and_last_job_escaped(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    name = f"nightly-{HOSTILE}"
    pg_store.save_recurring(
        RecurringSchedule(
            name=name,
            cron=f"0 6 * * * {HOSTILE}",
            timezone=f"Europe/{HOSTILE}",
            template={"channel_id": f"c-{HOSTILE}", "category": f"cat-{HOSTILE}"},
            next_slot=NEXT,
            last_slot=NEXT - timedelta(days=1),
            last_job_id=f"job-{HOSTILE}",
        )
    )
    status, out, err = run("recurring", uri=postgres_uri)
    assert status == 0, err
    assert_shown_escaped(out, times=4)
    assert f"nightly-{ESCAPED}" in out.decode()

    status, out, _ = run("recurring", "--json", uri=postgres_uri)
    assert status == 0
    shown = json.loads(out)
    assert (shown["name"], shown["category"]) == (name, f"cat-{HOSTILE}")

    status, out, err = run("recurring", "remove", name, uri=postgres_uri)
    assert status == 0, err
    assert_shown_escaped(out)  # "recurring schedule NAME removed"
    status, out, err = run("recurring", "remove", name, uri=postgres_uri)
    assert status == 1
    assert not any(raw in err for raw in RAW)  # the error names it, escaped


@pytest.fixture
def hostile_worker(pg_store: SqlJobStore) -> Iterator[WorkerInfo]:
    """A live worker whose host, channels and owner are hostile, running a step of a task
    whose name is."""
    pg_store.prune_workers(FAR_FUTURE)
    now = utcnow()
    worker = WorkerInfo(
        owner=f"owner-{HOSTILE}",
        host=f"host-{HOSTILE}",
        pid=101,
        started=now - timedelta(minutes=1),
        last_seen=now,
        heartbeat=5.0,
        channels=(f"etl-{HOSTILE}",),
    )
    pg_store.beat_worker(worker)
    assert pg_store.put(
        JobRecord(
            id=f"job-{HOSTILE}",
            status=Status.IN_PROGRESS,
            payload={"workflows": [{"tasks": [{"name": f"task-{HOSTILE}"}]}]},
            state={"cursor": [0, 0, 0, 0]},
            lease_owner=worker.owner,
            lease_expires=now + timedelta(seconds=30),
        )
    )
    yield worker
    pg_store.prune_workers(FAR_FUTURE)


def test_workers_shows_host_channels_owner_job_and_task_escaped(
    hostile_worker: WorkerInfo, postgres_uri: str
) -> None:
    status, out, err = run("workers", uri=postgres_uri)
    assert status == 0, err
    # worker table: host, channels, owner; steps table: host, job, task
    assert_shown_escaped(out, times=6)
    assert f"task-{ESCAPED}" in out.decode()
    status, out, _ = run("workers", "--json", uri=postgres_uri)
    assert json.loads(out)["host"] == hostile_worker.host


@pytest.mark.redis
def test_channels_shows_a_hostile_channel_name_escaped(
    redis_url: str, redis_client: redis.Redis
) -> None:
    name = f"cli-{HOSTILE}"
    try:
        status, out, err = run("channels", "stop", name, broker_url=redis_url)
        assert status == 0, err
        assert_shown_escaped(out)  # "channel NAME stopped ..."
        assert_shown_escaped(err)  # "channel NAME was not known in Redis: created"

        status, out, err = run("channels", broker_url=redis_url)
        assert status == 0, err
        assert_shown_escaped(out)
        status, out, _ = run("channels", "--json", broker_url=redis_url)
        assert name in [json.loads(line)["channel"] for line in out.splitlines()]

        for argv in (("resume", name), ("resize", name, "3")):
            status, out, err = run("channels", *argv, broker_url=redis_url)
            assert status == 0, err
            assert_shown_escaped(out)
    finally:
        RedisGate(redis_client, name).reset()
