"""``setup()``: one call that wires a process for distributed jobs."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from ...channels.broker import set_broker
from ...channels.channel import manager
from ...config import config, count, section
from ...defaults import installed_defaults
from ...engine.job_io import JOB_IO
from ...errors import ConfigError
from ...limits.concurrency import check_limit, key_concurrency
from ...limits.patterns import KeyPatterns
from ...limits.rates import Rate, key_limits, parse_rate
from ...metrics.prometheus import install_metrics
from ...metrics.tracing import install_tracing
from ...model.job import runtime
from ...ops.display import masked_url
from ...settings import YAML_KEYS, Settings
from ...stores.registry import configure_job_store, installed_job_store, setup_from_config
from ...transport import is_rabbitmq_broker, transport_for
from .middleware import WorkflowMiddleware
from .step_actor import declare_step_actor
from .undecodable import install as guard_against_undecodable

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_RABBITMQ_SCHEMES = ("amqp://", "amqps://")


#: The keys ``setup()`` reads under ``scheduler`` in the YAML file.
_SCHEDULER_KEYS = (
    "broker",
    "channels",
    "jobStore",
    "rateLimits",
    "concurrency",
    *YAML_KEYS.values(),
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
            f"broker_url {masked_url(url)!r} needs the Redis client, which is not installed "
            f"({exc}); install it with: pip install 'pypepper-dramatiq[redis]'"
        ) from exc
    try:
        _ = urlsplit(url).port  # a bad host or port: told here, naming the option
        broker: Broker = RedisBroker(  # type: ignore[no-untyped-call]
            url=url, heartbeat_timeout=heartbeat_timeout_ms
        )
    except ValueError as exc:  # the Redis client's parse of the URL
        raise ConfigError(f"broker_url {masked_url(url)!r} is malformed: {exc}") from None
    return broker


def _rabbitmq_broker(url: str) -> Broker:
    """Dramatiq's RabbitMQ broker, confirming each publish: a message is on the server
    (on disk: the queues are durable, the messages persistent) when ``send`` returns,
    so a RabbitMQ restart loses no job a producer was told was queued. An install
    without the ``rabbitmq`` extra is told which one."""
    try:
        # Imported here: pika is an extra.
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError as exc:
        raise ConfigError(
            f"broker_url {masked_url(url)!r} needs RabbitMQ's client (pika), which is not "
            f"installed ({exc}); install it with: pip install 'pypepper-dramatiq[rabbitmq]'"
        ) from exc
    try:
        # pika parses the URL here (host, port, query parameters); nothing connects
        # until the first message is sent or consumed.
        broker: Broker = RabbitmqBroker(url=url, confirm_delivery=True)
    except ValueError as exc:
        raise ConfigError(f"broker_url {masked_url(url)!r} is malformed: {exc}") from None
    return broker


def _store_named(store_uri: str | None, yml: dict[str, Any]) -> tuple[str, str] | None:
    """The job store ``setup()`` will open ("postgres", "mysql", "memory") and where it was
    named, for an error; None: it opens none."""
    if store_uri:
        return _backend_of(store_uri), f"store_uri {masked_url(store_uri)!r}"
    backend = section(yml, "scheduler", "jobStore").get("backend")
    if backend is None:
        return None
    return str(backend).lower(), f"scheduler.jobStore.backend {backend!r}"


def _refuse_rabbitmq_with_mysql(broker: Broker, store: tuple[str, str] | None) -> None:
    """ConfigError: RabbitMQ carries messages only, and what the processes share besides
    the store (channel admission, cancel and end notices, the sweep leader) lives in
    PostgreSQL next to it; MySQL and MariaDB have no LISTEN/NOTIFY to carry notices."""
    if store is not None and store[0] in ("mysql", "mariadb") and is_rabbitmq_broker(broker):
        raise ConfigError(
            f"{store[1]}: the RabbitMQ broker needs the PostgreSQL job store: with RabbitMQ "
            "the workers "
            "coordinate through PostgreSQL (channel admission, cancel and end notices by "
            "LISTEN/NOTIFY, the sweep leader by an advisory lock), which MySQL and "
            "MariaDB cannot do; use PostgreSQL with RabbitMQ, or Redis (redis://) with "
            "MySQL/MariaDB"
        )


def setup(
    broker_url: str | None = None,
    store_uri: str | None = None,
    *,
    config_path: str | Path | None = None,
    broker: Broker | None = None,
    channels: dict[str, int | dict[str, Any] | None] | list[str] | None = None,
    rate_limits: Mapping[str, str] | None = None,
    concurrency: Mapping[str, int] | None = None,
    migrate: bool = False,
    lease_seconds: float | None = None,
    sweep_interval: float | None = None,
    cancel_grace: float | None = None,
    dispatch_seconds: float | None = None,
    shutdown_grace: float | None = None,
    unknown_task_grace: float | None = None,
    defer_seconds: float | None = None,
    heartbeat_timeout_ms: int | None = None,
    retention: Mapping[str, float | str | timedelta] | None = None,
    metrics: bool = False,
    tracing: bool = False,
    continue_steps: int | None = None,
    continue_seconds: float | None = None,
    defaults: Mapping[str, Any] | None = None,
    claim_fetched: bool | None = None,
) -> Broker:
    """Install the broker, the middleware, the step actor, the job store and the
    engine's job I/O (what the job methods call).

    Talks to no Redis or RabbitMQ: the Redis broker's connection pool (RabbitMQ's
    connection) connects on first
    use, and each channel applies its bound on its first call to Redis (see
    :class:`~pypepper_dramatiq.transport.redis.gate.RedisGate`). A ``dramatiq`` worker whose
    module calls this starts while Redis is down, and Dramatiq's consumers
    retry until it is up. (The job store, when given, is opened here.)

    Args:
        broker_url: ``redis://...`` (Dramatiq's Redis broker) or ``amqp://...``
            (``amqps://``: Dramatiq's RabbitMQ broker, publishing with confirms; the
            ``rabbitmq`` extra, and the PostgreSQL job store: with MySQL or MariaDB
            it is a ``ConfigError``); without it (and without ``broker``) the
            in-memory stub broker is used.
        store_uri: ``postgresql+psycopg://...`` or ``mysql+pymysql://...``;
            without it the YAML's ``scheduler.jobStore`` (if any) or memory.
        config_path: a YAML file; ``scheduler.broker.url``, ``scheduler.jobStore``
            and ``scheduler.channels`` (id -> maxsize, or id -> ``{maxsize: 0,
            rateLimit: "50/s", maxRunning: 3}``) are read from it.
        broker: a broker you built yourself (our middleware is added to it); a
            ``RabbitmqBroker`` needs the PostgreSQL job store, as ``amqp://`` does.
        channels: channel ids (or id -> maxsize, or id -> ``{"maxsize": 0,
            "rate_limit": "50/s", "max_running": 3}``) to declare now, so that a
            ``dramatiq`` worker importing this module consumes them. ``rate_limit``
            bounds the step starts of the channel per second, minute or hour for
            every worker together (docs/howto/rate-limits.md); a malformed one is an
            ``InvalidRateLimitError`` (a ``ConfigError``) naming the channel.
            ``max_running`` bounds how many of its steps run at once on every worker
            together (docs/howto/concurrency-limits.md); one that is not a whole
            number of at least 1 is an ``InvalidConcurrencyLimitError`` (a
            ``ConfigError``) naming the channel.
        rate_limits: the rate limits of job keys, by shell-style pattern
            (``{"tenant-*": "10/s"}``; YAML ``scheduler.rateLimits``, winning key by
            key): every step start of a job scheduled with a ``rate_key`` the
            pattern matches counts against that key's own limit, for every worker
            together (the first pattern that matches, in order). A malformed rate
            is an ``InvalidRateLimitError`` naming the pattern, raised here.
        concurrency: the concurrency limits of job keys, by shell-style pattern
            (``{"tenant-*": 3}``; YAML ``scheduler.concurrency``, winning key by key):
            each key the pattern matches (``scheduled(concurrency_key="tenant-42")``)
            has at most that many steps of its jobs running at once, for every worker
            together (the first pattern that matches, in order; each key its own
            count). A limit that is not a whole number of at least 1 is an
            ``InvalidConcurrencyLimitError`` naming the pattern, raised here.
        migrate: upgrade the database schema first.
        lease_seconds: one of the timing settings, as are ``sweep_interval``,
            ``cancel_grace``, ``dispatch_seconds``, ``shutdown_grace``,
            ``unknown_task_grace``, ``defer_seconds`` and ``heartbeat_timeout_ms``
            (:class:`~pypepper_dramatiq.settings.Settings` documents each and its
            default); a YAML ``scheduler`` key wins.
        retention: how long ended jobs are kept, by final status, e.g.
            ``{"Completed": "7d", "Failed": "30d", "Cancelled": "7d"}`` (YAML
            ``scheduler.retention``, the same mapping): the sweep leader deletes
            older ones (by the time they ended), in bounded batches every
            ``sweep_interval``, except jobs a waiting job still needs and jobs
            whose ``on_final_failure`` hook has not run. A duration is seconds or
            ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"``; a bad one, a
            status that is not Completed, Failed or Cancelled, or a value that is
            not a mapping is a ``ConfigError`` naming it, raised here. Default:
            no retention, every job is kept.
        metrics: count jobs, attempts, retries, recoveries, missed deadlines,
            recurring firings and channel depths into Prometheus metrics
            (:func:`~pypepper_dramatiq.metrics.prometheus.install_metrics`, the ``metrics``
            extra; a ``ConfigError`` here without it). They show wherever this
            process's prometheus_client metrics are served: with Dramatiq's
            ``Prometheus`` middleware on the broker, on its exposition server.
        tracing: make OpenTelemetry spans of scheduling and of each attempt,
            the attempts' children of the scheduling's across processes
            (:func:`~pypepper_dramatiq.metrics.tracing.install_tracing`, the ``otel``
            extra; a ``ConfigError`` here without it), with OpenTelemetry's global
            tracer provider: configure it before the first job is scheduled or run.
        continue_steps, continue_seconds: the bound of continuation (YAML
            ``scheduler.continueSteps``, ``scheduler.continueSeconds``): a worker
            thread runs up to ``continue_steps`` zero-delay steps (the next task,
            a retry without delay) after its message's own, for at most
            ``continue_seconds`` from that message's start, without a new message
            (defaults 50 and 1.0; 0 for either: one message per step).
        defaults: what a task or a job of this process takes when neither it nor
            its handler class says: ``channel_id``, ``retry_count``,
            ``retry_delay``, ``retry_backoff``, ``retry_jitter``,
            ``retry_delay_max``, ``round_timeout``, ``max_start_delay`` (YAML
            ``scheduler.defaults`` with camelCase keys, ``retryCount``..., each
            winning over the same key given here; see
            :class:`~pypepper_dramatiq.defaults.Defaults`). Durations as for
            ``retention``. Checked here: an unknown key, a negative count, a value
            of the wrong type or a malformed duration is a ``ConfigError`` naming
            the key. The default channel is declared as ``channels`` are.
        claim_fetched: claim the step messages of each Redis fetch in one store
            call before the worker threads take them, and record their outcomes
            (then acknowledge their messages) many at a time in a completion
            thread (YAML ``scheduler.claimFetched``; default on, see
            ``bench/README.md``). RabbitMQ, whose consumer hands out one message
            at a time, keeps the per-message path whatever this says.

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
    rates: dict[str, Rate] = {}
    running: dict[str, int] = {}
    yaml_channels = section(yml, "scheduler", "channels")
    for source, words in ((yaml_channels, _YAML_WORDS), (channels or {}, _CODE_WORDS)):
        items = source.items() if isinstance(source, dict) else ((c, None) for c in source)
        for channel_id, spec in items:
            maxsize, rate, max_running = _channel_spec(str(channel_id), spec, words)
            if maxsize is not None:
                declared[str(channel_id)] = maxsize
            else:  # naming a channel again without a bound keeps the one the YAML gave
                declared.setdefault(str(channel_id), None)
            if rate is not None:
                rates[str(channel_id)] = rate
            if max_running is not None:
                running[str(channel_id)] = max_running

    key_rates = {**(rate_limits or {}), **section(yml, "scheduler", "rateLimits")}
    parsed_key_rates = KeyPatterns("rate_limits", parse_rate)
    parsed_key_rates.configure(key_rates)  # refused here, before anything is installed
    key_running = {**(concurrency or {}), **section(yml, "scheduler", "concurrency")}
    # Refused here, before anything is installed:
    KeyPatterns("concurrency", check_limit).configure(key_running)

    settings = Settings.of(
        scheduler,
        lease_seconds=lease_seconds,
        sweep_interval=sweep_interval,
        cancel_grace=cancel_grace,
        dispatch_seconds=dispatch_seconds,
        shutdown_grace=shutdown_grace,
        unknown_task_grace=unknown_task_grace,
        defer_seconds=defer_seconds,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
        retention=retention,
        continue_steps=continue_steps,
        continue_seconds=continue_seconds,
        defaults=defaults,
        claim_fetched=claim_fetched,
    )
    if settings.defaults.channel_id is not None:  # consumed by a worker of this module
        declared.setdefault(settings.defaults.channel_id, None)
    if broker is None:
        if broker_url:
            url = broker_url if isinstance(broker_url, str) else ""
            if url.startswith(_REDIS_SCHEMES):
                broker = _redis_broker(url, settings.heartbeat_timeout_ms)
            elif url.startswith(_RABBITMQ_SCHEMES):
                broker = _rabbitmq_broker(url)
            else:
                shown = masked_url(broker_url) if isinstance(broker_url, str) else broker_url
                raise ConfigError(
                    f"broker_url {shown!r}: expected a redis://, rediss:// or unix:// URL "
                    "(Redis), or an amqp:// or amqps:// URL (RabbitMQ)"
                )
        else:
            broker = StubBroker()
    _refuse_rabbitmq_with_mysql(broker, _store_named(store_uri, yml))
    if metrics:
        install_metrics(lazy=True)  # the metrics themselves once the worker booted
    if tracing:
        install_tracing()
    middleware = WorkflowMiddleware(settings)
    if not any(isinstance(m, WorkflowMiddleware) for m in broker.middleware):
        has_time_limit = any(isinstance(m, TimeLimit) for m in broker.middleware)
        broker.add_middleware(middleware, before=TimeLimit if has_time_limit else None)
    # The store first: PostgreSQL's coordinates the processes of some brokers (RabbitMQ).
    if store_uri:
        configure_job_store(_backend_of(store_uri), uri=store_uri, migrate=migrate)
    elif section(yml, "scheduler", "jobStore"):
        store_options = section(yml, "scheduler", "jobStore")
        store_options.setdefault("migrate", migrate)
        setup_from_config({"scheduler": {"jobStore": store_options}})
    # The transport is chosen here, once.
    set_broker(broker, transport_for(broker, installed_job_store()))
    runtime.install(JOB_IO)  # the job methods' I/O goes through the engine
    installed_defaults.install(settings.defaults)  # the tasks and jobs built from now on
    declare_step_actor(broker)
    guard_against_undecodable(broker)  # raw data that is no message: dead-lettered
    key_limits.configure(key_rates)
    key_concurrency.configure(key_running)
    manager.clear()
    for channel_id, maxsize in declared.items():
        # No Redis I/O: the bound waits for a first call.
        manager.new(
            channel_id,
            maxsize,
            rate_limit=rates.get(channel_id),
            max_running=running.get(channel_id),
        )

    return broker


#: The keys of a channel's mapping in code: its rate limit, its concurrency limit.
_CODE_WORDS = ("rate_limit", "max_running")
#: The same keys in the YAML file.
_YAML_WORDS = ("rateLimit", "maxRunning")


def _channel_spec(
    channel_id: str, spec: Any, words: tuple[str, str]
) -> tuple[int | None, Rate | None, int | None]:
    """A channel's bound, rate limit and concurrency limit as ``setup(channels=...)`` or
    the YAML gives them: a bound (or None), or a mapping of ``maxsize`` and ``words``
    (``rate_limit`` and ``max_running`` in code, ``rateLimit`` and ``maxRunning`` in
    YAML).

    Raises:
        ConfigError: an unknown key, a bound that is no whole number >= 0, a
            malformed rate limit (``InvalidRateLimitError``), or a concurrency limit
            that is no whole number >= 1 (``InvalidConcurrencyLimitError``), naming
            the channel.
    """
    if not isinstance(spec, dict):
        maxsize = None if spec is None else count(f"maxsize of channel {channel_id!r}", spec)
        return maxsize, None, None
    rate_word, running_word = words
    unknown = sorted(set(map(str, spec)) - {"maxsize", rate_word, running_word})
    if unknown:
        raise ConfigError(
            f"channel {channel_id!r}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"expected 'maxsize', {rate_word!r} and {running_word!r}"
        )
    maxsize = spec.get("maxsize")
    rate = spec.get(rate_word)
    max_running = spec.get(running_word)
    return (
        None if maxsize is None else count(f"maxsize of channel {channel_id!r}", maxsize),
        None if rate is None else parse_rate(rate, f"{rate_word} of channel {channel_id!r}"),
        None
        if max_running is None
        else check_limit(max_running, f"{running_word} of channel {channel_id!r}"),
    )
