"""Alembic's entry point, run in-process with a connection handed over by the caller.

There is no ``alembic.ini``: :func:`pypepper_dramatiq.stores.sql.upgrade_schema`
builds the config and puts an open connection in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from pypepper_dramatiq.stores.schema import VERSION_TABLE, metadata


def run_migrations_online() -> None:
    """Migrate over the caller's connection, inside its transaction if it has one."""
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError(
            "run migrations through pypepper_dramatiq.stores.sql.upgrade_schema "
            "or `pypepper-dramatiq migrate`"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported")
run_migrations_online()
