"""Cancels of jobs a real ``dramatiq`` worker process runs, from the command line (a
process of its own) and from the dashboard (a ``make_app`` in this process, which
installs no metrics): the interrupted attempt stays in the job's history, the row
and its timeline name who cancelled and from which host, and the worker counts the
end once and the attempt as cancelled (scraped from Dramatiq's exposition server).
"""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import Job, JobRecord, Status, Workflow
from pypepper_dramatiq.web import basic_auth, make_app
from pypepper_dramatiq.web.views import timeline

from .harness import Cluster, wait_for
from .test_metrics_processes import sample, scrape, start_metrics_worker
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

USER, PASSWORD = "ops", "cancel-history-test"


def running_job(cluster: Cluster) -> Job:
    """A job whose task works for two minutes unless it sees a cancel, running now."""
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name="crunch", sleep=120, poll_cancel=True)]))
    job.scheduled()
    wait_for(lambda: cluster.stamp("running", job, "crunch"), 60, "the task to start")
    return job


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPEPPER_")}
    return subprocess.run(
        [sys.executable, "-m", "pypepper_dramatiq", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def interrupted_attempt(job: Job) -> dict[str, Any] | None:
    """The attempt the cancel interrupted, once the worker recorded it."""
    record = Job.get_saved(job.id)
    entries = (record.state.get("history") or {}).get("0.0") if record else None
    return entries[-1] if entries else None


def check_history(record: JobRecord, by: str) -> None:
    assert record.status is Status.CANCELLED
    [attempt] = record.state["history"]["0.0"]
    assert attempt["outcome"] == "cancelled"
    assert attempt["worker"]  # the worker's owner id
    started, ended = (datetime.fromisoformat(attempt[k]) for k in ("started", "ended"))
    assert started <= ended
    assert record.state["attempts"] == {"0.0": 1}
    canceller = record.state["cancelled_by"]
    assert canceller["by"] == by and canceller["host"] == socket.gethostname()
    assert record.state["counted"] is True
    moments = [(m.what, m.detail) for m in timeline(record)]
    whats = [what for what, _ in moments]
    assert "task 0.0: attempt 1 started" in whats and "task 0.0: attempt 1 cancelled" in whats
    assert ("Cancelled", f"by {by} on {socket.gethostname()}") in moments


@pytest.mark.timeout(240)
def test_cancels_from_the_cli_and_the_dashboard_keep_the_run_and_count_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    port = start_metrics_worker(cluster, tmp_path, processes=1)
    store = ["--uri", cluster.store_uri, "--broker-url", cluster.redis_url]

    # From the command line.
    by_cli = running_job(cluster)
    done = cli("cancel", by_cli.id, *store)
    assert done.returncode == 0, done.stderr
    assert f"job {by_cli.id} cancelled" in done.stdout
    wait_for(lambda: interrupted_attempt(by_cli), 60, "the interrupted attempt recorded")
    # Again: the job has ended, as a completed one would have.
    again = cli("cancel", by_cli.id, *store)
    assert again.returncode == 1
    assert f"job {by_cli.id} has already ended (Cancelled): nothing was cancelled" in again.stderr

    # From the dashboard: the button's confirmation page, then its POST.
    by_dashboard = running_job(cluster)
    client = Client(make_app(auth=basic_auth(USER, PASSWORD)))
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth = {"Authorization": f"Basic {pair}"}
    asked = client.get(f"/actions/cancel/{by_dashboard.id}", headers=auth)
    assert asked.status_code == 200
    token = re.search(r'name="csrf_token" value="([^"]+)"', asked.get_data(as_text=True))
    assert token is not None
    answer = client.post(
        f"/actions/cancel/{by_dashboard.id}", data={"csrf_token": token[1]}, headers=auth
    )
    assert answer.status_code == 303 and answer.headers["Location"].endswith("notice=cancelled")
    wait_for(lambda: interrupted_attempt(by_dashboard), 60, "the interrupted attempt recorded")

    check_history(cluster.saved(by_cli), "cli")
    check_history(cluster.saved(by_dashboard), f"dashboard:{USER}")
    page = client.get(f"/jobs/{by_dashboard.id}", headers=auth).get_data(as_text=True)
    assert f"by dashboard:{USER} on {socket.gethostname()}" in page

    ended = "pypepper_jobs_ended_total"
    labels = {"status": "Cancelled", "channel": CHANNEL, "category": "it"}

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        samples = scrape(port)
        return samples if sample(samples, ended, **labels) >= 2 else None

    samples = wait_for(counted, 30, "the two cancels counted by the worker")
    assert sample(samples, ended, **labels) == 2  # once each, though nobody else counted
    attempts = "pypepper_task_duration_seconds_count"
    assert sample(samples, attempts, task="crunch", outcome="cancelled") == 2
    assert sample(samples, attempts, task="crunch", outcome="succeeded") == 0
    # The series of the worker's channel exist from its start.
    scheduled = ("pypepper_jobs_scheduled_total", frozenset({("channel", CHANNEL)}))
    assert scheduled in samples
    held = ("pypepper_jobs_held", frozenset({("channel", CHANNEL), ("reason", "jobs")}))
    assert held in samples, sorted(k for k in samples if "held" in k[0] or "depth" in k[0])
