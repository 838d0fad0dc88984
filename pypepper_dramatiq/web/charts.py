"""The Charts page: jobs ended per bucket of time, by final status, drawn as SVG bars."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..rules.status import Status
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
    ticks_every = max(1, buckets // 6)
    ticks = [
        (round(i * width, 2), when(since + timedelta(seconds=i * step))[5:16].replace("-", "/"))
        for i in range(0, buckets, ticks_every)
    ]
    totals = [(s.value, sum(n for (st, _), n in counts.items() if st is s)) for s in CHART_STATUSES]
    return Chart(
        range=name,
        bars=bars,
        peak=peak,
        totals=totals,
        ticks=ticks,
        bucket=_bucket_words(step),
    )
