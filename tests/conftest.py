"""Shared fixtures: the real servers of the test session and the stores built on them."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest
import redis
from services import (
    RABBITMQ_URL_VARIABLE,
    REDIS_URL_VARIABLE,
    ExternalRabbitMQ,
    ExternalRedis,
    MariaDBServer,
    PostgresServer,
    RabbitMQServer,
    RedisServer,
    ServiceError,
    external_rabbitmq_url,
    external_redis_url,
)
from sqlalchemy import delete

from pypepper_dramatiq.stores.schema import activity, activity_mark, jobs, paused, purged, recurring
from pypepper_dramatiq.stores.sql import SqlJobStore

# -- backend selection ----------------------------------------------------------------------

#: Markers naming a server a test needs; ``PYPEPPER_TEST_BACKENDS`` picks which run.
BACKEND_MARKERS = ("postgres", "mysql", "redis", "rabbitmq")


def selected_backends() -> set[str] | None:
    """Backends named in ``PYPEPPER_TEST_BACKENDS`` (``memory|postgres|mysql|redis|rabbitmq``);
    None = all."""
    raw = os.environ.get("PYPEPPER_TEST_BACKENDS", "").strip()
    if not raw:
        return None
    return {name for name in re.split(r"[\s,|]+", raw.lower()) if name}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests marked with a backend that is not selected."""
    backends = selected_backends()
    if backends is None:
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        needs = {m for m in BACKEND_MARKERS if item.get_closest_marker(m) is not None}
        (keep if needs <= backends else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def unavailable(reason: str) -> NoReturn:
    """A missing service fails the run in CI and skips the test elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


S = TypeVar(
    "S",
    PostgresServer,
    MariaDBServer,
    RedisServer,
    ExternalRedis,
    RabbitMQServer,
    ExternalRabbitMQ,
)


def started(server: S, name: str) -> S:
    """``server``, started; or, when it cannot start, its files removed and :func:`unavailable`."""
    try:
        server.start()
    except ServiceError as exc:
        if isinstance(server, RedisServer | ExternalRedis):
            server.stop(kill=True)
        else:
            server.cleanup()
        unavailable(f"{name} unavailable: {exc}")
    return server


# -- PostgreSQL -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole session (local throwaway cluster or ``PG*``)."""
    server = started(PostgresServer(tmp_path_factory.mktemp("postgres")), "PostgreSQL")
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def postgres_uri(postgres_server: PostgresServer) -> str:
    """``postgresql+psycopg://`` URL of the session's test database."""
    return postgres_server.uri


def emptied_store(uri: str) -> Iterator[SqlJobStore]:
    """A migrated :class:`SqlJobStore` at ``uri`` whose tables of jobs, schedules,
    tombstones, pauses and activity are emptied first; closed afterwards."""
    store = SqlJobStore(uri, migrate=True)
    with store.engine.begin() as connection:
        for table in (jobs, recurring, purged, paused, activity, activity_mark):
            connection.execute(delete(table))
    yield store
    store.close()


@pytest.fixture
def pg_store(postgres_uri: str) -> Iterator[SqlJobStore]:
    """A migrated :class:`SqlJobStore` on PostgreSQL with an empty jobs table."""
    yield from emptied_store(postgres_uri)


@pytest.fixture
def empty_postgres_uri(postgres_server: PostgresServer) -> Iterator[str]:
    """URL of a brand-new database with no schema, dropped afterwards."""
    name = f"pypepper_empty_{uuid.uuid4().hex[:8]}"
    yield postgres_server.create_database(name)
    postgres_server.drop_database(name)


# -- MySQL ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mysql_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A throwaway MariaDB server for the whole session."""
    server = started(MariaDBServer(tmp_path_factory.mktemp("mariadb")), "MariaDB")
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def mysql_uri(request: pytest.FixtureRequest) -> str:
    """``mysql+pymysql://`` URL: ``PYPEPPER_TEST_MYSQL_URI`` if set, else the session's MariaDB."""
    uri = os.environ.get("PYPEPPER_TEST_MYSQL_URI")
    if uri:
        return uri
    server: MariaDBServer = request.getfixturevalue("mysql_server")
    return server.uri


@pytest.fixture
def mysql_store(mysql_uri: str) -> Iterator[SqlJobStore]:
    """A migrated :class:`SqlJobStore` on MySQL/MariaDB with an empty jobs table."""
    yield from emptied_store(mysql_uri)


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    """A PostgreSQL cluster for this test alone (it gets stopped and restarted)."""
    workdir = tmp_path / "own-postgres"
    workdir.mkdir()
    server = PostgresServer(workdir)
    if server.external:
        pytest.skip("restarting PostgreSQL needs a local cluster, not the PGHOST server")
    started(server, "PostgreSQL")
    yield server
    server.cleanup()


# -- Redis ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisServer | ExternalRedis]:
    """The session's Redis: ``PYPEPPER_TEST_REDIS_URL``'s, else a ``redis-server`` of its own."""
    url = external_redis_url()
    server: RedisServer | ExternalRedis = (
        ExternalRedis(url) if url else RedisServer(tmp_path_factory.mktemp("redis"))
    )
    server = started(server, "Redis")
    yield server
    server.stop()


def restartable_redis(tmpdir: Path, *, appendonly: bool = False) -> RedisServer:
    """A ``redis-server`` of the test's own, which it stops or restarts (not started yet).

    Skipped, saying why, when the session uses ``PYPEPPER_TEST_REDIS_URL``'s Redis: a
    test run against a Redis container need not have ``redis-server`` itself.
    """
    if external_redis_url():
        pytest.skip(
            f"stops or restarts a Redis of its own; {REDIS_URL_VARIABLE} names the session's"
        )
    return RedisServer(tmpdir, appendonly=appendonly)


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """``redis://`` URL of the session's Redis server."""
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's Redis server, closed after the test."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# -- RabbitMQ -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbitmq_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RabbitMQServer | ExternalRabbitMQ]:
    """The session's RabbitMQ: ``PYPEPPER_TEST_RABBITMQ_URL``'s, else a node of its own,
    started when a test first asks for it (about 5 s)."""
    url = external_rabbitmq_url()
    server: RabbitMQServer | ExternalRabbitMQ
    try:
        server = ExternalRabbitMQ(url) if url else RabbitMQServer(tmp_path_factory.mktemp("rabbit"))
    except ServiceError as exc:  # not installed
        unavailable(f"RabbitMQ unavailable: {exc}")
    server = started(server, "RabbitMQ")
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def rabbitmq_url(rabbitmq_server: RabbitMQServer | ExternalRabbitMQ) -> str:
    """``amqp://`` URL of the session's RabbitMQ."""
    return rabbitmq_server.url


def restartable_rabbitmq(tmpdir: Path) -> RabbitMQServer:
    """A RabbitMQ node of the test's own, which it stops or restarts (not started yet).

    Skipped, saying why, when the session uses ``PYPEPPER_TEST_RABBITMQ_URL``'s server.
    """
    if external_rabbitmq_url():
        pytest.skip(
            f"stops or restarts a RabbitMQ of its own; {RABBITMQ_URL_VARIABLE} names the session's"
        )
    try:
        return RabbitMQServer(tmpdir)
    except ServiceError as exc:
        unavailable(f"RabbitMQ unavailable: {exc}")
