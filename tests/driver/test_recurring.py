"""Recurring schedules on the stub broker and the memory store.

Most tests fire slots with :func:`fire_due` at a chosen ``now`` (no worker);
one lets the Dramatiq worker's sweep fire a per-second schedule for real. The
daylight-saving rules are the cron module's (``tests/unit/test_cron.py``).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CallableExecutor,
    ConfigError,
    Context,
    InvalidPriorityError,
    Job,
    Status,
    Task,
    UnknownScheduleError,
    Workflow,
    get_job_store,
    list_recurring,
    recurring,
    remove_recurring,
    trigger_recurring,
    workflow_task,
)
from pypepper_dramatiq.rules.cron import firing_id
from pypepper_dramatiq.schedules.firing import fire_due

from .conftest import CHANNEL

_lock = threading.Lock()
RUNS: list[str | None] = []


@workflow_task(name="driver-recurring.tick")
def tick(task: Task, context: Context) -> str:
    with _lock:
        RUNS.append(context.job_id)
    return "ticked"


def template() -> Job:
    job = Job(category="recurring", channel_id=CHANNEL)
    job.workflows.append(Workflow([tick.task(name="tick")]))
    return job


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


def jobs_of(name: str) -> list[Any]:
    return [r for r in get_job_store().list(category="recurring") if r.id.startswith("rec-")]


@pytest.fixture(autouse=True)
def broker(stub_broker: StubBroker) -> StubBroker:
    """``setup()`` on the stub broker with the memory store (no worker unless asked)."""
    return stub_broker


# -- storing ----------------------------------------------------------------------------


def test_a_schedule_is_stored_listed_replaced_and_removed() -> None:
    stored = recurring("hourly", "0 * * * *", template(), timezone="Europe/Paris")
    assert stored.next_slot > datetime.now(timezone.utc)
    assert stored.next_slot.minute == 0 and stored.next_slot.second == 0
    [listed] = list_recurring()
    assert (listed.name, listed.cron, listed.timezone) == ("hourly", "0 * * * *", "Europe/Paris")
    assert listed.template["payload"]["workflows"][0]["tasks"][0]["name"] == "tick"

    # Same expression and zone: the next slot is kept; a new one starts afresh.
    get_job_store().advance_recurring(listed.evolve(next_slot=at(2020, 1, 1)))
    assert recurring("hourly", "0 * * * *", template(), timezone="Europe/Paris").next_slot == (
        at(2020, 1, 1)
    )
    assert recurring("hourly", "30 * * * *", template()).next_slot.minute == 30

    assert remove_recurring("hourly") is True
    assert remove_recurring("hourly") is False
    assert list_recurring() == []


@pytest.mark.parametrize(
    ("args", "options", "error", "named"),
    [
        (("bad", "61 * * * *"), {}, ConfigError, "61 \\* \\* \\* \\*"),
        (("bad", "not cron"), {}, ConfigError, "not cron"),
        (("bad", "* * * * *"), {"timezone": "Mars/Base"}, ConfigError, "Mars/Base"),
        (("bad", "* * * * *"), {"overlap": "queue"}, ValueError, "queue"),
        (("bad", "* * * * *"), {"catch_up": "some"}, ValueError, "some"),
        (("bad", "* * * * *"), {"max_start_delay": -1}, ValueError, "max_start_delay"),
        (("bad", "* * * * *"), {"max_start_delay": 0.0005}, ValueError, "max_start_delay"),
        (("", "* * * * *"), {}, ValueError, "name"),
        (("bad", "* * * * *"), {"priority": 10}, InvalidPriorityError, "priority"),
        (("bad", "* * * * *"), {"priority": "9"}, InvalidPriorityError, "priority"),
    ],
)
def test_bad_schedules_are_named_and_store_nothing(
    args: tuple[str, str], options: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        recurring(*args, template(), **options)
    assert list_recurring() == []


def test_a_template_whose_tasks_cannot_be_rebuilt_is_refused() -> None:
    job = Job(channel_id=CHANNEL)
    inline = CallableExecutor(lambda task, context: None)  # never registered
    job.workflows.append(Workflow([Task(CHANNEL, "dag", "fp", "inline", None, "", None, inline)]))
    with pytest.raises(ValueError, match="registered executor"):
        recurring("inline", "* * * * *", job)
    assert list_recurring() == []


# -- firing -----------------------------------------------------------------------------


def _due_at(name: str, slot: datetime) -> None:
    """Make ``name``'s next slot ``slot`` (as if the workers had been down since)."""
    store = get_job_store()
    schedule = store.get_recurring(name)
    assert schedule is not None
    assert store.advance_recurring(schedule.evolve(next_slot=slot))


def test_each_slot_fires_once_however_often_it_is_fired() -> None:
    recurring("minutely", "* * * * *", template(), catch_up="all", overlap="allow")
    _due_at("minutely", at(2026, 1, 1, 12, 0))
    now = at(2026, 1, 1, 12, 2, 30)

    fired = fire_due(now)
    assert fired == [firing_id("minutely", at(2026, 1, 1, 12, m)) for m in (0, 1, 2)]
    # Another process that read the schedule before it moved fires the same slots again:
    _due_at("minutely", at(2026, 1, 1, 12, 0))
    assert fire_due(now) == []
    assert sorted(r.id for r in jobs_of("minutely")) == sorted(fired)
    schedule = get_job_store().get_recurring("minutely")
    assert schedule is not None and schedule.next_slot == at(2026, 1, 1, 12, 3)
    assert schedule.last_slot == at(2026, 1, 1, 12, 2) and schedule.last_job_id == fired[-1]


@pytest.mark.parametrize(
    ("catch_up", "fired_slots"), [("latest", [3]), ("none", []), ("all", [1, 2, 3])]
)
def test_catch_up_after_downtime(catch_up: str, fired_slots: list[int]) -> None:
    recurring("hourly", "0 * * * *", template(), catch_up=catch_up, overlap="allow")
    _due_at("hourly", at(2026, 1, 1, 1))
    fired = fire_due(at(2026, 1, 1, 3, 20))
    assert fired == [firing_id("hourly", at(2026, 1, 1, h)) for h in fired_slots]
    schedule = get_job_store().get_recurring("hourly")
    assert schedule is not None and schedule.next_slot == at(2026, 1, 1, 4)


def test_none_still_fires_a_slot_that_is_on_time() -> None:
    recurring("hourly", "0 * * * *", template(), catch_up="none")
    _due_at("hourly", at(2026, 1, 1, 3))
    assert fire_due(at(2026, 1, 1, 3, 0, 2)) == [firing_id("hourly", at(2026, 1, 1, 3))]


@pytest.mark.parametrize("catch_up", ["latest", "none", "all"])
def test_ticks_a_little_late_drop_no_slot_of_a_per_second_schedule(catch_up: str) -> None:
    # The sweep's tick is a 1 s wait plus its own work: 1.1 s apart, each second's slot
    # still fires exactly once, whatever catch_up says (the slots are on time).
    recurring("per-second", "* * * * * *", template(), catch_up=catch_up, overlap="allow")
    start = at(2026, 1, 1, 12)
    _due_at("per-second", start + timedelta(seconds=1))
    fired: list[str] = []
    now = start
    for _ in range(55):  # 60.5 s of ticks
        now += timedelta(seconds=1.1)
        fired += fire_due(now)
    expected = [
        firing_id("per-second", start + timedelta(seconds=s)) for s in range(1, int(60.5) + 1)
    ]
    assert fired == expected
    assert sorted(r.id for r in jobs_of("per-second")) == sorted(expected)


def test_overlap_skip_fires_nothing_while_the_previous_firing_is_active() -> None:
    recurring("skip", "* * * * *", template(), overlap="skip")
    _due_at("skip", at(2026, 1, 1, 12, 0))
    [first] = fire_due(at(2026, 1, 1, 12, 0, 1))
    assert fire_due(at(2026, 1, 1, 12, 1, 1)) == []  # the first is still Scheduled
    recurring("allow", "* * * * *", template(), overlap="allow")
    _due_at("allow", at(2026, 1, 1, 12, 0))
    assert len(fire_due(at(2026, 1, 1, 12, 0, 1))) == 1
    assert len(fire_due(at(2026, 1, 1, 12, 1, 1))) == 1
    record = get_job_store().get(first)
    assert record is not None and record.unique_key == "recurring:skip"


def test_a_firing_s_deadline_counts_from_its_slot() -> None:
    recurring("late", "0 * * * *", template(), max_start_delay=60)
    _due_at("late", at(2026, 1, 1, 3))
    [job_id] = fire_due(at(2026, 1, 1, 3, 30))
    record = get_job_store().get(job_id)
    assert record is not None
    assert record.start_deadline == at(2026, 1, 1, 3, 1)


def test_each_firing_takes_the_schedule_s_priority_else_the_template_s() -> None:
    recurring("urgent", "0 0 1 1 *", template(), priority=8)
    own = template()
    own.priority = 3
    recurring("own", "0 0 1 1 *", own)
    recurring("plain", "0 0 1 1 *", template())
    fired = [trigger_recurring(name, at(2026, 1, 1, 12)) for name in ("urgent", "own", "plain")]
    records = [get_job_store().get(job_id) for job_id in fired]
    assert [Job.from_record(r).priority for r in records if r is not None] == [8, 3, 0]


def test_trigger_fires_now_and_unknown_names_are_refused() -> None:
    recurring("manual", "0 0 1 1 *", template())
    job_id = trigger_recurring("manual", at(2026, 1, 1, 12))
    record = get_job_store().get(job_id)
    assert record is not None and record.status is Status.SCHEDULED
    # While that firing is active, a trigger returns it (overlap="skip"), and a
    # trigger of the same instant returns the job that instant fired.
    assert trigger_recurring("manual", at(2026, 1, 1, 12, 0, 5)) == job_id
    assert trigger_recurring("manual", at(2026, 1, 1, 12)) == job_id
    assert [r.id for r in jobs_of("manual")] == [job_id]
    with pytest.raises(UnknownScheduleError, match="nope"):
        trigger_recurring("nope")


def test_the_worker_sweep_fires_a_per_second_schedule(stub_worker: dramatiq.Worker) -> None:
    with _lock:
        RUNS.clear()
    recurring("every-second", "* * * * * *", template(), overlap="allow")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with _lock:
            if len(RUNS) >= 2:
                break
        time.sleep(0.05)
    with _lock:
        runs = list(RUNS)
    assert len(runs) >= 2, runs
    assert len(set(runs)) == len(runs)  # each firing ran once
    stored = {r.id: r for r in jobs_of("every-second")}
    assert all(job_id in stored for job_id in runs)
    assert all(job_id is not None and job_id.startswith("rec-") for job_id in runs)
    assert timedelta(0) <= datetime.now(timezone.utc) - min(r.created for r in stored.values())
