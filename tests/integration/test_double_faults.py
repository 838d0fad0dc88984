"""Two faults at once, with real ``dramatiq`` workers, Redis and PostgreSQL (issue 9).

Each test breaks the store and the broker in an order that used to lose or
strand a job, then brings both back and expects the job Completed, with each
of its tasks finished exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from services import PostgresServer, RedisServer
from sqlalchemy.engine import make_url

from pypepper_dramatiq import Job, Workflow

from .faults import StallingRelay
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, probe, quiet_sleeper

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def cluster_on_own_servers(
    own_redis: RedisServer, own_postgres: PostgresServer, tmp_path: Path
) -> Iterator[Cluster]:
    """A cluster on a Redis and a PostgreSQL of this test's own (it stops them)."""
    wired = Cluster(own_redis.url, own_postgres.uri, tmp_path)
    yield wired
    wired.close()


def _queued(cluster: Cluster, queue: str = CHANNEL) -> int:
    return int(cluster.redis.llen(f"dramatiq:{queue}"))


def _submit_without_row(cluster: Cluster, name: str, value: int) -> Job:
    """Schedule a job while PostgreSQL is down: queued, its Scheduled row unwritten."""
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name=name, value=value)]))
    job.scheduled()  # seed 000: the message is the job now; a worker heals the row
    return job


def _one_clean_run(cluster: Cluster, job: Job, name: str) -> None:
    assert cluster.runs(job, name) == 1, cluster.logs()
    assert len(cluster.times("ends", job, name)) == 1


def test_a_job_without_a_row_survives_a_redis_outage_while_its_claim_is_deferred(
    cluster_on_own_servers: Cluster, own_redis: RedisServer, own_postgres: PostgresServer
) -> None:
    # The worker reaches the store through a relay that makes every call hang
    # 4 s before failing: time to stop Redis while the claim of the only copy
    # of a job (no row) fails and has to be put back in the broker.
    cluster = cluster_on_own_servers
    relay = StallingRelay(own_postgres.port)
    try:
        store_uri = make_url(own_postgres.uri).set(host="127.0.0.1", port=relay.port)
        worker = cluster.start_worker(
            threads=1,
            defer_seconds=1,
            store_uri=store_uri.render_as_string(hide_password=False),
        )
        own_postgres.stop(mode="fast")
        relay.stall(4)
        job = _submit_without_row(cluster, "late", 7)
        wait_for(lambda: _queued(cluster) == 0, 10, "the worker to take the message")
        own_redis.stop()  # while the claim hangs on the store
        time.sleep(8)  # the claim fails, and so does putting the message back
        assert worker.proc.poll() is None

        own_redis.start()
        time.sleep(3)  # the message goes back to the broker, the worker defers it
        own_postgres.start()
        relay.forward()
        records = cluster.wait_status([job], timeout=60)
    finally:
        relay.close()

    assert records[job.id].state["results"] == {"0.0": 7}
    _one_clean_run(cluster, job, "late")
    assert cluster.redis.zcard(f"dramatiq:{CHANNEL}.XQ") == 0  # nothing dead-lettered
    assert cluster.redis.scard(f"pypepper:channel:{CHANNEL}:waiting") == 0  # slot released


def test_sigterm_during_a_redis_outage_leaves_the_step_to_recovery_not_stranded(
    cluster_on_own_servers: Cluster, own_redis: RedisServer
) -> None:
    cluster = cluster_on_own_servers
    stopping = cluster.start_worker(shutdown_grace=0, lease_seconds=3)
    job = cluster.schedule(
        quiet_sleeper.task(name="long", sleep=30, value=1), probe.task(name="after", value=2)
    )
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the long task to start")

    own_redis.stop()
    stopping.terminate()  # the attempt is handed back; its message cannot be enqueued
    time.sleep(3)
    own_redis.start()  # the stopping worker acknowledges the original message and exits
    stopping.wait_exit(timeout=60)
    cluster.start_worker(lease_seconds=3)
    records = cluster.wait_status([job], timeout=60)

    assert records[job.id].state["results"] == {"0.0": 1, "0.1": 2}
    assert cluster.runs(job, "long") == 2  # the cut attempt, then the rerun
    assert len(cluster.times("ends", job, "long")) == 1  # only the rerun finished
    _one_clean_run(cluster, job, "after")
    assert "handed-back step not enqueued; recovery sends it" in stopping.log()


def test_a_deferred_first_step_dropped_by_a_live_worker_on_a_redis_blip_runs(
    cluster_on_own_servers: Cluster, own_redis: RedisServer, own_postgres: PostgresServer
) -> None:
    cluster = cluster_on_own_servers
    worker = cluster.start_worker(defer_seconds=12)
    own_postgres.stop(mode="fast")
    job = _submit_without_row(cluster, "deferred", 3)
    acks = "dramatiq:__acks__.*.it.DQ"
    wait_for(
        lambda: any(cluster.redis.scard(k) for k in cluster.redis.keys(acks)),
        20,
        "the deferred message to sit in the worker's delay queue",
    )

    own_redis.stop()  # the worker's delay-queue consumer drops what it held in memory
    time.sleep(3)
    own_redis.start()
    own_postgres.start()
    records = cluster.wait_status([job], timeout=60)

    assert records[job.id].state["results"] == {"0.0": 3}
    _one_clean_run(cluster, job, "deferred")
    assert worker.proc.poll() is None  # recovered while the worker lived
    assert "put back on the queue" in worker.log()


def test_a_blip_of_redis_between_two_steps_costs_no_dispatch_seconds(
    cluster_on_own_servers: Cluster, own_redis: RedisServer
) -> None:
    # The next step's message is retried a few times, then left to recovery
    # with its row marked due now: no wait for dispatch_seconds (60 s).
    cluster = cluster_on_own_servers
    cluster.start_worker(lease_seconds=3, sweep_interval=0.5)
    job = cluster.schedule(
        quiet_sleeper.task(name="first", sleep=2, value=1, trace_end=False),
        probe.task(name="second", value=1, add_to="first"),
    )
    wait_for(lambda: cluster.stamp("running", job, "first"), 30, "the first task to start")
    own_redis.stop()
    time.sleep(3.5)  # the first task ends meanwhile; its next message cannot go out
    own_redis.start()
    records = cluster.wait_status([job], timeout=40)

    history = records[job.id].state["history"]
    first_ended = datetime.fromisoformat(history["0.0"][-1]["ended"])
    second_started = datetime.fromisoformat(history["0.1"][0]["started"])
    pause = (second_started - first_ended).total_seconds()
    print(f"\n[next-step-after-redis-blip] pause_s={pause:.2f}")
    assert records[job.id].state["results"] == {"0.0": 1, "0.1": 2}
    assert pause < 3 + 0.5 + 5 + 3.5  # lease + sweep + 5 s, plus the outage itself
    _one_clean_run(cluster, job, "second")


def test_messages_a_killed_worker_had_prefetched_come_back_within_the_heartbeat_timeout(
    cluster_on_own_servers: Cluster,
) -> None:
    # A one-thread worker runs one job and holds the next ones prefetched; once
    # it is SIGKILLed they wait for the broker's heartbeat timeout (configurable:
    # setup(heartbeat_timeout_ms=...)), and our sweep, not Dramatiq's random
    # maintenance, brings them back.
    cluster = cluster_on_own_servers
    heartbeat_ms, sweep = 3000, 0.5
    crashed = cluster.start_worker(
        threads=1, heartbeat_timeout_ms=heartbeat_ms, sweep_interval=sweep
    )
    running = cluster.schedule(probe.task(name="long", sleep=30, value=1))
    wait_for(lambda: cluster.stamp("running", running, "long"), 30, "the long task to start")
    waiting = [cluster.schedule(probe.task(name="queued", value=1))]  # prefetch: 2 a thread
    wait_for(lambda: _queued(cluster) == 0, 10, "the worker to prefetch the queued job")

    crashed.kill()
    killed_at = time.time()
    cluster.start_worker(threads=2, heartbeat_timeout_ms=heartbeat_ms, sweep_interval=sweep)
    cluster.wait_status(waiting, timeout=60)

    came_back_after = max(cluster.times("starts", job, "queued")[0] for job in waiting) - killed_at
    print(
        f"\n[prefetched-after-sigkill] heartbeat_timeout_s={heartbeat_ms / 1000:g} "
        f"sweep_interval_s={sweep:g} started_after_kill_s={came_back_after:.2f}"
    )
    assert came_back_after < heartbeat_ms / 1000 + sweep + 5
    for job in waiting:
        _one_clean_run(cluster, job, "queued")
