"""The job store on PostgreSQL (psycopg 3) or MySQL (PyMySQL), over SQLAlchemy Core.

One module a concern: ``boundary`` (driver errors classified, the outage
boundary), ``engine``, ``migrate`` (Alembic), ``mapping`` (records as rows),
``statements`` (each statement once, by name), the store's parts (``jobs``,
``listings``, ``leases``, ``batches``, ``schedules``, ``workers``, ``links``,
``purge``), ``transactions`` (a caller's transaction), ``store`` (them all as
:class:`SqlJobStore`) and ``postgres`` (PostgreSQL's hot statements).
"""

from .migrate import MIGRATIONS, head_revision, schema_revision, upgrade_schema
from .postgres import PostgresJobStore
from .store import SqlJobStore

__all__ = [
    "MIGRATIONS",
    "PostgresJobStore",
    "SqlJobStore",
    "head_revision",
    "schema_revision",
    "upgrade_schema",
]
