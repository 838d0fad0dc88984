"""Defaults for a whole application: what a task or a job takes when it does not say.

``setup(defaults={...})`` and the YAML's ``scheduler.defaults`` give them; they are
checked once into one :class:`Defaults` (a bad one is a
:class:`~pypepper_dramatiq.errors.ConfigError` naming its key, raised by ``setup()``)
and installed in :data:`installed_defaults`, where :class:`~pypepper_dramatiq.model.task.Task`
and :class:`~pypepper_dramatiq.model.job.Job` read them when they are built. What a
task resolves to is stored with its job, so the process that builds a job decides:
a worker's defaults apply to the jobs it builds, not to jobs stored by another process.

The order, first found wins: the job's own value (its channel, ``scheduled()``'s
``max_start_delay``, ``priority``), the task's own (``Task(...)``, ``@workflow_task(...)``,
``executor_task(...)``), the handler class's attribute, these defaults, the
built-in default.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .config import count, duration
from .errors import ConfigError, InvalidPriorityError
from .rules.priorities import check_priority
from .rules.start_times import max_start_delay_seconds

#: The YAML key (under ``scheduler.defaults``) of each default, by its Python name.
YAML_DEFAULT_KEYS = {
    "channel_id": "channelId",
    "retry_count": "retryCount",
    "retry_delay": "retryDelay",
    "retry_backoff": "retryBackoff",
    "retry_jitter": "retryJitter",
    "retry_delay_max": "retryDelayMax",
    "round_timeout": "roundTimeout",
    "max_start_delay": "maxStartDelay",
    "priority": "priority",
}

#: The defaults that are a task's options (the rest are a job's).
TASK_OPTIONS = (
    "retry_count",
    "retry_delay",
    "retry_backoff",
    "retry_jitter",
    "retry_delay_max",
    "round_timeout",
)


@dataclass(frozen=True)
class Defaults:
    """What a task or a job takes when neither it nor its handler class says (None: no
    default of the application's; the built-in one applies).

    Args:
        channel_id: the channel of a ``Job`` built without one (built-in ``"default"``);
            ``setup()`` declares it, so that a ``dramatiq`` worker consumes it.
        retry_count: a task's retries per round (built-in 0).
        retry_delay: seconds before a retry (built-in 0); a duration.
        retry_backoff: the factor each further retry's wait grows by (built-in 1).
        retry_jitter: whether a retry waits a random part of its wait (built-in False).
        retry_delay_max: the cap of a retry's wait (built-in none); a task whose own
            ``retry_delay`` is longer waits its own delay.
        round_timeout: seconds one attempt may take (built-in 0: no limit); a duration.
        max_start_delay: a job not started this long after its planned start ends
            Cancelled (built-in: no deadline); a duration, 0 allowed.
        priority: a job's priority when neither ``scheduled()`` nor the job says
            (built-in 0, the lowest); a whole number from 0 to 9.

    A duration is seconds, a ``timedelta``, or ``"90s"``, ``"15m"``, ``"2h"`` (see
    :func:`~pypepper_dramatiq.config.duration`); it is held as seconds.

    Raises:
        ConfigError: a value of the wrong type or out of range, named.
    """

    channel_id: str | None = None
    retry_count: int | None = None
    retry_delay: float | None = None
    retry_backoff: float | None = None
    retry_jitter: bool | None = None
    retry_delay_max: float | None = None
    round_timeout: float | None = None
    max_start_delay: float | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                object.__setattr__(self, field.name, _checked(field.name, value, field.name))
        delay, cap = self.retry_delay, self.retry_delay_max
        if delay is not None and cap is not None and cap < delay:
            raise ConfigError(
                f"retry_delay_max ({cap}) must not be below retry_delay ({delay}) in the defaults"
            )

    @classmethod
    def of(cls, given: object, label: str = "defaults") -> Defaults:
        """``given`` (Python names, as ``setup(defaults=...)`` takes them) checked; a bad
        key or value is a ConfigError naming ``label.key``."""
        if isinstance(given, Defaults):
            return given
        if given is None:
            return cls()
        return cls(**_read(given, label, {name: name for name in YAML_DEFAULT_KEYS}))

    @classmethod
    def from_yaml(cls, section: object, label: str = "scheduler.defaults") -> Defaults:
        """The YAML's ``scheduler.defaults`` (camelCase keys) checked, named by ``label``."""
        return cls(**_read(section, label, {v: k for k, v in YAML_DEFAULT_KEYS.items()}))

    def over(self, base: Defaults) -> Defaults:
        """These defaults, ``base``'s where these have none."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        return Defaults(**{k: v if v is not None else getattr(base, k) for k, v in mine.items()})

    def task_options(self, own: Mapping[str, Any]) -> dict[str, Any]:
        """The task options these defaults give a task whose own (and its handler's)
        options are ``own``: those it does not set. The cap never goes below the
        task's own ``retry_delay``: its own value wins."""
        options = {
            name: getattr(self, name)
            for name in TASK_OPTIONS
            if name not in own and getattr(self, name) is not None
        }
        cap = options.get("retry_delay_max")
        delay = own.get("retry_delay", self.retry_delay)
        if cap is not None and _is_number(delay) and delay > cap:
            options["retry_delay_max"] = float(delay)
        return options


def _read(given: object, label: str, names: Mapping[str, str]) -> dict[str, Any]:
    """``given``'s entries by Python name; ConfigError for a non-mapping or an unknown key."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"{label} must be a mapping of option to value, got {given!r}")
    unknown = sorted(str(key) for key in given if key not in names)
    if unknown:
        raise ConfigError(
            f"unknown key {', '.join(unknown)} under {label}; known keys: {', '.join(names)}"
        )
    return {
        names[key]: _checked(names[key], value, f"{label}.{key}")
        for key, value in given.items()
        if value is not None
    }


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked(name: str, value: object, label: str) -> Any:
    """``value`` checked as default ``name``; a ConfigError names ``label``."""
    if name == "channel_id":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{label} must be a non-empty channel id, got {value!r}")
        return value
    if name == "retry_count":
        return count(label, value)
    if name == "priority":
        try:
            return check_priority(value, label)
        except InvalidPriorityError as exc:
            raise ConfigError(str(exc)) from None
    if name == "retry_jitter":
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, got {value!r}")
        return value
    if name == "retry_backoff":
        if not _is_number(value) or not 1 <= float(value) < math.inf:  # type: ignore[arg-type]
            raise ConfigError(f"{label} must be a finite number >= 1, got {value!r}")
        return float(value)  # type: ignore[arg-type]
    seconds = duration(label, value, zero=True)
    if name == "max_start_delay":
        try:
            return max_start_delay_seconds(seconds)
        except ValueError as exc:  # finer than a millisecond
            raise ConfigError(f"{label}: {exc}") from None
    return seconds


class InstalledDefaults:
    """The process's :class:`Defaults`: ``setup()`` installs them, tasks and jobs read them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._defaults = Defaults()

    @property
    def current(self) -> Defaults:
        """The installed defaults (none set until ``setup()`` gives some)."""
        return self._defaults

    def install(self, defaults: Defaults) -> None:
        """Use ``defaults`` for every task and job built from now on."""
        with self._lock:
            self._defaults = defaults

    def clear(self) -> None:
        """Back to the built-in defaults."""
        self.install(Defaults())


#: The process's defaults: one per process, as the job store and the broker are.
installed_defaults = InstalledDefaults()


#: The channel of a job that names none and of an application without a default one.
BUILT_IN_CHANNEL = "default"


def default_channel() -> str:
    """The channel of a job (or task) that names none: the application's default
    (``setup(defaults={"channel_id": ...})``), else :data:`BUILT_IN_CHANNEL`."""
    return installed_defaults.current.channel_id or BUILT_IN_CHANNEL
