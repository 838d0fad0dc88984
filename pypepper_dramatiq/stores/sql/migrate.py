"""The Alembic runner: the schema revision a database has, and bringing it to head."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from ...errors import SchemaVersionError
from ...ops.logs import get_logger
from ..schema import VERSION_TABLE
from .boundary import boundary, masked
from .dialects import dialect_named
from .engine import create_store_engine, transaction

logger = get_logger(__name__)

#: Where the Alembic scripts ship, inside the package.
MIGRATIONS = Path(__file__).parent.parent / "migrations"


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The schema revision this package needs."""
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise SchemaVersionError(f"no migrations found in {MIGRATIONS}")
    return head


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic's INFO lines ("Context impl...", "Will assume transactional DDL") are
    printed by every worker process at every start; we log one line of our own
    when a migration changed something, and let only its warnings through."""
    alembic_logger = logging.getLogger("alembic")
    level = alembic_logger.level
    if level < logging.WARNING:
        alembic_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_logger.setLevel(level)


def _current(connection: Connection) -> str | None:
    with _quiet_alembic():
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade_to_head(engine: Engine) -> str:
    with boundary(engine, "migrating the schema"), transaction(engine) as connection:
        # Serialise concurrent migrators (on PostgreSQL).
        dialect_named(connection.dialect.name).lock_migrations(connection)
        before = _current(connection)
        with _quiet_alembic():
            command.upgrade(_config(connection), "head")
        after = _current(connection)
    if before != after:
        logger.info(
            "upgraded job store schema from %s to %s on %s",
            before,
            after,
            masked(engine),
            extra={"action": "upgrade_schema", "from": before, "to": after},
        )
    return head_revision()


def revision_of(engine: Engine) -> str | None:
    with boundary(engine, "reading the schema revision"), engine.connect() as connection:
        return _current(connection)


def upgrade_schema(uri: str) -> str:
    """Bring the database at ``uri`` to this package's schema; returns the head revision.

    Safe to run again, and (on PostgreSQL) from several processes at once.
    """
    engine = create_store_engine(uri)
    try:
        return upgrade_to_head(engine)
    finally:
        engine.dispose()


def schema_revision(uri: str) -> str | None:
    """The schema revision of the database at ``uri``, or None if it has none."""
    engine = create_store_engine(uri)
    try:
        return revision_of(engine)
    finally:
        engine.dispose()


def check_schema(engine: Engine) -> None:
    current, head = revision_of(engine), head_revision()
    if current == head:
        return
    known = {script.revision for script in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current is not None and current not in known:
        raise SchemaVersionError(
            f"the job store at {masked(engine)} has schema revision {current!r}, newer "
            f"than this pypepper-dramatiq knows (head {head!r}); upgrade the package"
        )
    found = "no schema" if current is None else f"schema revision {current!r}"
    raise SchemaVersionError(
        f"the job store at {masked(engine)} has {found}, this package needs {head!r}; "
        f"upgrade it with: pypepper-dramatiq migrate --uri {shlex.quote(masked(engine))}"
    )
