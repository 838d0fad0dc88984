"""Priorities with real ``dramatiq`` workers (two processes) on Redis, with the
PostgreSQL and the MariaDB store, and on RabbitMQ (``max_priority``) with PostgreSQL.

On Redis a job of a priority above 0 goes to its channel's queue of that priority
(``<channel>.p<priority>``), which every worker consumes; on RabbitMQ its messages
carry the priority (``broker_priority``) and the queue, declared with
``x-max-priority``, hands the highest first to whichever process asks. Either way a
backlog of low-priority jobs does not keep a new high-priority job waiting behind it,
nor one held in the store (waiting for a parent) when it is released. Only what a
worker process has already prefetched may start before it: twice its threads, set
here (pypepper's batched Redis worker takes 6 per thread unless told otherwise, which
lets more of the backlog start first, as docs/howto/priorities.md says).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pypepper_dramatiq import Job, Workflow
from pypepper_dramatiq.drivers.dramatiq.fetch_claims import PREFETCH_ENV

from .conftest import empty_jobs_table, flush_redis
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The low-priority backlog, and how long each of its jobs works.
BACKLOG = 60
#: Long enough that the backlog (about 7 s over two processes) outlasts a loaded
#: machine's sweep releasing the held high job.
LOW_SECONDS = 0.25


def scheduled(
    cluster: Cluster,
    name: str,
    priority: int,
    sleep: float = 0.0,
    after: Job | None = None,
    channel: str = CHANNEL,
) -> Job:
    job = Job(category="it", channel_id=channel)
    job.workflows.append(Workflow([probe.task(name=name, sleep=sleep, value=1)]))
    job.scheduled(priority=priority, after=[] if after is None else [after])
    return job


#: Redis carries the messages; the priority is kept in the job's row on either store.
REDIS_AND_STORES = [
    ("redis", "postgres"),
    pytest.param("redis", "mysql", marks=pytest.mark.mysql),
]


#: The channel of the RabbitMQ cluster: its queue is declared with ``x-max-priority``,
#: which RabbitMQ would refuse for the queue of :data:`CHANNEL` other tests declared.
PRIORITY_CHANNEL = "it-priorities"


@pytest.fixture
def rabbitmq_cluster(
    redis_url: str, rabbitmq_url: str, postgres_uri: str, tmp_path: Path
) -> Iterator[Cluster]:
    """RabbitMQ with ``max_priority=9`` here and in the workers, PostgreSQL, and Redis
    for the probes' traces, emptied."""
    flush_redis(redis_url)
    empty_jobs_table(postgres_uri)
    wired = Cluster(
        redis_url, postgres_uri, tmp_path, rabbitmq_url, max_priority=9, channel=PRIORITY_CHANNEL
    )
    yield wired
    wired.close()


def backlog_then_highs(cluster: Cluster, channel: str) -> None:
    """Two worker processes of one thread each drain a backlog of low jobs; three jobs
    of priority 9, and one held for the first of them, are scheduled once it started.
    Each high job starts before at least half the backlog."""
    cluster.start_worker(
        processes=2,
        threads=1,
        sweep_interval=0.5,
        extra_env={ENV["channels"]: channel, PREFETCH_ENV: "2"},
    )
    lows = [scheduled(cluster, "low", 0, LOW_SECONDS, channel=channel) for _ in range(BACKLOG)]
    wait_for(lambda: cluster.stamp("running", lows[0], "low"), 30, "the backlog to start")
    highs = [scheduled(cluster, "high", 9, channel=channel) for _ in range(3)]
    # Held in the store until its parent ends, then released with its priority.
    highs.append(scheduled(cluster, "high", 9, after=highs[0], channel=channel))

    records = cluster.wait_status([*lows, *highs], 120)

    assert all(Job.from_record(records[job.id]).priority == 9 for job in highs)
    last_high = max(cluster.times("starts", job, "high")[0] for job in highs)
    low_starts = [cluster.times("starts", job, "low")[0] for job in lows]
    after = sum(start > last_high for start in low_starts)
    # Behind the backlog, every high job would start after all of it (0 after). At
    # most the running and the prefetched jobs of each worker process come first.
    assert after >= BACKLOG // 2, (after, cluster.logs())
    assert len({pid for job in lows for pid in cluster.run_pids(job, "low")}) == 2


@pytest.mark.parametrize(("broker_kind", "store_backend"), REDIS_AND_STORES, indirect=True)
def test_a_backlog_of_low_priority_jobs_does_not_hold_back_a_high_one(cluster: Cluster) -> None:
    backlog_then_highs(cluster, CHANNEL)


@pytest.mark.rabbitmq
def test_on_rabbitmq_a_backlog_of_low_priority_jobs_does_not_hold_back_a_high_one(
    rabbitmq_cluster: Cluster,
) -> None:
    backlog_then_highs(rabbitmq_cluster, PRIORITY_CHANNEL)


def test_equal_priorities_start_in_submit_order(cluster: Cluster) -> None:
    # One thread: the starts are one after the other, so their order is the queue's.
    cluster.start_worker(processes=1, threads=1, sweep_interval=0.5)
    busy = scheduled(cluster, "busy", 0, 1.0)
    wait_for(lambda: cluster.stamp("running", busy, "busy"), 30, "the worker to be busy")
    plan = [("b", 0), ("m", 5), ("b", 0), ("m", 5), ("h", 9), ("m", 5), ("b", 0), ("h", 9)]
    jobs = [scheduled(cluster, name, priority) for name, priority in plan]

    cluster.wait_status([busy, *jobs], 60)

    def starts(name: str) -> list[float]:
        return [
            cluster.times("starts", j, name)[0]
            for j, (n, _) in zip(jobs, plan, strict=True)
            if n == name
        ]

    for name in ("b", "m", "h"):
        assert starts(name) == sorted(starts(name)), name  # submit order within a priority
