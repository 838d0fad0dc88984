"""Fixtures for the distributed tests: a wired test process, and servers a test may restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import restartable_rabbitmq, restartable_redis, started  # tests/conftest.py
from services import RabbitMQServer, RedisServer
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


#: For ``@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)``.
BOTH_BROKERS = ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]
#: Every broker with every job store it takes (RabbitMQ takes PostgreSQL only), for
#: ``@pytest.mark.parametrize(("broker_kind", "store_backend"), ..., indirect=True)``.
BROKERS_AND_STORES = [
    ("redis", "postgres"),
    pytest.param("redis", "mysql", marks=pytest.mark.mysql),
    pytest.param("rabbitmq", "postgres", marks=pytest.mark.rabbitmq),
]


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """The broker the cluster uses: Redis unless a test parametrizes it."""
    return str(getattr(request, "param", "redis"))


@pytest.fixture
def broker_url(request: pytest.FixtureRequest, broker_kind: str) -> str:
    """The URL of the session's server of ``broker_kind``."""
    return str(request.getfixturevalue(f"{broker_kind}_url"))


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest,
    redis_url: str,
    broker_url: str,
    store_backend: str,
    tmp_path: Path,
) -> Iterator[Cluster]:
    """The session's servers, emptied: no queued messages, no jobs for a sweeper to recover."""
    store_uri = str(request.getfixturevalue(STORE_URIS[store_backend]))
    flush_redis(redis_url)
    empty_jobs_table(store_uri)
    wired = Cluster(redis_url, store_uri, tmp_path, broker_url)
    yield wired
    wired.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis with an append-only file, for this test alone (it gets restarted)."""
    server = started(restartable_redis(tmp_path / "own-redis", appendonly=True), "Redis")
    yield server
    server.stop(kill=True)


@pytest.fixture
def own_rabbitmq(tmp_path: Path) -> Iterator[RabbitMQServer]:
    """A RabbitMQ node for this test alone (it gets restarted)."""
    server = started(restartable_rabbitmq(tmp_path / "own-rabbitmq"), "RabbitMQ")
    yield server
    server.cleanup()
