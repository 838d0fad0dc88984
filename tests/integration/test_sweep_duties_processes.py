"""A recovery sweep duty that keeps failing, with a real ``dramatiq`` worker, Redis and
PostgreSQL: the other duties go on, the failure is logged once, and the worker's row
(what the workers page reads) names the failing duty.

The duty made to fail is the recurring firings: a due schedule whose cron expression
cannot be read (stored as an older release or a hand edit could leave it), which is
what a worker without croniter meets with every schedule.
"""

from __future__ import annotations

import pytest

from pypepper_dramatiq import Job, Workflow, get_job_store, recurring
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.workers import sweep_leader
from pypepper_dramatiq.rules.start_times import SHORT_DELAY_SECONDS

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

BAD = "it-sweep-unreadable"
GOOD = "it-sweep-readable"


def template() -> Job:
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name="fired", value="fired")]))
    return job


def test_a_failing_duty_leaves_waits_and_releases_going_and_shows_on_the_worker_row(
    cluster: Cluster,
) -> None:
    store = get_job_store()
    now = utcnow()
    for name in (BAD, GOOD):
        stored = recurring(name, "* * * * * *", template())  # every second
        store.save_recurring(
            stored.evolve(cron="61 * * * *" if name == BAD else stored.cron, next_slot=now)
        )
    worker = cluster.start_worker(sweep_interval=0.5)
    try:
        parent = cluster.schedule(probe.task(name="parent", value="p"))
        child = Job(category="it", channel_id=CHANNEL)
        child.workflows.append(Workflow([probe.task(name="child", value="c")]))
        child.scheduled(after=[parent.id])  # settled, then released, by the sweep
        later = Job(category="it", channel_id=CHANNEL)
        later.workflows.append(Workflow([probe.task(name="later", value="l")]))
        later.scheduled(delay=SHORT_DELAY_SECONDS + 1)  # held in the store
        held = store.get(later.id)
        assert held is not None and held.release_at is not None  # only the sweep releases it
        cluster.wait_status([parent, child, later], 60)

        good = store.get_recurring(GOOD)
        assert good is not None and good.last_job_id is not None  # the readable one fires
        bad = store.get_recurring(BAD)
        assert bad is not None and bad.last_job_id is None and bad.next_slot == now

        def failing() -> list[str]:
            leader = sweep_leader(store.workers(utcnow()), utcnow())
            if leader is None or leader.sweep is None:
                return []
            return [f"{f.duty}: {f.error}" for f in leader.sweep.failing]

        wait_for(lambda: failing() != [], 30, "the worker row to name the failing duty")
        [shown] = failing()
        assert shown.startswith(f"fire_schedules: schedule {BAD}: ConfigError")
        log = worker.log()  # the whole of it, after some seconds of sweeps every tick
        assert log.count(f"schedule {BAD} skipped") == 1, cluster.logs()
    finally:
        for name in (BAD, GOOD):
            store.delete_recurring(name)
