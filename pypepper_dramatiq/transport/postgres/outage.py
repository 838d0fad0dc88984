"""The transport's statements, and a PostgreSQL outage as the engine knows a
coordination server's: the store's SQL boundary classifies the driver's error,
and an unreachable server becomes
:class:`~pypepper_dramatiq.errors.BrokerUnavailableError`, as a Redis outage does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine

from ...errors import BrokerUnavailableError, StoreUnavailableError
from ...stores.sql.boundary import once_more_if_stale

T = TypeVar("T")


def coordinated(engine: Engine, doing: str, call: Callable[[], T]) -> T:
    """``call()`` (tried once more on a pooled connection a restart closed).

    Raises:
        BrokerUnavailableError: PostgreSQL could not be reached, naming ``doing``.
        StoreError: another failure the boundary classified (refused data...).
    """
    try:
        return once_more_if_stale(engine, doing, call)
    except StoreUnavailableError as exc:
        raise BrokerUnavailableError(f"PostgreSQL unreachable for {doing}: {exc}") from exc


def run(engine: Engine, doing: str, statement: Any, **params: Any) -> list[Any]:
    """The rows of ``statement``, in a transaction of its own (no round trip more on
    an autocommit engine, the store's default).

    Raises:
        BrokerUnavailableError: PostgreSQL could not be reached.
    """

    def call() -> list[Any]:
        with engine.begin() as connection:
            result = connection.execute(statement, params)
            return list(result) if result.returns_rows else []

    return coordinated(engine, doing, call)
