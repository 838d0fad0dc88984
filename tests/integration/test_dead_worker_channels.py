"""A dead worker's prefetch comes back whichever channels the sweep leader serves.

Real ``dramatiq`` processes: the recovery sweep's leader serves channel ``it-b``
only, and a worker of channel ``it-a`` is SIGKILLed while it holds delayed
messages of its channel (fetched from ``it-a.DQ``, waiting for their planned
start). The leader's own broker never declared ``it-a``: it finds the queue in
the dead worker's ack set.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from pypepper_dramatiq import Job, Workflow
from pypepper_dramatiq.transport.redis.layout import LEADER_KEY

from .harness import Cluster, WorkerProcess, wait_for
from .worker_app import ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The channel of the worker that dies, and the leader's.
DYING, LEADING = "it-a", "it-b"
HEARTBEAT_MS = 3_000
#: Long enough that the leader's lock (held for twice this) outlives a slow tick.
SWEEP = 2.0
#: Seconds from the queue's return to the task's start: a fetch after an idle
#: worker's backoff, the move from the delay queue, the claim in the store.
MARGIN = 5.0
JOBS = 7
DELAY = 5.0


def serving(cluster: Cluster, channel: str, *, wait: bool = True) -> WorkerProcess:
    return cluster.start_worker(
        threads=1,
        heartbeat_timeout_ms=HEARTBEAT_MS,
        sweep_interval=SWEEP,
        wait=wait,
        extra_env={ENV["channels"]: channel},
    )


def held_in_ack_sets(cluster: Cluster, queue: str) -> int:
    """How many messages of ``queue`` some worker fetched and has not acknowledged."""
    keys = cluster.redis.scan_iter(match=f"dramatiq:__acks__.*.{queue}", count=1000)
    return sum(int(cluster.redis.scard(key)) for key in keys)


def signal_group(worker: WorkerProcess, signum: int) -> None:
    os.killpg(worker.pid, signum)


def test_a_dead_workers_delayed_messages_start_in_time_when_the_leader_serves_another_channel(
    cluster: Cluster,
) -> None:
    serving(cluster, LEADING)
    leader = wait_for(lambda: cluster.redis.get(LEADER_KEY), 30, "the it-b worker to lead")
    leaders = {leader}
    # The worker that takes over, frozen until the other one died: it must not
    # fetch the delayed messages first.
    successor = serving(cluster, DYING)
    signal_group(successor, signal.SIGSTOP)
    dying = serving(cluster, DYING)

    jobs = []
    for i in range(JOBS):
        job = Job(category="it", channel_id=DYING)
        job.workflows.append(Workflow([probe.task(name="delayed", value=i)]))
        job.scheduled(delay=DELAY)
        jobs.append(job)
    wait_for(
        lambda: (
            cluster.redis.llen(f"dramatiq:{DYING}.DQ") == 0
            and held_in_ack_sets(cluster, f"{DYING}.DQ") == JOBS
        ),
        30,
        "the it-a worker to prefetch every delayed message",
    )
    dying.kill()
    killed_at = time.time()
    signal_group(successor, signal.SIGCONT)
    leaders.add(cluster.redis.get(LEADER_KEY))

    def all_started() -> bool:
        leaders.add(cluster.redis.get(LEADER_KEY))
        return all(cluster.times("starts", job, "delayed") for job in jobs)

    wait_for(all_started, 90, "every delayed job to start", interval=0.2)
    cluster.wait_status(jobs, timeout=60)

    assert leaders == {leader}, "the it-b worker led the sweep throughout"
    successor_pids = successor.group_pids()
    late = {}
    for job in jobs:
        planned = cluster.saved(job).not_before
        assert planned is not None
        assert killed_at < planned.timestamp(), "killed while it held the delayed messages"
        started = cluster.times("starts", job, "delayed")[0]
        late[job.id] = started - planned.timestamp()
        assert cluster.runs(job, "delayed") == 1
        assert set(cluster.run_pids(job, "delayed")) <= successor_pids
    worst = max(late.values())
    print(
        f"\n[dead-worker-other-channel] heartbeat_timeout_s={HEARTBEAT_MS / 1000:g} "
        f"sweep_interval_s={SWEEP:g} worst_start_after_planned_s={worst:.2f}"
    )
    assert worst <= HEARTBEAT_MS / 1000 + SWEEP + MARGIN, late
