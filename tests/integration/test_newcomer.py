"""What a new user meets on the first day, with real ``dramatiq`` workers, Redis and PostgreSQL.

Rolling deploys (a task only some workers know), SIGTERM while a task is blocked
in C, and worker logs without noise.
"""

from __future__ import annotations

import re
import time

import pytest

from pypepper_dramatiq import Job, Status, Task, Workflow
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.rules.steps import Position

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, DEPLOYED_LATER, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _new_release_job(cluster: Cluster) -> Job:
    """A job of a task that only upgraded workers have (submitted by new code)."""
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(
        Workflow(
            [
                Task(
                    CHANNEL,
                    "",
                    DEPLOYED_LATER,
                    "new",
                    None,
                    "",
                    [],
                    None,
                    executor_id=DEPLOYED_LATER,
                    params={"value": "v2"},
                ),
            ]
        )
    )
    job.scheduled()
    return job


def test_a_rolling_deploy_runs_the_new_task_on_the_upgraded_worker(cluster: Cluster) -> None:
    old = cluster.start_worker(unknown_task_grace=60)
    new = cluster.start_worker(unknown_task_grace=60, upgraded=True)
    jobs = [_new_release_job(cluster) for _ in range(4)]

    records = cluster.wait_status(jobs, timeout=60)

    new_pids = new.group_pids()
    for job in jobs:
        record = records[job.id]
        assert record.state["results"] == {"0.0": "v2"}
        assert record.state["attempts"] == {"0.0": 1}  # the hand-backs burned no attempt
        assert [int(p) for p in cluster.redis.lrange(f"pids:{job.id}:new", 0, -1)] in (
            [[p] for p in new_pids]
        )
    assert old.proc.poll() is None


def test_a_task_no_worker_knows_fails_after_the_grace_naming_its_id(cluster: Cluster) -> None:
    grace = 3.0
    cluster.start_worker(unknown_task_grace=grace)
    cluster.start_worker(unknown_task_grace=grace)
    started = time.monotonic()
    job = _new_release_job(cluster)

    records = cluster.wait_status([job], timeout=30, statuses=[Status.FAILED])

    failed_after = time.monotonic() - started
    error = records[job.id].error or ""
    assert "UnknownExecutorError" in error and DEPLOYED_LATER in error
    assert failed_after >= grace
    assert records[job.id].state["attempts"] == {"0.0": 1}


def test_sigterm_lets_a_task_blocked_in_c_finish_and_records_it(cluster: Cluster) -> None:
    # The task sleeps in one C call; an interrupt could land only when it returns.
    # Within shutdown_grace the attempt finishes and is recorded: never run again.
    stopping = cluster.start_worker(shutdown_grace=10)
    job = cluster.schedule(
        probe.task(name="blocked", sleep=3, block=True, value="done"),
        probe.task(name="after", value=1),
    )
    wait_for(lambda: cluster.stamp("running", job, "blocked"), 30, "the task to start")

    exited_after = stopping.stop_gracefully(timeout=30)
    cluster.start_worker()
    records = cluster.wait_status([job], timeout=30)

    assert cluster.runs(job, "blocked") == 1
    assert records[job.id].state["results"]["0.0"] == "done"
    assert cluster.runs(job, "after") == 1  # run by the second worker
    assert exited_after < 10  # left as soon as the attempt was recorded
    assert cluster.redis.get(f"interrupted:{job.id}:blocked") is None


def test_sigterm_past_the_grace_interrupts_and_hands_the_step_back(cluster: Cluster) -> None:
    stopping = cluster.start_worker(shutdown_grace=1)
    job = cluster.schedule(probe.task(name="long", sleep=20, value=1))
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the task to start")

    exited_after = stopping.stop_gracefully(timeout=30)
    cluster.start_worker()
    cluster.wait_status([job], timeout=60)

    interrupted = cluster.redis.get(f"interrupted:{job.id}:long")
    assert interrupted is not None and interrupted.split()[1] == b"Shutdown"
    assert 1 <= exited_after < 10
    assert cluster.runs(job, "long") == 2
    log = stopping.log()
    assert "still running 1.0s after shutdown began; interrupt sent" in log
    assert re.search(r"task stopped \d+\.\ds after the interrupt was sent", log)


def test_worker_logs_carry_no_noise_for_normal_work(cluster: Cluster) -> None:
    worker = cluster.start_worker()
    jobs = [cluster.schedule(probe.task(name="a", value=i)) for i in range(10)]
    cluster.wait_status(jobs, timeout=30)
    # Normal redeliveries: duplicates of finished steps, with and without the record.
    for job in jobs[:3]:
        cluster.broker.enqueue(StepMessage(job.id, Position()).to_message(CHANNEL))
        cluster.broker.enqueue(StepMessage(job.id, Position(), job.to_record()).to_message(CHANNEL))
    cancelled = cluster.schedule(probe.task(name="slow", sleep=10, poll_cancel=True))
    wait_for(lambda: cluster.stamp("running", cancelled, "slow"), 30, "the slow task to start")
    cancelled.cancel()
    cluster.wait_status([cancelled], timeout=30, statuses=[Status.CANCELLED])
    time.sleep(1.5)  # the duplicates are consumed, a few lease renewals pass

    log = worker.log()
    assert "was skipped" not in log
    assert "alembic" not in log.lower()
    assert "its row was not stored yet" not in log  # a heal (DEBUG)
    assert "was not recorded" not in log  # an outcome write lost to another writer
    assert log.count("cancel event set") <= 1
