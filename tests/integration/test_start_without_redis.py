"""A ``dramatiq`` worker started while Redis is down boots, waits quietly, then runs jobs.

Plain Dramatiq workers connect lazily and keep retrying; ours must too: the
user's module calls ``setup(channels=...)`` at import, which must not need
Redis, and our background threads must outlive a Redis that is not there yet.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import restartable_redis, started  # tests/conftest.py
from services import RedisServer

from pypepper_dramatiq import Status

from .conftest import empty_jobs_table
from .harness import READY_LINE, Cluster, WorkerProcess, wait_for
from .worker_app import probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: How long the worker is left alone with no Redis.
DOWN_SECONDS = 5.0

#: A log line of one of our loggers saying a service is unreachable (OutageLog's words).
OUTAGE_LINE = re.compile(r"\[(pypepper_dramatiq[\w.]*)\] \[WARNING\] (.+?) unreachable")


@pytest.fixture
def redis_not_yet(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis on a known port that is not running: the test starts it."""
    server = restartable_redis(tmp_path / "redis-not-yet", appendonly=False)
    yield server
    server.stop(kill=True)


@pytest.fixture
def cluster_without_redis(
    redis_not_yet: RedisServer, postgres_uri: str, tmp_path: Path
) -> Iterator[Cluster]:
    """This process wired by ``setup()`` to the Redis that is down (which it now allows)."""
    empty_jobs_table(postgres_uri)
    wired = Cluster(redis_not_yet.url, postgres_uri, tmp_path)
    yield wired
    wired.close()


def ours(log: str) -> list[str]:
    """The lines our loggers wrote (Dramatiq's consumers log their own retries)."""
    return [line for line in log.splitlines() if "[pypepper_dramatiq" in line]


def tracebacks_after_ours(log: str) -> list[str]:
    """Our log lines followed by a traceback (its lines do not start with ``[``)."""
    lines = log.splitlines()
    return [
        line
        for line, after in pairwise(lines)
        if "[pypepper_dramatiq" in line and not after.startswith("[")
    ]


def test_a_worker_started_while_redis_is_down_waits_then_runs_jobs(
    cluster_without_redis: Cluster, redis_not_yet: RedisServer
) -> None:
    cluster = cluster_without_redis
    worker: WorkerProcess = cluster.start_worker(wait=False)

    # The module's setup() did not need Redis: the process boots and stays up.
    worker.wait_ready(timeout=45)
    time.sleep(DOWN_SECONDS)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    down_log = worker.log()
    assert down_log.count(READY_LINE) == 1

    # Each part of ours that needs Redis said so once: no line per retry
    # (they retry every 0.5-1 s), no traceback, nothing above WARNING.
    outages = Counter(match.group(2) for match in OUTAGE_LINE.finditer(down_log))
    assert outages, f"no outage was logged:\n{down_log[-3000:]}"
    assert sum(outages.values()) == 1, outages  # one line per process, whoever noticed first
    assert all("Redis" in what or "broker" in what for what in outages), outages
    assert not [line for line in ours(down_log) if "[ERROR]" in line or "[CRITICAL]" in line]
    assert tracebacks_after_ours(down_log) == []

    started(redis_not_yet, "Redis")
    job = cluster.schedule(probe.task(name="a", value=2), probe.task(name="b", value=3))

    record = cluster.wait_status([job], timeout=60)[job.id]

    assert record.status is Status.COMPLETED
    assert record.state["results"] == {"0.0": 2, "0.1": 3}
    assert [cluster.runs(job, name) for name in "ab"] == [1, 1]
    assert worker.proc.poll() is None
    # Once Redis answered, each outage ended, logged once (at INFO).
    wait_for(
        lambda: all(f"{what} is back" in worker.log() for what in outages), 15, "the outages to end"
    )
    back = [line for line in ours(worker.log()) if " is back after " in line]
    assert sorted(line.split("] ")[-1].split(" is back")[0] for line in back) == sorted(outages)
    assert tracebacks_after_ours(worker.log()) == []
