"""Driver and SQLAlchemy errors classified, and the outage boundary of every statement."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from ...errors import StoreDataError, StoreError, StoreUnavailableError
from ..schema import ACTIVE_KEY_INDEX

#: MySQL's "Duplicate entry" error number.
_MYSQL_DUPLICATE_KEY = 1062

T = TypeVar("T")

try:  # the PostgreSQL driver is an extra
    import psycopg
    from psycopg.rows import dict_row as dict_row
    from psycopg.rows import tuple_row as tuple_row

    _DRIVER_ERRORS: tuple[type[Exception], ...] = (psycopg.Error,)
    DRIVER_DISCONNECTS: tuple[type[Exception], ...] = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
    _DRIVER_DATA_ERRORS: tuple[type[Exception], ...] = (psycopg.DataError,)
    #: What the PostgreSQL driver raises when the server refuses a statement.
    DRIVER_REFUSALS: tuple[type[Exception], ...] = (psycopg.DatabaseError,)
except ImportError:  # pragma: no cover - MySQL-only installs
    dict_row = tuple_row = None  # type: ignore[assignment]
    _DRIVER_ERRORS = DRIVER_DISCONNECTS = _DRIVER_DATA_ERRORS = DRIVER_REFUSALS = ()


def masked(engine: Engine) -> str:
    """``engine``'s URL with its password hidden: what messages and logs name."""
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
        *DRIVER_DISCONNECTS,  # from the hot statements sent straight to psycopg
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


def is_data_error(exc: BaseException) -> bool:
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
    where = f"{doing} on {masked(engine)}: {reason}"
    if is_data_error(exc):
        return StoreDataError(f"job store refused the data of {where}", reason=reason)
    if _is_unavailable(exc):
        return StoreUnavailableError(f"job store unavailable, {where}")
    return StoreError(f"job store failed {where}")


@contextmanager
def boundary(engine: Engine, doing: str) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors into ours, naming the (masked) backend.

    What retrying cannot cure (the statement's content refused) becomes
    :class:`StoreDataError`, an outage :class:`StoreUnavailableError`. Errors of
    the hot statements sent straight to psycopg are classified the same way.
    """
    try:
        yield
    except _CLASSIFIED as exc:
        raise _store_error(engine, doing, exc) from exc


#: What ``boundary`` turns into our errors: SQLAlchemy's, the driver's (the hot
#: statements), and text the driver cannot encode (a lone surrogate).
_CLASSIFIED: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    UnicodeEncodeError,
    *_DRIVER_ERRORS,
)


def once_more_if_stale(engine: Engine, doing: str, call: Callable[[], T]) -> T:
    """``call()``, tried a second time if it failed on a pooled connection the server
    had closed (a restart). The pool is not pinged before each use: that costs a
    round trip per call, while a stale pool costs one failed call after a restart.
    """
    try:
        try:  # boundary(), inline: its generator cost about 1 us of CPU a write
            return call()
        except _CLASSIFIED as exc:
            raise _store_error(engine, doing, exc) from exc
    except StoreUnavailableError as exc:
        cause = exc.__cause__
        stale = isinstance(cause, DRIVER_DISCONNECTS) or (
            isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated
        )
        if not stale:
            raise
    with boundary(engine, doing):
        return call()


#: The SQLSTATE of PostgreSQL's refusal of an insert whose job retention deleted
#: while the insert waited on its row (the trigger of migration 0018).
PURGED_MEANWHILE = "PP001"


def purged_meanwhile(exc: BaseException) -> bool:
    """Whether ``exc`` (the driver's error, or SQLAlchemy's around it) is the refusal
    of an insert whose job was purged while it waited (:data:`PURGED_MEANWHILE`)."""
    driver = getattr(exc, "orig", None) or exc
    return getattr(driver, "sqlstate", None) == PURGED_MEANWHILE


def refused_by_key_index(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the database refusing a second active job per unique key."""
    if exc is None:
        return False
    if isinstance(exc, sa_exc.IntegrityError):
        exc = exc.orig
    return exc is not None and ACTIVE_KEY_INDEX in str(exc)


def is_duplicate_key(exc: sa_exc.IntegrityError) -> bool:
    """Whether ``exc`` is a duplicate key: MySQL's "Duplicate entry" or PostgreSQL's
    unique violation (the portable upsert's cue to update; which index refused is
    :func:`refused_by_key_index`'s question)."""
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    if bool(args) and args[0] == _MYSQL_DUPLICATE_KEY:
        return True
    return getattr(exc.orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION
