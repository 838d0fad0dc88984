"""Fixtures for the distributed tests: a wired test process, and servers a test may restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import restartable_redis, started  # tests/conftest.py
from services import RedisServer
from sqlalchemy import delete

from pypepper_dramatiq.stores.schema import jobs
from pypepper_dramatiq.stores.sql import SqlJobStore

from .harness import Cluster


def flush_redis(url: str) -> None:
    """Drop every key of the Redis at ``url``: messages, channel gates, traces."""
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def empty_jobs_table(uri: str) -> None:
    """Delete every job row, so that no sweeper recovers an earlier test's job."""
    store = SqlJobStore(uri, migrate=True)
    try:
        with store.engine.begin() as connection:
            connection.execute(delete(jobs))
    finally:
        store.close()


#: The conftest fixture giving each job store's URI.
STORE_URIS = {"postgres": "postgres_uri", "mysql": "mysql_uri"}
#: For ``@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)``.
BOTH_STORES = ["postgres", pytest.param("mysql", marks=pytest.mark.mysql)]


@pytest.fixture
def store_backend(request: pytest.FixtureRequest) -> str:
    """The job store the cluster uses: PostgreSQL unless a test parametrizes it."""
    return str(getattr(request, "param", "postgres"))


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, redis_url: str, store_backend: str, tmp_path: Path
) -> Iterator[Cluster]:
    """The session's servers, emptied: no queued messages, no jobs for a sweeper to recover."""
    store_uri = str(request.getfixturevalue(STORE_URIS[store_backend]))
    flush_redis(redis_url)
    empty_jobs_table(store_uri)
    wired = Cluster(redis_url, store_uri, tmp_path)
    yield wired
    wired.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis with an append-only file, for this test alone (it gets restarted)."""
    server = started(restartable_redis(tmp_path / "own-redis", appendonly=True), "Redis")
    yield server
    server.stop(kill=True)
