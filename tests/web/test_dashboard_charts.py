"""The Charts page over the activity rollup: ends counted from the rollup where it
covers the range and from the jobs table where it does not, the times waited and run
(p50, p95) and the channels' depths as lines. On the memory store and PostgreSQL."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from werkzeug.test import Client

from pypepper_dramatiq.records.activity import (
    TIME_BOUNDS,
    TIME_BUCKETS,
    Activity,
    ActivityMark,
    bucket_of,
    minute_of,
)
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.web import make_app
from pypepper_dramatiq.web.views import when

from .conftest import CHANNEL, text


def hist(seconds: float, n: int) -> tuple[int, ...]:
    out = [0] * TIME_BUCKETS
    out[bucket_of(seconds)] = n
    return tuple(out)


def ended(store: IJobStore, job_id: str, status: Status, at: object) -> None:
    assert store.put(JobRecord(id=job_id, channel_id=CHANNEL, status=status, created=at,
                               updated=at))  # type: ignore[arg-type]  # fmt: skip


def titles(page: str, figure: str) -> list[str]:
    """The pointer texts of the points of one line chart of the page."""
    part = page.split(f'id="{figure}"', 1)[1].split("</figure>", 1)[0]
    return re.findall(r"<circle [^>]*><title>([^<]*)</title>", part)


def test_the_page_reads_the_rollup_and_counts_from_the_table_what_it_does_not_hold(
    store: IJobStore,
) -> None:
    now = utcnow()
    mark = ActivityMark(minute_of(now - timedelta(hours=2)), minute_of(now) - timedelta(minutes=2))
    rolled = mark.next_minute - timedelta(minutes=10)
    minutes = {
        (rolled, CHANNEL): Activity(ended=(4, 0, 0), waits=hist(40, 4), runs=hist(2, 4), depth=7),
        (rolled, "other"): Activity(depth=3),
    }
    assert store.add_activity(minutes, moved=(None, mark))
    # In the rollup already (its minute is before the mark): not counted twice.
    ended(store, "rolled", Status.COMPLETED, rolled + timedelta(seconds=5))
    # After the mark: counted from the jobs table.
    recent = mark.next_minute + timedelta(seconds=30)
    ended(store, "recent", Status.FAILED, recent)
    # Before the rollup's first minute: counted from the jobs table (the day's chart).
    older = mark.first_minute - timedelta(minutes=50)
    ended(store, "older", Status.FAILED, older)
    client = Client(make_app())

    page = text(client.get("/charts"))
    assert ">4 Completed</span>" in page and ">1 Failed</span>" in page
    assert "From the activity rollup" in page
    assert "ends outside it counted from the jobs table" in page
    waits = titles(page, "wait-chart")
    assert [t.split(": ")[0] for t in waits] == ["p50", "p95"]
    assert all(t.endswith("waited up to 1 min") for t in waits)  # 40 s: the bucket to 60 s
    assert all(t.endswith("ran up to 2.5 s") for t in titles(page, "run-chart"))
    depths = titles(page, "depth-chart")
    assert sorted(t.split(", ", 1)[1] for t in depths) == [
        "up to 3 waiting in other",
        f"up to 7 waiting in {CHANNEL}",
    ]

    day = text(client.get("/charts?range=day"))
    assert ">4 Completed</span>" in day and ">2 Failed</span>" in day
    bars = re.findall(r"<title>[^<]*: (\d+) (\w+)</title>", day)
    assert sorted(bars) == [("1", "Failed"), ("1", "Failed"), ("4", "Completed")]
    for at in (recent, older):  # each in the bar of its quarter of an hour
        quarter = datetime.fromtimestamp(at.timestamp() // 900 * 900, timezone.utc)
        assert f"<title>{when(quarter)}: 1 Failed</title>" in day
    week = text(client.get("/charts?range=week"))
    assert ">4 Completed</span>" in week and ">2 Failed</span>" in week


def test_without_a_rollup_the_ends_come_from_the_table_and_no_time_is_drawn(
    store: IJobStore,
) -> None:
    at = utcnow() - timedelta(minutes=5)
    ended(store, "done", Status.COMPLETED, at)
    page = text(Client(make_app()).get("/charts"))
    assert ">1 Completed</span>" in page
    assert "The activity rollup holds nothing yet" in page
    assert titles(page, "wait-chart") == [] and "Nothing recorded in this range." in page


def test_the_time_scale_reaches_the_slowest_line() -> None:
    from pypepper_dramatiq.web.charts import time_chart

    since = minute_of(utcnow())
    chart = time_chart({0: hist(0.003, 10), 1: hist(5_000, 1)}, "hour", since, "ran")
    labels = [label for _, label in chart.scale]
    assert labels[0] == "5 ms" and labels[-1] == "4 h"  # 5,000 s: the bucket to 4 h
    [p50] = [line for line in chart.lines if line.name == "p50"]
    fastest, slowest = (p.y for p in p50.points)
    # The fastest just above the axis, on its grid line; the slowest on top.
    assert 0 < chart.scale[0][0] == fastest < 220 and slowest == 0
    assert TIME_BOUNDS[0] == 0.005
