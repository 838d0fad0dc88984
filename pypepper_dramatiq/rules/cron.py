"""Recurring schedules: a cron expression read on the wall clock of an IANA time zone.

Everything here is a pure computation: the instants a schedule fires at, the slots due
after some downtime, and the deterministic job id of one firing. Returned instants are
aware datetimes in UTC.

Daylight saving time is resolved here rather than by croniter: the expression is
iterated over naive local wall-clock times, and each wall time is mapped to UTC with
:mod:`zoneinfo`. A wall time skipped by a spring-forward gap fires at the transition
instant (the first valid instant after it); a wall time repeated by an autumn fold fires
once, at its first occurrence.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..config import check_choice
from ..errors import ConfigError
from ..limits.storable import CRON_LENGTH, SCHEDULE_NAME_LENGTH, TIMEZONE_LENGTH, check_text

try:
    from croniter import croniter as _croniter
except ImportError:  # pragma: no cover - the tests simulate it by setting _croniter to None
    _croniter = None

__all__ = [
    "CATCH_UP",
    "CATCH_UP_LIMIT",
    "INSTALL_HINT",
    "ON_TIME_SECONDS",
    "SECONDS_FIRST",
    "OVERLAP",
    "CronSchedule",
    "available",
    "check_choice",
    "check_name",
    "due_slots",
    "firing_id",
]

CATCH_UP_LIMIT = 100
"""The most missed slots that ``catch_up="all"`` fires at once (the most recent ones)."""

ON_TIME_SECONDS = 10.0
"""A slot fired at most this many seconds after its instant is on time, not missed:
every on-time slot fires, whatever ``catch_up`` says (a sweep tick that comes a little
late, or finds two slots of a per-second schedule due, loses none)."""

SECONDS_FIRST = True
"""A 6-field expression's first field is the seconds (croniter's default reads them last).
Schedules stored by earlier releases were read seconds last: the schema migration 0008
rewrote them to keep firing as they did."""

CATCH_UP = ("latest", "none", "all")
"""What to fire when slots were missed: the latest one, none of them, or all of them."""

OVERLAP = ("skip", "allow")
"""Whether a firing may start while the previous firing of the schedule still runs."""

_UTC = timezone.utc
_SECOND = timedelta(seconds=1)
_MAX_NAME_LENGTH = SCHEDULE_NAME_LENGTH
INSTALL_HINT = "install it with: pip install croniter (a dependency of pypepper-dramatiq)"
"""How to get croniter, which reading a cron expression needs."""
# A fixed naive start for the probe that checks an expression matches some date at all.
_PROBE_START = datetime(2000, 1, 1)


def available() -> bool:
    """Whether cron expressions can be read here (croniter could be imported)."""
    return _croniter is not None


@dataclass(frozen=True)
class CronSchedule:
    """A cron expression evaluated on the wall clock of an IANA time zone.

    The expression has 5 fields (minute hour day-of-month month day-of-week), or 6 with
    seconds first (second minute hour day-of-month month day-of-week: ``"*/10 * * * * *"``
    fires every ten seconds, ``"0 * * * * *"`` once a minute), as Quartz-style and most
    job systems' 6-field crons read them; croniter's ``@hourly``-style aliases are
    accepted too.
    """

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if _croniter is None:
            raise ConfigError(f"cron schedules need the croniter package; {INSTALL_HINT}")
        _check_expression(self.expression)
        _check_zone(self.timezone)

    def next_after(self, instant: datetime) -> datetime:
        """The first slot strictly after the aware ``instant``, in UTC."""
        _check_aware(instant, "instant")
        return next(self._forward(instant))

    def slots_between(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every slot ``s`` with ``after < s <= until``, ascending, in UTC."""
        _check_aware(after, "after")
        _check_aware(until, "until")
        return self._bounded(after, until)

    def slots_until(self, until: datetime, count: int) -> list[datetime]:
        """The ``count`` latest slots at or before the aware ``until``, newest first, in UTC."""
        _check_aware(until, "until")
        found: list[datetime] = []
        for slot in self._backward(until):
            if len(found) >= count:
                break
            found.append(slot)
        return found

    def _bounded(self, after: datetime, until: datetime) -> Iterator[datetime]:
        for slot in self._forward(after):
            if slot > until:
                return
            yield slot

    def _cron(self, start: datetime) -> Any:
        return _croniter(self.expression, start, second_at_beginning=SECONDS_FIRST)

    def _forward(self, after: datetime) -> Iterator[datetime]:
        """The slots strictly after ``after``, ascending, without end."""
        zone = ZoneInfo(self.timezone)
        walls = self._cron(_last_wall(after, zone))
        last = after
        while True:
            slot = _to_utc(walls.get_next(datetime), zone)
            # Several gap wall times share one instant: keep the first of them only.
            if slot > last:
                yield slot
                last = slot

    def _backward(self, until: datetime) -> Iterator[datetime]:
        """The slots at or before ``until``, descending, without end."""
        zone = ZoneInfo(self.timezone)
        walls = self._cron(_last_wall(until, zone) + _SECOND)
        last: datetime | None = None
        while True:
            slot = _to_utc(walls.get_prev(datetime), zone)
            if slot <= until and (last is None or slot < last):
                yield slot
                last = slot


def due_slots(
    schedule: CronSchedule, next_slot: datetime, now: datetime, catch_up: str
) -> tuple[list[datetime], datetime]:
    """The slots to fire at ``now``, ascending, and the new stored next slot.

    ``next_slot`` is the first slot not handled yet; the slots due are those from it up
    to ``now`` included. Every due slot at most :data:`ON_TIME_SECONDS` old fires;
    ``catch_up`` decides only the older ones, missed during downtime: ``"latest"`` fires
    the most recent missed slot when no slot is on time (one firing stands for the
    missed period), ``"none"`` none, ``"all"`` each, at most :data:`CATCH_UP_LIMIT`
    slots in all. The new next slot is the first slot strictly after ``now``
    (``next_slot`` itself when nothing is due yet).
    """
    check_choice("catch_up", catch_up, CATCH_UP)
    _check_aware(next_slot, "next_slot")
    _check_aware(now, "now")
    if next_slot > now:
        return [], next_slot
    # Bounded work: rather than enumerating every due slot forward (millions of them for
    # a per-second schedule after a long outage), walk backwards from `now` with
    # croniter's get_prev and stop after the few slots that can fire.
    on_time: list[datetime] = []
    missed: list[datetime] = []
    for slot in schedule._backward(now):
        if slot < next_slot:
            break
        if _on_time(slot, now):
            on_time.append(slot)
            continue
        if catch_up == "none" or (catch_up == "latest" and (on_time or missed)):
            break
        if len(on_time) + len(missed) >= CATCH_UP_LIMIT:
            break
        missed.append(slot)
    fired = on_time + missed  # both descending, the on-time ones the newer
    fired.reverse()
    return fired, schedule.next_after(now)


def firing_id(name: str, slot: datetime) -> str:
    """The deterministic job id of the firing of schedule ``name`` at ``slot``.

    It is made of ``[A-Za-z0-9-]`` and is 37 characters long.
    """
    check_name(name)
    _check_aware(slot, "slot")
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"rec-{digest}-{slot.astimezone(_UTC):%Y%m%dT%H%M%SZ}"


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid schedule name, else raise :class:`ValueError`."""
    if isinstance(name, str) and 0 < len(name) <= _MAX_NAME_LENGTH:
        return check_text("a schedule name", name)
    if isinstance(name, str) and len(name) > _MAX_NAME_LENGTH:
        shown = f"{name[:32]!r}... ({len(name)} characters)"
    else:
        shown = repr(name)
    raise ValueError(
        f"a schedule name must be a non-empty string of at most {_MAX_NAME_LENGTH} "
        f"characters, got {shown}"
    )


def _check_expression(expression: object) -> None:
    if not isinstance(expression, str):
        raise ConfigError(f"invalid cron expression {expression!r}: not a string")
    _check_storable("cron", expression, CRON_LENGTH)
    fields = expression.split()
    if not expression.strip().startswith("@") and len(fields) not in (5, 6):
        raise ConfigError(
            f"invalid cron expression {expression!r}: expected 5 fields, or 6 with "
            f"seconds first, got {len(fields)}"
        )
    try:
        # Finding one date also rejects expressions that match none, such as Feb 30.
        _croniter(expression, _PROBE_START, second_at_beginning=SECONDS_FIRST).get_next(datetime)
    except (ValueError, LookupError, TypeError, ArithmeticError) as exc:
        raise ConfigError(f"invalid cron expression {expression!r}: {exc}") from exc


def _check_zone(name: object) -> None:
    message = f"unknown time zone {name!r} (an IANA name such as 'Europe/Paris')"
    if not isinstance(name, str):
        raise ConfigError(message)
    _check_storable("timezone", name, TIMEZONE_LENGTH)
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(message) from exc


def _check_storable(field: str, value: str, limit: int) -> None:
    """A ConfigError (naming ``field`` and its limit) for text a schedule's row cannot hold."""
    try:
        check_text(field, value, limit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_aware(value: object, what: str) -> None:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got {value!r}")


def _on_time(slot: datetime, now: datetime) -> bool:
    return now - slot <= timedelta(seconds=ON_TIME_SECONDS)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The naive local wall-clock time of ``instant`` in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def _earliest(low: datetime, high: datetime, test: Callable[[datetime], bool]) -> datetime:
    """The earliest ``low + k seconds`` (k >= 1) passing ``test``, by bisection.

    ``test`` must be false at ``low``, true at ``high``, and switch only once between.
    """
    below, above = 0, max(1, math.ceil((high - low).total_seconds()))
    while above - below > 1:
        middle = (below + above) // 2
        if test(low + timedelta(seconds=middle)):
            above = middle
        else:
            below = middle
    return low + timedelta(seconds=above)


def _to_utc(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a slot at naive wall time ``wall`` fires at, in UTC.

    A repeated wall time maps to its first occurrence (fold=0); a skipped one maps to
    the end of its gap, i.e. the transition instant.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(_UTC)
    if _wall(first, zone) == wall:
        return first
    # The wall time does not exist: its two readings (the offsets before and after the
    # transition) bracket the transition, the first instant whose wall time is later.
    other = wall.replace(tzinfo=zone, fold=1).astimezone(_UTC)
    return _earliest(min(first, other), max(first, other), lambda t: _wall(t, zone) > wall)


def _last_wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The latest whole-second wall time whose slot would fire at or before ``instant``.

    For whole-second wall times ``w``: ``w <= _last_wall(i)`` exactly when
    ``_to_utc(w) <= i``, which makes it the start of both walks over croniter.
    """
    utc = instant.astimezone(_UTC).replace(microsecond=0)
    local = utc.astimezone(zone)
    if not local.fold:
        return local.replace(tzinfo=None)
    # Second pass through a repeated hour: every repeated wall time already fired during
    # the first pass, so the answer is the last second of the first pass.
    offset = local.utcoffset()
    first_offset = local.replace(fold=0).utcoffset()
    assert offset is not None and first_offset is not None
    repeat = first_offset - offset
    fold_start = _earliest(utc - repeat, utc, lambda t: t.astimezone(zone).utcoffset() == offset)
    return (fold_start + first_offset).replace(tzinfo=None) - _SECOND
