"""A delayed job cancelled from the command line (a process without metrics) while it
is held in the store is counted once by a real ``dramatiq`` worker with metrics:
no worker meets such a job again, so its sweep leader's look at recent ends counts
it (scraped from Dramatiq's exposition server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pypepper_dramatiq import Job, Workflow

from .harness import Cluster, wait_for
from .test_cancel_history import cli
from .test_metrics_processes import sample, scrape, start_metrics_worker
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

HOUR = 3600
ENDED = "pypepper_jobs_ended_total"


def delayed_job() -> Job:
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name="later")]))
    job.scheduled(delay=HOUR)
    return job


@pytest.mark.timeout(180)
def test_a_delayed_job_cancelled_by_the_cli_is_counted_once_by_a_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    port = start_metrics_worker(cluster, tmp_path, processes=2)
    store = ["--uri", cluster.store_uri, "--broker-url", cluster.redis_url]

    def cancelled() -> float:
        return sample(scrape(port), ENDED, status="Cancelled", channel=CHANNEL, category="it")

    before = cancelled()
    first = delayed_job()
    assert cluster.saved(first).release_at is not None  # held: no message in flight
    done = cli("cancel", first.id, *store)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: cancelled() == before + 1, 60, "the cancel counted by the worker")
    assert cluster.saved(first).state["counted"] is True

    # A second one, cancelled once the first was counted, is counted by a later pass
    # of the sweep, which reads the first again (within its lag) and skips it.
    second = delayed_job()
    done = cli("cancel", second.id, *store)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: cancelled() >= before + 2, 60, "the second cancel counted")
    assert cancelled() == before + 2
    assert cluster.saved(second).state["counted"] is True
