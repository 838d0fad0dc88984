"""Celery: ``celery -A bench.apps.celery_app worker`` (Redis broker, PostgreSQL results).

The result backend is SQLAlchemy's ``db+postgresql+psycopg://`` (psycopg 3),
so each finished task is a row in ``celery_taskmeta``: the same durable
outcome our jobs leave in ``scheduler_jobs``.
"""

from __future__ import annotations

import os

from celery import Celery

from . import probe

app = Celery(
    "bench",
    broker=os.environ["BENCH_REDIS_URL"],
    backend="db+" + os.environ["BENCH_STORE_URI"],
)
app.conf.update(
    task_default_queue="celery",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop")
def noop(key: str | None = None) -> None:
    probe.mark("celery", key)
