"""The store contract of the activity rollup (the dashboard's charts).

Run against each store of :mod:`.test_store_contract`: memory, PostgreSQL and MariaDB
keep it; the ``IJobStore`` default (``MinimalStore``, as a third-party store inherits
it) keeps nothing, and says so (``keeps_activity``), so that the charts count ends
from the rows instead.
"""

from __future__ import annotations

from datetime import timedelta

from pypepper_dramatiq.records.activity import TIME_BUCKETS, Activity, ActivityMark
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import T0, store

__all__ = ["store"]  # the fixture: every store of the contract

M = timedelta(minutes=1)


def hist(*at: int) -> tuple[int, ...]:
    """A histogram with one job in each bucket of ``at``."""
    out = [0] * TIME_BUCKETS
    for i in at:
        out[i] += 1
    return tuple(out)


def test_a_store_that_keeps_no_rollup_says_so_and_answers_empty(store: IJobStore) -> None:
    if store.keeps_activity:
        return
    assert store.activity_mark() is None
    assert store.add_activity({(T0, "a"): Activity(ended=(1, 0, 0))}) is False
    assert store.activity(T0, T0 + M, 60) == {}


def test_added_minutes_add_up_per_bucket_and_channel(store: IJobStore) -> None:
    if not store.keeps_activity:
        return
    assert store.add_activity(
        {
            (T0, "a"): Activity(ended=(2, 1, 0), waits=hist(3, 4, 4), runs=hist(7, 7, 9)),
            (T0 + M, "a"): Activity(ended=(1, 0, 1), waits=hist(0), runs=hist(20)),
            (T0 + 2 * M, "b"): Activity(ended=(0, 0, 5)),
            (T0 + 5 * M, "a"): Activity(ended=(9, 0, 0)),  # past the range read
        }
    )
    # The same minute again: counts summed.
    assert store.add_activity({(T0, "a"): Activity(ended=(1, 0, 0), waits=hist(4), runs=hist(7))})
    found = store.activity(T0, T0 + 3 * M, 120)
    assert set(found) == {(0, "a"), (1, "b")}
    a = found[0, "a"]
    assert a.ended == (4, 1, 1)
    assert a.waits == hist(0, 3, 4, 4, 4)
    assert a.runs == hist(7, 7, 7, 9, 20)
    assert a.depth is None
    assert found[1, "b"].ended == (0, 0, 5)


def test_depths_keep_the_deepest_of_a_minute_and_leave_the_counts(store: IJobStore) -> None:
    if not store.keeps_activity:
        return
    assert store.add_activity({(T0, "a"): Activity(ended=(1, 0, 0))})
    assert store.add_activity({(T0, "a"): Activity(depth=7), (T0 + M, "a"): Activity(depth=2)})
    assert store.add_activity({(T0, "a"): Activity(depth=3)})
    per_minute = store.activity(T0, T0 + 2 * M, 60)
    assert per_minute[0, "a"] == Activity(ended=(1, 0, 0), depth=7)
    assert per_minute[1, "a"].depth == 2
    assert store.activity(T0, T0 + 2 * M, 120)[0, "a"].depth == 7


def test_the_mark_moves_by_compare_and_set_with_the_minutes(store: IJobStore) -> None:
    if not store.keeps_activity:
        return
    assert store.activity_mark() is None
    first = ActivityMark(T0, T0 + M)
    assert store.add_activity({(T0, "a"): Activity(ended=(1, 0, 0))}, moved=(None, first))
    assert store.activity_mark() == first
    # A second first leader, or one that read the mark before it moved: nothing added.
    assert not store.add_activity({(T0, "a"): Activity(ended=(5, 0, 0))}, moved=(None, first))
    stale = ActivityMark(T0, T0)
    assert not store.add_activity(
        {(T0, "a"): Activity(ended=(5, 0, 0))}, moved=(stale, ActivityMark(T0, T0 + 2 * M))
    )
    assert store.activity(T0, T0 + M, 60)[0, "a"].ended == (1, 0, 0)
    second = ActivityMark(T0, T0 + 2 * M)
    assert store.add_activity({(T0 + M, "a"): Activity(ended=(0, 1, 0))}, moved=(first, second))
    assert store.activity_mark() == second


def test_forgetting_deletes_old_minutes_and_moves_the_first_minute(store: IJobStore) -> None:
    if not store.keeps_activity:
        return
    hour = 60 * M
    mark = ActivityMark(T0, T0 + 2 * hour)
    minutes = {(T0 + i * 30 * M, "a"): Activity(ended=(1, 0, 0)) for i in range(4)}
    assert store.add_activity(minutes, moved=(None, mark))
    assert store.forget_activity(T0 + hour) > 0  # on an hour: no coarser row cut in two
    assert set(store.activity(T0, T0 + 2 * hour, 60)) == {(60, "a"), (90, "a")}
    assert store.activity(T0, T0 + 2 * hour, 3600) == {(1, "a"): Activity(ended=(2, 0, 0))}
    assert store.activity_mark() == ActivityMark(T0 + hour, T0 + 2 * hour)


def test_buckets_of_a_quarter_or_an_hour_add_up_the_same_minutes(store: IJobStore) -> None:
    # The SQL stores read their quarter and hour rows for such buckets (records.activity
    # GRAINS): the same figures as the minutes added up, a minute's depth included.
    if not store.keeps_activity:
        return
    minutes = {
        (T0 + i * 7 * M, "a"): Activity(ended=(1, i % 2, 0), runs=hist(i % 5), depth=i)
        for i in range(40)  # 280 minutes: across five hours
    }
    assert store.add_activity(minutes)
    assert store.add_activity({(T0 + 61 * M, "b"): Activity(ended=(0, 0, 1), depth=50)})
    per_minute = store.activity(T0, T0 + 300 * M, 60)
    for bucket_seconds in (900, 3600, 7200):
        found = store.activity(T0, T0 + 300 * M, bucket_seconds)
        expected: dict[tuple[int, str], Activity] = {}
        for (i, channel), a in per_minute.items():
            key = (i * 60 // bucket_seconds, channel)
            expected[key] = a if key not in expected else expected[key].plus(a)
        assert found == expected
    # A range that does not start on an hour reads minutes: the same answer still.
    expected = {}
    for (_, channel), a in store.activity(T0 + 7 * M, T0 + 67 * M, 60).items():
        expected[0, channel] = a if (0, channel) not in expected else expected[0, channel].plus(a)
    assert store.activity(T0 + 7 * M, T0 + 67 * M, 3600) == expected
    assert expected[0, "a"].ended == (9, 5, 0) and expected[0, "a"].depth == 9
