"""Moving a test database between schema revisions with the package's own Alembic scripts."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine

from pypepper_dramatiq.stores.sql import MIGRATIONS


def migrate_to(uri: str, revision: str, *, down: bool = False) -> None:
    """Move the database at ``uri`` up (or ``down``) to ``revision``."""
    engine = create_engine(uri)
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, revision)
    finally:
        engine.dispose()
