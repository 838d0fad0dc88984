"""What only the SQL store does: schema versions, error wrapping, agreement with memory."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from services import PostgresServer, free_port
from sqlalchemy import Connection, create_engine, event, inspect, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.schema import CreateTable

from pypepper_dramatiq.errors import SchemaVersionError, StoreError, StoreUnavailableError
from pypepper_dramatiq.rules.cron import CronSchedule
from pypepper_dramatiq.rules.status import Status, may_overwrite
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.schema import VERSION_TABLE, jobs
from pypepper_dramatiq.stores.sql import (
    PostgresJobStore,
    SqlJobStore,
    head_revision,
    schema_revision,
    upgrade_schema,
)

from .migrations import migrate_to

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)

#: What revision 0002 adds to ``scheduler_jobs``.
LEASE_COLUMNS = {"lease_owner", "lease_expires"}
LEASE_INDEX = "ix_scheduler_jobs_status_lease_expires"


def job_table(uri: str) -> tuple[dict[str, bool], set[str]]:
    """The columns of ``scheduler_jobs`` (name: nullable) and its index names."""
    engine = create_engine(uri)
    try:
        schema = inspect(engine)
        columns = {c["name"]: c["nullable"] for c in schema.get_columns("scheduler_jobs")}
        indexes = {str(i["name"]) for i in schema.get_indexes("scheduler_jobs")}
    finally:
        engine.dispose()
    return columns, indexes


# -- schema versions --------------------------------------------------------------------------


@pytest.mark.postgres
class TestSchema:
    def test_missing_schema_names_the_migrate_command(self, empty_postgres_uri: str) -> None:
        assert schema_revision(empty_postgres_uri) is None
        with pytest.raises(SchemaVersionError) as info:
            SqlJobStore(empty_postgres_uri)
        assert f"pypepper-dramatiq migrate --uri {empty_postgres_uri}" in str(info.value)

    def test_migrate_true_upgrades_to_head(self, empty_postgres_uri: str) -> None:
        store = SqlJobStore(empty_postgres_uri, migrate=True)
        try:
            assert schema_revision(empty_postgres_uri) == head_revision()
            assert store.put(JobRecord(id="j"))
        finally:
            store.close()
        again = SqlJobStore(empty_postgres_uri)  # the check now passes
        assert again.get("j") is not None
        again.close()

    def test_upgrade_schema_is_idempotent(self, empty_postgres_uri: str) -> None:
        assert upgrade_schema(empty_postgres_uri) == head_revision()
        store = SqlJobStore(empty_postgres_uri)
        assert store.put(JobRecord(id="kept"))
        assert upgrade_schema(empty_postgres_uri) == head_revision()
        assert store.get("kept") is not None
        store.close()

    def test_concurrent_upgrades_all_succeed(self, empty_postgres_uri: str) -> None:
        with ThreadPoolExecutor(max_workers=4) as pool:
            heads = list(pool.map(lambda _: upgrade_schema(empty_postgres_uri), range(4)))
        assert heads == [head_revision()] * 4

    def test_revision_0001_is_behind_until_migrated(self, empty_postgres_uri: str) -> None:
        migrate_to(empty_postgres_uri, "0001")
        assert schema_revision(empty_postgres_uri) == "0001" != head_revision()
        assert not LEASE_COLUMNS & job_table(empty_postgres_uri)[0].keys()
        engine = create_engine(empty_postgres_uri)
        with engine.begin() as conn:  # a job written by the previous release
            conn.execute(
                text(
                    "INSERT INTO scheduler_jobs (id, channel_id, status, version, created, updated)"
                    " VALUES ('old', 'default', 'InProgress', 3, now(), now())"
                )
            )
        engine.dispose()

        with pytest.raises(SchemaVersionError) as info:
            SqlJobStore(empty_postgres_uri)
        message = str(info.value)
        assert "schema revision '0001'" in message
        assert repr(head_revision()) in message
        assert f"pypepper-dramatiq migrate --uri {empty_postgres_uri}" in message

        store = SqlJobStore(empty_postgres_uri, migrate=True)
        try:
            assert schema_revision(empty_postgres_uri) == head_revision()
            columns, indexes = job_table(empty_postgres_uri)
            assert {name: columns[name] for name in LEASE_COLUMNS} == {
                "lease_owner": True,
                "lease_expires": True,
            }
            assert LEASE_INDEX in indexes
            old = store.get("old")
            assert old is not None and old.version == 3
            assert (old.lease_owner, old.lease_expires) == (None, None)
            assert store.renew_leases("anyone", ["old"], T0) == {}
        finally:
            store.close()
        SqlJobStore(empty_postgres_uri).close()  # the check now passes

    def test_leases_downgrade_and_upgrade_again(self, empty_postgres_uri: str) -> None:
        upgrade_schema(empty_postgres_uri)
        migrate_to(empty_postgres_uri, "0001", down=True)
        assert schema_revision(empty_postgres_uri) == "0001"
        columns, indexes = job_table(empty_postgres_uri)
        assert not LEASE_COLUMNS & columns.keys()
        assert LEASE_INDEX not in indexes
        assert upgrade_schema(empty_postgres_uri) == head_revision()
        assert job_table(empty_postgres_uri)[0].keys() >= LEASE_COLUMNS

    def test_0008_rewrites_six_field_crons_to_fire_as_they_did(
        self, empty_postgres_uri: str
    ) -> None:
        # Stored by 0.8 and read seconds last: "0 * * * * 30" fired at second 30 of
        # minute 0 of every hour. After the migration it is read seconds first and
        # must name the same slots; five fields and aliases are left alone.
        migrate_to(empty_postgres_uri, "0007")
        stored = {"six": "0 * * * * 30", "five": "*/5 * * * *", "alias": "@hourly"}
        engine = create_engine(empty_postgres_uri)
        try:
            with engine.begin() as conn:
                for name, cron in stored.items():
                    conn.execute(
                        text(
                            "INSERT INTO scheduler_recurring (name, cron, timezone, template, "
                            "overlap, catch_up, next_slot, paused, version, created, updated) "
                            "VALUES (:name, :cron, 'UTC', '{}', 'skip', 'latest', :t, false, "
                            "1, :t, :t)"
                        ),
                        {"name": name, "cron": cron, "t": T0},
                    )
            upgrade_schema(empty_postgres_uri)

            def crons() -> dict[str, str]:
                with engine.connect() as conn:
                    rows = conn.execute(text("SELECT name, cron FROM scheduler_recurring"))
                    return {name: cron for name, cron in rows}

            migrated = crons()
            assert migrated == {"six": "30 0 * * * *", "five": "*/5 * * * *", "alias": "@hourly"}
            old_reading = croniter("0 * * * * 30", T0)  # croniter's default: seconds last
            expected = [old_reading.get_next(datetime) for _ in range(3)]
            slots, after = [], T0
            for _ in range(3):
                after = CronSchedule(migrated["six"]).next_after(after)
                slots.append(after)
            assert slots == expected
            migrate_to(empty_postgres_uri, "0007", down=True)
            assert crons() == stored
        finally:
            engine.dispose()

    def test_version_table_is_ours(self, pg_store: SqlJobStore) -> None:
        with pg_store.engine.connect() as conn:
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
            assert found == head_revision()
            assert conn.execute(text("SELECT to_regclass('alembic_version')")).scalar() is None

    def test_unknown_newer_revision_says_upgrade_the_package(self, empty_postgres_uri: str) -> None:
        upgrade_schema(empty_postgres_uri)
        store = SqlJobStore(empty_postgres_uri)
        with store.engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'from_the_future'"))
        store.close()
        with pytest.raises(SchemaVersionError, match="upgrade the package"):
            SqlJobStore(empty_postgres_uri)


# -- errors at the boundary ---------------------------------------------------------------------


def closed_port_uri() -> str:
    return f"postgresql+psycopg://someone:s3cr3t@127.0.0.1:{free_port()}/nowhere"


@pytest.mark.parametrize("migrate", [False, True])
def test_closed_port_is_store_unavailable(migrate: bool) -> None:
    with pytest.raises(StoreUnavailableError) as info:
        SqlJobStore(closed_port_uri(), migrate=migrate, connect_args={"connect_timeout": 5})
    message = str(info.value)
    assert "s3cr3t" not in message
    assert "postgresql+psycopg://someone:***@127.0.0.1:" in message
    assert isinstance(info.value.__cause__, sa_exc.SQLAlchemyError)


def test_module_functions_wrap_unavailable_too() -> None:
    with pytest.raises(StoreUnavailableError, match=r"\*\*\*"):
        schema_revision(closed_port_uri())
    with pytest.raises(StoreUnavailableError, match=r"\*\*\*"):
        upgrade_schema(closed_port_uri())


def test_bad_url_is_store_error() -> None:
    with pytest.raises(StoreError):
        SqlJobStore("not a url")


@pytest.mark.postgres
def test_other_database_errors_are_store_errors(pg_store: SqlJobStore) -> None:
    with pytest.raises(StoreError) as info:
        # JobRecord checks the id's length itself; the channel is left to the column.
        pg_store.put(JobRecord(id="x", channel_id="c" * 129))
    assert not isinstance(info.value, StoreUnavailableError)
    assert "too long" in str(info.value)  # the database's reason, named
    assert info.value.__cause__ is not None  # the driver's error is kept as the cause


@pytest.mark.postgres
def test_pool_survives_a_server_restart(
    pg_store: SqlJobStore, postgres_server: PostgresServer
) -> None:
    if postgres_server.external:
        pytest.skip("cannot restart the external server named by PGHOST")
    assert pg_store.put(JobRecord(id="before"))
    postgres_server.restart()
    assert pg_store.get("before") is not None  # retried once on a fresh connection


def test_mysql_ddl_keeps_microseconds() -> None:
    ddl = str(CreateTable(jobs).compile(dialect=mysql.dialect()))
    assert "DATETIME(6)" in ddl
    assert "JSONB" in str(CreateTable(jobs).compile(dialect=postgresql.dialect()))


# -- agreement with the reference store ---------------------------------------------------------

steps = st.lists(
    st.tuples(st.sampled_from(list(Status)), st.sampled_from(["seen", "stale", "ahead", "zero"])),
    min_size=1,
    max_size=8,
)


@pytest.mark.postgres
@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=steps)
def test_sql_store_agrees_with_memory(
    pg_store: SqlJobStore, steps: list[tuple[Status, str]]
) -> None:
    memory = MemoryJobStore()
    job_id = uuid.uuid4().hex  # examples share the fixture's table
    for i, (status, which) in enumerate(steps):
        current = memory.get(job_id)
        seen = current.version if current else 0
        version = {"seen": seen, "stale": seen - 1, "ahead": seen + 1, "zero": 0}[which]
        moment = T0 + timedelta(seconds=i)
        record = JobRecord(
            id=job_id,
            status=status,
            version=max(version, 0),
            created=moment,
            updated=moment,
            state={"step": i},
        )
        written = pg_store.put(record)
        assert written == memory.put(record)
        if current is not None and record.version == current.version:
            assert written == may_overwrite(current.status, status)
        assert pg_store.get(job_id) == memory.get(job_id)


@pytest.mark.postgres
def test_migrations_build_exactly_the_declared_schema(empty_postgres_uri: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from pypepper_dramatiq.stores.schema import metadata

    upgrade_schema(empty_postgres_uri)
    engine = create_engine(empty_postgres_uri)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE, "compare_type": False}
            )
            differences = compare_metadata(context, metadata)
    finally:
        engine.dispose()
    assert differences == []


def _fill_4000_jobs(connection: Connection) -> None:
    """4,000 rows of four statuses on channel "c", one second apart, then ANALYZE."""
    statuses = ["Scheduled", "InProgress", "Completed", "Failed"]
    connection.execute(
        text(
            "INSERT INTO scheduler_jobs (id, channel_id, status, version, created, updated,"
            " state) SELECT 'j' || n, 'c', (CAST(:statuses AS text[]))[1 + n % 4], 1,"
            " now() - n * interval '1 second', now(), '{}' FROM generate_series(1, 4000) n"
        ),
        {"statuses": statuses},
    )
    connection.execute(text("ANALYZE scheduler_jobs"))


@pytest.mark.postgres
def test_listing_by_status_reads_an_index(pg_store: SqlJobStore) -> None:
    with pg_store.engine.connect() as connection:
        _fill_4000_jobs(connection)
        plan = "\n".join(
            row[0]
            for row in connection.execute(
                text(
                    "EXPLAIN SELECT * FROM scheduler_jobs WHERE status = 'Failed' "
                    "ORDER BY created, id LIMIT 100"
                )
            )
        )
    assert "ix_scheduler_jobs_status_created" in plan
    assert "Sort" not in plan  # read in order from the index, not sorted afterwards


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"status": "Failed"}, "ix_scheduler_jobs_status_created"),
        ({"status": "Failed", "channel_id": "c"}, "ix_scheduler_jobs_channel_status_created"),
    ],
)
def test_a_newest_first_page_after_a_cursor_reads_an_index_backwards(
    pg_store: SqlJobStore, filters: dict[str, str], index: str
) -> None:
    with pg_store.engine.connect() as connection:
        _fill_4000_jobs(connection)
    # The statement the store itself sends, caught on its way to the driver.
    sent: list[tuple[str, object]] = []

    def catch(
        _conn: object, _cursor: object, statement: str, parameters: object, *_: object
    ) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            sent.append((statement, parameters))

    event.listen(pg_store.engine, "before_cursor_execute", catch)
    try:
        first = pg_store.list(newest_first=True, limit=100, **filters)
        cursor = (first[-1].created, first[-1].id)
        second = pg_store.list(newest_first=True, limit=100, before=cursor, **filters)
    finally:
        event.remove(pg_store.engine, "before_cursor_execute", catch)
    assert len(first) == len(second) == 100 and second[0].created < first[-1].created
    statement, parameters = sent[-1]
    with pg_store.engine.connect() as connection:
        plan = "\n".join(
            str(row[0])
            for row in connection.exec_driver_sql(f"EXPLAIN {statement}", parameters)  # type: ignore[arg-type]
        )
    assert index in plan and "Backward" in plan, plan
    assert "Sort" not in plan, plan  # read in order from the index, not sorted afterwards


@pytest.mark.postgres
@pytest.mark.mysql
def test_each_dialect_gets_its_own_store_class(postgres_uri: str, mysql_uri: str) -> None:
    # PostgreSQL's hot statements live in a class of their own, not in branches.
    pg = SqlJobStore(postgres_uri, migrate=True)
    my = SqlJobStore(mysql_uri, migrate=True)
    try:
        assert type(pg) is PostgresJobStore and isinstance(pg, SqlJobStore)
        assert type(my) is SqlJobStore
    finally:
        pg.close()
        my.close()
