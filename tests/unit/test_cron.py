"""Recurring schedules: cron slots across time zones and DST, catch-up, firing ids."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from pypepper_dramatiq.errors import ConfigError
from pypepper_dramatiq.rules import cron
from pypepper_dramatiq.rules.cron import (
    CATCH_UP,
    CATCH_UP_LIMIT,
    ON_TIME_SECONDS,
    OVERLAP,
    CronSchedule,
    check_choice,
    check_name,
    due_slots,
    firing_id,
)

UTC = timezone.utc
NEW_YORK = "America/New_York"


def at(*parts: int) -> datetime:
    """An aware UTC datetime."""
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type]


def between(schedule: CronSchedule, after: datetime, until: datetime) -> list[datetime]:
    return list(schedule.slots_between(after, until))


def test_the_tz_database_is_available() -> None:
    assert ZoneInfo(NEW_YORK).utcoffset(datetime(2026, 1, 15)) == timedelta(hours=-5)


def test_constants() -> None:
    assert CATCH_UP == ("latest", "none", "all")
    assert OVERLAP == ("skip", "allow")
    assert CATCH_UP_LIMIT == 100
    assert ON_TIME_SECONDS == 10.0


# -- UTC basics ------------------------------------------------------------------------


def test_every_minute_in_utc() -> None:
    schedule = CronSchedule("* * * * *")
    assert schedule.timezone == "UTC"
    assert schedule.next_after(at(2026, 1, 1, 0, 0, 30)) == at(2026, 1, 1, 0, 1)
    assert between(schedule, at(2026, 1, 1), at(2026, 1, 1, 0, 3)) == [
        at(2026, 1, 1, 0, 1),
        at(2026, 1, 1, 0, 2),
        at(2026, 1, 1, 0, 3),
    ]


def test_next_after_is_strictly_after_and_in_utc() -> None:
    schedule = CronSchedule("0 * * * *")
    slot = schedule.next_after(at(2026, 1, 1, 5))
    assert slot == at(2026, 1, 1, 6)
    assert slot.tzinfo is UTC
    assert schedule.next_after(at(2026, 1, 1, 5, 59, 59, 999999)) == at(2026, 1, 1, 6)


def test_next_after_accepts_any_aware_instant() -> None:
    paris = datetime(2026, 1, 1, 6, 0, tzinfo=ZoneInfo("Europe/Paris"))  # 05:00 UTC
    slot = CronSchedule("0 * * * *").next_after(paris)
    assert slot == at(2026, 1, 1, 6)
    assert slot.tzinfo is UTC


def test_six_fields_fire_every_second() -> None:
    schedule = CronSchedule("* * * * * *")
    assert schedule.next_after(at(2026, 1, 1)) == at(2026, 1, 1, 0, 0, 1)
    assert schedule.next_after(at(2026, 1, 1, 0, 0, 0, 500)) == at(2026, 1, 1, 0, 0, 1)
    assert between(schedule, at(2026, 1, 1), at(2026, 1, 1, 0, 0, 3)) == [
        at(2026, 1, 1, 0, 0, 1),
        at(2026, 1, 1, 0, 0, 2),
        at(2026, 1, 1, 0, 0, 3),
    ]


def test_the_first_of_six_fields_is_seconds() -> None:
    schedule = CronSchedule("30 0 * * * *")  # minute 0 of each hour, at second 30
    assert schedule.next_after(at(2026, 1, 1)) == at(2026, 1, 1, 0, 0, 30)
    assert schedule.next_after(at(2026, 1, 1, 0, 0, 30)) == at(2026, 1, 1, 1, 0, 30)


def test_the_readmes_six_field_example_fires_every_ten_seconds() -> None:
    # Across a minute and an hour boundary: six slots a minute, never 60.
    schedule = CronSchedule("*/10 * * * * *")
    assert between(schedule, at(2026, 1, 1, 10, 59, 35), at(2026, 1, 1, 11, 0, 25)) == [
        at(2026, 1, 1, 10, 59, 40),
        at(2026, 1, 1, 10, 59, 50),
        at(2026, 1, 1, 11),
        at(2026, 1, 1, 11, 0, 10),
        at(2026, 1, 1, 11, 0, 20),
    ]


def test_second_zero_of_six_fields_fires_once_a_minute() -> None:
    schedule = CronSchedule("0 * * * * *")  # the job system we follow: once a minute
    assert between(schedule, at(2026, 1, 1, 10, 58, 30), at(2026, 1, 1, 11, 1, 30)) == [
        at(2026, 1, 1, 10, 59),
        at(2026, 1, 1, 11),
        at(2026, 1, 1, 11, 1),
    ]


def test_a_seconds_last_expression_is_no_longer_read_so() -> None:
    # Read seconds first, the old "minute 0 at second 30" names a day of week 30.
    with pytest.raises(ConfigError, match="invalid cron expression '0 \\* \\* \\* \\* 30'"):
        CronSchedule("0 * * * * 30")


def test_slots_between_excludes_after_and_includes_until() -> None:
    schedule = CronSchedule("0 * * * *")
    assert between(schedule, at(2026, 1, 1, 1), at(2026, 1, 1, 3)) == [
        at(2026, 1, 1, 2),
        at(2026, 1, 1, 3),
    ]
    assert between(schedule, at(2026, 1, 1, 1), at(2026, 1, 1, 1)) == []
    assert between(schedule, at(2026, 1, 1, 1), at(2026, 1, 1, 1, 59, 59)) == []
    assert between(schedule, at(2026, 1, 1, 3), at(2026, 1, 1, 1)) == []


def test_a_half_hour_zone() -> None:
    schedule = CronSchedule("0 9 * * *", "Asia/Kolkata")  # UTC+05:30, no DST
    assert between(schedule, at(2026, 6, 1), at(2026, 6, 3)) == [
        at(2026, 6, 1, 3, 30),
        at(2026, 6, 2, 3, 30),
    ]


# -- spring-forward gaps -----------------------------------------------------------------


def test_new_york_gap_fires_once_at_the_transition() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT at 07:00 UTC; 02:30 does not exist.
    schedule = CronSchedule("30 2 * * *", NEW_YORK)
    slots = between(schedule, at(2026, 3, 7, 12), at(2026, 3, 9, 12))
    assert slots == [at(2026, 3, 8, 7), at(2026, 3, 9, 6, 30)]
    local = slots[0].astimezone(ZoneInfo(NEW_YORK))
    assert (local.day, local.hour, local.minute) == (8, 3, 0)
    assert schedule.next_after(at(2026, 3, 8, 6, 59, 59)) == at(2026, 3, 8, 7)
    assert schedule.next_after(at(2026, 3, 8, 7)) == at(2026, 3, 9, 6, 30)


def test_paris_gap_fires_once_at_the_transition() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST at 01:00 UTC.
    schedule = CronSchedule("30 2 * * *", "Europe/Paris")
    assert between(schedule, at(2026, 3, 27, 12), at(2026, 3, 30, 12)) == [
        at(2026, 3, 28, 1, 30),
        at(2026, 3, 29, 1),
        at(2026, 3, 30, 0, 30),
    ]


def test_slots_in_a_gap_collapse_into_one() -> None:
    schedule = CronSchedule("*/15 2 * * *", NEW_YORK)
    assert between(schedule, at(2026, 3, 7, 12), at(2026, 3, 9)) == [at(2026, 3, 8, 7)]
    paris = CronSchedule("*/15 2 * * *", "Europe/Paris")
    assert between(paris, at(2026, 3, 28, 12), at(2026, 3, 29, 23)) == [at(2026, 3, 29, 1)]


def test_gap_slots_merge_with_the_slot_at_the_transition() -> None:
    # 02:00-02:45 are skipped and map to 07:00 UTC, where 03:00 EDT fires too.
    schedule = CronSchedule("*/15 2,3 * * *", NEW_YORK)
    assert between(schedule, at(2026, 3, 7, 12), at(2026, 3, 9)) == [
        at(2026, 3, 8, 7),
        at(2026, 3, 8, 7, 15),
        at(2026, 3, 8, 7, 30),
        at(2026, 3, 8, 7, 45),
    ]


def test_lord_howe_half_hour_gap() -> None:
    # 2026-10-04: 02:00 (+10:30) jumps to 02:30 (+11:00) at 15:30 UTC the day before.
    daily = CronSchedule("15 2 * * *", "Australia/Lord_Howe")
    assert between(daily, at(2026, 10, 2), at(2026, 10, 5)) == [
        at(2026, 10, 2, 15, 45),
        at(2026, 10, 3, 15, 30),
        at(2026, 10, 4, 15, 15),
    ]
    every_ten = CronSchedule("*/10 2 * * *", "Australia/Lord_Howe")
    assert between(every_ten, at(2026, 10, 3, 12), at(2026, 10, 4, 12)) == [
        at(2026, 10, 3, 15, 30),
        at(2026, 10, 3, 15, 40),
        at(2026, 10, 3, 15, 50),
    ]


# -- autumn folds --------------------------------------------------------------------------


def test_a_repeated_wall_time_fires_once_at_its_first_occurrence() -> None:
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST at 06:00 UTC; 01:30 happens twice.
    schedule = CronSchedule("30 1 * * *", NEW_YORK)
    assert between(schedule, at(2026, 10, 31, 12), at(2026, 11, 2, 12)) == [
        at(2026, 11, 1, 5, 30),
        at(2026, 11, 2, 6, 30),
    ]


def test_hourly_skips_the_repeated_hour() -> None:
    schedule = CronSchedule("0 * * * *", NEW_YORK)
    assert between(schedule, at(2026, 11, 1, 3, 30), at(2026, 11, 1, 8, 30)) == [
        at(2026, 11, 1, 4),
        at(2026, 11, 1, 5),
        at(2026, 11, 1, 7),
        at(2026, 11, 1, 8),
    ]


@pytest.mark.parametrize("expression", ["*/30 * * * *", "* * * * *", "* * * * * *"])
def test_starting_inside_the_repeated_hour(expression: str) -> None:
    # 06:15 UTC is 01:15 EST, the second pass: the rest of the hour already fired.
    schedule = CronSchedule(expression, NEW_YORK)
    assert schedule.next_after(at(2026, 11, 1, 6, 15)) == at(2026, 11, 1, 7)
    assert schedule.next_after(at(2026, 11, 1, 6)) == at(2026, 11, 1, 7)


def test_starting_in_the_first_pass_of_the_repeated_hour() -> None:
    schedule = CronSchedule("*/30 * * * *", NEW_YORK)
    assert schedule.next_after(at(2026, 11, 1, 5, 15)) == at(2026, 11, 1, 5, 30)
    assert schedule.next_after(at(2026, 11, 1, 5, 30)) == at(2026, 11, 1, 7)
    per_second = CronSchedule("* * * * * *", NEW_YORK)
    assert per_second.next_after(at(2026, 11, 1, 5, 59, 59)) == at(2026, 11, 1, 7)


def test_hourly_for_a_year_loses_only_the_skipped_hour() -> None:
    schedule = CronSchedule("0 * * * *", NEW_YORK)
    slots = between(schedule, at(2025, 12, 31, 23, 59), at(2026, 12, 31, 23, 59))
    # Every UTC hour of 2026 fires but 06:00 on Nov 1 (01:00 EST, the repeated hour);
    # the skipped 02:00 of Mar 8 fires at 07:00 UTC together with 03:00 EDT.
    assert len(slots) == 8760 - 1
    assert at(2026, 11, 1, 6) not in slots
    assert at(2026, 3, 8, 7) in slots
    assert all(a < b for a, b in pairwise(slots))
    assert len(set(slots)) == len(slots)


@pytest.mark.parametrize(
    ("zone", "start"),
    [
        (NEW_YORK, at(2026, 3, 8, 5)),
        (NEW_YORK, at(2026, 11, 1, 4)),
        ("Europe/Paris", at(2026, 10, 25, 0)),
        ("Australia/Lord_Howe", at(2026, 4, 4, 13)),
        ("Australia/Lord_Howe", at(2026, 10, 3, 14)),
    ],
)
def test_forward_and_backward_walks_agree_around_transitions(zone: str, start: datetime) -> None:
    schedule = CronSchedule("*/10 * * * *", zone)
    for step in range(0, 4 * 60, 7):
        now = start + timedelta(minutes=step, seconds=3)
        expected = between(schedule, now - timedelta(hours=2), now)
        assert expected, now
        fired, following = due_slots(schedule, expected[0], now, "all")
        assert fired == expected, now
        assert following == schedule.next_after(now) > now


# -- catch-up ------------------------------------------------------------------------------


HOURLY = CronSchedule("0 * * * *")
MINUTELY = CronSchedule("* * * * *")


def test_nothing_due_keeps_the_next_slot() -> None:
    next_slot = at(2026, 1, 1, 14)
    for catch_up in CATCH_UP:
        fired, following = due_slots(HOURLY, next_slot, at(2026, 1, 1, 13, 59, 59), catch_up)
        assert fired == []
        assert following is next_slot


def test_hourly_outage_catch_up_latest() -> None:
    # Slots 10:00 to 13:00 are due; at 13:20 the latest one is 20 minutes late.
    fired, following = due_slots(HOURLY, at(2026, 1, 1, 10), at(2026, 1, 1, 13, 20), "latest")
    assert fired == [at(2026, 1, 1, 13)]
    assert following == at(2026, 1, 1, 14)


def test_hourly_outage_catch_up_none() -> None:
    fired, following = due_slots(HOURLY, at(2026, 1, 1, 10), at(2026, 1, 1, 13, 20), "none")
    assert fired == []
    assert following == at(2026, 1, 1, 14)


def test_hourly_outage_catch_up_all() -> None:
    fired, following = due_slots(HOURLY, at(2026, 1, 1, 10), at(2026, 1, 1, 13, 20), "all")
    assert fired == [at(2026, 1, 1, 10), at(2026, 1, 1, 11), at(2026, 1, 1, 12), at(2026, 1, 1, 13)]
    assert following == at(2026, 1, 1, 14)


def test_catch_up_none_fires_an_on_time_slot() -> None:
    now = at(2026, 1, 1, 13, 0, 5)
    fired, following = due_slots(HOURLY, at(2026, 1, 1, 10), now, "none")
    assert fired == [at(2026, 1, 1, 13)]
    assert following == at(2026, 1, 1, 14)
    fired, _ = due_slots(HOURLY, at(2026, 1, 1, 13), now, "none")
    assert fired == [at(2026, 1, 1, 13)]


def test_on_time_boundary() -> None:
    slot = at(2026, 1, 1, 13)
    on_time = slot + timedelta(seconds=ON_TIME_SECONDS)
    assert due_slots(MINUTELY, slot, on_time, "none")[0] == [slot]
    late = on_time + timedelta(microseconds=1)
    assert due_slots(MINUTELY, slot, late, "none")[0] == []
    assert due_slots(MINUTELY, slot, late, "latest")[0] == [slot]


def test_minutely_outage() -> None:
    next_slot, now = at(2026, 1, 1, 10), at(2026, 1, 1, 13, 0, 30)  # 181 slots due
    assert due_slots(MINUTELY, next_slot, now, "latest") == (
        [at(2026, 1, 1, 13)],
        at(2026, 1, 1, 13, 1),
    )
    assert due_slots(MINUTELY, next_slot, now, "none") == ([], at(2026, 1, 1, 13, 1))
    fired, following = due_slots(MINUTELY, next_slot, now, "all")
    assert len(fired) == CATCH_UP_LIMIT
    assert fired[0] == at(2026, 1, 1, 11, 21)
    assert fired[-1] == at(2026, 1, 1, 13)
    assert following == at(2026, 1, 1, 13, 1)


def test_catch_up_all_after_a_week_keeps_the_most_recent_slots() -> None:
    now = at(2026, 1, 8, 0, 0, 5)
    fired, following = due_slots(MINUTELY, at(2026, 1, 1), now, "all")
    assert fired == between(MINUTELY, at(2026, 1, 7, 22, 20), at(2026, 1, 8))
    assert len(fired) == CATCH_UP_LIMIT
    assert all(a < b for a, b in pairwise(fired))
    assert following == at(2026, 1, 8, 0, 1)
    assert following > now


def test_catch_up_all_after_a_month_of_per_second_slots_is_bounded() -> None:
    schedule = CronSchedule("* * * * * *")
    now = at(2026, 2, 1) + timedelta(microseconds=500_000)
    fired, following = due_slots(schedule, at(2026, 1, 1), now, "all")
    assert len(fired) == CATCH_UP_LIMIT
    assert fired[0] == at(2026, 1, 31, 23, 58, 21)
    assert fired[-1] == at(2026, 2, 1)
    assert following == at(2026, 2, 1, 0, 0, 1)
    # The last ten seconds' slots are on time: they fire whatever catch_up says.
    on_time = between(schedule, at(2026, 1, 31, 23, 59, 50), at(2026, 2, 1))
    assert len(on_time) == 10
    assert due_slots(schedule, at(2026, 1, 1), now, "latest")[0] == on_time
    assert due_slots(schedule, at(2026, 1, 1), now, "none")[0] == on_time


PER_SECOND = CronSchedule("* * * * * *")


@pytest.mark.parametrize("catch_up", CATCH_UP)
def test_a_late_tick_fires_every_on_time_slot(catch_up: str) -> None:
    # A tick 1.1 s after the last finds two slots due, both on time: neither is dropped.
    next_slot = at(2026, 1, 1, 12, 0, 1)
    now = at(2026, 1, 1, 12, 0, 2) + timedelta(milliseconds=100)
    fired, following = due_slots(PER_SECOND, next_slot, now, catch_up)
    assert fired == [at(2026, 1, 1, 12, 0, 1), at(2026, 1, 1, 12, 0, 2)]
    assert following == at(2026, 1, 1, 12, 0, 3)


@pytest.mark.parametrize("catch_up", CATCH_UP)
def test_a_tick_late_by_the_whole_window_still_fires_each_slot(catch_up: str) -> None:
    next_slot = at(2026, 1, 1, 12, 0, 1)
    now = next_slot + timedelta(seconds=ON_TIME_SECONDS)
    fired, _ = due_slots(PER_SECOND, next_slot, now, catch_up)
    assert fired == between(PER_SECOND, at(2026, 1, 1, 12), now)
    assert len(fired) == ON_TIME_SECONDS + 1


def test_catch_up_decides_only_the_slots_beyond_the_window() -> None:
    # Slots 12:00:00 .. 12:00:30 due at 12:00:30.5: 12:00:21 .. 12:00:30 are on time.
    next_slot, now = at(2026, 1, 1, 12), at(2026, 1, 1, 12, 0, 30) + timedelta(milliseconds=500)
    on_time = between(PER_SECOND, at(2026, 1, 1, 12, 0, 20), now)
    assert due_slots(PER_SECOND, next_slot, now, "none")[0] == on_time
    assert due_slots(PER_SECOND, next_slot, now, "latest")[0] == on_time
    assert due_slots(PER_SECOND, next_slot, now, "all")[0] == between(
        PER_SECOND, next_slot - timedelta(seconds=1), now
    )
    # Nothing on time: "latest" fires the most recent missed slot alone.
    minutely_now = at(2026, 1, 1, 12, 0, 30)
    assert due_slots(MINUTELY, at(2026, 1, 1, 11), minutely_now, "latest")[0] == [
        at(2026, 1, 1, 12)
    ]


def test_catch_up_all_across_a_gap_has_no_duplicates() -> None:
    schedule = CronSchedule("*/15 2,3 * * *", NEW_YORK)
    fired, following = due_slots(schedule, at(2026, 3, 7, 7), at(2026, 3, 8, 7, 20), "all")
    assert fired == [
        *(at(2026, 3, 7, 7) + timedelta(minutes=15 * i) for i in range(8)),
        at(2026, 3, 8, 7),
        at(2026, 3, 8, 7, 15),
    ]
    assert following == at(2026, 3, 8, 7, 30)


def test_catch_up_inside_the_repeated_hour() -> None:
    schedule = CronSchedule("*/30 * * * *", NEW_YORK)
    now = at(2026, 11, 1, 6, 45)  # 01:45 EST, second pass
    fired, following = due_slots(schedule, at(2026, 11, 1, 5), now, "all")
    assert fired == [at(2026, 11, 1, 5), at(2026, 11, 1, 5, 30)]
    assert following == at(2026, 11, 1, 7)


def test_unknown_catch_up() -> None:
    with pytest.raises(ValueError, match=r"catch_up must be one of .*got 'sometimes'"):
        due_slots(HOURLY, at(2026, 1, 1), at(2026, 1, 2), "sometimes")


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression", ["61 * * * *", "not cron", "", "* * * * * * 2027", "0 0 30 2 *"]
)
def test_bad_cron_expression(expression: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"invalid cron expression {expression!r}")):
        CronSchedule(expression)


@pytest.mark.parametrize("expression", [None, 5, ["*"] * 5])
def test_cron_expression_must_be_a_string(expression: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(repr(expression))):
        CronSchedule(expression)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Base", "", "../x", "/etc/passwd", 3, None])
def test_unknown_time_zone(zone: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"unknown time zone {zone!r}")) as info:
        CronSchedule("* * * * *", zone)  # type: ignore[arg-type]
    assert "IANA" in str(info.value)


def test_missing_croniter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cron, "_croniter", None)
    with pytest.raises(ConfigError, match=re.escape("pip install croniter")):
        CronSchedule("* * * * *")


def test_naive_datetimes_are_refused() -> None:
    naive, aware = datetime(2026, 1, 1), at(2026, 1, 1)
    with pytest.raises(ValueError, match="instant"):
        HOURLY.next_after(naive)
    with pytest.raises(ValueError, match="after"):
        HOURLY.slots_between(naive, aware)
    with pytest.raises(ValueError, match="until"):
        HOURLY.slots_between(aware, naive)
    with pytest.raises(ValueError, match="next_slot"):
        due_slots(HOURLY, naive, aware, "all")
    with pytest.raises(ValueError, match="now"):
        due_slots(HOURLY, aware, naive, "all")
    with pytest.raises(ValueError, match="slot"):
        firing_id("nightly", naive)


def test_schedules_are_frozen_values() -> None:
    assert CronSchedule("0 * * * *", NEW_YORK) == CronSchedule("0 * * * *", NEW_YORK)
    assert len({CronSchedule("0 * * * *"), CronSchedule("0 * * * *")}) == 1


# -- firing ids and checks -------------------------------------------------------------------


def test_firing_id_format() -> None:
    digest = hashlib.sha256(b"nightly").hexdigest()[:16]
    slot = at(2026, 3, 8, 7)
    assert firing_id("nightly", slot) == f"rec-{digest}-20260308T070000Z"
    same_instant = slot.astimezone(ZoneInfo(NEW_YORK))
    assert firing_id("nightly", same_instant) == firing_id("nightly", slot)


def test_firing_id_is_deterministic_and_distinct() -> None:
    slot = at(2026, 1, 1, 12)
    ident = firing_id("report", slot)
    assert ident == firing_id("report", slot)
    assert len(ident) <= 64
    assert re.fullmatch(r"[A-Za-z0-9-]+", ident)
    assert firing_id("report", slot + timedelta(seconds=1)) != ident
    assert firing_id("report2", slot) != ident
    assert len(firing_id("x" * 128, slot)) <= 64
    assert re.fullmatch(r"[A-Za-z0-9-]+", firing_id("ünïcode name/with spaces", slot))


def test_check_name() -> None:
    assert check_name("nightly") == "nightly"
    assert check_name("n" * 128) == "n" * 128
    for bad, shown in [("", "''"), ("n" * 129, "'nnn"), (None, "None"), (5, "5")]:
        with pytest.raises(ValueError, match="schedule name") as info:
            check_name(bad)
        assert f"got {shown}" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("(129 characters)")):
        check_name("n" * 129)


def test_check_choice() -> None:
    assert check_choice("overlap", "skip", OVERLAP) == "skip"
    with pytest.raises(ValueError) as info:
        check_choice("overlap", "x", OVERLAP)
    assert str(info.value) == "overlap must be one of 'skip', 'allow', got 'x'"
    with pytest.raises(ValueError, match="got None"):
        check_choice("catch_up", None, CATCH_UP)
