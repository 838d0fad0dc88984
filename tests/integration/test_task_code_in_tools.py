"""Task code in the operator tools: ``--import`` for every command that rebuilds jobs.

The CLI and the dashboard run as separate processes, as a user runs them, in a
directory holding the task module; this test process never imports that module.
A command without the module refuses with the option to use (the dashboard with a
409, never a 500); with ``--import`` (or ``$PYPEPPER_IMPORT``) it rebuilds the job.
"""

from __future__ import annotations

import base64
import html
import http.cookiejar
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

from .conftest import empty_jobs_table, flush_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

MODULE = "tools_tasks"
EXECUTOR = "tools.hello"
TASK = {"name": "hello", "executor_id": EXECUTOR, "params": {}}
PAYLOAD = {"workflows": [{"tasks": [TASK]}]}
USER, PASSWORD = "ops", "task-code-test"
HINT = "--import MODULE"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory holding the task module, as a project's would."""
    (tmp_path / f"{MODULE}.py").write_text(
        "from pypepper_dramatiq import workflow_task\n\n\n"
        f"@workflow_task(name={EXECUTOR!r})\n"
        "def hello(task, context):\n"
        "    return 'hi'\n"
    )
    return tmp_path


@pytest.fixture
def store(postgres_uri: str, redis_url: str) -> Iterator[SqlJobStore]:
    flush_redis(redis_url)
    empty_jobs_table(postgres_uri)
    opened = SqlJobStore(postgres_uri, migrate=True)
    opened.delete_recurring("nightly")
    opened.save_recurring(
        RecurringSchedule(
            name="nightly",
            cron="0 6 * * *",
            timezone="UTC",
            template={"channel_id": "tools", "category": "nightly", "payload": PAYLOAD},
            next_slot=datetime(2030, 1, 1, tzinfo=timezone.utc),
            overlap="allow",
        )
    )
    assert opened.put(
        JobRecord(
            id="failed-one",
            channel_id="tools",
            status=Status.FAILED,
            payload=PAYLOAD,
            state={"cursor": [0, 0, 0, 0]},
        )
    )
    yield opened
    opened.delete_recurring("nightly")
    opened.close()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPEPPER_")}
    env.update(extra)
    return env


def cli(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pypepper_dramatiq", *argv],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_recurring_trigger_and_retry_need_the_tasks_code_and_take_import(
    workdir: Path, store: SqlJobStore, postgres_uri: str, redis_url: str
) -> None:
    where = ["--uri", postgres_uri, "--broker-url", redis_url]
    refused = cli(workdir, "recurring", "trigger", "nightly", *where)
    assert refused.returncode == 2, refused.stderr
    assert f"no executor is registered under id {EXECUTOR!r}" in refused.stderr
    assert HINT in refused.stderr and "$PYPEPPER_IMPORT" in refused.stderr

    fired = cli(workdir, "recurring", "trigger", "nightly", *where, "--import", MODULE)
    assert fired.returncode == 0, fired.stderr
    job_id = fired.stdout.strip().rsplit(" ", 1)[-1]
    record = store.get(job_id)
    assert record is not None and record.status is Status.SCHEDULED

    by_env = cli(workdir, "retry", "failed-one", *where, PYPEPPER_IMPORT=f"nothing_else,{MODULE}")
    assert by_env.returncode == 2 and "No module named 'nothing_else'" in by_env.stderr
    retried = cli(workdir, "retry", "failed-one", *where, PYPEPPER_IMPORT=MODULE)
    assert retried.returncode == 0, retried.stderr
    new = store.get(retried.stdout.strip())
    assert new is not None and new.status is Status.SCHEDULED


class Dashboard:
    """A ``pypepper-dramatiq dashboard`` process, and a browser-like client of it."""

    def __init__(self, cwd: Path, *argv: str) -> None:
        self.log = cwd / f"dashboard-{len(list(cwd.glob('dashboard-*.log')))}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pypepper_dramatiq", "dashboard", "--port", "0", *argv],
                cwd=cwd,
                env=_env(PYPEPPER_DASHBOARD_USER=USER, PYPEPPER_DASHBOARD_PASSWORD=PASSWORD),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while True:
            found = re.search(r"dashboard on (http://[\d.]+:\d+)/", self.output())
            if found:
                self.url = found.group(1)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("the dashboard did not start:\n" + self.output())
            time.sleep(0.05)
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
            _NoRedirects(),
        )
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        self.opener.addheaders = [("Authorization", f"Basic {token}")]

    def get(self, path: str) -> tuple[int, str]:
        return self._call(urllib.request.Request(self.url + path))

    def post(self, path: str, form_page: str) -> tuple[int, str, str]:
        status, page = self.get(form_page)
        assert status == 200, page
        found = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert found, "no form on " + form_page
        body = urllib.parse.urlencode({"csrf_token": found.group(1)}).encode()
        request = urllib.request.Request(
            self.url + path, data=body, headers={"Origin": self.url}, method="POST"
        )
        try:
            with self.opener.open(request, timeout=30) as answer:
                location, page = answer.headers.get("Location") or "", answer.read().decode()
                return answer.status, location, html.unescape(page)
        except urllib.error.HTTPError as error:
            location, page = error.headers.get("Location") or "", error.read().decode()
            return error.code, location, html.unescape(page)

    def _call(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_the_dashboard_answers_409_without_the_code_and_rebuilds_with_import(
    workdir: Path, store: SqlJobStore, postgres_uri: str, redis_url: str
) -> None:
    where = ["--uri", postgres_uri, "--broker-url", redis_url]
    plain = Dashboard(workdir, *where)
    try:
        status, _, page = plain.post("/actions/trigger/nightly", "/schedules")
        assert status == 409, page
        assert f"no executor is registered under id {EXECUTOR!r}" in page
        assert "dashboard --import MODULE" in page
        status, _, page = plain.post("/actions/retry/failed-one", "/jobs/failed-one")
        assert status == 409, page
        assert "dashboard --import MODULE" in page
    finally:
        plain.close()
    # Served by waitress, not Werkzeug's development server.
    assert "development server" not in plain.output()

    served = Dashboard(workdir, *where, "--import", MODULE)
    try:
        status, location, _ = served.post("/actions/trigger/nightly", "/schedules")
        assert status == 303 and "/jobs/rec-" in location
        status, location, _ = served.post("/actions/retry/failed-one", "/jobs/failed-one")
        assert status == 303 and "/jobs/" in location
        new_id = urllib.parse.unquote(location.split("/jobs/", 1)[1].split("?", 1)[0])
        record = store.get(new_id)
        assert record is not None and record.status is Status.SCHEDULED
    finally:
        served.close()
