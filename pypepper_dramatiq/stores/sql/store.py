"""The job store on PostgreSQL (psycopg 3) or MySQL (PyMySQL), over SQLAlchemy Core.

Every put rule is checked by the database in the statement that writes, so two
processes racing on one job cannot both win:

* PostgreSQL: one ``INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE version = :seen
  AND status IN (...) RETURNING id``;
* MySQL, whose upsert takes no WHERE: an ``INSERT``, and on a duplicate key an
  ``UPDATE ... WHERE id = :id AND version = :seen AND status IN (...)``.

Lease recovery is just as atomic: the lapsed rows are picked with ``FOR UPDATE
SKIP LOCKED``, so concurrent recoverers split them and never share one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import Engine

from ...errors import ConfigError
from ..base import IJobStore
from .activity import ActivityRows
from .batches import BatchRows
from .boundary import masked
from .engine import backend_name, create_store_engine, database_of
from .jobs import JobRows
from .leases import LeaseRows
from .links import LinkRows
from .listings import JobListings
from .migrate import check_schema, upgrade_to_head
from .pauses import PauseRows
from .purge import PurgeRows
from .schedules import ScheduleRows
from .transactions import InCallerTransaction, caller_connection
from .workers import WorkerRows


class SqlJobStore(
    JobRows,
    JobListings,
    LeaseRows,
    BatchRows,
    ScheduleRows,
    WorkerRows,
    LinkRows,
    PurgeRows,
    PauseRows,
    ActivityRows,
):
    """Job records in the ``scheduler_jobs`` table of a PostgreSQL or MySQL database.

    The statements here are portable SQL (what MySQL and MariaDB run);
    ``SqlJobStore(uri)`` of a PostgreSQL URL makes a :class:`PostgresJobStore`,
    which overrides the hot statements with PostgreSQL's own.

    Args:
        uri: an SQLAlchemy URL, ``postgresql+psycopg://...`` or ``mysql+pymysql://...``.
        migrate: bring the schema to this package's head first; otherwise a
            database behind it raises :class:`~pypepper_dramatiq.errors.SchemaVersionError`.
        **engine_kwargs: passed on to :func:`sqlalchemy.create_engine`.
    """

    #: The subclass ``SqlJobStore(uri)`` makes for a backend (a dialect's own statements).
    _for_backend: ClassVar[dict[str, type[SqlJobStore]]] = {}

    def __init_subclass__(cls, *, backend: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if backend is not None:
            SqlJobStore._for_backend[backend] = cls

    def __new__(cls, uri: str, *args: Any, **kwargs: Any) -> SqlJobStore:
        if cls is SqlJobStore:
            cls = SqlJobStore._for_backend.get(backend_name(uri) or "", cls)
        return super().__new__(cls)

    def __init__(self, uri: str, *, migrate: bool = False, **engine_kwargs: Any) -> None:
        given = sorted(engine_kwargs)
        # No pre-ping: it costs a round trip per checkout. A connection that died
        # fails its statement instead (StoreUnavailableError, which every caller
        # handles), and SQLAlchemy then drops the whole stale pool.
        engine_kwargs.setdefault("pool_recycle", 1800)
        # A worker's threads each hold a connection during a step, plus the lease
        # keeper and the sweeper: beyond pool_size, connections are opened and
        # closed per use, which costs more than the statement.
        engine_kwargs.setdefault("pool_size", 16)
        engine_kwargs.setdefault("max_overflow", 16)
        # Most calls are one statement: autocommit spares a BEGIN and a
        # COMMIT/ROLLBACK each; the few multi-statement ones use transaction().
        engine_kwargs.setdefault("isolation_level", "AUTOCOMMIT")
        self._engine = create_store_engine(uri, engine_kwargs, given)
        try:
            if migrate:
                upgrade_to_head(self._engine)
            else:
                check_schema(self._engine)
        except BaseException:
            self._engine.dispose()
            raise

    @property
    def engine(self) -> Engine:
        """The pooled engine (for tests and administration)."""
        return self._engine

    def __repr__(self) -> str:
        return f"{type(self).__name__}({masked(self._engine)!r})"

    def close(self) -> None:
        self._engine.dispose()

    def within(self, connection: object) -> IJobStore:
        """This store writing through ``connection`` (a SQLAlchemy ``Connection``, or a
        ``Session``'s), in the caller's transaction.

        Each statement runs in a savepoint of that transaction, so that one the
        database refuses (a held unique key) rolls back alone and the caller's
        transaction goes on. Reads and writes of one job (``put``, ``advance``,
        ``get``, ``get_many``, ``key_holder``) are what it is for.

        Raises:
            ConfigError: ``connection`` is neither, or reaches another database.
        """
        caller = caller_connection(connection)
        mine, theirs = database_of(self._engine.url), database_of(caller.engine.url)
        if mine != theirs:
            raise ConfigError(
                f"connection= reaches {caller.engine.url.render_as_string(hide_password=True)}, "
                f"not the job store's database ({masked(self._engine)})"
            )
        return _CallerStore(caller, self._engine, connection)


class _CallerStore(InCallerTransaction, SqlJobStore):
    """A :class:`SqlJobStore` whose statements run in a caller's transaction (see
    :meth:`SqlJobStore.within`)."""
