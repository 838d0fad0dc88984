"""An application's defaults in a real ``dramatiq`` worker: its task module (``worker_app``)
gives them to ``setup(defaults=...)``; the test process, the producer here, gives none.

The worker applies them to the job it builds itself (a follow-up a task schedules,
naming neither channel nor retry policy): the job goes to the default channel, which
``setup()`` declared so the worker consumes it, and its task is retried the default
number of times under the default ``round_timeout``.
"""

from __future__ import annotations

import json

import pytest

from pypepper_dramatiq import Job, Status

from .harness import Cluster
from .worker_app import ENV, schedules_a_follow_up

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The worker's defaults: a channel of their own, which the worker serves only through them.
WORKER_DEFAULTS = {"channel_id": "it-defaults", "retry_count": 2, "round_timeout": "1m"}


def test_a_worker_applies_the_defaults_its_task_module_gives_to_the_jobs_it_builds(
    cluster: Cluster,
) -> None:
    worker = cluster.start_worker(extra_env={ENV["defaults"]: json.dumps(WORKER_DEFAULTS)})
    parent = cluster.schedule(schedules_a_follow_up.task(name="schedule"))

    done = cluster.wait_status([parent], timeout=60)[parent.id]
    follow_up = Job(category="follow-up", id=str(done.result("schedule")))
    failed = cluster.wait_status([follow_up], timeout=60, statuses=[Status.FAILED])[follow_up.id]

    assert failed.channel_id == "it-defaults"
    assert failed.state["attempts"] == {"0.0": 3}  # retry_count 2
    assert cluster.runs(follow_up, "follow-up") == 3
    assert set(cluster.run_pids(follow_up, "follow-up")) <= worker.group_pids()
    stored = failed.payload["workflows"][0]["tasks"][0]
    assert (stored["channel_id"], stored["retry_count"], stored["round_timeout"]) == (
        "it-defaults",
        2,
        60.0,
    )
    # The producer's own jobs took none of them: it gave no defaults.
    assert done.payload["workflows"][0]["tasks"][0]["retry_count"] == 0
    assert Job().channel_id == "default"
