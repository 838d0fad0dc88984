"""Durations are bounded where they are given (``durations.MAX_SECONDS``), so that
every date computed from them is a valid datetime; beyond it, NaN or infinite, an
option is refused naming it and the bound."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import CallableExecutor, ConfigError, Job, RetryPolicy, Task, Workflow, setup
from pypepper_dramatiq.config import duration as config_duration
from pypepper_dramatiq.limits.durations import MAX_SECONDS
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.settings import YAML_KEYS, Settings
from pypepper_dramatiq.stores.registry import get_job_store

from .test_start_times import start_times

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
TOO_LONG = MAX_SECONDS * 1.01


def test_the_bound_keeps_every_date_computed_from_it_valid_for_millennia() -> None:
    assert 99 * 365 * 86_400 < MAX_SECONDS < 101 * 365 * 86_400
    far = datetime(7800, 1, 1, tzinfo=timezone.utc)
    assert far + 2 * timedelta(seconds=MAX_SECONDS) < datetime.max.replace(tzinfo=timezone.utc)
    assert NOW - timedelta(seconds=MAX_SECONDS) > datetime.min.replace(tzinfo=timezone.utc)


def job() -> Job:
    made = Job()
    made.workflows = [Workflow([task()])]
    return made


def task(**kw: Any) -> Task:
    return Task("c", "dag", "fp", "t", None, "", [], CallableExecutor(lambda t, c: None), **kw)


# -- scheduled(): delay, eta, max_start_delay -----------------------------------------------


BOUND = r"must be finite and at most 3155760000 seconds \(100 years\)"
ETA_BOUND = r"must be within 3155760000 seconds \(100 years\) of now"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"delay": 1e308}, f"delay {BOUND}"),
        ({"delay": TOO_LONG}, f"delay {BOUND}"),
        ({"delay": 10**400}, "delay must be a finite number"),
        ({"delay": timedelta.max}, f"delay {BOUND}"),
        ({"delay": float("nan")}, "delay must be a finite number"),
        ({"max_start_delay": 1e308}, f"max_start_delay {BOUND}"),
        ({"max_start_delay": timedelta.max}, f"max_start_delay {BOUND}"),
        ({"max_start_delay": float("inf")}, "max_start_delay must be a finite number"),
        ({"eta": datetime.max.replace(tzinfo=timezone.utc)}, f"eta {ETA_BOUND}"),
        ({"eta": datetime(1, 1, 2, tzinfo=timezone.utc)}, f"eta {ETA_BOUND}"),
        ({"eta": utcnow() + timedelta(seconds=TOO_LONG)}, f"eta {ETA_BOUND}"),
    ],
    ids=[
        "delay-1e308",
        "delay-over",
        "delay-huge-int",
        "delay-timedelta.max",
        "delay-nan",
        "msd-1e308",
        "msd-timedelta.max",
        "msd-inf",
        "eta-max",
        "eta-year-1",
        "eta-over",
    ],
)
def test_a_time_option_beyond_the_bound_is_refused_naming_it_and_the_bound(
    fresh_process_state: StubBroker, options: dict[str, Any], named: str
) -> None:
    refused = job()
    with pytest.raises(ValueError, match=f"^{named}"):
        refused.scheduled(**options)
    assert get_job_store().list() == []
    assert sum(q.qsize() for q in fresh_process_state.queues.values()) == 0


def test_the_bound_itself_is_accepted_and_its_dates_computed() -> None:
    times = start_times(NOW, delay=MAX_SECONDS, max_start_delay=timedelta(seconds=MAX_SECONDS))
    assert times.not_before == NOW + timedelta(seconds=MAX_SECONDS)
    assert times.deadline == NOW + 2 * timedelta(seconds=MAX_SECONDS)
    far = NOW + timedelta(seconds=MAX_SECONDS)
    assert start_times(NOW, eta=far, max_start_delay=MAX_SECONDS).deadline == far + timedelta(
        seconds=MAX_SECONDS
    )


def test_a_long_delay_at_the_bound_is_scheduled_and_stored() -> None:
    far = job()
    far.scheduled(delay=MAX_SECONDS, max_start_delay=MAX_SECONDS)
    row = get_job_store().get(far.id)
    assert row is not None and row.start_deadline is not None
    assert row.start_deadline - utcnow() > timedelta(days=2 * 365 * 99)


# -- retry table and timeouts ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: RetryPolicy(retry_delay=TOO_LONG), "retry_delay"),
        (lambda: RetryPolicy(retry_delay=10**400), "retry_delay"),
        (lambda: RetryPolicy(retry_delay=float("inf")), "retry_delay"),
        (lambda: RetryPolicy(retry_delay=1, retry_delay_max=1e300), "retry_delay_max"),
        (lambda: task(retry_delay=1e308), "retry_delay"),
        (lambda: task(round_timeout=1e308), "round_timeout"),
        (lambda: task(round_timeout=float("inf")), "round_timeout"),
        (lambda: task(round_timeout_join=TOO_LONG), "round_timeout_join"),
    ],
    ids=[
        "delay-over",
        "delay-huge-int",
        "delay-inf",
        "cap-1e300",
        "task-delay",
        "timeout",
        "timeout-inf",
        "join",
    ],
)
def test_a_retry_delay_or_timeout_beyond_the_bound_is_refused(
    make: Callable[[], object], named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{named} must be finite and at most 3155760000"):
        make()


def test_retry_delays_and_timeouts_at_the_bound_are_accepted() -> None:
    assert RetryPolicy(retry_delay=MAX_SECONDS, retry_delay_max=MAX_SECONDS).retry_delay_max
    assert task(round_timeout=MAX_SECONDS, round_timeout_join=MAX_SECONDS).round_timeout


# -- settings and retention -------------------------------------------------------------------

#: The settings that are not a time: a mapping, a count and a switch.
NOT_SECONDS = ("retention", "continue_steps", "defaults", "claim_fetched")
SECONDS_SETTINGS = [name for name in YAML_KEYS if name not in NOT_SECONDS]


@pytest.mark.parametrize("name", SECONDS_SETTINGS)
@pytest.mark.parametrize("value", [1e308, TOO_LONG, 10**400], ids=["1e308", "over", "huge-int"])
def test_every_timing_setting_beyond_the_bound_is_a_config_error(name: str, value: float) -> None:
    if name == "heartbeat_timeout_ms":
        value = int(value * 1000) if value != 1e308 else 10**400
    with pytest.raises(ConfigError, match=rf"^{name} must .*at most .*\(100 years\)"):
        Settings(**{name: value})


def test_timing_settings_at_the_bound_are_accepted() -> None:
    given = {name: MAX_SECONDS for name in SECONDS_SETTINGS}
    given["heartbeat_timeout_ms"] = int(MAX_SECONDS * 1000)
    assert Settings(**given).lease_seconds == MAX_SECONDS  # type: ignore[arg-type]


@pytest.mark.parametrize("after", ["999999d", "5300w", timedelta(days=40_000), TOO_LONG], ids=repr)
def test_a_retention_beyond_the_bound_is_refused_at_setup(after: object) -> None:
    broker = StubBroker()
    with pytest.raises(ConfigError, match=r"^retention\.Completed must be at most 3155760000"):
        setup(broker=broker, retention={"Completed": after})
    assert dramatiq.broker.global_broker is not broker  # nothing installed
    broker.close()


def test_a_retention_beyond_the_bound_in_yaml_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^scheduler\.retention\.Failed must be at most"):
        Settings.of({"retention": {"Failed": "99999999999s"}})


def test_the_longest_retention_gives_a_valid_cutoff() -> None:
    kept = Settings(retention={"Completed": "5200w"}).purge_after
    (seconds,) = kept.values()
    assert seconds <= MAX_SECONDS
    assert NOW - timedelta(seconds=seconds) < NOW  # the sweep's cutoff, computed
    assert config_duration("x", "36500d") == 36_500 * 86_400
