"""The SQL store's engine: made from a URL, its transactions, which database it reaches."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from ...errors import ConfigError, StoreError
from ...limits.storable import json_text

#: The extra that installs each dialect's driver.
_EXTRAS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}


def create_store_engine(
    uri: str, engine_kwargs: dict[str, Any] | None = None, given: list[str] | None = None
) -> Engine:
    """The engine of ``uri``; our errors for a missing driver, a bad URL or option.

    Args:
        uri: the SQLAlchemy URL.
        engine_kwargs: passed on to :func:`sqlalchemy.create_engine`.
        given: the options the caller named (the error of a wrong one lists them).
    """
    try:
        # JSON columns bound as values are written as every store writes JSON text.
        options = {"json_serializer": json_text, **(engine_kwargs or {})}
        return create_engine(uri, **options)
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
def transaction(engine: Engine) -> Iterator[Connection]:
    """A real transaction, also on an engine whose connections autocommit."""
    connection = engine.connect().execution_options(isolation_level="READ COMMITTED")
    with connection, connection.begin():
        yield connection


#: Each backend's port when a URL names none.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def database_of(url: Any) -> tuple[str, str, int | None, str]:
    """What makes two URLs the same database, whatever their driver or user."""
    backend = url.get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    host = url.host or str(url.query.get("host") or "localhost")
    return backend, host, url.port or _DEFAULT_PORTS.get(backend), url.database or ""


def backend_name(uri: str) -> str | None:
    try:
        return make_url(uri).get_backend_name()
    except Exception:  # a bad URL: the constructor names the problem
        return None
