"""The YAML configuration file."""

from __future__ import annotations

import copy
import math
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .limits.durations import MAX_SECONDS, MAX_SHOWN, bounded


class Config:
    """Holds the YAML configuration loaded by :meth:`load_config`.

    Loading does not apply anything: call
    :func:`~pypepper_dramatiq.store.setup_from_config` (and ``setup``) with
    :meth:`get_yml_config` afterwards.
    """

    def __init__(self) -> None:
        self._yml: dict[str, Any] = {}
        self._path: Path | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        return self._path

    def load_config(self, path: str | Path) -> dict[str, Any]:
        """Read ``path``; raises :class:`ConfigError` naming the file (and line) on bad YAML."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"invalid YAML in {file}{where}: {problem}") from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {file} must hold a mapping at the top, not {type(data).__name__}"
            )
        with self._lock:
            self._yml, self._path = data, file
        return copy.deepcopy(data)

    def get_yml_config(self) -> dict[str, Any]:
        """A copy of the loaded configuration ({} before any load)."""
        with self._lock:
            return copy.deepcopy(self._yml)

    def set_yml_config(self, data: dict[str, Any]) -> None:
        """Use ``data`` as if it had been loaded from a file."""
        if not isinstance(data, dict):
            raise ConfigError(f"configuration must be a mapping, not {type(data).__name__}")
        with self._lock:
            self._yml, self._path = copy.deepcopy(data), None

    def clear(self) -> None:
        with self._lock:
            self._yml, self._path = {}, None


#: The process-wide configuration.
config = Config()


def section(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``data[k1][k2]...`` as a mapping ({} when absent); ConfigError if not a mapping."""
    node: Any = data
    for depth, key in enumerate(keys):
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return {}
        if not isinstance(node, dict):
            where = ".".join(keys[: depth + 1])
            raise ConfigError(f"config key {where} must be a mapping, not {type(node).__name__}")
    return dict(node)


def seconds(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as finite seconds > 0 (>= 0 with ``zero``), at most
    :data:`~pypepper_dramatiq.limits.durations.MAX_SECONDS`; ConfigError naming ``name``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = _as_float(value)
        if number >= 0 if zero else number > 0:  # NaN fails both
            return bounded(name, number, ConfigError)  # infinity too, naming the bound
    bound = ">= 0" if zero else "> 0"
    raise ConfigError(f"{name} must be a number of seconds {bound}, got {value!r}")


def _as_float(number: float) -> float:
    """``number`` as a float; an int beyond floats is infinite (not an OverflowError)."""
    try:
        return float(number)
    except OverflowError:
        return float("inf")


#: Seconds per unit of a duration string (``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"``).
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}

#: The spelled-out units people type (``"1 week"``, ``"90 minutes"``), each as the one-letter
#: unit of :data:`DURATION_UNITS` it means; matched in any letter case.
DURATION_WORDS = {
    **dict.fromkeys(("sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("day", "days"), "d"),
    **dict.fromkeys(("week", "weeks"), "w"),
}

#: The accepted forms, as the refusal of a bad duration lists them.
DURATION_FORMS = (
    "seconds as a number, or a number and one unit: '90s', '15m', '12h', '7d', '2w', "
    "or spelled out: '30 seconds', '90 minutes', '12 hours', '2 days', '1 week'"
)

#: A duration string: a number, then at most one unit (none: seconds), a space between or not.
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def _unit_seconds(unit: str) -> int | None:
    """Seconds in ``unit`` (``""`` is seconds), or None for a unit that is not one.

    The one-letter units are lower case only (``"M"`` might be read as months), the
    words in any case."""
    if unit in DURATION_UNITS or not unit:
        return DURATION_UNITS[unit or "s"]
    letter = DURATION_WORDS.get(unit.lower())
    return None if letter is None else DURATION_UNITS[letter]


def duration(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as seconds > 0 (>= 0 with ``zero``): a number of seconds, a
    :class:`~datetime.timedelta`, or a string of a number and one unit: a letter of
    :data:`DURATION_UNITS` (``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"``) or a
    word of :data:`DURATION_WORDS` (``"30 seconds"``, ``"90 minutes"``, ``"12 hours"``,
    ``"2 days"``, ``"1 week"``, singular or plural, a space before it or not); a bare
    number is seconds. The one parser of durations given as text: the CLI,
    ``setup(retention=...)``, ``setup(defaults=...)`` and YAML. A ConfigError naming
    ``name`` and listing :data:`DURATION_FORMS` otherwise."""
    number: object = value
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        unit = _unit_seconds(match.group(2)) if match else None
        number = None if match is None or unit is None else float(match.group(1)) * unit
    numeric = isinstance(number, (int, float)) and not isinstance(number, bool)
    finite = numeric and math.isfinite(_as_float(number))  # type: ignore[arg-type]
    if finite and _as_float(number) > MAX_SECONDS:  # type: ignore[arg-type]
        raise ConfigError(
            f"{name} must be at most {MAX_SECONDS:.0f} seconds ({MAX_SHOWN}), got {value!r}"
        )
    try:
        return seconds(name, number, zero=zero)
    except ConfigError:
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(
            f"{name} must be a duration {bound}: {DURATION_FORMS}; got {value!r}"
        ) from None


def count(name: str, value: object) -> int:
    """``value`` as a whole number >= 0; ConfigError naming ``name``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")


def check_choice(option: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming ``option``."""
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise ValueError(f"{option} must be one of {allowed}, got {value!r}")
