"""The workers' heartbeat rows with real ``dramatiq`` worker processes, Redis and PostgreSQL.

A worker process is listed (by ``pypepper-dramatiq workers``) with its host and pid and
the step it runs while a slow task runs; SIGTERM removes its row, SIGKILL leaves it,
and the listing calls it gone once three heartbeats were missed.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.records.workers import GONE_AFTER_BEATS, heartbeat_seconds

from .harness import Cluster, WorkerProcess, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The harness's lease (5 s) is renewed every 5/3 s, so each worker beats every 5 s.
LEASE_SECONDS = 5.0
HEARTBEAT = heartbeat_seconds(LEASE_SECONDS / 3)


def listed(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """What ``pypepper-dramatiq workers --json`` prints now."""
    capsys.readouterr()
    assert main(["workers", "--uri", cluster.store_uri, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def rows_of(
    worker: WorkerProcess, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> list[dict[str, Any]]:
    """The listed rows of ``worker``'s processes (rows of other tests' workers may stay)."""
    pids = worker.group_pids()
    return [row for row in listed(cluster, capsys) if row["pid"] in pids]


def rows_of_pid(
    pid: int, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> list[dict[str, Any]]:
    """The listed rows of the worker process ``pid``."""
    return [row for row in listed(cluster, capsys) if row["pid"] == pid]


def test_a_worker_is_listed_with_the_step_it_runs_and_a_sigterm_removes_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = cluster.start_worker(lease_seconds=LEASE_SECONDS)
    job = cluster.schedule(probe.task(name="slow", sleep=30, poll_cancel=True))
    wait_for(lambda: cluster.stamp("running", job, "slow"), 30, "the slow task to start")

    def running_it() -> dict[str, Any] | None:
        rows = rows_of(worker, cluster, capsys)
        return rows[0] if rows and rows[0]["steps"] else None

    row = wait_for(running_it, 10, "the worker listed with its step")
    [pid] = cluster.run_pids(job, "slow")
    assert row["pid"] == pid and row["host"] == socket.gethostname()
    assert row["owner"].startswith(f"{socket.gethostname()}:{pid}:")
    assert row["state"] == "live" and row["channels"] == [CHANNEL]
    assert row["heartbeat"] == HEARTBEAT
    [step] = row["steps"]
    assert (step["job_id"], step["task"], step["key"]) == (job.id, "slow", "0.0")
    assert cluster.saved(job).lease_owner == row["owner"]

    worker.stop_gracefully(timeout=30)
    assert rows_of_pid(pid, cluster, capsys) == []  # deleted as it stopped, not left to age


def test_a_sigkilled_worker_stays_listed_and_is_gone_after_three_missed_heartbeats(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = cluster.start_worker(lease_seconds=LEASE_SECONDS)
    job = cluster.schedule(probe.task(name="slow", sleep=60))
    wait_for(lambda: cluster.stamp("running", job, "slow"), 30, "the slow task to start")
    [pid] = cluster.run_pids(job, "slow")
    wait_for(lambda: rows_of_pid(pid, cluster, capsys), 10, "the worker's row")

    worker.kill()
    killed_at = time.monotonic()
    [row] = rows_of_pid(pid, cluster, capsys)
    assert row["state"] == "live"  # its last heartbeat is recent: not yet called gone

    def gone() -> dict[str, Any] | None:
        rows = rows_of_pid(pid, cluster, capsys)
        return rows[0] if rows and rows[0]["state"] == "gone" else None

    limit = GONE_AFTER_BEATS * HEARTBEAT
    row = wait_for(gone, limit + 10, "the killed worker shown as gone", interval=0.5)
    noticed_in = time.monotonic() - killed_at
    print(f"\n[workers] SIGKILLed worker shown as gone {noticed_in:.1f}s after the kill")
    assert noticed_in <= limit + 2
    assert row["silent_for"] > limit
    # No worker is left to recover it: its step stays listed under it, stranded.
    assert [step["job_id"] for step in row["steps"]] == [job.id]
