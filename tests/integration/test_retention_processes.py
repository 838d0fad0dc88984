"""Retention with real ``dramatiq`` workers, Redis and PostgreSQL (and MariaDB):
the sweep leader deletes the jobs that ended long ago while the workers run
jobs, and nothing else.

Figures are printed (``pytest -s``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from pypepper_dramatiq import Job, Status, Workflow, get_job_store
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.stores.schema import jobs as jobs_table
from pypepper_dramatiq.stores.sql import SqlJobStore

from .conftest import BOTH_STORES
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

RETENTION = {"Completed": "7d", "Failed": "7d", "Cancelled": "7d"}
#: Old ended rows seeded per status: more than one purge statement's worth of Completed.
OLD = {"Completed": 2500, "Failed": 300, "Cancelled": 300}


def one_task_job(task: Any) -> Job:
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([task]))
    return job


def old_count(store: SqlJobStore) -> int:
    with store.engine.connect() as connection:
        query = select(func.count()).select_from(jobs_table).where(jobs_table.c.id.like("old-%"))
        return int(connection.execute(query).scalar_one())


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
def test_retention_deletes_only_old_ended_jobs_while_workers_run_jobs(
    cluster: Cluster, store_backend: str
) -> None:
    store = get_job_store()
    assert isinstance(store, SqlJobStore)
    now = utcnow()
    ended_long_ago, tomorrow = now - timedelta(days=10), now + timedelta(days=1)
    seeded = [
        {
            "id": f"old-{status}-{i}",
            "channel_id": CHANNEL,
            "status": status,
            "version": 1,
            "created": ended_long_ago,
            "updated": ended_long_ago,
            "state": {},
        }
        for status, count in OLD.items()
        for i in range(count)
    ]
    with store.engine.begin() as connection:
        connection.execute(insert(jobs_table), seeded)

    def keep(job_id: str, status: Status, **fields: Any) -> str:
        fields.setdefault("created", ended_long_ago)
        fields.setdefault("updated", ended_long_ago)
        record = Job(channel_id=CHANNEL, id=job_id).to_record()
        assert store.put(record.evolve(status=status, **fields))
        return job_id

    kept = {
        keep("recent-completed", Status.COMPLETED, updated=now - timedelta(days=1)),
        # Not ended, however old: a step held by a live lease, a job held for a long delay.
        keep("old-running", Status.IN_PROGRESS, lease_owner="elsewhere", lease_expires=tomorrow),
        keep("old-held", Status.SCHEDULED, not_before=tomorrow, release_at=tomorrow),
        # A final-failure hook not run yet (held by a live worker until tomorrow).
        keep(
            "old-hooked",
            Status.FAILED,
            state={
                "hooks": {
                    "0.0": {
                        "status": "pending",
                        "owner": "elsewhere",
                        "since": ended_long_ago.isoformat(),
                        "until": tomorrow.isoformat(),
                    }
                }
            },
        ),
    }
    parent = keep("old-parent", Status.COMPLETED)
    # A job that waits for the old parent and for one that runs a few seconds.
    slow = one_task_job(probe.task(name="slow", sleep=6.0, value="slow"))
    slow.scheduled()
    child = one_task_job(probe.task(name="child", value="child"))
    child.scheduled(after=[parent, slow.id])

    started = time.monotonic()
    cluster.start_worker(threads=4, sweep_interval=0.5, retention=RETENTION)
    wait_for(lambda: old_count(store) == 4, 30, "the old ended jobs to be purged")
    purged_after = time.monotonic() - started
    # Meanwhile the waiting child keeps its parent: it waits on (slow is running).
    assert store.get(parent) is not None
    assert cluster.saved(slow).status is Status.IN_PROGRESS, "slow ended before the purge"
    assert cluster.saved(child).status is Status.SCHEDULED
    assert {r.id for r in store.list() if r.id.startswith("old-")} == {
        "old-running",
        "old-held",
        "old-hooked",
        parent,
    }

    # The workers keep completing new jobs while the sweep purges.
    fresh = [cluster.schedule(probe.task(name="fresh", value=i)) for i in range(20)]
    cluster.wait_status(fresh, 30)
    cluster.wait_status([slow, child], 30)
    assert cluster.runs(child, "child") == 1
    # The child's wait ended, so its old parent may go now; the child ended just now: it stays.
    wait_for(lambda: store.get(parent) is None, 10, "the old parent to be purged")

    remaining = {r.id for r in store.list()}
    assert remaining == kept | {slow.id, child.id} | {job.id for job in fresh}
    log = cluster.logs()
    assert "purged" in log and "past their retention" in log
    print(
        f"\n[retention {store_backend}] {sum(OLD.values())} old ended jobs purged "
        f"{purged_after:.1f}s after the worker started"
    )
