"""A channel's rate limit on both drivers (the ``driver`` fixture runs each test on
the in-process Worker, on a ``dramatiq.Worker`` over the stub broker, and over
RabbitMQ with PostgreSQL counting the turns).

Starts over the limit are held until their turn, not failed: no attempt is counted
while a step waits, and every job completes. The Dramatiq driver sends the held
message again, due at its turn; the in-process Worker awaits it without a thread.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    ConfigError,
    Context,
    InvalidPriorityError,
    InvalidRateKeyError,
    InvalidRateLimitError,
    Job,
    Rate,
    Status,
    Task,
    get_job_store,
    list_recurring,
    manager,
    recurring,
    schedule_many,
    setup,
    trigger_recurring,
    workflow_task,
)
from pypepper_dramatiq.limits.rates import key_limits

from .drivers import (
    CHANNEL,
    CallLog,
    Driver,
    attempts,
    emptied_around_each_test,
    held_ids,
    make_job,
)

#: When each call started (``time.monotonic()``), with its key.
STARTS: CallLog[tuple[float, str]] = CallLog()
no_starts = emptied_around_each_test(STARTS)


@workflow_task(name="driver-rate.step")
def step(task: Task, context: Context, key: str) -> str:
    STARTS.record((time.monotonic(), key))
    return key


def rate_held_ids(caplog: pytest.LogCaptureFixture) -> set[str]:
    return held_ids(caplog, "rate_hold")


def test_starts_over_the_channel_rate_limit_wait_for_their_turn_and_all_complete(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # 2/s: six jobs queued at once: two start at once, each other one is held
    # (logged) until the window frees, no attempt burnt, and the six starts take at
    # least about two seconds (a lower bound: slowness only adds).
    manager.new(CHANNEL, rate_limit="2/s")
    jobs = [make_job([step.options(retry_count=0).task(name="w", key=f"k{n}")]) for n in range(6)]
    for job in jobs:
        job.scheduled()
    driver.start()
    records = driver.wait(*jobs)
    assert [r.status for r in records] == [Status.COMPLETED] * 6
    assert all(attempts(job) == Counter({"0.0": 1}) for job in jobs)
    assert len(rate_held_ids(holds) & {job.id for job in jobs}) >= 2
    times = sorted(t for t, _ in STARTS)
    assert len(times) == 6
    assert times[-1] - times[0] >= 2.0 - 0.25, times
    assert all(times[i + 2] - times[i] >= 1.0 - 0.25 for i in range(4)), times


def test_every_step_of_a_job_takes_a_turn(driver: Driver, holds: pytest.LogCaptureFixture) -> None:
    # One job of three steps on a 1/s channel: the later steps wait for their turns
    # too (the Dramatiq driver does not continue them in the same message).
    manager.new(CHANNEL, rate_limit="1/s")
    job = make_job([step.options(retry_count=0).task(name=f"s{n}", key=f"s{n}") for n in range(3)])
    job.scheduled()
    driver.start()
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    assert [key for _, key in STARTS] == ["s0", "s1", "s2"]
    assert job.id in rate_held_ids(holds)
    times = [t for t, _ in STARTS]
    assert times[-1] - times[0] >= 2.0 - 0.25, times


def test_a_channel_without_a_rate_limit_never_asks_the_limiter(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = manager.available(CHANNEL)
    assert channel.rate_limit is None
    asked: list[str] = []

    def counted(key: str, rate: Rate) -> float:
        asked.append(key)
        return 0.0

    monkeypatch.setattr(channel.transport, "ask_start", counted)
    jobs = [make_job([step.task(name=f"s{n}", key=f"s{n}") for n in range(2)]) for _ in range(3)]
    for job in jobs:
        job.scheduled()
    driver.start()
    assert [r.status for r in driver.wait(*jobs)] == [Status.COMPLETED] * 3
    assert asked == []


def test_a_jobs_rate_key_has_its_own_limit_and_other_jobs_are_not_held(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # "tenant-*" at 1/s: three jobs keyed "tenant-1" are held and spread; three
    # without a key, on the same channel (which has no limit), never wait.
    key_limits.configure({"tenant-*": "1/s"})
    keyed = [make_job([step.options(retry_count=0).task(name="w", key=f"t{n}")]) for n in range(3)]
    free = [make_job([step.options(retry_count=0).task(name="w", key=f"f{n}")]) for n in range(3)]
    for job in keyed:
        job.scheduled(rate_key="tenant-1")
    for job in free:
        job.scheduled()
    driver.start()
    records = driver.wait(*keyed, *free)
    assert [r.status for r in records] == [Status.COMPLETED] * 6
    assert all(attempts(job) == Counter({"0.0": 1}) for job in [*keyed, *free])
    held = rate_held_ids(holds)
    assert len(held & {job.id for job in keyed}) >= 2
    assert not held & {job.id for job in free}
    times = sorted(t for t, key in STARTS if key.startswith("t"))
    assert times[-1] - times[0] >= 2.0 - 0.25, times
    assert get_job_store().get(keyed[0].id).payload["rate_key"] == "tenant-1"  # type: ignore[index]


def keyed_starts_are_spread(keyed: list[Job], holds: pytest.LogCaptureFixture) -> None:
    """Three jobs of one key at 1/s: held (logged) and spread over two seconds at
    least, each started once, no attempt burnt."""
    assert all(attempts(job) == Counter({"0.0": 1}) for job in keyed)
    assert len(rate_held_ids(holds) & {job.id for job in keyed}) >= 2
    times = sorted(t for t, key in STARTS if key.startswith("t"))
    assert len(times) == 3
    assert times[-1] - times[0] >= 2.0 - 0.25, times


def test_schedule_many_gives_every_job_its_rate_key_and_priority(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # As scheduled(rate_key=, priority=) would: the batch's keyed jobs wait their
    # turns under "tenant-*" at 1/s; a batch without a key is never held.
    key_limits.configure({"tenant-*": "1/s"})
    keyed = [make_job([step.options(retry_count=0).task(name="w", key=f"t{n}")]) for n in range(3)]
    free = [make_job([step.options(retry_count=0).task(name="w", key=f"f{n}")]) for n in range(3)]
    assert all(isinstance(r, str) for r in schedule_many(keyed, rate_key="tenant-1", priority=4))
    assert all(isinstance(r, str) for r in schedule_many(free))
    driver.start()
    records = driver.wait(*keyed, *free)
    assert [r.status for r in records] == [Status.COMPLETED] * 6
    keyed_starts_are_spread(keyed, holds)
    assert not held_ids(holds) & {job.id for job in free}
    for record in records[:3]:
        assert record.payload is not None and record.payload["rate_key"] == "tenant-1"
        assert Job.from_record(record).priority == 4
    assert all(r.payload is not None and "rate_key" not in r.payload for r in records[3:])


def test_schedule_many_keeps_each_jobs_own_rate_key(stub_broker: object) -> None:
    own = make_job([step.task(name="w", key="x")])
    own.rate_key = "tenant-own"
    other = make_job([step.task(name="w", key="y")])
    schedule_many([own, other])
    assert Job.from_record(get_job_store().get(own.id)).rate_key == "tenant-own"  # type: ignore[arg-type]
    assert Job.from_record(get_job_store().get(other.id)).rate_key is None  # type: ignore[arg-type]


#: Bad rate keys, and the words of their errors.
BAD_RATE_KEYS = [(5, "not int"), ("", "empty"), ("k" * 200, "128"), ("a\x00b", "U\\+0000")]


@pytest.mark.parametrize(("bad", "why"), BAD_RATE_KEYS)
def test_schedule_many_refuses_a_bad_rate_key_naming_it_and_stores_nothing(
    stub_broker: object, bad: object, why: str
) -> None:
    jobs = [make_job([step.task(name="w", key="x")]) for _ in range(2)]
    with pytest.raises(InvalidRateKeyError, match=why) as caught:
        schedule_many(jobs, rate_key=bad)  # type: ignore[arg-type]
    assert "rate_key" in str(caught.value) and caught.value.value == bad
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)
    jobs[1].rate_key = bad  # type: ignore[assignment]
    with pytest.raises(InvalidRateKeyError, match=why):
        schedule_many(jobs)  # set on the job: refused as scheduled() refuses it
    with pytest.raises(InvalidPriorityError, match="priority"):
        schedule_many(jobs, priority=10)
    assert all(get_job_store().get(job.id) is None for job in jobs)
    assert all(job.version == 0 for job in jobs)


def test_each_recurring_firing_counts_against_the_schedules_rate_key(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    # The schedule's rate_key goes to every firing, as scheduled(rate_key=) would:
    # three firings under "tenant-*" at 1/s wait their turns. A template's own key
    # is taken when the schedule names none.
    key_limits.configure({"tenant-*": "1/s"})
    recurring(
        "keyed",
        "0 0 1 1 *",
        make_job([step.options(retry_count=0).task(name="w", key="t")]),
        overlap="allow",
        rate_key="tenant-1",
        priority=2,
    )
    fired = [
        trigger_recurring("keyed", datetime(2026, 1, 1, 12, 0, n, tzinfo=timezone.utc))
        for n in range(3)
    ]
    own = make_job([step.task(name="w", key="o")])
    own.rate_key = "own-key"
    recurring("own", "0 0 1 1 *", own)
    [schedule] = [s for s in list_recurring() if s.name == "own"]
    assert schedule.template["payload"]["rate_key"] == "own-key"
    driver.start()
    keyed = [Job.from_record(get_job_store().get(job_id)) for job_id in fired]  # type: ignore[arg-type]
    records = driver.wait(*keyed)
    assert [r.status for r in records] == [Status.COMPLETED] * 3
    keyed_starts_are_spread(keyed, holds)
    assert all(Job.from_record(r).rate_key == "tenant-1" for r in records)
    assert all(Job.from_record(r).priority == 2 for r in records)


@pytest.mark.parametrize(("bad", "why"), BAD_RATE_KEYS)
def test_recurring_refuses_a_bad_rate_key_naming_it_and_stores_nothing(
    stub_broker: object, bad: Any, why: str
) -> None:
    with pytest.raises(InvalidRateKeyError, match=why) as caught:
        recurring("bad", "* * * * *", make_job([step.task(name="w", key="x")]), rate_key=bad)
    assert "rate_key" in str(caught.value)
    own = make_job([step.task(name="w", key="x")])
    own.rate_key = bad
    with pytest.raises(InvalidRateKeyError, match=why):
        recurring("bad", "* * * * *", own)
    assert list_recurring() == []


# -- declaring a rate limit ---------------------------------------------------------------


def test_setup_takes_a_channels_bound_and_rate_limit_as_a_mapping() -> None:
    setup(
        broker=StubBroker(),
        channels={"etl": {"maxsize": 3, "rate_limit": "50/s"}, "mail": 10, "plain": None},
    )
    etl, mail = manager.get("etl"), manager.get("mail")
    assert etl is not None and etl.maxsize == 3 and etl.rate_limit == Rate(50, 1.0)
    assert mail is not None and mail.maxsize == 10 and mail.rate_limit is None
    assert manager.rate_limit("plain") is None


def test_setup_reads_a_rate_limit_from_the_yaml(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "app.yaml"
    path.write_text(
        "scheduler:\n"
        "  channels:\n"
        "    etl: {maxsize: 0, rateLimit: 100/m}\n"
        "    mail: 5\n"
        "  jobStore: {backend: memory}\n"
    )
    setup(config_path=path, broker=StubBroker())
    assert manager.rate_limit("etl") == Rate(100, 60.0)
    assert manager.rate_limit("mail") is None


@pytest.mark.parametrize("bad", ["100/x", "0/s", "-1/m", "abc"])
def test_a_malformed_rate_limit_names_the_channel_and_declares_nothing(bad: str) -> None:
    with pytest.raises(InvalidRateLimitError, match="channel 'etl'") as caught:
        setup(broker=StubBroker(), channels={"ok": 1, "etl": {"rate_limit": bad}})
    assert repr(bad) in str(caught.value)
    assert manager.get("ok") is None and manager.get("etl") is None
    with pytest.raises(InvalidRateLimitError, match="'etl'"):
        manager.new("etl", rate_limit=bad)
    assert manager.get("etl") is None


def test_setup_takes_the_rate_limits_of_job_keys_and_refuses_a_malformed_one() -> None:
    setup(broker=StubBroker(), rate_limits={"tenant-*": "10/s", "*": "100/m"})
    assert key_limits.of("tenant-7") == Rate(10, 1.0)
    assert key_limits.of("other") == Rate(100, 60.0)  # the first pattern that matches
    assert key_limits.of(None) is None
    with pytest.raises(InvalidRateLimitError, match="tenant-"):
        setup(broker=StubBroker(), rate_limits={"tenant-*": "0/s"})
    assert key_limits.of("tenant-7") == Rate(10, 1.0)  # the limits in force are kept


def test_a_rate_key_too_long_is_refused_naming_it_and_nothing_stored(stub_broker: object) -> None:
    job = make_job([step.task(name="w", key="x")])
    with pytest.raises(InvalidRateKeyError, match="rate_key"):
        job.scheduled(rate_key="k" * 200)
    assert get_job_store().get(job.id) is None


def test_an_unknown_key_of_a_channel_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="'rate'"):
        setup(broker=StubBroker(), channels={"etl": {"rate": "5/s"}})
