"""What every benchmark task does: one pipelined round trip to the probe Redis.

The probe is a second ``redis-server``, apart from the broker, so the broker's
``INFO commandstats`` counts only the competitors' own traffic.
"""

from __future__ import annotations

import os
import time

import redis

_client = redis.Redis.from_url(os.environ["BENCH_PROBE_URL"])


def mark(tag: str, key: str | None = None) -> None:
    """Count one run of a ``tag`` task; keep its start time under ``key`` when given."""
    now = time.time()
    pipe = _client.pipeline(transaction=False)
    pipe.incr(f"{tag}:n")
    pipe.set(f"{tag}:first", now, nx=True)
    pipe.set(f"{tag}:last", now)
    if key is not None:
        pipe.hset(f"{tag}:start", key, now)
    pipe.execute()


def mark_job(tag: str, job_id: str | None) -> None:
    """Count one run of job ``job_id`` (``<tag>:runs``) and keep its first start time."""
    now = time.time()
    pipe = _client.pipeline(transaction=False)
    pipe.incr(f"{tag}:n")
    if job_id is not None:
        pipe.hincrby(f"{tag}:runs", job_id, 1)
        pipe.hsetnx(f"{tag}:start", job_id, now)
    pipe.execute()


def count(tag: str, n: int) -> None:
    """Add ``n`` to ``<tag>:n`` (the spans a worker's tracing exported, by the hundred)."""
    _client.incrby(f"{tag}:n", n)
