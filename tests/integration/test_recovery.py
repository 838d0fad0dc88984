"""Bounded recovery of what a dead worker held, and draining a stopped Redis channel."""

from __future__ import annotations

import time

import pytest

from pypepper_dramatiq import ChannelStoppedError, manager

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_messages_prefetched_by_a_sigkilled_worker_come_back_in_bounded_time(
    cluster: Cluster,
) -> None:
    # A one-thread worker busy with a long task still prefetches the jobs queued
    # behind it. Killed, it leaves them unacknowledged in its Redis ack set,
    # where Dramatiq alone returns them only in a random maintenance pass; the
    # sweeper runs that pass for every queue once the heartbeat is stale.
    # Claims off: its prefetched jobs stay Scheduled (with claims ahead they are claimed
    # with their fetch, and recovered by their leases: test_claims_ahead_processes.py).
    heartbeat_ms = 2_000
    crashed = cluster.start_worker(
        threads=1, heartbeat_timeout_ms=heartbeat_ms, extra_env={ENV["claim_fetched"]: "0"}
    )
    blocker = cluster.schedule(probe.task(name="long", sleep=30))
    wait_for(lambda: cluster.stamp("running", blocker, "long"), 30, "the long task to start")
    queued = [cluster.schedule(probe.task(name="quick", value=i)) for i in range(3)]
    # Its prefetch (2 per thread) takes one more message while its thread is busy.
    wait_for(
        lambda: cluster.redis.llen(f"dramatiq:{CHANNEL}") < len(queued),
        15,
        "the busy worker to prefetch a queued job",
    )
    ack_sets = cluster.redis.scan_iter("dramatiq:__acks__.*")
    unacked = sum(cluster.redis.scard(key) for key in ack_sets)
    assert unacked >= 2  # the running message and at least one prefetched one
    assert all(cluster.saved(job).status.value == "Scheduled" for job in queued)

    crashed.kill()
    killed_at = time.time()
    cluster.start_worker(threads=2, heartbeat_timeout_ms=heartbeat_ms, lease_seconds=2)
    cluster.wait_status(queued, timeout=40)
    recovered_in = time.time() - killed_at
    assert all(cluster.runs(job, "quick") == 1 for job in queued)
    print(
        f"\n[prefetch] {len(queued)} prefetched jobs completed {recovered_in:.1f}s after the "
        f"kill (heartbeat timeout {heartbeat_ms / 1000:g}s)"
    )
    # Bounded by the heartbeat timeout plus a few sweeps and the new worker's boot.
    assert recovered_in < 30


def test_a_stopped_redis_channel_refuses_new_jobs_and_drains_queued_ones(
    cluster: Cluster,
) -> None:
    queued = [cluster.schedule(probe.task(name="quick", value=i)) for i in range(5)]
    manager.available(CHANNEL).request_stop()
    with pytest.raises(ChannelStoppedError):
        cluster.schedule(probe.task(name="late", value=0))
    cluster.start_worker(threads=2)
    cluster.wait_status(queued, timeout=40)
    assert all(cluster.runs(job, "quick") == 1 for job in queued)
    assert manager.available(CHANNEL).length() == 0
