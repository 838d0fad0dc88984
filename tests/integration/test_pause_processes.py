"""Pausing a channel and a task type with real ``dramatiq`` workers (two processes), on
Redis with the PostgreSQL and the MariaDB store, and on RabbitMQ with PostgreSQL.

With jobs queued, running and delayed (a short delay carried by the broker, a long
one held in the store): the running step finishes uninterrupted, nothing else starts
while paused (each step a worker picks up is held in the store, no attempt counted),
and after the resume every job completes, each task having run exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import delete

from pypepper_dramatiq import (
    Job,
    Status,
    pause_channel,
    pause_task,
    resume_channel,
    resume_task,
)
from pypepper_dramatiq.engine.pausing import PAUSE_READ_SECONDS
from pypepper_dramatiq.records.pauses import PAUSED_UNTIL
from pypepper_dramatiq.rules.start_times import SHORT_DELAY_SECONDS
from pypepper_dramatiq.stores.schema import paused
from pypepper_dramatiq.stores.sql import SqlJobStore

from .conftest import BROKERS_AND_STORES, STORE_URIS
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, pause, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: How long the running step works: the pause comes while it runs.
RUNNING_SECONDS = 3.0


@pytest.fixture(autouse=True)
def nothing_paused(request: pytest.FixtureRequest, store_backend: str) -> Iterator[None]:
    """No pause of an earlier test (the table outlives it); none left after this one."""
    uri = str(request.getfixturevalue(STORE_URIS[store_backend]))

    def clear() -> None:
        store = SqlJobStore(uri, migrate=True)
        try:
            with store.engine.begin() as connection:
                connection.execute(delete(paused))
        finally:
            store.close()

    clear()
    yield
    clear()


def held(cluster: Cluster, job: Job) -> bool:
    row = cluster.saved(job)
    return PAUSED_UNTIL in (row.release_at, row.lease_expires)


@pytest.mark.parametrize(("broker_kind", "store_backend"), BROKERS_AND_STORES, indirect=True)
@pytest.mark.parametrize("kind", ["channel", "task"])
def test_pause_holds_queued_running_and_delayed_jobs_and_resume_runs_each_once(
    cluster: Cluster, kind: str
) -> None:
    cluster.start_worker(processes=2, threads=2, sweep_interval=0.5)
    running = cluster.schedule(
        probe.task(name="slow", sleep=RUNNING_SECONDS, value=1),
        probe.task(name="after", value=2),
    )
    wait_for(lambda: cluster.stamp("running", running, "slow"), 30, "the slow step to start")

    if kind == "channel":
        assert pause_channel(CHANNEL) is True
    else:
        assert pause_task("it.probe") is True
    # Each worker process reads the paused set at most once a second: from then on,
    # nothing of it starts anywhere.
    time.sleep(PAUSE_READ_SECONDS + 0.2)

    queued = [cluster.schedule(probe.task(name="work", value=n)) for n in range(4)]
    short = cluster.schedule_in(0.5, probe.task(name="work", value=10))
    long = cluster.schedule_in(SHORT_DELAY_SECONDS + 1, probe.task(name="work", value=11))
    # Another task type on the same channel: held by a channel's pause, not a task's.
    other = cluster.schedule(pause.task(name="other", value=12))
    jobs = [*queued, short, long]

    wait_for(
        lambda: all(held(cluster, job) for job in [running, *jobs]),
        SHORT_DELAY_SECONDS + 30,
        "every step to be held",
    )
    if kind == "task":
        cluster.wait_status([other], 30)
    else:
        assert held(cluster, other)
    # The running step finished, uninterrupted; nothing else started.
    assert cluster.runs(running, "slow") == 1
    assert cluster.stamp("interrupted", running, "slow") is None
    assert cluster.runs(running, "after") == 0
    assert all(cluster.runs(job, "work") == 0 for job in jobs)
    for job in jobs:
        row = cluster.saved(job)
        assert row.status is Status.SCHEDULED and not row.state.get("history"), (
            jobs.index(job),
            row,
            cluster.logs(),
        )
    assert cluster.saved(running).state["history"].keys() == {"0.0"}

    if kind == "channel":
        assert resume_channel(CHANNEL) is True
    else:
        assert resume_task("it.probe") is True
    records = cluster.wait_status([running, *jobs, other], 60)

    assert cluster.runs(running, "after") == 1
    assert all(cluster.runs(job, "work") == 1 for job in jobs)
    for record in records.values():  # one attempt per task: none burnt while held
        assert all(len(entries) == 1 for entries in record.state["history"].values()), record
    assert {r.status for r in records.values()} == {Status.COMPLETED}
    assert records[long.id].not_before is not None
    assert cluster.times("starts", long, "work")[0] >= records[long.id].not_before.timestamp()
