"""Job stores: where a job's snapshot and its optimistic-concurrency version live."""

import logging

from .base import IJobStore, JobRecord
from .memory import MemoryJobStore

__all__ = ["IJobStore", "JobRecord", "MemoryJobStore"]

# Alembic (imported by the SQL store) announces each of its built-in plugins at
# INFO when it is imported: six lines in every worker process's log that say
# nothing to anyone. Quieted unless the application set that logger's level.
_alembic_plugins = logging.getLogger("alembic.runtime.plugins")
if _alembic_plugins.level == logging.NOTSET:
    _alembic_plugins.setLevel(logging.WARNING)
