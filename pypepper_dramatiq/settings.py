"""The timing settings of a worker process, and the application's defaults for its tasks
and jobs, parsed once into one typed object.

``setup()`` reads them from its arguments and the YAML's ``scheduler`` section;
:class:`~pypepper_dramatiq.drivers.dramatiq.middleware.WorkflowMiddleware` and the
Redis broker take them from here. Each value is checked once, and a bad one is
a :class:`~pypepper_dramatiq.errors.ConfigError` naming the option (or the YAML
key it came from). The settings' built-in values are written here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from types import MappingProxyType
from typing import Any, cast

from .config import duration, seconds
from .defaults import Defaults
from .errors import ConfigError
from .limits.durations import MAX_SECONDS, MAX_SHOWN
from .rules.status import TERMINAL, Status


@dataclass(frozen=True)
class Settings:
    """How a worker process keeps time.

    Args:
        lease_seconds: how long a step stays reserved without renewal; a
            SIGKILLed worker's step is recovered about this long after it died.
        sweep_interval: seconds between recovery sweeps.
        cancel_grace: seconds a task may ignore its cancel event before its
            thread is interrupted.
        defer_seconds: delay before retrying a message whose claim failed
            because the store was unreachable.
        dispatch_seconds: how long a step's message may wait in its queue
            before recovery sends it again (None: max(60, 2 * lease_seconds)).
        shutdown_grace: on worker shutdown (SIGTERM), seconds running attempts
            may take to finish (and be recorded) before they are interrupted
            and handed back to another worker; 0 interrupts at once.
        unknown_task_grace: how long a step whose task this worker does not
            know (a rolling deploy) is handed back for a worker that knows it,
            before it fails naming the executor id.
        heartbeat_timeout_ms: the Redis broker's heartbeat timeout: how long the
            messages a dead worker had prefetched wait before they come back.
        retention: how long ended jobs are kept, by final status:
            ``{"Completed": "7d", "Failed": "30d", "Cancelled": "7d"}`` (each a
            duration: seconds, or ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``,
            ``"2w"``, ``"1 week"``; see :func:`~pypepper_dramatiq.config.duration`). The sweep
            leader deletes the jobs that ended with that status longer ago (by
            their ``updated`` time), a bounded batch per ``sweep_interval``,
            except those another job still needs. A status not named is kept.
            Default None: every job is kept for ever.
        continue_steps: how many steps a worker thread may run past its message's
            own, one after the other, when each is to run at once (the next task,
            or a retry without delay): each is claimed in the write that records
            the step before it, with no new message. 0 turns continuation off
            (every step is a message).
        continue_seconds: how long such a chain may hold its thread, counted from
            the start of its message; the step due after that goes back to its
            queue as a message, behind the jobs that waited meanwhile. 0 turns
            continuation off.
        claim_fetched: claim the step messages of each fetch of the Redis consumer
            together, in one store call, before they reach the worker threads
            (:mod:`~pypepper_dramatiq.drivers.dramatiq.fetch_claims`), and record
            their outcomes, then acknowledge their messages, many at a time in a
            completion thread (:mod:`~pypepper_dramatiq.drivers.dramatiq.completion`);
            a worker then prefetches 6 messages per thread unless
            ``dramatiq_queue_prefetch`` is set. On by default: the worker threads
            then wait on no store round trip of ours (``bench/README.md``). A broker
            whose consumer hands out one message at a time (RabbitMQ) keeps the
            per-message path: each thread claims and records its own step.
        defaults: what a task or a job takes when neither it nor its handler class
            says (:class:`~pypepper_dramatiq.defaults.Defaults`: channel, retry count,
            delay, backoff, jitter and cap, ``round_timeout``, ``max_start_delay``),
            given as a mapping of those names.
    """

    lease_seconds: float = 30.0
    sweep_interval: float = 5.0
    cancel_grace: float = 10.0
    defer_seconds: float = 2.0
    dispatch_seconds: float | None = None
    shutdown_grace: float = 10.0
    unknown_task_grace: float = 300.0
    heartbeat_timeout_ms: int = 20_000
    #: Checked and stored read-only as status -> seconds (see :attr:`purge_after`).
    retention: Mapping[str, float | str | timedelta] | None = None
    continue_steps: int = 50
    continue_seconds: float = 1.0
    claim_fetched: bool = True
    #: Checked into :class:`~pypepper_dramatiq.defaults.Defaults` (a mapping may be given).
    defaults: Defaults = field(default_factory=Defaults)

    def __post_init__(self) -> None:
        for setting in fields(self):
            value = getattr(self, setting.name)
            if value is not None or setting.name not in _OPTIONAL:
                object.__setattr__(self, setting.name, _checked(setting.name, setting.name, value))

    @property
    def purge_after(self) -> dict[Status, float]:
        """:attr:`retention` as seconds by status ({}: keep every job)."""
        return {Status(k): cast(float, v) for k, v in (self.retention or {}).items()}

    @property
    def next_step_dispatch_seconds(self) -> float:
        """``dispatch_seconds``, or its default when not set."""
        if self.dispatch_seconds is not None:
            return self.dispatch_seconds
        return max(60.0, 2 * self.lease_seconds)

    @classmethod
    def of(cls, yaml_section: dict[str, Any] | None = None, **given: Any) -> Settings:
        """Settings from the YAML's ``scheduler`` section (camelCase keys; they win
        when present) and ``given`` arguments (None: the default). A bad YAML
        value is named by its key (``scheduler.leaseSeconds``). The defaults merge
        key by key: ``scheduler.defaults.retryCount`` wins over ``retry_count`` given."""
        values: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        for name, key in YAML_KEYS.items():
            if yaml_section and yaml_section.get(key) is not None:
                values[name] = _checked(name, f"scheduler.{key}", yaml_section[key])
        if yaml_section and yaml_section.get("defaults") is not None:
            given_defaults = Defaults.of(given.get("defaults"))
            values["defaults"] = values["defaults"].over(given_defaults)
        return cls(**values)


#: The YAML key (under ``scheduler``) of each setting.
YAML_KEYS = {
    "lease_seconds": "leaseSeconds",
    "sweep_interval": "sweepInterval",
    "cancel_grace": "cancelGrace",
    "defer_seconds": "deferSeconds",
    "dispatch_seconds": "dispatchSeconds",
    "shutdown_grace": "shutdownGrace",
    "unknown_task_grace": "unknownTaskGrace",
    "heartbeat_timeout_ms": "heartbeatTimeoutMs",
    "retention": "retention",
    "continue_steps": "continueSteps",
    "continue_seconds": "continueSeconds",
    "claim_fetched": "claimFetched",
    "defaults": "defaults",
}


def _checked(name: str, label: str, value: object) -> Any:
    """``value`` checked as setting ``name``; a ConfigError names ``label``."""
    if name == "heartbeat_timeout_ms":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{label} must be a whole number of milliseconds > 0, got {value!r}")
        if value > MAX_SECONDS * 1000:
            raise ConfigError(
                f"{label} must be at most {MAX_SECONDS * 1000:.0f} milliseconds ({MAX_SHOWN}), "
                f"got {value!r}"
            )
        return value
    if name == "retention":
        return _retention(label, value)
    if name == "defaults":
        if label.startswith("scheduler."):  # the YAML's camelCase keys
            return Defaults.from_yaml(value, label)
        return Defaults.of(value, label)
    if name == "claim_fetched":
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, got {value!r}")
        return value
    if name == "continue_steps":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{label} must be a whole number of steps >= 0, got {value!r}")
        return value
    return seconds(label, value, zero=name in _ZERO_ALLOWED)


def _retention(label: str, value: object) -> Mapping[Status, float]:
    """A retention mapping (final status -> duration), read-only, as seconds."""
    ended = ", ".join(sorted(status.value for status in TERMINAL))
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{label} must be a mapping of final status to duration "
            f"(e.g. {{'Completed': '7d'}}), got {value!r}"
        )
    kept: dict[Status, float] = {}
    for key, after in value.items():
        name = key.value if isinstance(key, Status) else key  # an Enum hashes by its name
        if not isinstance(name, str) or name not in {status.value for status in TERMINAL}:
            raise ConfigError(
                f"{label}: {key!r} is not a final status (only ended jobs are purged); "
                f"expected one of {ended}"
            )
        kept[Status(name)] = duration(f"{label}.{name}", after)
    return MappingProxyType(kept)


#: Settings that may be None (then their default rule applies).
_OPTIONAL = frozenset({"dispatch_seconds", "retention"})

#: Settings for which 0 means "not at all" rather than an error.
_ZERO_ALLOWED = frozenset(
    {"cancel_grace", "shutdown_grace", "unknown_task_grace", "continue_seconds"}
)
