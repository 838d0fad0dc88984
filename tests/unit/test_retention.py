"""Retention: durations, the ``retention`` mapping, how it reaches the sweep, what it keeps."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import ConfigError, WorkflowMiddleware, setup
from pypepper_dramatiq.config import duration
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import JobRecord
from pypepper_dramatiq.rules.retention import (
    TOMBSTONE_KEEP,
    awaited,
    still_needed,
    tombstones_expire_before,
)
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.settings import Settings
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.registry import set_job_store

DAY = 86_400.0
RETENTION = {"Completed": "7d", "Failed": "30d", "Cancelled": 3600}


# -- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (3600, 3600.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("12h", 43_200.0),
        ("7d", 7 * DAY),
        ("2w", 14 * DAY),
        ("0.5h", 1800.0),
        (" 7d ", 7 * DAY),
        (timedelta(days=1, hours=1), DAY + 3600),
        ("1 week", 7 * DAY),
        ("2 weeks", 14 * DAY),
        ("1week", 7 * DAY),
        ("2 days", 2 * DAY),
        ("1 day", DAY),
        ("12 hours", 43_200.0),
        ("1 hour", 3600.0),
        ("2 hrs", 7200.0),
        ("90 minutes", 5400.0),
        ("90 mins", 5400.0),
        ("1 minute", 60.0),
        ("30 seconds", 30.0),
        ("1 second", 1.0),
        ("30 secs", 30.0),
        ("1.5 days", 1.5 * DAY),
        ("7 s", 7.0),
        (" 1 Week ", 7 * DAY),
    ],
)
def test_a_duration_is_seconds_or_a_number_and_a_unit(given: object, seconds: float) -> None:
    assert duration("ttl", given) == seconds


@pytest.mark.parametrize(
    "given",
    [
        0,
        -1,
        "0s",
        "-1d",
        "7x",
        "7D",
        "90 M",
        "7 fortnights",
        "1 week 2 days",
        "1 year",
        "days",
        "1d12h",
        "d",
        "",
        float("nan"),
        float("inf"),
        True,
        None,
        [7],
        timedelta(0),
    ],
    ids=repr,
)
def test_a_bad_duration_is_a_config_error_naming_the_option_and_the_value(given: object) -> None:
    with pytest.raises(ConfigError, match=r"^ttl must be a duration > 0") as caught:
        duration("ttl", given)
    assert repr(given) in str(caught.value)
    assert "'2w'" in str(caught.value) and "'1 week'" in str(caught.value)  # the forms accepted


@pytest.mark.parametrize("given", ["5218 weeks", "36526 days", "876601 hours", "52000 weeks"])
def test_a_spelled_out_duration_has_the_same_100_year_bound(given: str) -> None:
    with pytest.raises(ConfigError, match=r"^ttl must be at most .* \(100 years\)"):
        duration("ttl", given)


# -- the retention mapping ---------------------------------------------------------------------


def test_retention_is_checked_once_into_seconds_by_final_status() -> None:
    settings = Settings(retention=RETENTION)
    assert settings.purge_after == {
        Status.COMPLETED: 7 * DAY,
        Status.FAILED: 30 * DAY,
        Status.CANCELLED: 3600.0,
    }
    assert Settings(retention={Status.FAILED: "1h"}).purge_after == {Status.FAILED: 3600.0}
    with pytest.raises(TypeError):  # read-only once checked
        settings.retention["Completed"] = 1  # type: ignore[index]


def test_no_retention_keeps_every_job_by_default() -> None:
    assert Settings().retention is None and Settings().purge_after == {}
    assert Settings(retention={}).purge_after == {}


def test_a_spelled_out_retention_is_the_same_duration() -> None:
    kept = Settings(retention={"Completed": "1 week", "Failed": "30 days"}).purge_after
    assert kept == {Status.COMPLETED: 7 * DAY, Status.FAILED: 30 * DAY}


@pytest.mark.parametrize(
    ("retention", "named"),
    [
        ({"Complete": "7d"}, r"'Complete' is not a final status"),
        ({"completed": "7d"}, r"'completed' is not a final status"),
        ({"Scheduled": "7d"}, r"'Scheduled' is not a final status"),
        ({"InProgress": "7d"}, r"'InProgress' is not a final status"),
        ({1: "7d"}, r"1 is not a final status"),
        ({"Completed": "7 fortnights"}, r"retention\.Completed must be a duration > 0.*'7 f"),
        ({"Failed": 0}, r"retention\.Failed must be a duration > 0.*got 0"),
        (["Completed"], r"retention must be a mapping.*\['Completed'\]"),
        ("7d", r"retention must be a mapping.*'7d'"),
    ],
)
def test_a_bad_retention_is_a_config_error_naming_the_culprit(
    retention: object, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings(retention=retention)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=named):
        setup(broker=StubBroker(), retention=retention)  # type: ignore[arg-type]


def test_setup_hands_retention_to_the_sweeper(fresh_process_state: StubBroker) -> None:
    broker = setup(broker=fresh_process_state, retention=RETENTION)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert middleware.settings.purge_after[Status.COMPLETED] == 7 * DAY
    middleware.start_background(broker)
    try:
        [sweeper] = [t for t in middleware._threads if isinstance(t, RecoverySweeper)]
        assert sweeper.retention == Settings(retention=RETENTION).purge_after
    finally:
        middleware.stop_background()


def test_yaml_scheduler_retention_is_read_and_a_bad_one_named_by_its_key(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(
        "scheduler:\n"
        "  retention:\n"
        "    Completed: 7d\n"
        "    Failed: 2w\n"
        "    Cancelled: 3600\n"
        "  jobStore: {backend: memory}\n"
    )
    broker = setup(broker=StubBroker(), config_path=path)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert middleware.settings.purge_after == {
        Status.COMPLETED: 7 * DAY,
        Status.FAILED: 14 * DAY,
        Status.CANCELLED: 3600.0,
    }
    path.write_text("scheduler:\n  retention:\n    Completed: 1 week\n    Failed: 2 days\n")
    broker = setup(broker=StubBroker(), config_path=path)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert middleware.settings.purge_after == {Status.COMPLETED: 7 * DAY, Status.FAILED: 2 * DAY}
    path.write_text("scheduler:\n  retention:\n    Completed: 7 fortnights\n")
    with pytest.raises(ConfigError, match=r"scheduler\.retention\.Completed must be a duration"):
        setup(broker=StubBroker(), config_path=path)
    path.write_text("scheduler:\n  retention:\n    Done: 7d\n")
    with pytest.raises(ConfigError, match=r"scheduler\.retention: 'Done' is not a final status"):
        setup(broker=StubBroker(), config_path=path)
    path.write_text("scheduler:\n  retention: 7d\n")
    with pytest.raises(ConfigError, match=r"scheduler\.retention must be a mapping"):
        setup(broker=StubBroker(), config_path=path)


# -- what is still needed ----------------------------------------------------------------------


def test_still_needed_keeps_awaited_jobs_and_jobs_with_a_hook_due() -> None:
    waits: list[dict[str, Any] | None] = [
        {"parents": ["p1", "p2"], "on_parent_failure": "cancel"},
        {"parents": [], "key": "k", "holder": "h"},
        None,
    ]
    waited_for = awaited(waits)
    assert waited_for == {"p1", "p2", "h"}
    assert still_needed(JobRecord(id="p1"), waited_for)
    assert still_needed(JobRecord(id="h"), waited_for)
    assert not still_needed(JobRecord(id="x"), waited_for)
    due = {"hooks": {"0.1": {"status": "running", "owner": "w", "until": None}}}
    assert still_needed(JobRecord(id="x", state=due), set())
    ran = {"hooks": {}, "hooks_done": {"0.1": {"ended": "2024-01-01T00:00:00+00:00"}}}
    assert not still_needed(JobRecord(id="x", state=ran), set())


# -- the sweep ---------------------------------------------------------------------------------

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def test_the_sweep_purges_in_full_passes_only_in_bounded_batches_and_logs_the_count(
    fresh_process_state: StubBroker, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    for i in range(25):
        store.put(JobRecord(id=f"old-{i:02}", status=Status.COMPLETED, created=T0, updated=T0))
    now = datetime.now(timezone.utc)
    store.put(JobRecord(id="recent", status=Status.COMPLETED, updated=now - timedelta(days=6)))
    store.put(JobRecord(id="old-failed", status=Status.FAILED, created=T0, updated=T0))
    store.put(JobRecord(id="running", status=Status.IN_PROGRESS, created=T0, updated=T0))
    retention = Settings(retention={"Completed": "7d"}).purge_after
    sweeper = RecoverySweeper(
        fresh_process_state, "me", lease_seconds=30, interval=5, retention=retention
    )
    sweeper.purge_batch, sweeper.purge_batches = 10, 2

    sweeper.sweep(full=False)
    assert len(store.list(status=Status.COMPLETED)) == 26

    caplog.set_level(logging.DEBUG, logger="pypepper_dramatiq.drivers.dramatiq.recovery")
    sweeper.sweep(full=True)
    assert len(store.list(status=Status.COMPLETED)) == 6  # two batches of ten a pass
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "purge"]
    assert record.levelno == logging.INFO
    assert (record.purged, record.by_status) == (20, {"Completed": 20})  # type: ignore[attr-defined]

    caplog.clear()
    assert sweeper.purge_ended(datetime.now(timezone.utc)) == 5
    assert sweeper.purge_ended(datetime.now(timezone.utc)) == 0
    levels = [r.levelno for r in caplog.records if getattr(r, "action", None) == "purge"]
    assert levels == [logging.INFO, logging.DEBUG]
    assert {r.id for r in store.list()} == {"recent", "old-failed", "running"}


def test_a_pass_past_its_purge_budget_starts_no_further_batch_but_each_status_gets_one(
    fresh_process_state: StubBroker,
) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    for i in range(25):
        store.put(JobRecord(id=f"old-{i:02}", status=Status.COMPLETED, created=T0, updated=T0))
        store.put(JobRecord(id=f"failed-{i:02}", status=Status.FAILED, created=T0, updated=T0))
    retention = Settings(retention={"Completed": "7d", "Failed": "7d"}).purge_after
    sweeper = RecoverySweeper(
        fresh_process_state, "me", lease_seconds=30, interval=5, retention=retention
    )
    sweeper.purge_batch, sweeper.purge_batches = 10, 3
    sweeper.purge_share = 0.0  # the budget is spent once a batch ran

    assert sweeper.purge_ended(datetime.now(timezone.utc)) == 20  # one batch per status
    assert len(store.list(status=Status.COMPLETED)) == 15
    assert len(store.list(status=Status.FAILED)) == 15
    sweeper.purge_share = 1.0  # five seconds: the three batches of the pass
    assert sweeper.purge_ended(datetime.now(timezone.utc)) == 30
    assert store.list() == []


def test_without_retention_the_sweep_deletes_nothing(fresh_process_state: StubBroker) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    store.put(JobRecord(id="old", status=Status.COMPLETED, created=T0, updated=T0))
    sweeper = RecoverySweeper(fresh_process_state, "me", lease_seconds=30, interval=5)
    sweeper.sweep(full=True)
    assert sweeper.purge_ended(datetime.now(timezone.utc)) == 0
    assert store.get("old") is not None


def test_a_purged_jobs_tombstone_is_kept_a_week() -> None:
    now = datetime(2024, 3, 10, 12, 0, tzinfo=timezone.utc)
    assert timedelta(days=7) == TOMBSTONE_KEEP
    assert tombstones_expire_before(now) == datetime(2024, 3, 3, 12, 0, tzinfo=timezone.utc)
