"""The process-wide job store: choose it by code or from the YAML file.

When the loaded YAML names a durable backend (``scheduler.jobStore.backend``)
and nothing was installed yet, saving or loading a job raises
:class:`~pypepper_dramatiq.errors.StoreNotConfiguredError` (a ``ValueError``)
instead of silently using memory.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from sqlalchemy.engine import URL

from ..config import config, section
from ..defaults import Defaults, installed_defaults
from ..errors import ConfigError, StoreNotConfiguredError
from .base import IJobStore, JobRecord
from .memory import MemoryJobStore

__all__ = [
    "BACKENDS",
    "IJobStore",
    "JobRecord",
    "PersistenceWarning",
    "configure_job_store",
    "get_job_store",
    "installed_job_store",
    "reset_job_store",
    "set_job_store",
    "setup_from_config",
]

#: Backends ``configure_job_store`` knows.
BACKENDS = ("memory", "postgres", "mysql")
_DRIVERS = {"postgres": "postgresql+psycopg", "mysql": "mysql+pymysql"}


class PersistenceWarning(UserWarning):
    """Jobs will be kept in memory although the YAML names a durable backend."""


class _Installed:
    """The process's job store, whether one was installed, and whether the
    in-memory warning was given: read and changed together, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.store: IJobStore | None = None
        self.installed = False
        self.warned = False


_installed = _Installed()


def _yaml_backend() -> str | None:
    backend = section(config.get_yml_config(), "scheduler", "jobStore").get("backend")
    return None if backend is None else str(backend).lower()


def get_job_store() -> IJobStore:
    """The installed store (memory by default).

    Raises:
        StoreNotConfiguredError: the YAML names a durable backend that was
            never set up.
    """
    with _installed.lock:
        if not _installed.installed:
            backend = _yaml_backend()
            if backend not in (None, "memory"):
                raise StoreNotConfiguredError(
                    f"the YAML configuration names job store backend {backend!r} but it was "
                    "never set up: call setup_from_config(config.get_yml_config()) "
                    "or configure_job_store(...) first"
                )
        if _installed.store is None:
            _installed.store = MemoryJobStore()
        return _installed.store


def installed_job_store() -> IJobStore | None:
    """The store installed in this process, or None while none was (no default made)."""
    with _installed.lock:
        return _installed.store if _installed.installed else None


def set_job_store(store: IJobStore) -> IJobStore:
    """Install ``store`` for this process."""
    if not isinstance(store, IJobStore):
        raise TypeError(f"expected an IJobStore, got {type(store).__name__}")
    with _installed.lock:
        backend = _yaml_backend()
        memory = isinstance(store, MemoryJobStore)
        if memory and backend not in (None, "memory") and not _installed.warned:
            _installed.warned = True
            warnings.warn(
                f"jobs will be kept in memory, not in the {backend!r} backend "
                "the YAML configuration names",
                PersistenceWarning,
                stacklevel=3,
            )
        old, _installed.store, _installed.installed = _installed.store, store, True
    if old is not None and old is not store:
        old.close()
    return store


def _sql_uri(backend: str, options: dict[str, Any]) -> str:
    uri = options.pop("uri", None) or options.pop("url", None)
    if uri:
        return str(uri)
    host = options.pop("host", None)
    if not host:
        raise ConfigError(f"job store {backend!r} needs a uri or a host")
    port = options.pop("port", None)
    return URL.create(
        _DRIVERS[backend],
        username=options.pop("user", None) or options.pop("username", None),
        password=options.pop("password", None),
        host=str(host),
        port=None if port is None else _port(port),
        database=options.pop("db", None) or options.pop("database", None),
    ).render_as_string(hide_password=False)


def _port(value: object) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(f"job store port must be a number from 1 to 65535, got {value!r}")
    return value


def configure_job_store(backend: str, **options: Any) -> IJobStore:
    """Create and install a store.

    Args:
        backend: ``memory``, ``postgres`` or ``mysql``.
        **options: for SQL, ``uri`` or ``host``/``port``/``user``/``password``/``db``;
            ``migrate=True`` upgrades the schema first; the rest go to the engine.

    Raises:
        ConfigError: unknown backend, missing connection settings, or an
            option the engine does not take.
    """
    name = str(backend).lower()
    if name == "memory":
        return set_job_store(MemoryJobStore())
    if name not in _DRIVERS:
        raise ConfigError(f"unknown job store backend {backend!r}; choose one of {BACKENDS}")
    from .sql import SqlJobStore

    opts = dict(options)
    uri = _sql_uri(name, opts)
    return set_job_store(SqlJobStore(uri, **opts))


def setup_from_config(yml: dict[str, Any]) -> IJobStore:
    """Install the store that ``scheduler.jobStore`` in ``yml`` names (memory if none),
    and the application's defaults ``scheduler.defaults`` when it has them (as
    ``setup()`` reads them; the in-process driver's path to the same defaults).

    Raises:
        ConfigError: a bad ``scheduler.defaults`` key or value, named; nothing is
            installed then.
    """
    given = section(yml, "scheduler").get("defaults")
    defaults = None if given is None else Defaults.from_yaml(given)
    options = section(yml, "scheduler", "jobStore")
    backend = str(options.pop("backend", "memory"))
    store = configure_job_store(backend, **options)
    if defaults is not None:
        installed_defaults.install(defaults)
    return store


def reset_job_store() -> None:
    """Forget the installed store; the YAML guard and the one-shot warning re-arm."""
    with _installed.lock:
        old = _installed.store
        _installed.store, _installed.installed, _installed.warned = None, False, False
    if old is not None:
        old.close()
