"""``on_final_failure`` hooks and self-cancel on real ``dramatiq`` workers, Redis and PostgreSQL.

A hook runs once per (job, task): not once per attempt, not again when a
sweep sees it running longer than a lease, and, when the worker that recorded
the failure is SIGKILLed before the hook's work, once on another worker (the
recovery sweep takes it over after the dead worker's hold lapsed). The hook
(``worker_app.hook_probe``) counts its runs in Redis; a file written by the
test pauses it before its work, which is where the worker gets killed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pypepper_dramatiq import Job, Status
from pypepper_dramatiq.redis_layout import CANCEL_CHANNEL

from .harness import Cluster, wait_for
from .worker_app import cancel_own_job, fail_with_hook, probe, trace_key

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: Short leases, so that a dead worker's hold lapses within seconds.
LEASE_SECONDS = 2.0


def hook_runs(cluster: Cluster, job: Job, name: str) -> int:
    return int(cluster.redis.get(trace_key("hook_runs", job.id, name)) or 0)


def hook_list(cluster: Cluster, kind: str, job: Job, name: str) -> list[str]:
    return [v.decode() for v in cluster.redis.lrange(trace_key(kind, job.id, name), 0, -1)]


def hooks_settled(cluster: Cluster, job: Job) -> bool:
    return "hooks" not in cluster.saved(job).state


def test_a_hook_runs_exactly_once_on_real_workers(cluster: Cluster) -> None:
    # Two workers, so that another process's recovery sweep looks at the job
    # too; the hook runs longer than a lease, so its hold must be renewed.
    for _ in range(2):
        cluster.start_worker(lease_seconds=LEASE_SECONDS)
    job = cluster.schedule(
        fail_with_hook.options(retry_count=2).task(name="t", hook_sleep=2.5 * LEASE_SECONDS)
    )

    [record] = cluster.wait_status([job], timeout=60, statuses=(Status.FAILED,)).values()
    wait_for(lambda: hooks_settled(cluster, job), 30, "the hook to be marked done")
    time.sleep(LEASE_SECONDS + 2)  # any sweep that would take it over has had its chance

    assert cluster.runs(job, "t") == 3  # three attempts...
    assert hook_runs(cluster, job, "t") == 1  # ...one hook
    assert hook_list(cluster, "hook_errors", job, "t") == ["RuntimeError: t: planned failure 3"]
    record = cluster.saved(job)
    assert record.status is Status.FAILED
    assert record.error == "task t failed: RuntimeError: t: planned failure 3"
    done = record.state["hooks_done"]["0.0"]
    assert "error" not in done
    assert record.lease_owner is None and record.lease_expires is None


def test_a_hook_left_due_by_a_sigkilled_worker_runs_once_on_another(
    cluster: Cluster, tmp_path: Path
) -> None:
    pause = tmp_path / "pause-hook"
    pause.write_text("the hook waits while this file exists\n")
    crashed = cluster.start_worker(lease_seconds=LEASE_SECONDS, threads=1)
    job = cluster.schedule(fail_with_hook.task(name="t", pause_file=str(pause)))

    paused_pid = wait_for(
        lambda: cluster.redis.get(trace_key("hook_paused", job.id, "t")),
        30,
        "the hook to be called (and pause)",
    )
    # The failure is on record, and the hook due in the same row, before any hook work.
    record = cluster.saved(job)
    assert record.status is Status.FAILED
    entry = record.state["hooks"]["0.0"]
    assert entry["status"] == "pending" and entry["until"] is not None
    assert hook_runs(cluster, job, "t") == 0

    crashed.kill()
    killed_at = time.monotonic()
    pause.unlink()
    cluster.start_worker(lease_seconds=LEASE_SECONDS)
    wait_for(lambda: hooks_settled(cluster, job), 40, "the recovered hook to be marked done")
    recovered_in = time.monotonic() - killed_at
    time.sleep(LEASE_SECONDS + 2)  # nothing runs it a second time

    assert hook_runs(cluster, job, "t") == 1
    [pid] = hook_list(cluster, "hook_pids", job, "t")
    assert int(pid) != int(paused_pid)  # run by the other worker
    assert hook_list(cluster, "hook_errors", job, "t") == ["RuntimeError: t: planned failure 1"]
    record = cluster.saved(job)
    assert record.status is Status.FAILED
    assert record.state["hooks_done"]["0.0"]["owner"] != entry["owner"]
    assert cluster.runs(job, "t") == 1  # the failed task itself never ran again
    print(f"\n[hooks] a dead worker's hook ran elsewhere {recovered_in:.1f}s after the kill")
    # The hold (a lease) lapses, then the new worker's sweep takes it over.
    assert recovered_in < LEASE_SECONDS + 20


def test_a_task_cancelling_its_job_is_announced_on_the_cancel_channel(cluster: Cluster) -> None:
    listener = cluster.redis.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(CANCEL_CHANNEL)
    try:
        cluster.start_worker()
        job = cluster.schedule(
            cancel_own_job.options(retry_count=2).task(name="quit"),
            probe.task(name="after"),
        )
        [record] = cluster.wait_status([job], timeout=40, statuses=(Status.CANCELLED,)).values()

        def announced() -> bool:
            message = listener.get_message(timeout=0.1)
            return message is not None and message["data"] == job.id.encode()

        wait_for(announced, 10, "the cancel to be published")
    finally:
        listener.close()

    assert cluster.runs(job, "quit") == 1 and cluster.runs(job, "after") == 0
    assert record.error == "task quit cancelled the job: JobCancellationError: quit: nothing to do"
    assert record.state["history"]["0.0"][0]["outcome"] == "cancelled"
