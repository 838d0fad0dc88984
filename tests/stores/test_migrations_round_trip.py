"""Every migration can be undone: head down to base and up again, on each SQL dialect."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from pypepper_dramatiq.stores.schema import VERSION_TABLE
from pypepper_dramatiq.stores.sql import head_revision, schema_revision

from .migrations import migrate_to


def tables(uri: str) -> set[str]:
    """The tables of the database at ``uri``, the version table left out."""
    engine = create_engine(uri)
    try:
        return set(inspect(engine).get_table_names()) - {VERSION_TABLE}
    finally:
        engine.dispose()


@pytest.fixture
def empty_mysql_uri(mysql_uri: str) -> Iterator[str]:
    """URL of a brand-new MySQL/MariaDB database with no schema, dropped afterwards."""
    name = f"pypepper_empty_{uuid.uuid4().hex[:8]}"
    server = create_engine(mysql_uri)
    try:
        with server.begin() as connection:
            connection.execute(text(f"CREATE DATABASE {name}"))
        yield make_url(mysql_uri).set(database=name).render_as_string(hide_password=False)
        with server.begin() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
    finally:
        server.dispose()


def round_trip(uri: str) -> None:
    migrate_to(uri, "head")
    assert tables(uri), "the upgrade made no table"
    migrate_to(uri, "base", down=True)
    assert tables(uri) == set()
    migrate_to(uri, "head")
    assert schema_revision(uri) == head_revision()


@pytest.mark.postgres
def test_postgresql_schema_goes_down_to_base_and_up_again(empty_postgres_uri: str) -> None:
    round_trip(empty_postgres_uri)


@pytest.mark.mysql
def test_mysql_schema_goes_down_to_base_and_up_again(empty_mysql_uri: str) -> None:
    # Revision 0006's downgrade dropped the links' child index before the table, which
    # MariaDB refuses while the foreign key needs that index.
    round_trip(empty_mysql_uri)
