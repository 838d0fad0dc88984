"""``schedule_many`` with real ``dramatiq`` worker processes on Redis, rows in a SQL store.

The messages a batch queues are written by our Lua script, not by
``RedisBroker.enqueue``: a stock worker must consume them as it consumes any
other, and run each admitted job exactly once.
"""

from __future__ import annotations

import pytest

from pypepper_dramatiq import ChannelFullError, Job, Workflow, manager, schedule_many

from .conftest import BOTH_STORES
from .harness import Cluster
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def jobs(count: int) -> list[Job]:
    made = []
    for i in range(count):
        job = Job(category="it", channel_id=CHANNEL)
        job.workflows.append(
            Workflow([probe.task(name="a", value=i), probe.task(name="b", value=1, add_to="a")])
        )
        made.append(job)
    return made


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
def test_a_batch_is_run_by_stock_workers_each_task_once(cluster: Cluster) -> None:
    cluster.start_worker(threads=4)
    batch = jobs(40)

    assert schedule_many(batch) == [job.id for job in batch]

    records = cluster.wait_status(batch, timeout=60)
    assert {records[j.id].state["results"]["0.1"] for j in batch} == set(range(1, 41))
    runs = {(j.id, name): cluster.runs(j, name) for j in batch for name in "ab"}
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    assert manager.available(CHANNEL).length() == 0  # every slot given back


def test_a_channel_full_in_the_middle_runs_exactly_the_admitted_jobs(cluster: Cluster) -> None:
    manager.resize(CHANNEL, 5)
    batch = jobs(8)

    results = schedule_many(batch)

    assert results[:5] == [job.id for job in batch[:5]]
    assert all(isinstance(result, ChannelFullError) for result in results[5:])
    cluster.start_worker(threads=4)
    cluster.wait_status(batch[:5], timeout=60)
    assert [cluster.runs(j, "a") for j in batch] == [1] * 5 + [0] * 3
    assert all(Job.get_saved(j.id) is None for j in batch[5:])
