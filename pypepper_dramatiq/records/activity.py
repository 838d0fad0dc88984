"""The activity rollup: per minute and channel, the jobs that ended by status, how long
they waited and ran (fixed-bucket histograms), and how deep the channel was.

The recovery sweep's leader adds to it (duty ``roll_up_activity``) from the ends it
reads; the dashboard's charts read it, so that a week's chart reads about 10,000
small rows a channel instead of every ended job. Times are read from the histograms
and are approximate to a bucket (:func:`percentile`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from ..rules.status import Status
from .record import JobRecord

#: The histograms' buckets, by upper bound in seconds (the last bucket has none): wide
#: enough for a task of milliseconds and one of hours, a bucket's width about doubling.
TIME_BOUNDS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1_800,
    3_600,
    14_400,
    86_400,
)
#: Buckets of a histogram: one per bound, and the last for longer times.
TIME_BUCKETS = len(TIME_BOUNDS) + 1
#: The statuses counted, in the order the rollup's columns hold them.
ENDED = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
#: One minute, the rollup's finest grain.
MINUTE = timedelta(minutes=1)
#: The grains a SQL store keeps the rollup at, in minutes: each end is added to its
#: minute, its quarter of an hour and its hour, so that a chart reads the coarsest
#: grain that divides its buckets (a week: 168 rows a channel, not 10,080).
GRAINS = (1, 15, 60)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _zeros() -> tuple[int, ...]:
    return (0,) * TIME_BUCKETS


@dataclass(frozen=True)
class Activity:
    """What one minute of one channel held (or several minutes, added up).

    Attributes:
        ended: jobs ended by status, in the order of :data:`ENDED`.
        waits: jobs by time waited (created or planned start to first start), per
            bucket of :data:`TIME_BOUNDS`.
        runs: jobs by time running (first start to end), per bucket.
        depth: the most jobs seen waiting in the channel's queue; None: not read.
    """

    ended: tuple[int, ...] = (0,) * len(ENDED)
    waits: tuple[int, ...] = field(default_factory=_zeros)
    runs: tuple[int, ...] = field(default_factory=_zeros)
    depth: int | None = None

    def plus(self, other: Activity) -> Activity:
        """Both added up (counts summed, the deeper depth kept)."""
        depths = [d for d in (self.depth, other.depth) if d is not None]
        return Activity(
            ended=tuple(a + b for a, b in zip(self.ended, other.ended, strict=True)),
            waits=tuple(a + b for a, b in zip(self.waits, other.waits, strict=True)),
            runs=tuple(a + b for a, b in zip(self.runs, other.runs, strict=True)),
            depth=max(depths) if depths else None,
        )

    def count(self, status: Status) -> int:
        """Jobs that ended ``status``."""
        return self.ended[ENDED.index(status)]


@dataclass(frozen=True)
class ActivityMark:
    """How far the rollup holds every end: from ``first_minute`` (the first still
    kept) to ``next_minute`` (excluded: the first it has not read yet)."""

    first_minute: datetime
    next_minute: datetime


def minute_of(at: datetime) -> datetime:
    """The start of the minute ``at`` falls in (UTC)."""
    seconds = math.floor((at - _EPOCH).total_seconds() / 60) * 60
    return _EPOCH + timedelta(seconds=seconds)


def grain_for(bucket_seconds: int, since: datetime) -> int:
    """The coarsest of :data:`GRAINS` (minutes) whose rows fall whole in buckets of
    ``bucket_seconds`` starting at ``since``."""
    offset = (since - _EPOCH).total_seconds()
    fits = [g for g in GRAINS if bucket_seconds % (g * 60) == 0 and offset % (g * 60) == 0]
    return max(fits, default=1)


def grained(
    minutes: Mapping[tuple[datetime, str], Activity],
) -> dict[tuple[int, datetime, str], Activity]:
    """``minutes`` added up at each of :data:`GRAINS`: (grain, its start, channel)."""
    out: dict[tuple[int, datetime, str], Activity] = {}
    for (minute, channel), activity in minutes.items():
        offset = int((minute - _EPOCH).total_seconds())
        for grain in GRAINS:
            start = minute - timedelta(seconds=offset % (grain * 60))
            before = out.get((grain, start, channel))
            out[grain, start, channel] = activity if before is None else before.plus(activity)
    return out


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a time of ``seconds``."""
    for i, bound in enumerate(TIME_BOUNDS):
        if seconds <= bound:
            return i
    return len(TIME_BOUNDS)


def first_start(record: JobRecord) -> datetime | None:
    """When the job's first attempt started, from its history (each task's first
    attempt is always kept); None if no attempt started."""
    starts: list[datetime] = []
    for entries in (record.state.get("history") or {}).values():
        for item in entries[:1]:
            try:
                starts.append(datetime.fromisoformat(str(item["started"])))
            except (KeyError, TypeError, ValueError):
                continue
    return min(starts) if starts else None


def activity_of(record: JobRecord) -> Activity:
    """The activity one ended job adds to its minute: its end, and, if it started, the
    time it waited and the time it ran."""
    ended = tuple(int(record.status is status) for status in ENDED)
    started = first_start(record)
    if started is None:
        return Activity(ended=ended)
    planned = max(record.created, record.not_before or record.created)
    waits, runs = [0] * TIME_BUCKETS, [0] * TIME_BUCKETS
    waits[bucket_of(max(0.0, (started - planned).total_seconds()))] = 1
    runs[bucket_of(max(0.0, (record.updated - started).total_seconds()))] = 1
    return Activity(ended=ended, waits=tuple(waits), runs=tuple(runs))


def add_up(
    items: Iterable[tuple[tuple[datetime, str], Activity]],
) -> dict[tuple[datetime, str], Activity]:
    """The activities of ``items`` added up per (minute, channel)."""
    out: dict[tuple[datetime, str], Activity] = {}
    for key, activity in items:
        before = out.get(key)
        out[key] = activity if before is None else before.plus(activity)
    return out


def bucketed(
    minutes: Mapping[tuple[datetime, str], Activity],
    since: datetime,
    until: datetime,
    bucket_seconds: int,
) -> dict[tuple[int, str], Activity]:
    """``minutes`` from ``since`` (bucket 0) to ``until`` added up per bucket of
    ``bucket_seconds`` and channel: what :meth:`IJobStore.activity` answers."""
    out: dict[tuple[int, str], Activity] = {}
    for (minute, channel), activity in minutes.items():
        if since <= minute < until:
            index = int((minute - since).total_seconds()) // bucket_seconds
            before = out.get((index, channel))
            out[index, channel] = activity if before is None else before.plus(activity)
    return out


def percentile(histogram: tuple[int, ...], q: float) -> float | None:
    """The time below which a share ``q`` of the histogram's jobs fall, approximate to a
    bucket: the upper bound of the bucket holding it (the last bound for the open
    bucket); None for an empty histogram."""
    total = sum(histogram)
    if not total:
        return None
    wanted = q * total
    seen = 0
    for i, n in enumerate(histogram):
        seen += n
        if seen >= wanted and n:
            return TIME_BOUNDS[min(i, len(TIME_BOUNDS) - 1)]
    return TIME_BOUNDS[-1]
