"""The ETL example runs as its README says: a script submits, a stock dramatiq worker runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pypepper_dramatiq.stores.sql import SqlJobStore

from .harness import DRAMATIQ, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ETL = Path(__file__).resolve().parents[2] / "examples" / "etl"


def test_the_etl_example_submits_and_its_worker_finishes_the_jobs(
    redis_url: str, postgres_uri: str, tmp_path: Path
) -> None:
    env = dict(os.environ, REDIS_URL=redis_url, STORE_URI=postgres_uri, PYTHONPATH=str(ETL))
    submitted = subprocess.run(
        [sys.executable, "etl.py", "submit", "4"],
        cwd=ETL,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert len(submitted) == 4
    log = (tmp_path / "etl-worker.log").open("wb")
    worker = subprocess.Popen(
        [DRAMATIQ, "etl", "--processes", "1", "--threads", "4"],
        cwd=ETL,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    store = SqlJobStore(postgres_uri)
    try:

        def finished() -> bool:
            records = [store.get(job_id) for job_id in submitted]
            return all(r is not None and r.status.is_terminal for r in records)

        wait_for(finished, 90, "the example's jobs to end")
        records = [store.get(job_id) for job_id in submitted]
        # extract fails at random (30 %) with 3 retries: a job fails only on 4 misses in a row.
        assert sum(r is not None and r.status.value == "Completed" for r in records) >= 2
        for record in records:
            assert record is not None
            assert "UnknownExecutorError" not in (record.error or ""), record.error
        status = subprocess.run(
            [sys.executable, "etl.py", "status"],
            cwd=ETL,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert all(job_id in status for job_id in submitted)
    finally:
        store.close()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        log.close()
