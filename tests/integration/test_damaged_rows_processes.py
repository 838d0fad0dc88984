"""The issue's probe with real worker processes: rows changed by raw SQL, a sweep that
goes on past them (each skipped and logged once, no traceback every second), the other
jobs run, and the damaged rows left as they are for a person to see."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pypepper_dramatiq import Status, get_job_store
from pypepper_dramatiq.records.record import JobRecord, utcnow

from .harness import Cluster, raw, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

PAYLOAD = {"workflows": [{"tasks": [{"name": "t", "executor_id": "none", "params": {}}]}]}


def test_the_sweep_goes_on_past_damaged_rows_and_leaves_them_as_they_are(
    cluster: Cluster,
) -> None:
    store = get_job_store()
    past = utcnow() - timedelta(minutes=5)
    damaged = {
        # held for release, due: the sweep's due_releases
        "dmg-release": dict(status=Status.SCHEDULED, release_at=past),
        # past its start deadline: the sweep's overdue
        "dmg-overdue": dict(status=Status.SCHEDULED, start_deadline=past),
        # a lapsed lease: the sweep's recover_expired
        "dmg-lapsed": dict(status=Status.IN_PROGRESS, lease_owner="gone", lease_expires=past),
    }
    for job_id, fields in damaged.items():
        assert store.put(JobRecord(id=job_id, channel_id=CHANNEL, payload=PAYLOAD, **fields))
        assert (
            raw(
                cluster.store_uri,
                f"UPDATE scheduler_jobs SET state = '[1,2,3]' WHERE id = '{job_id}'",
            )
            == 1
        )

    cluster.start_worker(lease_seconds=2, sweep_interval=0.2)
    first = cluster.schedule(probe.task(name="before", value=1))
    cluster.wait_status([first], timeout=60)

    def skipped_each() -> bool:
        log = cluster.logs()
        return all(f"job {job_id} skipped: its row cannot be read" in log for job_id in damaged)

    wait_for(skipped_each, 60, f"the sweep to skip each damaged row:\n{cluster.logs()}")
    # Many passes later, the sweep still runs (a new job is served) ...
    second = cluster.schedule(probe.task(name="after", value=2))
    cluster.wait_status([second], timeout=60)
    assert cluster.saved(first).status is Status.COMPLETED
    assert cluster.saved(second).status is Status.COMPLETED
    log = "\n".join(worker.log() for worker in cluster.workers)
    # ... and logged each damaged row once per duty, never a traceback per pass.
    skips = [line.split("] ")[-1] for line in log.splitlines() if "skipped: its row" in line]
    assert skips and len(skips) == len(set(skips)), log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    rows = raw(cluster.store_uri, "SELECT id, state FROM scheduler_jobs WHERE id LIKE 'dmg-%'")
    assert {job_id: state for job_id, state in rows} == {key: [1, 2, 3] for key in damaged}
