"""``setup()``: one call that wires a process for distributed jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from ..channels.broker import set_broker
from ..channels.channel import manager
from ..config import config, count, seconds, section
from ..errors import ConfigError
from ..stores.registry import configure_job_store, setup_from_config
from .middleware import WorkflowMiddleware
from .step_actor import declare_step_actor

#: Dramatiq's Redis broker default is 60 s; ours is shorter so that messages
#: prefetched by a dead worker come back sooner (see recovery.py).
DEFAULT_HEARTBEAT_TIMEOUT_MS = 20_000


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_T = TypeVar("_T")


#: The keys ``setup()`` reads under ``scheduler`` in the YAML file.
_SCHEDULER_KEYS = (
    "broker",
    "channels",
    "jobStore",
    "leaseSeconds",
    "sweepInterval",
    "cancelGrace",
    "dispatchSeconds",
    "shutdownGrace",
    "unknownTaskGrace",
    "deferSeconds",
)


def _refuse_unknown(
    path: str | Path | None, where: str, mapping: dict[str, Any], known: tuple[str, ...]
) -> None:
    """ConfigError naming keys under ``where`` that nothing reads (a typo, most likely)."""
    unknown = sorted(str(key) for key in mapping if key not in known)
    if unknown:
        raise ConfigError(
            f"unknown key {', '.join(unknown)} under {where} in {path}; "
            f"known keys: {', '.join(known)}"
        )


def _yaml_seconds(
    scheduler: dict[str, Any], key: str, given: _T, *, zero: bool = False
) -> float | _T:
    """The YAML's ``scheduler.<key>`` if set (checked, named in errors), else ``given``."""
    if scheduler.get(key) is None:
        return given
    return seconds(f"scheduler.{key}", scheduler[key], zero=zero)


def _backend_of(uri: str) -> str:
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    if scheme in ("mysql", "mariadb"):
        return "mysql"
    raise ConfigError(f"store_uri {scheme!r}: expected a postgresql:// or mysql:// URI")


def _redis_broker(url: str, heartbeat_timeout_ms: int) -> Broker:
    """Dramatiq's Redis broker; an install without the ``redis`` extra is told which one."""
    try:
        # Imported here: the Redis client is an extra, and the embedded default needs none.
        from dramatiq.brokers.redis import RedisBroker
    except ImportError as exc:
        raise ConfigError(
            f"broker_url {url!r} needs the Redis client, which is not installed ({exc}); "
            "install it with: pip install 'pypepper-dramatiq[redis]'"
        ) from exc
    broker: Broker = RedisBroker(  # type: ignore[no-untyped-call]
        url=url, heartbeat_timeout=heartbeat_timeout_ms
    )
    return broker


def setup(
    broker_url: str | None = None,
    store_uri: str | None = None,
    *,
    config_path: str | Path | None = None,
    broker: Broker | None = None,
    channels: dict[str, int] | list[str] | None = None,
    migrate: bool = False,
    lease_seconds: float = 30.0,
    sweep_interval: float = 5.0,
    cancel_grace: float = 10.0,
    dispatch_seconds: float | None = None,
    shutdown_grace: float = 10.0,
    unknown_task_grace: float = 300.0,
    defer_seconds: float = 2.0,
    heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
) -> Broker:
    """Install the broker, the middleware, the step actor and the job store.

    Talks to no Redis: the Redis broker's connection pool connects on first
    use, and each channel applies its bound on its first call to Redis (see
    :class:`~pypepper_dramatiq.channels.gates.RedisGate`). A ``dramatiq`` worker whose
    module calls this starts while Redis is down, and Dramatiq's consumers
    retry until it is up. (The job store, when given, is opened here.)

    Args:
        broker_url: ``redis://...``; without it (and without ``broker``) the
            in-memory stub broker is used.
        store_uri: ``postgresql+psycopg://...`` or ``mysql+pymysql://...``;
            without it the YAML's ``scheduler.jobStore`` (if any) or memory.
        config_path: a YAML file; ``scheduler.broker.url``, ``scheduler.jobStore``
            and ``scheduler.channels`` (id -> maxsize) are read from it.
        broker: a broker you built yourself (our middleware is added to it).
        channels: channel ids (or id -> maxsize) to declare now, so that a
            ``dramatiq`` worker importing this module consumes them.
        migrate: upgrade the database schema first.
        lease_seconds, sweep_interval, cancel_grace, dispatch_seconds,
        shutdown_grace, unknown_task_grace, defer_seconds: see
            :class:`WorkflowMiddleware`.
        heartbeat_timeout_ms: the Redis broker's heartbeat timeout.

    Returns:
        The broker, also installed as Dramatiq's global broker.
    """
    yml: dict[str, Any] = {}
    if config_path is not None:
        yml = config.load_config(config_path)
    scheduler = section(yml, "scheduler")
    _refuse_unknown(config_path, "scheduler", scheduler, _SCHEDULER_KEYS)
    _refuse_unknown(config_path, "scheduler.broker", section(scheduler, "broker"), ("url",))
    broker_url = broker_url or section(yml, "scheduler", "broker").get("url")
    # id -> bound; None = "no bound given" (list form, YAML null): with Redis the
    # stored bound is kept, while a given one replaces it (see RedisGate).
    declared: dict[str, int | None] = {}
    for source in (section(yml, "scheduler", "channels"), channels or {}):
        items = source.items() if isinstance(source, dict) else ((c, None) for c in source)
        for channel_id, maxsize in items:
            if maxsize is not None:
                declared[str(channel_id)] = count(f"maxsize of channel {channel_id!r}", maxsize)
            else:  # naming a channel again without a bound keeps the one the YAML gave
                declared.setdefault(str(channel_id), None)

    if broker is None:
        if broker_url:
            if not isinstance(broker_url, str) or not broker_url.startswith(_REDIS_SCHEMES):
                raise ConfigError(
                    f"broker_url {broker_url!r}: expected a redis://, rediss:// or unix:// URL"
                )
            broker = _redis_broker(broker_url, heartbeat_timeout_ms)
        else:
            broker = StubBroker()
    middleware = WorkflowMiddleware(
        lease_seconds=_yaml_seconds(scheduler, "leaseSeconds", lease_seconds),
        sweep_interval=_yaml_seconds(scheduler, "sweepInterval", sweep_interval),
        cancel_grace=_yaml_seconds(scheduler, "cancelGrace", cancel_grace, zero=True),
        dispatch_seconds=_yaml_seconds(scheduler, "dispatchSeconds", dispatch_seconds),
        shutdown_grace=_yaml_seconds(scheduler, "shutdownGrace", shutdown_grace, zero=True),
        unknown_task_grace=_yaml_seconds(
            scheduler, "unknownTaskGrace", unknown_task_grace, zero=True
        ),
        defer_seconds=_yaml_seconds(scheduler, "deferSeconds", defer_seconds),
    )
    if not any(isinstance(m, WorkflowMiddleware) for m in broker.middleware):
        has_time_limit = any(isinstance(m, TimeLimit) for m in broker.middleware)
        broker.add_middleware(middleware, before=TimeLimit if has_time_limit else None)
    set_broker(broker)
    declare_step_actor(broker)
    manager.clear()
    for channel_id, maxsize in declared.items():
        manager.new(channel_id, maxsize)  # no Redis I/O: the bound waits for a first call

    if store_uri:
        configure_job_store(_backend_of(store_uri), uri=store_uri, migrate=migrate)
    elif section(yml, "scheduler", "jobStore"):
        store_options = section(yml, "scheduler", "jobStore")
        store_options.setdefault("migrate", migrate)
        setup_from_config({"scheduler": {"jobStore": store_options}})
    return broker
