"""Delays and start deadlines with real ``dramatiq`` workers, Redis and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from services import PostgresServer, RedisServer

from pypepper_dramatiq import Job, Status, Workflow
from pypepper_dramatiq.rules.start_times import SHORT_DELAY_SECONDS

from .conftest import empty_jobs_table
from .harness import Cluster, wait_for
from .worker_app import probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def cluster_on_own_redis(
    own_redis: RedisServer, postgres_uri: str, tmp_path: Path
) -> Iterator[Cluster]:
    empty_jobs_table(postgres_uri)
    wired = Cluster(own_redis.url, postgres_uri, tmp_path)
    yield wired
    wired.close()


def test_a_long_delay_is_held_in_the_store_and_survives_worker_and_redis_restarts(
    cluster_on_own_redis: Cluster, own_redis: RedisServer
) -> None:
    cluster = cluster_on_own_redis
    delay = SHORT_DELAY_SECONDS + 4
    first = cluster.start_worker(sweep_interval=0.5)
    job = Job(category="it", channel_id="it")
    job.workflows.append(Workflow([probe.task(name="later", value=1, patient=True)]))
    scheduled_at = time.time()
    job.scheduled(delay=delay)
    held = cluster.saved(job)
    assert held.release_at is not None and held.not_before == held.release_at
    assert cluster.redis.hlen("dramatiq:it.msgs") == 0  # no message: held in the store

    first.kill()  # the worker goes, comes back; Redis too, while the job waits
    own_redis.stop()
    own_redis.start()
    cluster.start_worker(sweep_interval=0.5)
    records = cluster.wait_status([job], timeout=delay + 30)

    started = cluster.times("starts", job, "later")
    print(f"\n[held-delay] delay_s={delay:g} started_after_s={started[0] - scheduled_at:.2f}")
    assert len(started) == 1
    assert started[0] - scheduled_at >= delay - 0.05  # never early
    assert started[0] - scheduled_at < delay + 0.5 + 2  # a sweep, and a little, after
    assert records[job.id].state["results"] == {"0.0": 1}


def test_a_start_deadline_cancels_a_job_nobody_picks_up(
    own_redis: RedisServer, own_postgres: PostgresServer, tmp_path: Path
) -> None:
    cluster = Cluster(own_redis.url, own_postgres.uri, tmp_path)
    try:
        cluster.start_worker(sweep_interval=0.5)  # serves channel "it" only
        job = Job(category="it", channel_id="nobody-serves-this")
        job.workflows.append(Workflow([probe.task(name="never", value=1)]))
        job.scheduled(max_start_delay=1)
        cancelled = wait_for(
            lambda: cluster.saved(job).status is Status.CANCELLED and cluster.saved(job),
            15,
            "the sweep to cancel the overdue job",
        )
        assert cancelled.error is not None and "start deadline passed" in cancelled.error
        assert cluster.runs(job, "never") == 0
        assert cluster.redis.scard("pypepper:channel:nobody-serves-this:waiting") == 0
    finally:
        cluster.close()
