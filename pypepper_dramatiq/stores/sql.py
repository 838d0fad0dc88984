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

import builtins
import dataclasses
import functools
import json
import logging
import shlex
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Connection,
    Engine,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement, Select

from .. import retention
from ..engine.group_commit import rounds_of
from ..errors import (
    ConfigError,
    CorruptRecordError,
    CorruptScheduleError,
    DuplicateJobError,
    SchemaVersionError,
    StoreDataError,
    StoreError,
    StoreUnavailableError,
    UnknownJobError,
    retry_may_cure,
)
from ..links import AFTER, Link, parent_order, parents_of, required_parents
from ..logs import get_logger
from ..progress import PROGRESS_KEY
from ..recurring import RecurringSchedule
from ..start_times import is_retry
from ..state import HOOKS_KEY
from ..status import Status, overwritable_by
from ..workers import WorkerInfo, forget_before, listed
from .base import (
    HELD_FOR_JOBS,
    HELD_FOR_TIME,
    IJobStore,
    JobRecord,
    StepClaim,
    check_ended,
    claimed_row,
    why_not_claimable,
)
from .rows import (
    due_schedules,
    job_record,
    listed_jobs,
    listed_schedules,
    listed_workers,
    readable_waits,
    recurring_schedule,
    status_or_unknown,
)
from .schema import ACTIVE_KEY_INDEX, VERSION_TABLE, UtcDateTime, jobs, links, recurring
from .schema import workers as worker_rows

__all__ = [
    "PostgresJobStore",
    "SqlJobStore",
    "head_revision",
    "schema_revision",
    "upgrade_schema",
]

logger = get_logger(__name__)

#: Where the Alembic scripts ship, inside the package.
MIGRATIONS = Path(__file__).with_name("migrations")

#: Key of the PostgreSQL advisory lock held while migrating ("pypepper" in ASCII, truncated).
_MIGRATION_LOCK = 0x7079706570706572

#: MySQL's "Duplicate entry" error number.
_MYSQL_DUPLICATE_KEY = 1062

#: Rows per multi-row INSERT of ``put_many`` (PostgreSQL takes 65,535 parameters a
#: statement, 18 a row; MySQL's packet limit bounds the statement's size).
_INSERT_ROWS = 500


def _masked(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _reason(engine: Engine, exc: BaseException) -> str:
    if isinstance(exc, UnicodeEncodeError):  # its position is in the statement, not the value
        code = ord(exc.object[exc.start]) if exc.start < len(exc.object) else 0
        return f"text holds U+{code:04X}, which {exc.encoding} cannot encode"
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    password = engine.url.password
    return first.replace(password, "***") if password else first


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    outages = (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        sa_exc.DisconnectionError,
        sa_exc.TimeoutError,
        *_DRIVER_DISCONNECTS,  # from the hot statements sent straight to psycopg
    )
    return isinstance(exc, outages)


#: PostgreSQL's SQLSTATE classes of a statement refused for what it holds: data
#: exceptions (a NUL or lone surrogate in JSON, a value too long...) and program
#: limits (a row or value larger than the server takes). Class 23 (integrity)
#: counts too, but for the unique-key refusal the store answers itself.
_PG_DATA_CLASSES = ("22", "54")
_PG_INTEGRITY_CLASS = "23"
_PG_UNIQUE_VIOLATION = "23505"
#: MySQL/MariaDB error numbers of a statement refused for what it holds that
#: PyMySQL raises as neither DataError nor IntegrityError (a CHECK constraint,
#: MariaDB's JSON check among them, is an OperationalError there): row too large,
#: packet too large, wrong value, invalid characters, value out of range, invalid
#: JSON (MySQL), CHECK constraint (MySQL 8, MariaDB); and text a column's character
#: set cannot compare ("illegal mix of collations": an id outside latin1 looked up
#: in a latin1 table).
_MYSQL_DATA_ERRORS = frozenset(
    {1118, 1153, 1267, 1270, 1271, 1292, 1300, 1366, 1367, 1406, 1690, 3140, 3141, 3144}
    | {3819, 4025}
)
#: MySQL's duplicate-key refusals (the store answers them itself, as PostgreSQL's 23505).
_MYSQL_DUPLICATE_KEYS = frozenset({1022, _MYSQL_DUPLICATE_KEY, 1586})


def _is_data_error(exc: BaseException) -> bool:
    """Whether the database (or its driver) refused what the statement holds, so that
    sending the same statement again cannot succeed: a data error, an integrity
    error on a row's content (not a duplicate key), text the driver cannot
    encode. The one classification of :class:`StoreDataError` for SQL stores."""
    if isinstance(exc, UnicodeEncodeError):
        return True
    cause = getattr(exc, "orig", None) or exc
    args: tuple[Any, ...] = getattr(cause, "args", ())
    mysql_number = (
        args[0]
        if args and isinstance(args[0], int) and type(cause).__module__.startswith("pymysql")
        else None
    )
    if mysql_number in _MYSQL_DATA_ERRORS:
        return True  # before the SQLSTATE: PyMySQL's errors carry one too (HY000 for most)
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:  # psycopg: the server's SQLSTATE
        kind = sqlstate[:2]
        return kind in _PG_DATA_CLASSES or (
            kind == _PG_INTEGRITY_CLASS and sqlstate != _PG_UNIQUE_VIOLATION
        )
    if isinstance(cause, _DRIVER_DATA_ERRORS):  # psycopg's own refusal (a NUL in text)
        return True
    if mysql_number is not None:
        if mysql_number in _MYSQL_DUPLICATE_KEYS:
            return False
        return isinstance(exc, sa_exc.DataError | sa_exc.IntegrityError)
    return isinstance(exc, sa_exc.DataError)


def _store_error(engine: Engine, doing: str, exc: BaseException) -> StoreError:
    """Ours for a SQLAlchemy or driver error: refused data, an outage, or another failure."""
    reason = _reason(engine, exc)
    where = f"{doing} on {_masked(engine)}: {reason}"
    if _is_data_error(exc):
        return StoreDataError(f"job store refused the data of {where}", reason=reason)
    if _is_unavailable(exc):
        return StoreUnavailableError(f"job store unavailable, {where}")
    return StoreError(f"job store failed {where}")


@contextmanager
def _boundary(engine: Engine, doing: str) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors into ours, naming the (masked) backend.

    What retrying cannot cure (the statement's content refused) becomes
    :class:`StoreDataError`, an outage :class:`StoreUnavailableError`. Errors of
    the hot statements sent straight to psycopg are classified the same way.
    """
    try:
        yield
    except _CLASSIFIED as exc:
        raise _store_error(engine, doing, exc) from exc


T = TypeVar("T")

try:  # the PostgreSQL driver is an extra
    import psycopg
    from psycopg.rows import dict_row

    _DRIVER_ERRORS: tuple[type[Exception], ...] = (psycopg.Error,)
    _DRIVER_DISCONNECTS: tuple[type[Exception], ...] = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
    _DRIVER_DATA_ERRORS: tuple[type[Exception], ...] = (psycopg.DataError,)
except ImportError:  # pragma: no cover - MySQL-only installs
    dict_row = None  # type: ignore[assignment]
    _DRIVER_ERRORS = _DRIVER_DISCONNECTS = _DRIVER_DATA_ERRORS = ()

#: What ``_boundary`` turns into our errors: SQLAlchemy's, the driver's (the hot
#: statements), and text the driver cannot encode (a lone surrogate).
_CLASSIFIED: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    UnicodeEncodeError,
    *_DRIVER_ERRORS,
)


def _once_more_if_stale(engine: Engine, doing: str, call: Callable[[], T]) -> T:
    """``call()``, tried a second time if it failed on a pooled connection the server
    had closed (a restart). The pool is not pinged before each use: that costs a
    round trip per call, while a stale pool costs one failed call after a restart.
    """
    try:
        with _boundary(engine, doing):
            return call()
    except StoreUnavailableError as exc:
        cause = exc.__cause__
        stale = isinstance(cause, _DRIVER_DISCONNECTS) or (
            isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated
        )
        if not stale:
            raise
    with _boundary(engine, doing):
        return call()


#: The extra that installs each dialect's driver.
_EXTRAS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}


def _create_engine(
    uri: str, engine_kwargs: dict[str, Any] | None = None, given: list[str] | None = None
) -> Engine:
    try:
        return create_engine(uri, **(engine_kwargs or {}))
    except ImportError as exc:
        backend = make_url(uri).get_backend_name()
        extra = _EXTRAS.get(backend, backend)
        raise StoreError(
            f"the {backend} driver is missing ({exc}); "
            f"install it with: pip install 'pypepper-dramatiq[{extra}]'"
        ) from exc
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise StoreError(f"invalid job store URL: {exc}") from exc
    except (TypeError, AttributeError) as exc:  # an engine option of the wrong name or kind
        raise ConfigError(f"invalid job store option among {given or []}: {exc}") from exc


@contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    """A real transaction, also on an engine whose connections autocommit."""
    connection = engine.connect().execution_options(isolation_level="READ COMMITTED")
    with connection, connection.begin():
        yield connection


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


def _upgrade(engine: Engine) -> str:
    with _boundary(engine, "migrating the schema"), _transaction(engine) as connection:
        if connection.dialect.name == "postgresql":
            # Serialise concurrent migrators; PostgreSQL DDL is transactional, so
            # the loser then finds the schema at head and does nothing.
            connection.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
        before = _current(connection)
        with _quiet_alembic():
            command.upgrade(_config(connection), "head")
        after = _current(connection)
    if before != after:
        logger.info(
            "upgraded job store schema from %s to %s on %s",
            before,
            after,
            _masked(engine),
            extra={"action": "upgrade_schema", "from": before, "to": after},
        )
    return head_revision()


def _revision(engine: Engine) -> str | None:
    with _boundary(engine, "reading the schema revision"), engine.connect() as connection:
        return _current(connection)


def upgrade_schema(uri: str) -> str:
    """Bring the database at ``uri`` to this package's schema; returns the head revision.

    Safe to run again, and (on PostgreSQL) from several processes at once.
    """
    engine = _create_engine(uri)
    try:
        return _upgrade(engine)
    finally:
        engine.dispose()


def schema_revision(uri: str) -> str | None:
    """The schema revision of the database at ``uri``, or None if it has none."""
    engine = _create_engine(uri)
    try:
        return _revision(engine)
    finally:
        engine.dispose()


def _check_schema(engine: Engine) -> None:
    current, head = _revision(engine), head_revision()
    if current == head:
        return
    known = {script.revision for script in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current is not None and current not in known:
        raise SchemaVersionError(
            f"the job store at {_masked(engine)} has schema revision {current!r}, newer "
            f"than this pypepper-dramatiq knows (head {head!r}); upgrade the package"
        )
    found = "no schema" if current is None else f"schema revision {current!r}"
    raise SchemaVersionError(
        f"the job store at {_masked(engine)} has {found}, this package needs {head!r}; "
        f"upgrade it with: pypepper-dramatiq migrate --uri {shlex.quote(_masked(engine))}"
    )


def _row_values(record: JobRecord) -> dict[str, Any]:
    """The columns of ``record``'s row (every write goes through here).

    Raises:
        CorruptRecordError: ``record`` is a listing's placeholder for a damaged row
            (or made from one): writing it would replace what could not be read.
    """
    if record.damaged is not None:
        raise CorruptRecordError(
            record.id, "-", f"a placeholder is never written back ({record.damaged})"
        )
    return {
        "id": record.id,
        "channel_id": record.channel_id,
        "category": record.category,
        "status": record.status.value,
        "version": record.version + 1,
        "created": record.created,
        "updated": record.updated,
        "payload": record.payload,
        "state": record.state,
        "error": record.error,
        "lease_owner": record.lease_owner,
        "lease_expires": record.lease_expires,
        "not_before": record.not_before,
        "release_at": record.release_at,
        "start_deadline": record.start_deadline,
        "unique_key": record.unique_key,
        "waits": record.waits,
        "waiting_since": record.waiting_since,
    }


def _status_is(status: Status) -> ColumnElement[bool]:
    """``status = '<value>'`` with the value written into the statement, not bound.

    The statuses are few and fixed, and how many rows each has differs by orders of
    magnitude. Bound, a statement run often on one connection gets PostgreSQL's
    generic plan (psycopg prepares it after a few runs), one plan for every status:
    for a rare status, a scan of the whole table. Written in, each status keeps its
    own plan.
    """
    return jobs.c.status == literal(status.value, literal_execute=True)


#: The escape character of the ``search`` filter's LIKE pattern (the same on every dialect).
_LIKE_ESCAPE = "!"


def _like_pattern(text: str) -> str:
    """``%text%`` with the LIKE wildcards in ``text`` made plain characters."""
    for char in (_LIKE_ESCAPE, "%", "_"):
        text = text.replace(char, _LIKE_ESCAPE + char)
    return f"%{text}%"


def _filters(
    *,
    channel_id: str | None = None,
    category: str | None = None,
    before: tuple[datetime, str] | None = None,
    after: tuple[datetime, str] | None = None,
    created_from: datetime | None = None,
    created_until: datetime | None = None,
    search: str | None = None,
) -> builtins.list[ColumnElement[bool]]:
    """The conditions of :meth:`IJobStore.list`'s filters other than the status."""
    where: builtins.list[ColumnElement[bool]] = []
    if channel_id is not None:
        where.append(jobs.c.channel_id == channel_id)
    if category is not None:
        where.append(jobs.c.category == category)
    if before is not None:
        # A plain tuple on the right takes the columns' types (UtcDateTime's binding).
        where.append(tuple_(jobs.c.created, jobs.c.id) < (before[0], before[1]))
    if after is not None:
        where.append(tuple_(jobs.c.created, jobs.c.id) > (after[0], after[1]))
    if created_from is not None:
        where.append(jobs.c.created >= created_from)
    if created_until is not None:
        where.append(jobs.c.created < created_until)
    if search is not None:
        pattern = _like_pattern(search)
        where.append(
            or_(
                jobs.c.id.ilike(pattern, escape=_LIKE_ESCAPE),
                jobs.c.category.ilike(pattern, escape=_LIKE_ESCAPE),
            )
        )
    return where


_COLUMNS = (
    "id, channel_id, category, status, version, created, updated, payload, state, error, "
    "lease_owner, lease_expires, not_before, release_at, start_deadline, unique_key, waits, "
    "waiting_since"
)

#: PostgreSQL's hot statements, written out: building them with SQLAlchemy Core
#: on every call cost more CPU than the database spent running them.
_PG_UPSERT = f"""
INSERT INTO scheduler_jobs ({_COLUMNS})
VALUES (%(id)s, %(channel_id)s, %(category)s, %(status)s, %(version)s + 1, %(created)s,
        %(updated)s, %(payload)s::jsonb, %(state)s::jsonb, %(error)s, %(lease_owner)s,
        %(lease_expires)s, %(not_before)s, %(release_at)s, %(start_deadline)s,
        %(unique_key)s, %(waits)s::jsonb, %(waiting_since)s)
ON CONFLICT (id) DO UPDATE SET
    channel_id = EXCLUDED.channel_id, category = EXCLUDED.category,
    status = EXCLUDED.status, version = scheduler_jobs.version + 1,
    updated = EXCLUDED.updated, payload = EXCLUDED.payload, state = EXCLUDED.state,
    error = EXCLUDED.error, lease_owner = EXCLUDED.lease_owner,
    lease_expires = EXCLUDED.lease_expires, not_before = EXCLUDED.not_before,
    release_at = EXCLUDED.release_at, start_deadline = EXCLUDED.start_deadline,
    unique_key = EXCLUDED.unique_key, waits = EXCLUDED.waits,
    waiting_since = EXCLUDED.waiting_since
WHERE scheduler_jobs.version = %(version)s AND scheduler_jobs.status = ANY(%(allowed)s)
"""

_PG_ADVANCE = """
UPDATE scheduler_jobs SET
    status = %(status)s, version = version + 1, updated = %(updated)s,
    state = %(state)s::jsonb, error = %(error)s, lease_owner = %(lease_owner)s,
    lease_expires = %(lease_expires)s, not_before = %(not_before)s,
    release_at = %(release_at)s, start_deadline = %(start_deadline)s,
    unique_key = %(unique_key)s, waits = %(waits)s::jsonb, waiting_since = %(waiting_since)s
WHERE id = %(id)s AND version = %(version)s AND status = ANY(%(allowed)s)
"""

_PG_GET = f"SELECT {_COLUMNS} FROM scheduler_jobs WHERE id = %(id)s"

# The claims below leave a row whose state is not an object (a damaged row) as it
# is: jsonb_set would fail on it; the caller's read of the row then names it.
# They are base.why_not_claimable in SQL; ``retry`` is start_times.is_retry of the
# cursor (the cursor must equal the row's), so that a late retry is refused by
# the same rule (start_times.late_retry) in every store.

_PG_CLAIM = f"""
UPDATE scheduler_jobs SET
    status = 'InProgress', version = version + 1, updated = %(now)s,
    state = jsonb_set(state, '{{cursor}}', %(cursor)s::jsonb),
    lease_owner = %(owner)s, lease_expires = %(lease_until)s
WHERE id = %(id)s AND jsonb_typeof(state) = 'object' AND (
    (status = 'InProgress' AND state -> 'cursor' = %(cursor)s::jsonb
        AND (lease_owner IS NULL OR lease_expires < %(now)s)
        AND (NOT %(retry)s OR start_deadline IS NULL OR start_deadline >= %(now)s))
    OR (status = 'Scheduled' AND %(start)s
        AND (not_before IS NULL OR not_before <= %(now)s)
        AND (start_deadline IS NULL OR start_deadline >= %(now)s)
        AND waiting_since IS NULL))
RETURNING {_COLUMNS}
"""


def _prefixed(columns: str, table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in columns.split(","))


#: Group commit's claims: the predicate of _PG_CLAIM, for each row of the arrays.
_PG_CLAIM_MANY = f"""
UPDATE scheduler_jobs AS j SET
    status = 'InProgress', version = j.version + 1, updated = c.now,
    state = jsonb_set(j.state, '{{cursor}}', c.cursor::jsonb),
    lease_owner = c.owner, lease_expires = c.lease_until
FROM unnest(%(n)s::int[], %(id)s::text[], %(cursor)s::text[], %(owner)s::text[],
            %(now)s::timestamptz[], %(lease_until)s::timestamptz[], %(start)s::bool[],
            %(retry)s::bool[])
    AS c(n, id, cursor, owner, now, lease_until, start, retry)
WHERE j.id = c.id AND jsonb_typeof(j.state) = 'object' AND (
    (j.status = 'InProgress' AND j.state -> 'cursor' = c.cursor::jsonb
        AND (j.lease_owner IS NULL OR j.lease_expires < c.now)
        AND (NOT c.retry OR j.start_deadline IS NULL OR j.start_deadline >= c.now))
    OR (j.status = 'Scheduled' AND c.start
        AND (j.not_before IS NULL OR j.not_before <= c.now)
        AND (j.start_deadline IS NULL OR j.start_deadline >= c.now)
        AND j.waiting_since IS NULL))
RETURNING c.n, {_prefixed(_COLUMNS, "j")}
"""

#: Group commit's outcome records: _PG_ADVANCE for each row of the arrays (the
#: allowed statuses of a row as one comma-separated text).
_PG_ADVANCE_MANY = """
UPDATE scheduler_jobs AS j SET
    status = a.status, version = j.version + 1, updated = a.updated,
    state = a.state::jsonb, error = a.error, lease_owner = a.lease_owner,
    lease_expires = a.lease_expires, not_before = a.not_before,
    release_at = a.release_at, start_deadline = a.start_deadline,
    unique_key = a.unique_key, waits = a.waits::jsonb, waiting_since = a.waiting_since
FROM unnest(%(n)s::int[], %(id)s::text[], %(version)s::int[], %(allowed)s::text[],
            %(status)s::text[], %(updated)s::timestamptz[], %(state)s::text[],
            %(error)s::text[], %(lease_owner)s::text[], %(lease_expires)s::timestamptz[],
            %(not_before)s::timestamptz[], %(release_at)s::timestamptz[],
            %(start_deadline)s::timestamptz[], %(unique_key)s::text[], %(waits)s::text[],
            %(waiting_since)s::timestamptz[])
    AS a(n, id, version, allowed, status, updated, state, error, lease_owner,
         lease_expires, not_before, release_at, start_deadline, unique_key, waits,
         waiting_since)
WHERE j.id = a.id AND j.version = a.version
    AND j.status = ANY(string_to_array(a.allowed, ','))
RETURNING a.n
"""


#: The stored statuses each status may replace, as the arrays the statements take.
_ALLOWED = {status: sorted(s.value for s in overwritable_by(status)) for status in Status}


def _pg_params(record: JobRecord) -> dict[str, Any]:
    """Parameters of the hot PostgreSQL statements: the seen version, JSON as text."""
    params = _row_values(record)
    params.update(
        version=record.version,
        payload=None if record.payload is None else json.dumps(record.payload),
        state=json.dumps(record.state),
        waits=None if record.waits is None else json.dumps(record.waits),
        allowed=_ALLOWED[record.status],
    )
    return params


def _pg_claim_arrays(requests: Sequence[StepClaim], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameters of _PG_CLAIM_MANY: one array per column, a row per request."""
    picked = [requests[n] for n in chosen]
    return {
        "n": list(chosen),
        "id": [r.job_id for r in picked],
        "cursor": [json.dumps(list(r.cursor)) for r in picked],
        "owner": [r.owner for r in picked],
        "now": [r.now for r in picked],
        "lease_until": [r.lease_until for r in picked],
        "start": [r.start for r in picked],
        "retry": [is_retry(r.cursor) for r in picked],
    }


#: The columns _PG_ADVANCE_MANY takes as arrays, besides ``n`` and ``allowed``.
_ADVANCE_ARRAYS = (
    "id",
    "version",
    "status",
    "updated",
    "state",
    "error",
    "lease_owner",
    "lease_expires",
    "not_before",
    "release_at",
    "start_deadline",
    "unique_key",
    "waits",
    "waiting_since",
)


def _pg_advance_arrays(records: Sequence[JobRecord], chosen: Sequence[int]) -> dict[str, Any]:
    """The parameters of _PG_ADVANCE_MANY: one array per column, a row per record."""
    rows = [_pg_params(records[n]) for n in chosen]
    arrays: dict[str, Any] = {"n": list(chosen)}
    for column in _ADVANCE_ARRAYS:
        arrays[column] = [row[column] for row in rows]
    arrays["allowed"] = [",".join(row["allowed"]) for row in rows]
    return arrays


def _advance_statement(record: JobRecord) -> Any:
    """The compare-and-set UPDATE of ``advance``: every column but id, created, payload."""
    values = _row_values(record)
    for column in ("id", "created", "version", "payload"):
        del values[column]
    values["version"] = jobs.c.version + 1
    return update(jobs).where(jobs.c.id == record.id, _guard(record)).values(values)


def _guard(record: JobRecord) -> ColumnElement[bool]:
    """The stored row may be replaced by ``record``: seen version, allowed status."""
    allowed = sorted(s.value for s in overwritable_by(record.status))
    return (jobs.c.version == record.version) & jobs.c.status.in_(allowed)


def _lapsed(now: datetime, limit: int) -> Select[Any]:
    """Up to ``limit`` InProgress rows whose lease lapsed before ``now``, oldest first,
    locked for this transaction; rows another recoverer holds are skipped, not awaited."""
    return (
        select(jobs.c.id)
        .where(jobs.c.status == Status.IN_PROGRESS.value, jobs.c.lease_expires < now)
        .order_by(jobs.c.lease_expires, jobs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


class _Candidate(NamedTuple):
    """What :func:`~pypepper_dramatiq.retention.still_needed` reads of a row to purge."""

    id: str
    state: dict[str, Any]


class SqlJobStore(IJobStore):
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

    def __new__(cls, uri: str, *args: Any, **kwargs: Any) -> SqlJobStore:
        if cls is SqlJobStore and _backend_name(uri) == "postgresql":
            cls = PostgresJobStore
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
        # COMMIT/ROLLBACK each; the few multi-statement ones use _transaction().
        engine_kwargs.setdefault("isolation_level", "AUTOCOMMIT")
        self._engine = _create_engine(uri, engine_kwargs, given)
        try:
            if migrate:
                _upgrade(self._engine)
            else:
                _check_schema(self._engine)
        except BaseException:
            self._engine.dispose()
            raise

    @property
    def engine(self) -> Engine:
        """The pooled engine (for tests and administration)."""
        return self._engine

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_masked(self._engine)!r})"

    def put(self, record: JobRecord) -> bool:
        # A new job that came from others (after=, a retry) is inserted with its
        # links in one transaction; every other put is the one upsert statement.
        found = parents_of(record.id, record.payload, record.waits) if record.version == 0 else []
        write = (lambda: self._insert_linked(record, found)) if found else None
        return self._keyed(
            record,
            lambda: _once_more_if_stale(
                self._engine, f"saving job {record.id}", write or (lambda: self._upsert(record))
            ),
        )

    @contextmanager
    def _linked_write(self) -> Iterator[Connection]:
        """A transaction for a row and its links."""
        with _transaction(self._engine) as connection:
            yield connection

    def _insert_linked(self, record: JobRecord, found: Sequence[Link]) -> bool:
        try:
            with self._linked_write() as connection:
                waiting = record.waiting_since is not None
                _lock_parents(connection, required_parents(found, waiting=waiting))
                connection.execute(insert(jobs).values(_row_values(record)))
                connection.execute(
                    insert(links),
                    [{"parent_id": k.parent, "child_id": k.child, "kind": k.kind} for k in found],
                )
            return True
        except sa_exc.IntegrityError as exc:
            if not _is_duplicate_key(exc) or _refused_by_key_index(exc):
                raise
        # The row is there already (a put tried again): its links went in with it.
        return self._upsert(record)

    def _keyed(self, record: JobRecord, write: Callable[[], bool]) -> bool:
        """``write()``; a refusal by the unique index of active keys becomes a
        DuplicateJobError naming the holder."""
        try:
            return write()
        except StoreError as exc:
            if record.unique_key is None or not _refused_by_key_index(exc.__cause__):
                raise
        holder = self.key_holder(record.unique_key)
        raise DuplicateJobError(record.unique_key, None if holder is None else holder.id)

    def _upsert(self, record: JobRecord) -> bool:
        # Insert, and on a duplicate key update under the guard (MySQL has no
        # conditional upsert that reports whether the guard held).
        values = _row_values(record)
        try:
            with self._engine.connect() as connection:
                connection.execute(insert(jobs).values(values))
            return True
        except sa_exc.IntegrityError as exc:
            if not _is_duplicate_key(exc) or _refused_by_key_index(exc):
                raise
        del values["id"], values["created"], values["version"]
        values["version"] = jobs.c.version + 1
        stmt = update(jobs).where(jobs.c.id == record.id, _guard(record)).values(values)
        with self._engine.connect() as connection:
            return connection.execute(stmt).rowcount == 1

    def advance(self, record: JobRecord) -> bool:
        return self._keyed(
            record,
            lambda: _once_more_if_stale(
                self._engine, f"updating job {record.id}", lambda: self._advance(record)
            ),
        )

    def _advance(self, record: JobRecord) -> bool:
        with self._engine.connect() as connection:
            return connection.execute(_advance_statement(record)).rowcount == 1

    def write_progress(self, job_id: str, key: str, value: dict[str, Any]) -> bool:
        # One statement that merges the entry into state["progress"] on the server
        # and leaves version and status alone.
        patch = json.dumps({PROGRESS_KEY: {key: value}})
        if self._engine.dialect.name == "postgresql":
            merged = text(
                "UPDATE scheduler_jobs SET state = jsonb_set(state, '{progress}', "
                "COALESCE(state -> 'progress', '{}'::jsonb) || "
                "(CAST(:patch AS jsonb) -> 'progress')) "
                "WHERE id = :id AND status = 'InProgress'"
            )
        else:  # MySQL and MariaDB: RFC 7396 merge, objects merged key by key
            merged = text(
                "UPDATE scheduler_jobs SET state = JSON_MERGE_PATCH(state, :patch) "
                "WHERE id = :id AND status = 'InProgress'"
            )
        with (
            _boundary(self._engine, f"writing the progress of job {job_id}"),
            self._engine.connect() as connection,
        ):
            return connection.execute(merged, {"id": job_id, "patch": patch}).rowcount == 1

    def advance_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        # One transaction (one commit) for all rows. A row refused by the unique
        # index of active keys rolls it back: then row by row, so that the
        # refusal names its own row.
        if not records:
            return []
        return self._whole_or_row_by_row(
            records, self._advance_many, lambda: [self.advance(record) for record in records]
        )

    def _whole_or_row_by_row(
        self,
        records: Sequence[JobRecord],
        whole: Callable[[Sequence[JobRecord]], builtins.list[T]],
        row_by_row: Callable[[], builtins.list[T]],
        *,
        after_data_error: bool = False,
    ) -> builtins.list[T]:
        """``whole(records)``, all rows at once; ``row_by_row()`` instead when the
        unique index of active keys refused one of them (and so undid them all),
        or, with ``after_data_error``, when the database refused one row's content
        (:class:`StoreDataError`): then only that row gets the refusal."""
        try:
            return _once_more_if_stale(
                self._engine, f"updating {len(records)} jobs", lambda: whole(records)
            )
        except StoreError as exc:
            refused_row = after_data_error and not retry_may_cure(exc)
            if not refused_row and not _refused_by_key_index(exc.__cause__):
                raise
        return row_by_row()

    def _advance_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        written: dict[int, bool] = {}
        with _transaction(self._engine) as connection:
            # In id order, so that two multi-row writers never wait on each other.
            for n in sorted(range(len(records)), key=lambda n: records[n].id):
                written[n] = connection.execute(_advance_statement(records[n])).rowcount == 1
        return [written[n] for n in range(len(records))]

    def get(self, job_id: str) -> JobRecord | None:
        row = _once_more_if_stale(self._engine, f"loading job {job_id}", lambda: self._get(job_id))
        return None if row is None else job_record(row)

    def _get(self, job_id: str) -> Any:
        with self._engine.connect() as connection:
            query = select(jobs).where(jobs.c.id == job_id)
            return connection.execute(query).mappings().first()

    def delete(self, job_id: str) -> bool:
        with _boundary(self._engine, f"deleting job {job_id}"), self._engine.connect() as conn:
            return conn.execute(delete(jobs).where(jobs.c.id == job_id)).rowcount == 1

    def list(
        self,
        *,
        status: Status | str | None = None,
        channel_id: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before: tuple[datetime, str] | None = None,
        after: tuple[datetime, str] | None = None,
        created_from: datetime | None = None,
        created_until: datetime | None = None,
        search: str | None = None,
    ) -> Sequence[JobRecord]:
        # Both columns in one direction, and the cursor as one row comparison, so
        # that a status filter (alone, or with a channel or a category) reads the
        # (status, ...) / (channel_id, status, ...) / (category, status, ...) index
        # in order, backwards for newest first, starting at the cursor: a page
        # costs its own rows, however deep it is.
        where = _filters(
            channel_id=channel_id,
            category=category,
            before=before,
            after=after,
            created_from=created_from,
            created_until=created_until,
            search=search,
        )

        def ordered(query: Select[Any]) -> Select[Any]:
            columns = query.selected_columns
            if newest_first:
                return query.order_by(columns.created.desc(), columns.id.desc())
            return query.order_by(columns.created, columns.id)

        if status is not None:
            query = ordered(select(jobs).where(_status_is(Status(status)), *where))
            if limit is not None:
                query = query.limit(limit)
        elif limit is not None:
            # No status: the first ``limit`` rows of each status, each read in its
            # index's order, merged. No index leads with ``created``, and sorting
            # every row for one page is what a million rows cannot afford.
            branches = [
                ordered(select(jobs).where(_status_is(value), *where)).limit(limit)
                for value in Status
            ]
            merged = union_all(*branches).subquery()
            query = ordered(select(merged)).limit(limit)
        else:
            query = ordered(select(jobs).where(*where))
        with _boundary(self._engine, "listing jobs"), self._engine.connect() as conn:
            return listed_jobs(conn.execute(query).mappings())

    def renew_leases(
        self, owner: str, job_ids: Collection[str], until: datetime
    ) -> dict[str, Status]:
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        held = jobs.c.id.in_(ids) & (jobs.c.lease_owner == owner)
        # Deliberately no ``version = version + 1``: a renewal must not make the
        # owner's own next put look stale.
        renew = update(jobs).where(held).values(lease_expires=until)
        with _boundary(self._engine, f"renewing {len(ids)} leases of {owner}"):
            rows = self._renew(renew, held)
        return {job_id: status_or_unknown(status) for job_id, status in rows}

    def _renew(self, renew: Any, held: Any) -> Sequence[Any]:
        # No RETURNING on UPDATE: read back in the same transaction. The
        # renewed rows stay locked by it, so the read sees them as written.
        with _transaction(self._engine) as conn:
            conn.execute(renew)
            return conn.execute(select(jobs.c.id, jobs.c.status).where(held)).all()

    def recover_expired(
        self, now: datetime, lease_until: datetime, limit: int = 100
    ) -> builtins.list[JobRecord]:
        changes = {
            "lease_owner": None,
            "lease_expires": lease_until,
            "version": jobs.c.version + 1,
        }
        with _boundary(self._engine, "recovering lapsed leases"):
            return self._recover(now, limit, changes)

    def _recover(
        self, now: datetime, limit: int, changes: dict[str, Any]
    ) -> builtins.list[JobRecord]:
        # MySQL cannot LIMIT a subquery of IN, nor update the table it selects
        # from; so lock, then update. Under READ COMMITTED the locking read takes
        # no gap locks, which could otherwise hold up a concurrent recoverer
        # moving its rows' (status, lease_expires) index entries into the gap.
        with _transaction(self._engine) as conn:
            ids: builtins.list[str] = list(conn.execute(_lapsed(now, limit)).scalars())
            if not ids:
                return []
            conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(changes))
            rows = conn.execute(select(jobs).where(jobs.c.id.in_(ids))).mappings().all()
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted(listed_jobs(rows), key=lambda r: order[r.id])

    def due_releases(self, until: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        query = (
            select(jobs)
            .where(jobs.c.status == Status.SCHEDULED.value, jobs.c.release_at <= until)
            .order_by(jobs.c.release_at, jobs.c.id)
            .limit(limit)
        )
        with _boundary(self._engine, "listing jobs due for release"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def overdue(self, now: datetime, limit: int = 100) -> builtins.list[JobRecord]:
        query = (
            select(jobs)
            .where(jobs.c.status == Status.SCHEDULED.value, jobs.c.start_deadline < now)
            .order_by(jobs.c.start_deadline, jobs.c.id)
            .limit(limit)
        )
        with _boundary(self._engine, "listing overdue jobs"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def get_many(self, job_ids: Collection[str]) -> builtins.list[JobRecord]:
        ids = sorted(set(job_ids))
        found: builtins.list[JobRecord] = []
        with _boundary(self._engine, f"loading {len(ids)} jobs"), self._engine.connect() as c:
            for start in range(0, len(ids), 500):
                query = select(jobs).where(jobs.c.id.in_(ids[start : start + 500]))
                found.extend(listed_jobs(c.execute(query).mappings()))
        return found

    def _corrupt(self, job_id: str) -> CorruptRecordError | None:
        """The error of a damaged row that a batch read as a placeholder: the single
        read's, naming the column (None if the row reads whole by now)."""
        try:
            self.get(job_id)
        except CorruptRecordError as exc:
            return exc
        return None

    def key_holder(self, key: str) -> JobRecord | None:
        # On MySQL the column holds the key's utf8mb4 bytes (see schema.active_key_type).
        mysql = self._engine.dialect.name in ("mysql", "mariadb")
        query = select(jobs).where(jobs.c.active_key == (key.encode() if mysql else key))
        with _boundary(self._engine, f"looking up key {key!r}"), self._engine.connect() as c:
            row = c.execute(query).mappings().first()
        return None if row is None else job_record(row)

    def waiting(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        query = (
            select(jobs)
            .where(jobs.c.waiting_since.is_not(None), jobs.c.status == Status.SCHEDULED.value)
            .order_by(jobs.c.waiting_since, jobs.c.id)
            .limit(limit)
        )
        if after is not None:
            query = query.where(tuple_(jobs.c.waiting_since, jobs.c.id) > (after[0], after[1]))
        with _boundary(self._engine, "listing waiting jobs"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def held_counts(self) -> dict[tuple[str, str], int]:
        reason = case(
            (jobs.c.waiting_since.is_not(None), literal(HELD_FOR_JOBS)),
            else_=literal(HELD_FOR_TIME),
        ).label("reason")
        query = (
            select(jobs.c.channel_id, reason, func.count())
            .where(
                jobs.c.status == Status.SCHEDULED.value,
                or_(jobs.c.waiting_since.is_not(None), jobs.c.release_at.is_not(None)),
            )
            .group_by(jobs.c.channel_id, reason)
        )
        with _boundary(self._engine, "counting held jobs"), self._engine.connect() as conn:
            return {(str(ch), str(why)): int(n) for ch, why, n in conn.execute(query)}

    def ended_since(
        self, status: Status, after: tuple[datetime, str], limit: int = 100
    ) -> builtins.list[JobRecord]:
        check_ended(status)
        at, job_id = after
        # The keyset spelt out (not a row comparison) so that MySQL ranges over
        # ix_scheduler_jobs_status_updated as PostgreSQL does.
        query = (
            select(jobs)
            .where(
                jobs.c.status == status.value,
                jobs.c.updated >= at,
                or_(jobs.c.updated > at, jobs.c.id > job_id),
            )
            .order_by(jobs.c.updated, jobs.c.id)
            .limit(limit)
        )
        with _boundary(self._engine, "listing ended jobs"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    # -- recurring schedules ----------------------------------------------------------

    def save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        # Two first saves of one name (processes starting together) both find no
        # row; the primary key refuses the loser's insert, and its second try
        # finds the winner's row and replaces it.
        try:
            return self._save_recurring(schedule)
        except StoreError as exc:
            if not isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise
        return self._save_recurring(schedule)

    def _save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        with (
            _boundary(self._engine, f"saving schedule {schedule.name}"),
            _transaction(self._engine) as conn,
        ):
            current = conn.execute(
                select(recurring.c.version, recurring.c.created)
                .where(recurring.c.name == schedule.name)
                .with_for_update()
            ).first()
            if current is None:
                stored = schedule.evolve(version=1)
                conn.execute(insert(recurring).values(_schedule_values(stored)))
                return stored
            stored = schedule.evolve(version=current.version + 1, created=current.created)
            values = _schedule_values(stored)
            del values["name"], values["created"]
            conn.execute(update(recurring).where(recurring.c.name == schedule.name).values(values))
            return stored

    def advance_recurring(self, schedule: RecurringSchedule) -> bool:
        values = _schedule_values(schedule)
        for column in ("name", "created"):
            del values[column]
        values["version"] = recurring.c.version + 1
        stmt = (
            update(recurring)
            .where(recurring.c.name == schedule.name, recurring.c.version == schedule.version)
            .values(values)
        )
        with (
            _boundary(self._engine, f"updating schedule {schedule.name}"),
            self._engine.connect() as c,
        ):
            return c.execute(stmt).rowcount == 1

    def get_recurring(self, name: str) -> RecurringSchedule | None:
        query = select(recurring).where(recurring.c.name == name)
        with _boundary(self._engine, f"loading schedule {name}"), self._engine.connect() as c:
            row = c.execute(query).mappings().first()
        return None if row is None else recurring_schedule(row)

    def list_recurring(self) -> builtins.list[RecurringSchedule]:
        query = select(recurring).order_by(recurring.c.name)
        with _boundary(self._engine, "listing schedules"), self._engine.connect() as c:
            return listed_schedules(c.execute(query).mappings())

    def delete_recurring(self, name: str) -> bool:
        stmt = delete(recurring).where(recurring.c.name == name)
        with _boundary(self._engine, f"deleting schedule {name}"), self._engine.connect() as c:
            return c.execute(stmt).rowcount == 1

    def due_recurring(self, now: datetime, limit: int = 100) -> builtins.list[RecurringSchedule]:
        query = (
            select(recurring)
            .where(recurring.c.next_slot <= now, recurring.c.paused.is_(False))
            .order_by(recurring.c.next_slot, recurring.c.name)
            .limit(limit)
        )
        with _boundary(self._engine, "listing due schedules"), self._engine.connect() as c:
            return due_schedules(c.execute(query).mappings())

    # -- on_final_failure hooks -------------------------------------------------------

    def pending_hooks(
        self, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> builtins.list[JobRecord]:
        # The key is absent from a row with no hook due (JobState.to_dict drops it);
        # ``->`` on PostgreSQL, ``JSON_EXTRACT`` on MySQL. No index serves it: the
        # recovery sweep runs it at most every interval.
        query = (
            select(jobs)
            .where(jobs.c.state[HOOKS_KEY].is_not(None))
            .order_by(jobs.c.created, jobs.c.id)
            .limit(limit)
        )
        if after is not None:
            query = query.where(tuple_(jobs.c.created, jobs.c.id) > (after[0], after[1]))
        with _boundary(self._engine, "listing jobs with hooks due"), self._engine.connect() as c:
            return listed_jobs(c.execute(query).mappings())

    def close(self) -> None:
        self._engine.dispose()

    # -- retention ----------------------------------------------------------------------

    def purge(
        self,
        status: Status | str,
        older_than: datetime,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        ended = retention.ended_status(status)
        with _boundary(self._engine, f"purging {ended.value} jobs"):
            chosen = self._purgeable(ended, older_than, max(0, limit))
            if dry_run:
                return [job_id for job_id, _ in chosen]
            deleted: builtins.list[str] = []
            for start in range(0, len(chosen), retention.BATCH):
                batch = chosen[start : start + retention.BATCH]
                deleted.extend(self._delete_purgeable(ended, older_than, batch))
            return deleted

    def _purgeable(
        self, ended: Status, older_than: datetime, limit: int
    ) -> builtins.list[tuple[str, int]]:
        """Up to ``limit`` rows ``purge`` may delete, as (id, version), oldest created first.

        Read by the (status, created, id) index (an ended job was created before it
        ended), a page at a time, past the rows still needed; of each candidate only
        its hooks are read (``state -> 'hooks'``, ``JSON_EXTRACT`` on MySQL).
        """
        chosen: builtins.list[tuple[str, int]] = []
        if limit == 0:
            return chosen
        hooks = jobs.c.state[retention.HOOKS_KEY].label("hooks")
        page = min(limit, retention.BATCH)
        after: tuple[datetime, str] | None = None
        with self._engine.connect() as conn:
            waits = conn.execute(
                select(jobs.c.waits).where(
                    jobs.c.waiting_since.is_not(None), jobs.c.status == Status.SCHEDULED.value
                )
            ).scalars()
            waited_for = retention.awaited(readable_waits(waits))
            while len(chosen) < limit:
                query = (
                    select(jobs.c.id, jobs.c.version, jobs.c.created, hooks)
                    .where(
                        jobs.c.status == ended.value,
                        jobs.c.created < older_than,
                        jobs.c.updated < older_than,
                    )
                    .order_by(jobs.c.created, jobs.c.id)
                    .limit(page)
                )
                if after is not None:
                    query = query.where(tuple_(jobs.c.created, jobs.c.id) > after)
                rows = conn.execute(query).all()
                for row in rows:
                    state = {} if row.hooks is None else {retention.HOOKS_KEY: row.hooks}
                    if not retention.still_needed(_Candidate(row.id, state), waited_for):
                        chosen.append((row.id, row.version))
                if len(rows) < page:
                    break
                after = (rows[-1].created, rows[-1].id)
        return chosen[:limit]

    def _delete_purgeable(
        self, ended: Status, older_than: datetime, chosen: Sequence[tuple[str, int]]
    ) -> builtins.list[str]:
        """Delete the ``chosen`` rows that are still as read (version, status, time);
        their ids. MySQL has no DELETE ... RETURNING: lock, then delete."""
        with _transaction(self._engine) as conn:
            guard = _purge_guard(ended, older_than, chosen)
            locked = list(conn.execute(select(jobs.c.id).where(guard).with_for_update()).scalars())
            if not locked:
                return []
            # A locking read: it sees the links of children committed meanwhile.
            kept = select(jobs.c.id).where(jobs.c.id.in_(locked), _unawaited(locked))
            ids = list(conn.execute(kept.with_for_update(read=True)).scalars())
            if ids:
                conn.execute(delete(jobs).where(jobs.c.id.in_(ids), guard))
        return ids

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
        caller = _caller_connection(connection)
        mine, theirs = _database_of(self._engine.url), _database_of(caller.engine.url)
        if mine != theirs:
            raise ConfigError(
                f"connection= reaches {caller.engine.url.render_as_string(hide_password=True)}, "
                f"not the job store's database ({_masked(self._engine)})"
            )
        return _InCallerTransaction(caller, self._engine, connection)

    # -- counts (the dashboard) ---------------------------------------------------------

    def count_by_status(
        self,
        *,
        channel_id: str | None = None,
        category: str | None = None,
        created_from: datetime | None = None,
        created_until: datetime | None = None,
        limit: int | None = None,
    ) -> dict[Status, int]:
        where = _filters(
            channel_id=channel_id,
            category=category,
            created_from=created_from,
            created_until=created_until,
        )
        if limit is None:
            # One GROUP BY over the (status, ...) index of the filter.
            query: Any = select(jobs.c.status, func.count()).where(*where).group_by(jobs.c.status)
        else:
            # Per status, count at most limit + 1 entries of its index: bounded
            # however many rows match.
            query = union_all(
                *(
                    select(literal(value.value), func.count()).select_from(
                        select(literal(1).label("one"))
                        .select_from(jobs)
                        .where(_status_is(value), *where)
                        .limit(max(0, limit) + 1)
                        .subquery()
                    )
                    for value in Status
                )
            )
        counts = dict.fromkeys(Status, 0)
        with _boundary(self._engine, "counting jobs"), self._engine.connect() as conn:
            for status, count in conn.execute(query):
                if status in counts:  # a status no version knows is not counted
                    counts[Status(status)] = int(count)
        return counts

    def links(self, job_id: str, limit: int = 100) -> builtins.list[Link]:
        columns = (links.c.parent_id, links.c.child_id, links.c.kind)
        parents = select(*columns).where(links.c.child_id == job_id)
        children = (
            select(*columns)
            .select_from(links.join(jobs, jobs.c.id == links.c.child_id))
            .where(links.c.parent_id == job_id)
            .order_by(jobs.c.created, jobs.c.id)
            .limit(max(0, limit))
        )
        reading = _boundary(self._engine, f"reading the links of job {job_id}")
        with reading, self._engine.connect() as conn:
            above = [Link(*row) for row in conn.execute(parents)]
            below = [Link(*row) for row in conn.execute(children)]
        return sorted(above, key=parent_order) + below

    # -- worker processes (the workers page) --------------------------------------------

    def beat_worker(self, worker: WorkerInfo) -> None:
        # One statement whether the row exists or not: PostgreSQL's ON CONFLICT DO
        # UPDATE, MySQL's and MariaDB's ON DUPLICATE KEY UPDATE. ``started`` keeps the
        # value first written; a retry after a stale connection writes the same row.
        values = _worker_values(worker)
        kept = ("owner", "started")
        stmt: Any
        if self._engine.dialect.name == "postgresql":
            stmt = pg_insert(worker_rows).values(values)
            stmt = stmt.on_conflict_do_update(
                index_elements=[worker_rows.c.owner],
                set_={name: stmt.excluded[name] for name in values if name not in kept},
            )
        else:
            stmt = mysql_insert(worker_rows).values(values)
            stmt = stmt.on_duplicate_key_update(
                {name: stmt.inserted[name] for name in values if name not in kept}
            )

        def beat() -> None:
            with self._engine.connect() as connection:
                connection.execute(stmt)

        _once_more_if_stale(self._engine, f"recording worker {worker.owner}", beat)

    def forget_worker(self, owner: str) -> bool:
        stmt = delete(worker_rows).where(worker_rows.c.owner == owner)
        with _boundary(self._engine, f"forgetting worker {owner}"), self._engine.connect() as c:
            return c.execute(stmt).rowcount == 1

    def workers(self, now: datetime) -> builtins.list[WorkerInfo]:
        # A few rows per worker process: sorted here, as MySQL's collations would not.
        query = select(worker_rows).where(worker_rows.c.last_seen >= forget_before(now))
        with _boundary(self._engine, "listing workers"), self._engine.connect() as c:
            found = listed_workers(c.execute(query).mappings())
        return listed(found, now)

    def prune_workers(self, before: datetime) -> int:
        stmt = delete(worker_rows).where(worker_rows.c.last_seen < before)
        with _boundary(self._engine, "deleting old worker rows"), self._engine.connect() as c:
            return int(c.execute(stmt).rowcount)

    def held_by(self, owners: Collection[str]) -> builtins.list[JobRecord]:
        # InProgress rows are few: the (status, ...) indexes find them.
        wanted = sorted(set(owners))
        found: builtins.list[JobRecord] = []
        with _boundary(self._engine, "listing the steps workers hold"), self._engine.connect() as c:
            for start in range(0, len(wanted), 500):
                query = select(jobs).where(
                    jobs.c.status == Status.IN_PROGRESS.value,
                    jobs.c.lease_owner.in_(wanted[start : start + 500]),
                )
                found.extend(listed_jobs(c.execute(query).mappings()))
        return sorted(found, key=lambda r: r.id)

    # -- group commit ------------------------------------------------------------------

    def claim_steps(
        self, requests: Sequence[StepClaim]
    ) -> builtins.list[JobRecord | CorruptRecordError | None]:
        # MySQL and MariaDB: one read of every row, then the claims that may win
        # in one transaction (one commit), each guarded by its version.
        if len(requests) <= 1:
            return super().claim_steps(requests)
        current = {r.id: r for r in self.get_many({q.job_id for q in requests})}
        answers: builtins.list[JobRecord | CorruptRecordError | None] = [None] * len(requests)
        chosen: dict[str, tuple[int, JobRecord]] = {}
        for n, request in enumerate(requests):
            row = current.get(request.job_id)
            if row is not None and row.damaged is not None:
                answers[n] = self._corrupt(request.job_id)  # None: mended since, read again
                continue
            if (
                row is None
                or request.job_id in chosen  # one claim per job: the others would lose
                or why_not_claimable(row, request.cursor, request.now, request.start) is not None
            ):
                continue
            chosen[request.job_id] = (n, claimed_row(row, request))
        tried = list(chosen.values())
        for (n, claimed), won in zip(
            tried, self.advance_each([claimed for _, claimed in tried]), strict=True
        ):
            if isinstance(won, Exception):
                raise won
            if won:
                answers[n] = claimed.evolve(version=claimed.version + 1)
        return answers

    def advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        # One round trip (PostgreSQL) or one transaction (MySQL) for all rows. A
        # row refused by the unique index of active keys, or for its content (a
        # data error), undoes it: then row by row, so that the refusal is answered
        # in its own row's place and the other rows are written.
        if len(records) <= 1:
            return super().advance_each(records)
        return self._whole_or_row_by_row(
            records,
            self._advance_each,
            lambda: super(SqlJobStore, self).advance_each(records),
            after_data_error=True,
        )

    def _advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        return list(self._advance_many(records))

    # -- bulk scheduling ------------------------------------------------------------------

    def put_many(self, records: Sequence[JobRecord]) -> builtins.list[bool]:
        # New jobs without links go in multi-row INSERTs of up to _INSERT_ROWS rows;
        # anything else (an update, a job with parents, an id twice) and a
        # statement the database refused whole (a unique key taken; on MySQL, an
        # id stored already) are put row by row, so that each row gets its own answer.
        ids = [record.id for record in records]
        if len(set(ids)) < len(ids) or any(
            record.version != 0 or parents_of(record.id, record.payload, record.waits)
            for record in records
        ):
            return super().put_many(records)
        answers: builtins.list[bool] = []
        for start in range(0, len(records), _INSERT_ROWS):
            chunk = records[start : start + _INSERT_ROWS]
            try:
                inserted = _once_more_if_stale(
                    self._engine,
                    f"inserting {len(chunk)} jobs",
                    functools.partial(self._insert_many, chunk),
                )
            except StoreError as exc:
                cause = exc.__cause__
                if not isinstance(cause, sa_exc.IntegrityError) and not _refused_by_key_index(
                    cause
                ):
                    raise
                answers += super().put_many(chunk)
                continue
            answers += [record.id in inserted for record in chunk]
        return answers

    def _insert_many(self, records: Sequence[JobRecord]) -> set[str]:
        """Insert new rows in one statement; the ids inserted."""
        # One statement compiled once (SQLAlchemy caches it), executed for many
        # rows: PyMySQL's executemany (and SQLAlchemy's "insertmanyvalues" on
        # psycopg, in a caller's transaction) send them as one multi-row INSERT.
        # A VALUES list built with .values(rows) would be compiled anew per call,
        # at about 1 ms a row. PostgresJobStore sends arrays instead.
        rows = [_row_values(record) for record in records]
        if self._engine.dialect.name == "postgresql":
            stmt = (
                pg_insert(jobs)
                .on_conflict_do_nothing(index_elements=[jobs.c.id])
                .returning(jobs.c.id)
            )
            with self._engine.connect() as connection:
                return {row[0] for row in connection.execute(stmt, rows)}
        # MySQL and MariaDB answer no row by row: an id stored already fails the
        # insert, and the transaction (PyMySQL splits a long one in several
        # statements) leaves nothing written.
        with self._linked_write() as connection:
            connection.execute(insert(jobs), rows)
        return {record.id for record in records}


class _InCallerTransaction(SqlJobStore):
    """A :class:`SqlJobStore` whose statements run in a caller's transaction.

    The portable statements only (the PostgreSQL subclass's hot paths use pooled
    driver connections of their own); made by :meth:`SqlJobStore.within`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> _InCallerTransaction:
        return object.__new__(cls)

    def __init__(self, connection: Connection, engine: Engine, given: object) -> None:
        self._engine = cast(Engine, _CallerTransaction(connection, engine))
        self._session = given if isinstance(given, Session) else None
        self.tells_commits = self._session is not None

    @contextmanager
    def _linked_write(self) -> Iterator[Connection]:
        """A savepoint in the caller's transaction."""
        with self._engine.connect() as connection:
            yield connection

    def after_commit(self, callback: Callable[[], object]) -> None:
        if self._session is not None:
            # Once, after the commit that makes the row visible (never on a rollback).
            event.listen(self._session, "after_commit", lambda _session: callback(), once=True)


class _CallerTransaction:
    """What a :class:`SqlJobStore` needs of an engine, on a caller's connection:
    each ``connect()`` is a savepoint in the caller's transaction."""

    def __init__(self, connection: Connection, engine: Engine) -> None:
        self._connection = connection
        self.url = engine.url
        self.dialect = connection.dialect

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._connection.begin_nested():
            yield self._connection

    def dispose(self) -> None:
        """The connection is the caller's: nothing to release."""


def _caller_connection(connection: object) -> Connection:
    if isinstance(connection, Session):
        return connection.connection()
    if isinstance(connection, Connection):
        return connection
    raise ConfigError(
        f"connection= takes a SQLAlchemy Connection or Session, got {type(connection).__name__}"
    )


#: Each backend's port when a URL names none.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def _database_of(url: Any) -> tuple[str, str, int | None, str]:
    """What makes two URLs the same database, whatever their driver or user."""
    backend = url.get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    host = url.host or str(url.query.get("host") or "localhost")
    return backend, host, url.port or _DEFAULT_PORTS.get(backend), url.database or ""


class PostgresJobStore(SqlJobStore):
    """:class:`SqlJobStore` on PostgreSQL: the hot statements in PostgreSQL's SQL.

    ``put``, ``advance``, ``get`` and ``claim_step`` are fixed statements
    (``INSERT ... ON CONFLICT DO UPDATE ... WHERE``, guarded ``UPDATE ...
    RETURNING``) sent as prepared statements on the pooled psycopg connection:
    building them with SQLAlchemy Core per call cost more CPU than the database
    spent on them. Renewals and recovery use ``RETURNING`` in one statement.
    """

    @contextmanager
    def _driver_cursor(self) -> Iterator[Any]:
        """A cursor of a pooled driver connection, for the hot statements.

        SQLAlchemy's Connection and result objects cost more CPU per call than
        these one-statement round trips themselves; the pool stays SQLAlchemy's.
        A connection that fails is invalidated, so it is not handed out again.
        """
        connection = self._engine.raw_connection()
        try:
            cursor: Any = connection.cursor(row_factory=dict_row)
            with cursor:
                yield cursor
        except _DRIVER_DISCONNECTS:
            connection.invalidate()
            raise
        finally:
            connection.close()

    def _run(self, sql: str, params: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """Execute a prepared hot statement: (rowcount, first row or None)."""
        with self._driver_cursor() as cursor:
            cursor.execute(sql, params, prepare=True)
            row = cursor.fetchone() if cursor.description is not None else None
            return cursor.rowcount, row

    def _upsert(self, record: JobRecord) -> bool:
        return self._run(_PG_UPSERT, _pg_params(record))[0] == 1

    def _advance(self, record: JobRecord) -> bool:
        return self._run(_PG_ADVANCE, _pg_params(record))[0] == 1

    def _get(self, job_id: str) -> Any:
        return self._run(_PG_GET, {"id": job_id})[1]

    def claim_step(
        self,
        job_id: str,
        cursor: Sequence[int],
        owner: str,
        now: datetime,
        lease_until: datetime,
        *,
        start: bool = False,
    ) -> JobRecord | None:
        params = {
            "id": job_id,
            "cursor": json.dumps(list(cursor)),
            "owner": owner,
            "now": now,
            "lease_until": lease_until,
            "start": start,
            "retry": is_retry(cursor),
        }

        def claim() -> dict[str, Any] | None:
            return self._run(_PG_CLAIM, params)[1]

        row = _once_more_if_stale(self._engine, f"claiming a step of job {job_id}", claim)
        return None if row is None else job_record(row)

    def _renew(self, renew: Any, held: Any) -> Sequence[Any]:
        with self._engine.connect() as conn:
            return conn.execute(renew.returning(jobs.c.id, jobs.c.status)).all()

    def _recover(
        self, now: datetime, limit: int, changes: dict[str, Any]
    ) -> builtins.list[JobRecord]:
        stmt = (
            update(jobs)
            .where(jobs.c.id.in_(_lapsed(now, limit)))
            .values(changes)
            .returning(*jobs.c)
        )
        with self._engine.connect() as conn:
            return listed_jobs(conn.execute(stmt).mappings())

    def _delete_purgeable(
        self, ended: Status, older_than: datetime, chosen: Sequence[tuple[str, int]]
    ) -> builtins.list[str]:
        # The (id, version) pairs as two arrays: a list of 1,000 row values took
        # PostgreSQL longer to plan than to run (about 45 ms against 20).
        ids = literal([job_id for job_id, _ in chosen], postgresql.ARRAY(postgresql.TEXT))
        versions = literal([version for _, version in chosen], postgresql.ARRAY(postgresql.INTEGER))
        pairs = select(func.unnest(ids), func.unnest(versions))
        guard = _purge_guard(ended, older_than, chosen, pairs)
        # Lock first, then delete in a statement of its own, whose fresh read sees a
        # child committed while it waited for a parent's lock (see _lock_parents).
        with _transaction(self._engine) as conn:
            locked = list(conn.execute(select(jobs.c.id).where(guard).with_for_update()).scalars())
            if not locked:
                return []
            stmt = delete(jobs).where(jobs.c.id.in_(locked), _unawaited(locked), guard)
            return list(conn.execute(stmt.returning(jobs.c.id)).scalars())

    def claim_steps(
        self, requests: Sequence[StepClaim]
    ) -> builtins.list[JobRecord | CorruptRecordError | None]:
        # One UPDATE ... FROM unnest(...) RETURNING for the first request of each
        # job; a job asked for again in the same batch is claimed alone after it.
        if len(requests) <= 1:
            return super().claim_steps(requests)
        # (a multi-row UPDATE ... FROM would apply only one of two source rows for a job)
        first, *again = rounds_of([r.job_id for r in requests])
        rows = _once_more_if_stale(
            self._engine,
            f"claiming {len(first)} steps",
            lambda: self._run_many(_PG_CLAIM_MANY, _pg_claim_arrays(requests, first)),
        )
        answers: builtins.list[JobRecord | CorruptRecordError | None] = [None] * len(requests)
        for row in rows:
            n = row.pop("n")
            try:
                answers[n] = job_record(row)
            except CorruptRecordError as exc:  # this row's own answer
                answers[n] = exc
        for n in (n for later in again for n in later):
            r = requests[n]
            answers[n] = self.claim_step(
                r.job_id, r.cursor, r.owner, r.now, r.lease_until, start=r.start
            )
        return answers

    def _advance_each(self, records: Sequence[JobRecord]) -> builtins.list[bool | Exception]:
        # One guarded UPDATE ... FROM unnest(...) for the first record of each job
        # (one statement: all or nothing, so an error here leaves no row written);
        # a job given again in the same batch is written alone after it.
        first, *again = rounds_of([r.id for r in records])
        answers: builtins.list[bool | Exception] = [False] * len(records)
        for row in self._run_many(_PG_ADVANCE_MANY, _pg_advance_arrays(records, first)):
            answers[row["n"]] = True
        for n in (n for later in again for n in later):
            try:
                answers[n] = self.advance(records[n])
            except (DuplicateJobError, StoreError) as exc:  # this row's own fate
                answers[n] = exc
        return answers

    def _run_many(self, sql: str, params: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        """Execute a prepared multi-row hot statement: the rows it returns."""
        with self._driver_cursor() as cursor:
            cursor.execute(sql, params, prepare=True)
            return list(cursor.fetchall())

    def _insert_many(self, records: Sequence[JobRecord]) -> set[str]:
        # One fixed statement, prepared once, over the rows as one JSON array: the
        # long VALUES list of a multi-row INSERT is parsed anew by psycopg every
        # call, and one array per column costs psycopg a Python loop per value.
        rows = [_row_values(record) for record in records]
        for row in rows:
            for name in _TIME_COLUMNS:
                if row[name] is not None:
                    row[name] = row[name].isoformat()
        with self._driver_cursor() as cursor:
            cursor.execute(_PG_INSERT_MANY, {"rows": json.dumps(rows)}, prepare=True)
            return {row["id"] for row in cursor.fetchall()}


#: The columns ``put_many``'s rows send as ISO 8601 text (JSON has no time type).
_TIME_COLUMNS = tuple(column.name for column in jobs.c if isinstance(column.type, UtcDateTime))
#: Each JSON object becomes a row typed as the table's (a JSON null is SQL NULL,
#: a nested object the value of a JSON column).
_PG_INSERT_MANY = f"""
INSERT INTO scheduler_jobs ({_COLUMNS})
SELECT {_COLUMNS} FROM json_populate_recordset(NULL::scheduler_jobs, %(rows)s::json)
ON CONFLICT (id) DO NOTHING
RETURNING id
"""


def _lock_parents(connection: Connection, parents: Sequence[str]) -> None:
    """Share-lock the rows of ``parents`` until the transaction ends, or raise
    UnknownJobError for the first that is not stored.

    A purge locks the rows it deletes for update, then checks that no waiting
    child links to them (:func:`_unawaited`): whichever comes first, the child
    either sees its parent stored and keeps it until its links are committed,
    or sees it gone and is refused, never stored waiting for a lost parent.
    """
    if not parents:
        return
    query = select(jobs.c.id).where(jobs.c.id.in_(parents)).with_for_update(read=True)
    present = set(connection.execute(query).scalars())
    for parent in parents:
        if parent not in present:
            raise UnknownJobError(parent)


def _unawaited(ids: Sequence[str]) -> ColumnElement[bool]:
    """The rows of ``ids`` no Scheduled job waits for through a link (``after=``).

    Run after the rows are locked for update, in a statement of its own (a fresh
    read under READ COMMITTED): it sees a child whose insert committed meanwhile.
    """
    child = jobs.alias("child")
    waiting_child = (
        select(links.c.parent_id)
        .select_from(links.join(child, child.c.id == links.c.child_id))
        .where(
            links.c.parent_id.in_(ids),
            links.c.kind == AFTER,
            child.c.status == Status.SCHEDULED.value,
            child.c.waiting_since.is_not(None),
        )
    )
    return jobs.c.id.not_in(waiting_child)


def _purge_guard(
    ended: Status,
    older_than: datetime,
    chosen: Sequence[tuple[str, int]],
    pairs: Select[Any] | None = None,
) -> ColumnElement[bool]:
    """The rows of ``chosen`` (id, version) still at that version, ended ``ended``
    before ``older_than``: the purge's delete checks it all again. ``pairs``: the
    same pairs as a query (default: a list of row values)."""
    return (
        jobs.c.id.in_([job_id for job_id, _ in chosen])
        & tuple_(jobs.c.id, jobs.c.version).in_(list(chosen) if pairs is None else pairs)
        & (jobs.c.status == ended.value)
        & (jobs.c.updated < older_than)
    )


def _backend_name(uri: str) -> str | None:
    try:
        return make_url(uri).get_backend_name()
    except Exception:  # a bad URL: the constructor names the problem
        return None


def _refused_by_key_index(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the database refusing a second active job per unique key."""
    if exc is None:
        return False
    if isinstance(exc, sa_exc.IntegrityError):
        exc = exc.orig
    return exc is not None and ACTIVE_KEY_INDEX in str(exc)


def _schedule_values(schedule: RecurringSchedule) -> dict[str, Any]:
    """The row of ``schedule``: its fields are the table's columns, by name.

    Raises:
        CorruptScheduleError: ``schedule`` is a listing's placeholder for a damaged row.
    """
    if schedule.damaged is not None:
        raise CorruptScheduleError(
            schedule.name, "-", f"a placeholder is never written back ({schedule.damaged})"
        )
    return {
        field.name: getattr(schedule, field.name)
        for field in dataclasses.fields(schedule)
        if field.name != "damaged"
    }


def _is_duplicate_key(exc: sa_exc.IntegrityError) -> bool:
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return bool(args) and args[0] == _MYSQL_DUPLICATE_KEY


def _worker_values(worker: WorkerInfo) -> dict[str, Any]:
    """The ``scheduler_workers`` row of ``worker``."""
    return {
        "owner": worker.owner,
        "host": worker.host,
        "pid": worker.pid,
        "started": worker.started,
        "last_seen": worker.last_seen,
        "heartbeat": worker.heartbeat,
        "channels": list(worker.channels),
        "dramatiq_version": worker.dramatiq_version,
        "sweep": None if worker.sweep is None else worker.sweep.to_dict(),
    }
