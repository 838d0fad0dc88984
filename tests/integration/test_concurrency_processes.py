"""Concurrency limits held across real ``dramatiq`` workers (two worker CLIs), on Redis
with the PostgreSQL and the MariaDB stores (the slots in Redis) and on RabbitMQ (the
slots in PostgreSQL), while one of them is
SIGKILLed in the middle of a step.

The channel allows 2 steps at once (``max_running=2``) and each tenant's key 1
(``concurrency={"tenant-*": 1}``); 12 jobs of two tenants are queued at once. The
probe stamps each run's start and end in Redis: at no moment do more than 2 runs
overlap, nor 2 of one tenant (a run cut by the kill ends when the kill lands). The
killed step's slot is given back by its lease: its tenant has only that one, so the
tenant's other jobs would wait forever if it leaked; every job completes, and each
step that was not killed ran once (no attempt burnt while held).
"""

from __future__ import annotations

import json
import time

import pytest

from pypepper_dramatiq import Job, Status, Workflow

from .conftest import BROKERS_AND_STORES
from .harness import Cluster, WorkerProcess, wait_for
from .worker_app import CHANNEL, ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The channel's limit and each tenant's.
CHANNEL_LIMIT = 2
TENANT_LIMIT = 1
TENANTS = ("a", "b")
JOBS_PER_TENANT = 6
#: How long each step works: long enough to be killed in the middle of it.
STEP_SECONDS = 1.0
LEASE_SECONDS = 3.0


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one moment (an end before a start that
    has the same time: a slot given back, then taken)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def runs_of(cluster: Cluster, job: Job, killed_at: float) -> list[tuple[float, float]]:
    """The job's runs as (start, end): a run with no end stamp before the next start
    was cut by the kill, and ended when it landed."""
    starts = sorted(cluster.times("starts", job, "work"))
    ends = sorted(cluster.times("ends", job, "work"))
    runs = []
    for n, start in enumerate(starts):
        following = starts[n + 1] if n + 1 < len(starts) else float("inf")
        end = next((e for e in ends if start <= e < following), None)
        runs.append((start, killed_at if end is None else end))
    return runs


def running_in(cluster: Cluster, worker: WorkerProcess, jobs: list[Job]) -> bool:
    """Whether a step of ``jobs`` runs in ``worker`` now (started there, not ended)."""
    pids = worker.group_pids()
    for job in jobs:
        ran = cluster.run_pids(job, "work")
        if ran and ran[-1] in pids and len(cluster.times("ends", job, "work")) < len(ran):
            return True
    return False


@pytest.mark.parametrize(("broker_kind", "store_backend"), BROKERS_AND_STORES, indirect=True)
def test_channel_and_key_limits_hold_across_workers_and_a_killed_workers_slot_comes_back(
    cluster: Cluster,
) -> None:
    env = {
        ENV["max_running"]: str(CHANNEL_LIMIT),
        ENV["concurrency"]: json.dumps({"tenant-*": TENANT_LIMIT}),
        "dramatiq_worker_timeout": "100",
    }
    victim = cluster.start_worker(threads=4, lease_seconds=LEASE_SECONDS, extra_env=env)
    cluster.start_worker(threads=4, lease_seconds=LEASE_SECONDS, extra_env=env)
    jobs: dict[str, list[Job]] = {tenant: [] for tenant in TENANTS}
    for n in range(JOBS_PER_TENANT):
        for tenant in TENANTS:
            job = Job(category="it", channel_id=CHANNEL)
            job.workflows.append(Workflow([probe.task(name="work", sleep=STEP_SECONDS, value=n)]))
            job.scheduled(concurrency_key=f"tenant-{tenant}")
            jobs[tenant].append(job)
    every = [job for tenant_jobs in jobs.values() for job in tenant_jobs]

    wait_for(lambda: running_in(cluster, victim, every), 60, "a step running in the victim")
    victim.kill()
    killed_at = time.time()
    records = cluster.wait_status(every, 90)

    assert {r.status for r in records.values()} == {Status.COMPLETED}
    runs = {job.id: runs_of(cluster, job, killed_at) for job in every}
    killed = [job_id for job_id, job_runs in runs.items() if len(job_runs) > 1]
    assert killed, "no step was cut by the kill"
    assert all(len(job_runs) == 1 for job_id, job_runs in runs.items() if job_id not in killed)
    channel_peak = most_at_once([run for job_runs in runs.values() for run in job_runs])
    tenant_peaks = {
        tenant: most_at_once([run for job in jobs[tenant] for run in runs[job.id]])
        for tenant in TENANTS
    }
    assert channel_peak <= CHANNEL_LIMIT, (channel_peak, runs)
    assert all(peak <= TENANT_LIMIT for peak in tenant_peaks.values()), (tenant_peaks, runs)
    print(
        f"most steps at once: {channel_peak} (limit {CHANNEL_LIMIT}); per tenant: "
        f"{tenant_peaks} (limit {TENANT_LIMIT}); runs cut by the kill: {len(killed)}"
    )
