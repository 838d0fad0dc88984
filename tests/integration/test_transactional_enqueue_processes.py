"""``scheduled(connection=...)`` with real processes: a producer that commits and is
SIGKILLed before it could send still gets its job run by the workers (their sweep
relays it); one that rolls back leaves nothing to run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pypepper_dramatiq import Job, Status

from .harness import APP_DIR, Cluster
from .worker_app import ENV

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def produce(cluster: Cluster, mode: str) -> tuple[str, int]:
    """Run the producer; its job id and exit code."""
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    done = subprocess.run(
        [sys.executable, "transactional_producer.py", cluster.redis_url, cluster.store_uri, mode],
        cwd=APP_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    job_id = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    assert job_id, f"the producer printed no job id: {done.stderr}"
    return job_id, done.returncode


def test_a_job_committed_by_a_producer_killed_before_sending_still_runs(
    cluster: Cluster,
) -> None:
    cluster.start_worker(sweep_interval=1)
    job_id, code = produce(cluster, "commit-then-die")
    assert code == -signal.SIGKILL  # died in its after_commit, before the job's own listener
    committed = time.time()
    [record] = cluster.wait_status([Job(id=job_id)], timeout=30).values()
    assert record.status is Status.COMPLETED
    assert cluster.runs(Job(id=job_id), "tx") == 1
    lag = record.updated.timestamp() - committed
    print(f"\n[transactional relay] committed -> completed {lag:.2f} s")


def test_a_rolled_back_job_never_runs(cluster: Cluster) -> None:
    cluster.start_worker(sweep_interval=1)
    job_id, code = produce(cluster, "rollback")
    assert code == 0
    time.sleep(3)  # three sweep ticks
    assert Job.get_saved(job_id) is None
    assert cluster.runs(Job(id=job_id), "tx") == 0
