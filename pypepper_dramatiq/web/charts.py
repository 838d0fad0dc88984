"""The Charts page: jobs ended per bucket of time by final status (SVG bars), the time
jobs waited and ran (p50 and p95 lines) and the channels' depths (lines), drawn on the
server as SVG.

Read from the activity rollup the sweep's leader keeps
(:mod:`~pypepper_dramatiq.records.activity`) where it covers the range; the ends it
does not cover yet (its last minute or two, or a store that keeps none) are counted
from the jobs table (:meth:`IJobStore.ended_counts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ..records.activity import ENDED, TIME_BOUNDS, Activity, ActivityMark, percentile
from ..rules.status import Status
from ..stores.base import IJobStore
from .views import when

# -- charts --------------------------------------------------------------------------------------

#: The ranges the charts page shows: (its span, one bar's width), in seconds.
CHART_RANGES = {"hour": (3_600, 60), "day": (86_400, 900), "week": (604_800, 3_600)}
#: The chart's drawing size, in SVG units; the bars stack from the bottom.
CHART_WIDTH, CHART_HEIGHT = 960, 220
#: The final statuses, bottom to top of a bar.
CHART_STATUSES = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class Bar:
    """One status's part of one bar of the chart."""

    x: float
    y: float
    width: float
    height: float
    status: str
    #: What a pointer over it says: the bucket's start, the count, the status.
    title: str


@dataclass(frozen=True)
class Chart:
    """Jobs ended per bucket by status over one range, drawn as stacked bars."""

    range: str
    bars: list[Bar]
    #: The most jobs one bucket holds (the top of the scale), and the totals by status.
    peak: int
    totals: list[tuple[str, int]]
    #: Labels under the x axis: (x, text).
    ticks: list[tuple[float, str]]
    bucket: str
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def _bucket_words(seconds: int) -> str:
    """A bar's width in words: "minute", "15 minutes", "hour"."""
    if seconds % 3_600 == 0:
        hours = seconds // 3_600
        return "hour" if hours == 1 else f"{hours} hours"
    minutes = seconds // 60
    return "minute" if minutes == 1 else f"{minutes} minutes"


def ended_chart(counts: Mapping[tuple[Status, int], int], name: str, since: datetime) -> Chart:
    """The chart of ``counts`` (:meth:`IJobStore.ended_counts` from ``since``) for the
    range ``name`` of :data:`CHART_RANGES`."""
    span, step = CHART_RANGES[name]
    buckets = span // step
    width = CHART_WIDTH / buckets
    peak = max([sum(counts.get((s, i), 0) for s in CHART_STATUSES) for i in range(buckets)] or [0])
    scale = CHART_HEIGHT / peak if peak else 0.0
    bars: list[Bar] = []
    for i in range(buckets):
        base = float(CHART_HEIGHT)
        start = since + timedelta(seconds=i * step)
        for status in CHART_STATUSES:
            n = counts.get((status, i), 0)
            if not n:
                continue
            height = n * scale
            base -= height
            bars.append(
                Bar(
                    x=round(i * width, 2),
                    y=round(base, 2),
                    width=round(max(width - 1, 1), 2),
                    height=round(height, 2),
                    status=status.value,
                    title=f"{when(start)}: {n:,} {status.value}",
                )
            )
    totals = [(s.value, sum(n for (st, _), n in counts.items() if st is s)) for s in CHART_STATUSES]
    return Chart(
        range=name,
        bars=bars,
        peak=peak,
        totals=totals,
        ticks=_ticks(name, since),
        bucket=_bucket_words(step),
    )


# -- what the page reads -----------------------------------------------------------------

#: Channels drawn on the depth chart at most (the deepest); the others are counted.
DEPTH_LINES = 6
#: The shares of jobs the time charts draw a line for, with their names.
TIME_LINES = ((0.5, "p50"), (0.95, "p95"))


@dataclass(frozen=True)
class Point:
    """One point of a line: where, and what a pointer over it says."""

    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Line:
    """One series of a line chart: its name, the CSS class it is drawn with, its
    points, and the runs of consecutive points drawn joined (``points`` of polylines)."""

    name: str
    css: str
    points: list[Point]
    runs: list[str]


@dataclass(frozen=True)
class LineChart:
    """Lines over one range: times (on a log scale) or depths."""

    range: str
    lines: list[Line]
    #: Labels of the y axis: (y, text).
    scale: list[tuple[float, str]]
    ticks: list[tuple[float, str]]
    bucket: str
    #: What the chart leaves out (channels past :data:`DEPTH_LINES`), or "".
    note: str = ""
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


@dataclass(frozen=True)
class Charts:
    """Everything the Charts page draws for one range."""

    ended: Chart
    waits: LineChart
    runs: LineChart
    depths: LineChart
    #: Where the figures come from, in words.
    source: str


def seconds_words(seconds: float) -> str:
    """A time as the time charts label it: "5 ms", "2.5 s", "10 min", "4 h"."""
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds < 60:
        return f"{seconds:g} s"
    if seconds < 3_600:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3_600:g} h"


def _ticks(name: str, since: datetime) -> list[tuple[float, str]]:
    span, step = CHART_RANGES[name]
    buckets = span // step
    width = CHART_WIDTH / buckets
    every = max(1, buckets // 6)
    return [
        (round(i * width, 2), when(since + timedelta(seconds=i * step))[5:16].replace("-", "/"))
        for i in range(0, buckets, every)
    ]


def _line(
    name: str,
    css: str,
    values: Mapping[int, float],
    width: float,
    y_of: Callable[[float], float],
    words: Callable[[int, float], str],
) -> Line:
    """A line through ``values`` (bucket -> value), a point in the middle of each bucket
    of ``width``; buckets without a value break it."""
    points: list[Point] = []
    runs: list[str] = []
    run: list[str] = []
    last = None
    for i in sorted(values):
        x = round((i + 0.5) * width, 2)
        y = round(y_of(values[i]), 2)
        points.append(Point(x, y, f"{name}: {words(i, values[i])}"))
        if last is not None and i != last + 1 and run:
            runs.append(" ".join(run))
            run = []
        run.append(f"{x},{y}")
        last = i
    if run:
        runs.append(" ".join(run))
    return Line(name=name, css=css, points=points, runs=runs)


def time_chart(
    histograms: Mapping[int, tuple[int, ...]], name: str, since: datetime, what: str
) -> LineChart:
    """The p50 and p95 of ``histograms`` (bucket -> histogram of times) as lines on a
    log scale; approximate to a histogram bucket (the upper bound of the one holding it)."""
    span, step = CHART_RANGES[name]
    width = CHART_WIDTH / (span // step)
    lo = math.log10(TIME_BOUNDS[0] / 2)  # the fastest bucket above the axis
    found = {
        label: {i: value for i, h in histograms.items() if (value := percentile(h, q)) is not None}
        for q, label in TIME_LINES
    }
    top = max([1.0] + [v for values in found.values() for v in values.values()])
    hi = math.log10(top)

    def y_of(seconds: float) -> float:
        return CHART_HEIGHT - (math.log10(seconds) - lo) / (hi - lo) * CHART_HEIGHT

    def words(i: int, seconds: float) -> str:
        start = since + timedelta(seconds=i * step)
        return f"{when(start)}, {what} up to {seconds_words(seconds)}"

    lines = [
        _line(label, f"series-{label}", values, width, y_of, words)
        for label, values in found.items()
        if values
    ]
    marks = [b for b in (TIME_BOUNDS[0], 0.1, 1, 60, 3_600, 86_400) if b <= top] + [top]
    scale = [(round(y_of(b), 2), seconds_words(b)) for b in sorted(set(marks))]
    return LineChart(
        range=name, lines=lines, scale=scale, ticks=_ticks(name, since), bucket=_bucket_words(step)
    )


def depth_chart(depths: Mapping[tuple[int, str], int], name: str, since: datetime) -> LineChart:
    """The deepest each channel was seen per bucket, a line per channel (the
    :data:`DEPTH_LINES` deepest)."""
    span, step = CHART_RANGES[name]
    width = CHART_WIDTH / (span // step)
    per_channel: dict[str, dict[int, float]] = {}
    for (i, channel), depth in depths.items():
        per_channel.setdefault(channel, {})[i] = depth
    ranked = sorted(per_channel, key=lambda ch: (-max(per_channel[ch].values()), ch))
    shown = sorted(ranked[:DEPTH_LINES])
    top = max([1.0] + [v for ch in shown for v in per_channel[ch].values()])

    def y_of(depth: float) -> float:
        return CHART_HEIGHT - depth / top * CHART_HEIGHT

    lines = []
    for n, channel in enumerate(shown):

        def words(i: int, depth: float, channel: str = channel) -> str:
            start = since + timedelta(seconds=i * step)
            return f"{when(start)}, up to {depth:,.0f} waiting in {channel}"

        lines.append(_line(channel, f"series-{n}", per_channel[channel], width, y_of, words))
    left = len(ranked) - len(shown)
    return LineChart(
        range=name,
        lines=lines,
        scale=[(0.0, f"{top:,.0f}"), (float(CHART_HEIGHT), "0")],
        ticks=_ticks(name, since),
        bucket=_bucket_words(step),
        note=f"{left:,} shallower channel(s) not drawn." if left > 0 else "",
    )


def _aligned_up(at: datetime, step: int) -> datetime:
    seconds = math.ceil(at.timestamp() / step) * step
    return datetime.fromtimestamp(seconds, timezone.utc)


def _counted(
    store: IJobStore, since: datetime, start: datetime, end: datetime, step: int
) -> dict[tuple[Status, int], int]:
    """The ends from ``start`` to ``end`` (both on a minute) counted from the jobs table,
    per bucket of ``step`` from ``since``: whole buckets in one count, the minutes of a
    bucket cut by ``start`` or ``end`` in counts per minute."""
    out: dict[tuple[Status, int], int] = {}
    if start >= end:
        return out
    first, last = _aligned_up(start, step), end - timedelta(seconds=end.timestamp() % step)
    pieces = (
        [(start, end, 60)]
        if first >= last
        else [(start, first, 60), (first, last, step), (last, end, 60)]
    )
    for lo, hi, width in pieces:
        if lo >= hi:
            continue
        for (status, i), n in store.ended_counts(lo, hi, width).items():
            at = lo + timedelta(seconds=i * width)
            key = (status, int((at - since).total_seconds()) // step)
            out[key] = out.get(key, 0) + n
    return out


def _source(mark: ActivityMark | None, since: datetime, end: datetime) -> str:
    if mark is None:
        return (
            "The activity rollup holds nothing yet (no sweep leader has filled it, or this "
            "store keeps none): ends are counted from the jobs table; times and depths "
            "need the rollup."
        )
    parts = [
        f"From the activity rollup, {when(max(mark.first_minute, since))} to "
        f"{when(min(mark.next_minute, end))}"
    ]
    if mark.first_minute > since or mark.next_minute < end:
        parts.append("ends outside it counted from the jobs table")
    parts.append("times approximate to a histogram bucket")
    return "; ".join(parts) + "."


def read_charts(store: IJobStore, name: str, now: datetime) -> Charts:
    """The charts of range ``name`` (:data:`CHART_RANGES`) at ``now``: buckets aligned on
    their width, the current one last."""
    span, step = CHART_RANGES[name]
    end = datetime.fromtimestamp((now.timestamp() // step + 1) * step, timezone.utc)
    since = end - timedelta(seconds=span)
    mark = store.activity_mark() if store.keeps_activity else None
    if mark is None or mark.next_minute <= since or mark.first_minute >= end:
        counts = dict(store.ended_counts(since, end, step))
        found: dict[tuple[int, str], Activity] = {}
    else:
        found = store.activity(since, end, step)
        counts = {}
        for (i, _), activity in found.items():
            for status in ENDED:
                if n := activity.count(status):
                    counts[status, i] = counts.get((status, i), 0) + n
        for lo, hi in ((since, mark.first_minute), (mark.next_minute, end)):
            for key, n in _counted(store, since, max(lo, since), min(hi, end), step).items():
                counts[key] = counts.get(key, 0) + n
    waits: dict[int, Activity] = {}
    for (i, _), activity in found.items():
        waits[i] = activity if i not in waits else waits[i].plus(activity)
    depths = {key: a.depth for key, a in found.items() if a.depth is not None}
    return Charts(
        ended=ended_chart(counts, name, since),
        waits=time_chart({i: a.waits for i, a in waits.items()}, name, since, "waited"),
        runs=time_chart({i: a.runs for i, a in waits.items()}, name, since, "ran"),
        depths=depth_chart(depths, name, since),
        source=_source(mark, since, end),
    )
