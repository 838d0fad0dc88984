"""Continuation of zero-delay steps with real ``dramatiq`` worker processes.

A continued step runs in the thread of the message before it, without a message
of its own: while a chain runs, the only step message its worker holds (in its
Redis ack set) is the one the chain started from. These tests check that a
worker SIGKILLed mid-chain is recovered by the step's lease, that
``round_timeout`` and a cancel reach a continued attempt, and that plain actors
and other jobs get their turn beside long chains.
"""

from __future__ import annotations

import json

import pytest

from pypepper_dramatiq import Job, Status
from pypepper_dramatiq.channels.messages import OPTION_KEY

from .conftest import BOTH_STORES
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, ENV, flaky_plain, probe

#: A bound no test chain reaches: the whole job runs on its first message.
WHOLE_CHAIN = {ENV["continue_steps"]: "1000", ENV["continue_seconds"]: "600"}


def held_positions(cluster: Cluster, job: Job) -> list[list[int]]:
    """The positions of ``job``'s step messages that workers hold unacknowledged."""
    ids: set[bytes] = set()
    for key in cluster.redis.scan_iter(f"dramatiq:__acks__.*.{CHANNEL}"):
        ids |= set(cluster.redis.smembers(key))
    held = []
    for raw in cluster.redis.hmget(f"dramatiq:{CHANNEL}.msgs", list(ids)) if ids else []:
        if raw is None:
            continue
        data = json.loads(raw)["options"].get(OPTION_KEY)
        if data is not None and data["job"] == job.id:
            held.append(data["pos"])
    return held


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
def test_a_worker_sigkilled_mid_chain_is_recovered_and_no_finished_task_runs_again(
    cluster: Cluster,
) -> None:
    lease = 2.0
    crashed = cluster.start_worker(threads=1, lease_seconds=lease, extra_env=WHOLE_CHAIN)
    names = [f"t{i:02d}" for i in range(20)]
    job = cluster.schedule(*(probe.task(name=name, sleep=0.15, value=1) for name in names))
    wait_for(lambda: cluster.stamp("running", job, "t08"), 30, "the ninth task to start")
    # Nine steps in, the worker still holds only the message the chain started from.
    assert held_positions(cluster, job) == [[0, 0, 0, 0]]

    crashed.kill()
    finished = {name for name in names if cluster.times("ends", job, name)}
    assert "t19" not in finished, "the crash came too late"
    cluster.start_worker(threads=2, lease_seconds=lease, extra_env=WHOLE_CHAIN)
    record = cluster.wait_status([job], timeout=60)[job.id]

    assert record.status is Status.COMPLETED
    runs = {name: cluster.runs(job, name) for name in names}
    assert all(runs[name] == 1 for name in finished), runs
    assert all(runs[name] in (1, 2) for name in names), runs
    rerun = [name for name in names if runs[name] == 2]
    assert len(rerun) <= 1, rerun  # only the attempt the kill cut short
    survivor = cluster.workers[1].group_pids()
    assert set(cluster.run_pids(job, "t19")) <= survivor


def test_round_timeout_interrupts_continued_attempts_in_a_worker(cluster: Cluster) -> None:
    cluster.start_worker(threads=1, extra_env=WHOLE_CHAIN)
    job = cluster.schedule(
        probe.task(name="first"),
        probe.options(round_timeout=1, retry_count=1).task(name="busy", sleep=30),
        probe.task(name="never"),
    )
    wait_for(lambda: cluster.stamp("running", job, "busy"), 30, "the busy task to start")
    assert held_positions(cluster, job) == [[0, 0, 0, 0]]  # continued, no message of its own

    record = cluster.wait_status([job], timeout=40, statuses=[Status.FAILED])[job.id]

    assert record.error is not None and "TaskTimeoutError" in record.error
    entries = record.state["history"]["0.1"]
    assert [e["outcome"] for e in entries] == ["timed_out", "timed_out"]  # both continued
    assert cluster.runs(job, "busy") == 2
    interrupted = cluster.redis.get(f"interrupted:{job.id}:busy")
    assert interrupted is not None and b"AttemptTimedOut" in interrupted
    assert cluster.runs(job, "never") == 0


def test_a_cancel_reaches_a_continued_attempt_and_no_later_task_starts(cluster: Cluster) -> None:
    cluster.start_worker(threads=1, extra_env=WHOLE_CHAIN)
    job = cluster.schedule(
        probe.task(name="first"),
        probe.task(name="poll", sleep=30, poll_cancel=True),
        probe.task(name="never"),
    )
    wait_for(lambda: cluster.stamp("running", job, "poll"), 30, "the polling task to start")
    assert held_positions(cluster, job) == [[0, 0, 0, 0]]

    assert job.cancel()
    wait_for(lambda: cluster.stamp("cancel_seen", job, "poll"), 10, "the task to notice")
    cluster.wait_status([job], timeout=15, statuses=[Status.CANCELLED])

    assert cluster.runs(job, "first") == cluster.runs(job, "poll") == 1
    assert cluster.runs(job, "never") == 0


def test_sigterm_during_a_continued_attempt_hands_the_step_back(cluster: Cluster) -> None:
    stopping = cluster.start_worker(threads=1, shutdown_grace=1, extra_env=WHOLE_CHAIN)
    job = cluster.schedule(
        probe.task(name="first", value=1),
        probe.task(name="long", sleep=20, value=1),
        probe.task(name="after", value=2),
    )
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the long task to start")
    assert held_positions(cluster, job) == [[0, 0, 0, 0]]

    stopping.stop_gracefully(timeout=30)

    record = cluster.saved(job)
    assert record.status is Status.IN_PROGRESS
    assert record.state["cursor"] == [0, 1, 0, 0]
    assert record.lease_owner is None  # released: no lease to wait for
    assert "0.1" not in record.state.get("attempts", {})  # handed back, not counted
    interrupted = cluster.redis.get(f"interrupted:{job.id}:long")
    assert interrupted is not None and interrupted.split()[1] == b"Shutdown"
    cluster.start_worker()
    cluster.wait_status([job], timeout=60)
    assert [cluster.runs(job, name) for name in ("first", "long", "after")] == [1, 2, 1]


def test_plain_actors_beside_continued_chains_keep_exact_counts(cluster: Cluster) -> None:
    cluster.start_worker(processes=2, threads=4)
    keys = [f"load-{i}" for i in range(40)]
    jobs = []
    for i, key in enumerate(keys):
        cluster.broker.enqueue(flaky_plain.message(key, 1).copy(queue_name=CHANNEL))
        if i % 2 == 0:
            jobs.append(cluster.schedule(*(probe.task(name=f"t{n}", value=n) for n in range(10))))

    records = cluster.wait_status(jobs, timeout=90)
    wait_for(
        lambda: all(cluster.redis.get(f"plain-done:{key}") for key in keys), 30, "plain actors"
    )

    assert all(r.status is Status.COMPLETED for r in records.values())
    assert all(cluster.runs(job, f"t{n}") == 1 for job in jobs for n in range(10))
    # One planned failure each, retried once by Dramatiq's Retries: exactly two calls.
    assert [cluster.redis.get(f"plain:{key}") for key in keys] == [b"2"] * len(keys)
    assert [cluster.redis.get(f"plain-done:{key}") for key in keys] == [b"2"] * len(keys)


def test_a_long_chain_yields_its_thread_to_messages_queued_behind_it(cluster: Cluster) -> None:
    """One worker thread, a 40-step chain of 0.1 s steps, the default bound (1 s): the
    chain goes back to the queue after a second, so plain messages queued while it
    runs are served before it ends."""
    cluster.start_worker(threads=1)
    names = [f"t{i:02d}" for i in range(40)]
    job = cluster.schedule(*(probe.task(name=name, sleep=0.1) for name in names))
    wait_for(lambda: cluster.stamp("running", job, "t01"), 30, "the chain to run")
    keys = [f"behind-{i}" for i in range(5)]
    for key in keys:
        cluster.broker.enqueue(flaky_plain.message(key, 0).copy(queue_name=CHANNEL))

    wait_for(
        lambda: all(cluster.redis.get(f"plain-done:{key}") for key in keys), 30, "plain actors"
    )
    assert not cluster.times("ends", job, "t39"), "the chain held its thread to the end"
    cluster.wait_status([job], timeout=60)
    assert all(cluster.runs(job, name) == 1 for name in names)
