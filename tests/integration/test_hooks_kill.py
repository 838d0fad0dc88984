"""``on_final_failure`` hooks and self-cancel on real ``dramatiq`` workers, Redis and PostgreSQL.

A hook runs once per (job, task): not once per attempt, not again when a
sweep sees it running longer than a lease, and, when the worker that recorded
the failure is SIGKILLed before the hook's work, once on another worker (the
recovery sweep takes it over after the dead worker's hold lapsed). A job
that goes on past an optional task whose hook its worker was killed in waits
about a lease for its next step (held by that worker meanwhile), not
``dispatch_seconds``. The hook (``worker_app.hook_probe``) counts its runs in
Redis; a file written by the test pauses it before its work, which is where
the worker gets killed.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from pypepper_dramatiq import Job, Status
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.transport.redis.layout import CANCEL_CHANNEL

from .harness import Cluster, wait_for
from .worker_app import cancel_own_job, fail_with_hook, probe, trace_key

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: Short leases, so that a dead worker's hold lapses within seconds.
LEASE_SECONDS = 2.0
#: How often the workers' recovery sweeps look (the harness's default).
SWEEP_INTERVAL = 0.5


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


def test_a_worker_sigkilled_inside_an_optional_tasks_hook_delays_the_next_task_one_lease(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The job goes on past the optional task: its next step is held by the
    # hook's worker (a lease renewed with the hook's hold), not sent only
    # after the hook. Killed inside the hook, the worker leaves a lease that
    # lapses within LEASE_SECONDS: the other worker's sweep sends the step, and
    # runs the hook again, instead of the job waiting for dispatch_seconds.
    pause = tmp_path / "pause-hook"
    pause.write_text("the hook waits while this file exists\n")
    workers = [
        cluster.start_worker(lease_seconds=LEASE_SECONDS, sweep_interval=SWEEP_INTERVAL)
        for _ in range(2)
    ]
    job = cluster.schedule(
        probe.task(name="before", value=1),
        fail_with_hook.options(optional=True).task(name="opt", pause_file=str(pause)),
        probe.task(name="after", value=2),
    )

    paused_pid = int(
        wait_for(
            lambda: cluster.redis.get(trace_key("hook_paused", job.id, "opt")),
            30,
            "the hook to be called (and pause)",
        )
    )
    [crashed] = [w for w in workers if paused_pid in w.group_pids()]
    [survivor] = [w for w in workers if w is not crashed]
    # The failure is recorded; the next step is held by the hook's worker under
    # a lease (not the dispatch_seconds of a step whose message is on its way).
    record = cluster.saved(job)
    assert record.status is Status.IN_PROGRESS
    assert record.state["cursor"] == [0, 2, 0, 0]
    assert record.state["skipped"] == ["0.1"]
    assert record.lease_owner == record.state["hooks"]["0.1"]["owner"]
    assert record.lease_expires is not None
    assert record.lease_expires <= utcnow() + timedelta(seconds=LEASE_SECONDS)
    assert cluster.runs(job, "after") == 0 and hook_runs(cluster, job, "opt") == 0

    killed_at = time.time()
    crashed.kill()
    pause.unlink()  # the recovered hook runs through
    wait_for(lambda: cluster.times("starts", job, "after"), 30, "the next task to start")
    started_in = cluster.times("starts", job, "after")[0] - killed_at
    cluster.wait_status([job], timeout=30)
    wait_for(lambda: hooks_settled(cluster, job), 30, "the recovered hook to be marked done")

    print(f"\n[hooks] the next task started {started_in:.1f}s after a kill inside the hook")
    # A lease, the sweep's interval, and a margin for the sweep lock's handover
    # (2 x sweep_interval when the dead worker led) and a loaded machine; the
    # stall this replaces was dispatch_seconds (60 s).
    assert started_in < LEASE_SECONDS + SWEEP_INTERVAL + 3.0
    assert hook_runs(cluster, job, "opt") >= 1  # run again, after the kill
    survivors = survivor.group_pids()
    assert {int(pid) for pid in hook_list(cluster, "hook_pids", job, "opt")} <= survivors
    assert set(cluster.run_pids(job, "after")) <= survivors
    # No finished task ran again, and the next one ran once.
    assert [cluster.runs(job, name) for name in ("before", "opt", "after")] == [1, 1, 1]
    record = cluster.saved(job)
    assert record.status is Status.COMPLETED
    assert record.result("after") == 2
    assert record.lease_owner is None


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
