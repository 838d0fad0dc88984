"""An ETL job run by `dramatiq` worker processes; state in PostgreSQL, messages on Redis.

Workers:   dramatiq etl --processes 2 --threads 8        (from this folder)
Submit:    python etl.py submit 10
Watch:     python etl.py status
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

from pypepper_dramatiq import Job, Workflow, get_job_store, setup, workflow_task

broker = setup(
    broker_url=os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    store_uri=os.environ.get(
        "STORE_URI", "postgresql+psycopg://scheduler:scheduler@localhost:5432/scheduler"
    ),
    channels={"etl": 1000},  # at most 1000 jobs waiting, across every producer
    migrate=True,
)


@workflow_task(retry_count=3, retry_delay=2, round_timeout=30)
def extract(task: Any, context: Any, source: str) -> dict[str, Any]:
    """Read rows from a source; fails now and then, like a real network."""
    if random.random() < 0.3:
        raise ConnectionError(f"{source} did not answer")
    return {"source": source, "rows": random.randint(10, 100)}


@workflow_task(retry_count=1)
def transform(task: Any, context: Any) -> int:
    """Work on the extracted rows, stopping early if the job is cancelled."""
    rows = context.results["extract"]["rows"]
    for _ in range(rows):
        if context.cancelled:
            return 0
        time.sleep(0.01)
    return rows * 2


@workflow_task(optional=True)
def notify(task: Any, context: Any) -> None:
    """Tell someone; an optional task, so its failure does not fail the job."""
    print(f"job {context.job_id}: {context.results['transform']} rows loaded")


def submit(count: int) -> list[str]:
    ids = []
    for n in range(count):
        job = Job(category="etl", channel_id="etl")
        job.workflows.append(
            Workflow([extract.task(source=f"shard-{n}"), transform.task(), notify.task()])
        )
        job.scheduled()
        ids.append(job.id)
    return ids


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "submit":
        for job_id in submit(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
            print(job_id)
    else:
        for record in get_job_store().list(category="etl", limit=50):
            print(record.id, record.status.value, record.error or "")
