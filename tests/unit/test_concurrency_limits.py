"""Concurrency limits as written (``max_running=3``, ``{"tenant-*": 3}``) and a job's
``concurrency_key``: checked at the boundary, refused by a typed error naming the
culprit, nothing declared or stored; a step under no limit asks nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from dramatiq.brokers.stub import StubBroker
from process_state import clean_process_state

from pypepper_dramatiq import (
    ConfigError,
    Context,
    InvalidConcurrencyKeyError,
    InvalidConcurrencyLimitError,
    Job,
    Task,
    Workflow,
    get_job_store,
    list_recurring,
    manager,
    recurring,
    schedule_many,
    setup,
    trigger_recurring,
    workflow_task,
)
from pypepper_dramatiq.engine import concurrency
from pypepper_dramatiq.limits.concurrency import (
    MAX_RUNNING,
    check_concurrency_key,
    check_limit,
    key_concurrency,
)
from pypepper_dramatiq.limits.patterns import KeyPatterns
from pypepper_dramatiq.rules.priorities import channel_of_queue
from pypepper_dramatiq.transport import LocalTransport


@pytest.fixture(autouse=True)
def clean() -> object:
    with clean_process_state():
        yield


@pytest.mark.parametrize("good", [1, 3, MAX_RUNNING])
def test_a_limit_is_a_whole_number_of_at_least_one(good: int) -> None:
    assert check_limit(good) == good


@pytest.mark.parametrize("bad", [0, -1, MAX_RUNNING + 1, 2.5, "3", None, True])
def test_a_bad_limit_is_a_typed_error_naming_where_and_what(bad: object) -> None:
    with pytest.raises(InvalidConcurrencyLimitError) as caught:
        check_limit(bad, "max_running of 'etl'")
    assert "max_running of 'etl'" in str(caught.value)
    assert repr(bad) in str(caught.value)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, TypeError)
    assert caught.value.value is bad


@pytest.mark.parametrize("bad", ["", "k" * 129, "a\x00b", 42, b"tenant"])
def test_a_bad_concurrency_key_is_a_typed_error_naming_it(bad: object) -> None:
    with pytest.raises(InvalidConcurrencyKeyError, match="concurrency_key") as caught:
        check_concurrency_key(bad)
    assert caught.value.value == bad
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)


def test_key_limits_take_the_first_pattern_that_matches() -> None:
    limits = KeyPatterns("concurrency", check_limit)
    limits.configure({"tenant-vip-*": 10, "tenant-*": 3})
    assert limits.of("tenant-vip-1") == 10
    assert limits.of("tenant-42") == 3
    assert limits.of("other") is None
    assert limits.of(None) is None


def test_a_bad_key_limit_names_its_pattern_and_keeps_the_limits_in_force() -> None:
    key_concurrency.configure({"tenant-*": 3})
    with pytest.raises(InvalidConcurrencyLimitError, match=r"concurrency\['tenant-\*'\]"):
        key_concurrency.configure({"a": 1, "tenant-*": 0})
    assert key_concurrency.of("tenant-1") == 3
    assert key_concurrency.of("a") is None


def test_a_bad_max_running_declares_no_channel() -> None:
    with pytest.raises(InvalidConcurrencyLimitError, match="'etl'"):
        manager.new("etl", max_running=0)
    assert manager.get("etl") is None
    with pytest.raises(InvalidConcurrencyLimitError, match="max_running of channel 'etl'"):
        setup(broker=StubBroker(), channels={"ok": 1, "etl": {"max_running": "3"}})
    assert manager.get("ok") is None and manager.get("etl") is None
    with pytest.raises(InvalidConcurrencyLimitError, match=r"concurrency\['t-\*'\]"):
        setup(broker=StubBroker(), channels=["ok"], concurrency={"t-*": -2})
    assert manager.get("ok") is None


def test_setup_and_the_yaml_declare_channel_and_key_limits(tmp_path: object) -> None:
    from pathlib import Path

    setup(
        broker=StubBroker(),
        channels={"etl": {"maxsize": 3, "max_running": 2}, "mail": 5},
        concurrency={"tenant-*": 3},
    )
    assert manager.max_running("etl") == 2 and manager.max_running("mail") is None
    assert key_concurrency.of("tenant-9") == 3
    path = Path(str(tmp_path)) / "app.yaml"
    path.write_text(
        "scheduler:\n"
        "  channels:\n"
        "    etl: {maxsize: 0, maxRunning: 4}\n"
        "  concurrency:\n"
        '    "acme-*": 1\n'
        "  jobStore: {backend: memory}\n"
    )
    setup(config_path=path, broker=StubBroker(), concurrency={"acme-*": 9, "x": 2})
    assert manager.max_running("etl") == 4
    assert key_concurrency.of("acme-1") == 1  # the YAML wins, key by key
    assert key_concurrency.of("x") == 2
    with pytest.raises(ConfigError, match="max_runing"):
        setup(broker=StubBroker(), channels={"etl": {"max_runing": 2}})


@pytest.mark.parametrize("bad", ["", "k" * 200])
def test_a_bad_concurrency_key_stores_nothing(bad: str) -> None:
    setup(broker=StubBroker(), channels=["jobs"])
    job = Job(category="c", channel_id="jobs")
    with pytest.raises(InvalidConcurrencyKeyError):
        job.scheduled(concurrency_key=bad)
    assert get_job_store().get(job.id) is None
    assert manager.available("jobs").gate.waiting() == 0


@workflow_task(name="unit-concurrency.step")
def keyed_step(task: Task, context: Context) -> None:
    return None


def keyed_job() -> Job:
    job = Job(category="c", channel_id="jobs")
    job.workflows.append(Workflow([keyed_step.task(name="w")]))
    return job


def stored_key(job_id: str) -> object:
    record = get_job_store().get(job_id)
    assert record is not None and record.payload is not None
    return record.payload.get("concurrency_key")


def test_schedule_many_and_recurring_take_a_concurrency_key_as_scheduled_does() -> None:
    # The batch's key goes to every job of it (a job's own is kept when none is given);
    # a schedule's goes to every firing, as scheduled(concurrency_key=) would store it.
    setup(broker=StubBroker(), channels=["jobs"])
    batch, own = [keyed_job() for _ in range(2)], keyed_job()
    own.concurrency_key = "own-key"
    assert all(isinstance(r, str) for r in schedule_many(batch, concurrency_key="tenant-1"))
    assert all(isinstance(r, str) for r in schedule_many([own, keyed_job()]))
    assert [stored_key(job.id) for job in [*batch, own]] == ["tenant-1", "tenant-1", "own-key"]
    assert Job.from_record(get_job_store().get(batch[0].id)).concurrency_key == "tenant-1"  # type: ignore[arg-type]
    recurring("keyed", "0 0 1 1 *", keyed_job(), concurrency_key="tenant-2")
    recurring("own", "0 0 1 1 *", own)
    templates = {s.name: s.template["payload"] for s in list_recurring()}
    assert templates["keyed"]["concurrency_key"] == "tenant-2"  # type: ignore[index]
    assert templates["own"]["concurrency_key"] == "own-key"  # type: ignore[index]
    fired = trigger_recurring("keyed", datetime(2026, 1, 1, 12, tzinfo=timezone.utc))
    assert stored_key(fired) == "tenant-2"


@pytest.mark.parametrize("bad", ["", "k" * 200, "a\x00b", 5])
def test_schedule_many_and_recurring_refuse_a_bad_concurrency_key_storing_nothing(
    bad: object,
) -> None:
    setup(broker=StubBroker(), channels=["jobs"])
    jobs = [keyed_job() for _ in range(2)]
    with pytest.raises(InvalidConcurrencyKeyError) as caught:
        schedule_many(jobs, concurrency_key=bad)  # type: ignore[arg-type]
    assert caught.value.value == bad
    jobs[1].concurrency_key = bad  # type: ignore[assignment]
    with pytest.raises(InvalidConcurrencyKeyError):
        schedule_many(jobs)  # set on the job: refused as scheduled() refuses it
    assert all(get_job_store().get(job.id) is None for job in jobs)
    assert all(job.version == 0 for job in jobs)
    assert manager.available("jobs").gate.waiting() == 0
    with pytest.raises(InvalidConcurrencyKeyError):
        recurring("bad", "* * * * *", keyed_job(), concurrency_key=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidConcurrencyKeyError):
        recurring("bad", "* * * * *", jobs[1])
    assert list_recurring() == []


def test_a_step_under_no_limit_asks_the_transport_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    setup(broker=StubBroker(), channels=["jobs"], concurrency={"tenant-*": 1})
    transport = manager.available("jobs").transport
    assert isinstance(transport, LocalTransport)

    def refused(*args: object) -> bool:
        raise AssertionError("asked")

    monkeypatch.setattr(transport, "acquire_slots", refused)
    assert not concurrency.limited("jobs", None) and not concurrency.limited("jobs", "other")
    assert concurrency.try_start("jobs", "other", "j", "me", 30.0) is concurrency.NO_SLOTS


def test_slots_are_given_back_once_and_renewed_while_held() -> None:
    setup(broker=StubBroker(), channels={"jobs": {"max_running": 1}})
    transport = manager.available("jobs").transport
    first = concurrency.try_start("jobs", None, "j1", "me", 30.0)
    assert first is not None and concurrency.held_here.holders() == [first.holder]
    assert concurrency.try_start("jobs", None, "j2", "me", 30.0) is None
    assert transport.slots_held("channel:jobs") == [first.holder]
    first.release()
    first.release()
    assert concurrency.held_here.holders() == []
    second = concurrency.try_start("jobs", None, "j2", "me", 30.0)
    assert second is not None
    second.release()
    assert transport.slots_held("channel:jobs") == []


def test_a_start_held_again_and_again_asks_less_often_up_to_a_second() -> None:
    assert [concurrency.hold_seconds(n) for n in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert concurrency.hold_seconds(10_000) == concurrency.MAX_HOLD_SECONDS


def test_a_priority_queue_counts_under_its_channels_limits() -> None:
    # On Redis a job of priority 5 travels on "<channel>.p5": its steps run under the
    # channel's concurrency limit all the same (the queue is mapped back to it).
    setup(broker=StubBroker(), channels={"etl": {"max_running": 1}})
    assert channel_of_queue("etl") == "etl"
    assert channel_of_queue("etl.p5") == "etl"
    assert concurrency.limited(channel_of_queue("etl.p9"))
    assert not concurrency.limited("etl.p9")  # the queue's own name is no channel
