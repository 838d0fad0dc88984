"""``async def`` tasks run by a real ``dramatiq`` worker process on Redis and PostgreSQL.

``worker_app.async_probe`` awaits and leaves traces in Redis; no AsyncIO
middleware is configured: each step runs its coroutine on a loop of its own.
"""

from __future__ import annotations

import time

import pytest

from pypepper_dramatiq import Status

from .harness import Cluster, wait_for
from .worker_app import async_probe, trace_key

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_async_tasks_complete_time_out_and_cancel_in_a_dramatiq_worker(cluster: Cluster) -> None:
    cluster.start_worker(threads=4)
    quick = cluster.schedule(async_probe.task(name="quick", value={"x": 1}))
    timed = cluster.schedule(
        async_probe.options(round_timeout=1, retry_count=1).task(
            name="timed", sleep=30, slow_runs=1, value="second try"
        )
    )
    waiting = cluster.schedule(async_probe.task(name="waiting", sleep=30, slow_runs=1))
    wait_for(lambda: cluster.runs(waiting, "waiting") == 1, 30, "the waiting task to start")

    cancelled_at = time.monotonic()
    assert waiting.cancel()
    records = cluster.wait_status([quick, timed], timeout=30)
    [cancelled] = cluster.wait_status([waiting], timeout=30, statuses=[Status.CANCELLED]).values()

    # (a) the body ran once and its value is the stored result
    assert records[quick.id].state["results"] == {"0.0": {"x": 1}}
    assert cluster.runs(quick, "quick") == 1
    # (b) the first attempt was stopped at round_timeout, the retry returned
    assert records[timed.id].state["results"] == {"0.0": "second try"}
    assert cluster.runs(timed, "timed") == 2
    assert len(cluster.times("ends", timed, "timed")) == 1
    assert cluster.stamp("interrupted", timed, "timed") is not None
    # (c) the cancel stopped the await (the Redis notice arrives at once)
    assert cancelled.status is Status.CANCELLED
    interrupted = cluster.redis.get(trace_key("interrupted", waiting.id, "waiting"))
    assert interrupted is not None and interrupted.endswith(b"CancelledError")
    assert time.monotonic() - cancelled_at < 10
    assert cluster.times("ends", waiting, "waiting") == []
    assert cluster.runs(waiting, "waiting") == 1
