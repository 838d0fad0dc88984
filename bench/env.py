"""The servers a benchmark run owns, and the counters read from them.

PostgreSQL and Redis come from ``tests/services.py`` (the same throwaway
servers the tests start). PostgreSQL is started with ``pg_stat_statements``
preloaded, so statements are counted exactly; the benchmark's own polling
connects as a separate role and is left out of the count.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from services import PostgresServer, RabbitMQServer, RedisServer  # noqa: E402

#: The role the harness polls as; its statements are not counted.
PROBE_ROLE = "bench_probe"


class BenchPostgres(PostgresServer):
    """The tests' throwaway cluster, with pg_stat_statements loaded (and counting the
    planning time too: scenario 18 sets it beside the execution time)."""

    def _options(self) -> str:
        return (
            super()._options()
            + " -c shared_preload_libraries=pg_stat_statements"
            + " -c pg_stat_statements.track_planning=on"
        )


@dataclass(frozen=True)
class Counters:
    """Cumulative server counters at one moment."""

    pg_statements: int
    redis_commands: int
    at: float

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.pg_statements - other.pg_statements,
            self.redis_commands - other.redis_commands,
            self.at - other.at,
        )


class Stack:
    """PostgreSQL, the broker Redis and the probe Redis, for one benchmark run."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pypepper-bench-"))
        self.pg = BenchPostgres(self.tmp / "pg", database="bench")
        self.redis = RedisServer(self.tmp / "redis")
        self.probe_redis = RedisServer(self.tmp / "probe")
        self._pg_conn: psycopg.Connection[Any] | None = None
        #: Started by the RabbitMQ scenario only (:meth:`start_rabbitmq`).
        self.rabbitmq: RabbitMQServer | None = None

    def start_rabbitmq(self) -> str:
        """Start a RabbitMQ node (once); its URL, also in ``BENCH_RABBITMQ_URL``."""
        if self.rabbitmq is None:
            self.rabbitmq = RabbitMQServer(self.tmp)
            self.rabbitmq.start()
            os.environ["BENCH_RABBITMQ_URL"] = self.rabbitmq.url
        return self.rabbitmq.url

    def start(self) -> None:
        (self.tmp / "pg").mkdir()
        self.pg.start()
        self.redis.start()
        self.probe_redis.start()
        admin = psycopg.connect(self._dsn("bench", self.pg.user), autocommit=True)
        with admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute(f"CREATE ROLE {PROBE_ROLE} LOGIN SUPERUSER")
        self._pg_conn = psycopg.connect(self._dsn("bench", PROBE_ROLE), autocommit=True)
        self.broker = redis.Redis.from_url(self.redis.url)
        self.probe = redis.Redis.from_url(self.probe_redis.url)
        os.environ.update(self.env())

    def stop(self) -> None:
        if self._pg_conn is not None:
            self._pg_conn.close()
        self.redis.stop()
        self.probe_redis.stop()
        if self.rabbitmq is not None:
            self.rabbitmq.cleanup()
        self.pg.cleanup()

    def env(self) -> dict[str, str]:
        return {
            "BENCH_REDIS_URL": self.redis.url,
            "BENCH_PROBE_URL": self.probe_redis.url,
            "BENCH_STORE_URI": self.pg.uri,
        }

    def _dsn(self, database: str, user: str) -> str:
        return f"host={self.pg.host} port={self.pg.port} dbname={database} user={user}"

    # -- reading

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        assert self._pg_conn is not None
        return self._pg_conn.execute(query.encode(), args or None).fetchall()

    def execute(self, statement: str) -> None:
        assert self._pg_conn is not None
        self._pg_conn.execute(statement.encode())

    def scalar(self, query: str, *args: Any) -> Any:
        return self.sql(query, *args)[0][0]

    def counters(self) -> Counters:
        statements = self.scalar(
            "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
            "JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname <> %s",
            PROBE_ROLE,
        )
        stats = self.broker.info("commandstats")
        commands = sum(int(v["calls"]) for v in stats.values())
        return Counters(int(statements), commands, time.perf_counter())

    def redis_memory(self) -> int:
        return int(self.broker.info("memory")["used_memory"])

    def table_exists(self, name: str) -> bool:
        return bool(self.scalar("SELECT to_regclass(%s) IS NOT NULL", name))

    # -- between runs

    def reset(self) -> None:
        """Empty both Redis servers, RabbitMQ's queues and every benchmark table."""
        self.broker.flushall()
        self.probe.flushall()
        if self.rabbitmq is not None:
            self._purge_rabbitmq()
        for table in (
            "scheduler_jobs",
            "scheduler_recurring",
            "scheduler_channel_slots",
            "scheduler_activity",
            "scheduler_activity_mark",
            "scheduler_purged",
            "scheduler_paused",
            "scheduler_rate_turns",
            "scheduler_concurrency_slots",
            "celery_taskmeta",
        ):
            if self.table_exists(table):
                self.execute(f"TRUNCATE {table} CASCADE")

    #: The queues the RabbitMQ scenario uses (each with Dramatiq's delay and dead queues).
    RABBITMQ_QUEUES = ("plain_rmq", "bench")

    def _purge_rabbitmq(self) -> None:
        import pika

        assert self.rabbitmq is not None
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbitmq.url))
        try:
            for queue in self.RABBITMQ_QUEUES:
                for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                    channel = connection.channel()
                    try:
                        channel.queue_purge(name)
                        channel.close()
                    except pika.exceptions.ChannelClosedByBroker:
                        pass  # not declared yet: nothing to purge
        finally:
            connection.close()
