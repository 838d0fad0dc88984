"""``schedule_many``: many jobs scheduled at once, each decided alone, on both drivers.

The jobs are ``@workflow_task`` functions that count their calls, so that a test
can tell exactly which jobs ran (the admitted ones, once each) and which did not
(the refused ones, never).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    ChannelFullError,
    ChannelStoppedError,
    Context,
    DuplicateJobError,
    InvalidTransitionError,
    Job,
    Status,
    Task,
    get_job_store,
    manager,
    schedule_many,
    workflow_task,
)

from .conftest import CHANNEL
from .drivers import Driver, make_job

_lock = threading.Lock()
#: Calls per key.
CALLS: Counter[str] = Counter()


@workflow_task(name="schedule-many.count")
def count(task: Task, context: Context, key: str) -> str:
    with _lock:
        CALLS[key] += 1
    return key


def jobs(prefix: str, n: int) -> list[Job]:
    return [make_job([count.task(key=f"{prefix}{i}")]) for i in range(n)]


def calls(prefix: str) -> dict[str, int]:
    with _lock:
        return {key: n for key, n in CALLS.items() if key.startswith(prefix)}


@pytest.fixture
def prefix() -> str:
    return f"{uuid.uuid4().hex[:8]}-"


def test_every_job_is_stored_sent_and_run_once(driver: Driver, prefix: str) -> None:
    batch = jobs(prefix, 6)
    results = schedule_many(batch)
    assert results == [job.id for job in batch]
    for job in batch:
        assert job.status is Status.SCHEDULED
        assert job.version == 1
        record = get_job_store().get(job.id)
        assert record is not None and record.status is Status.SCHEDULED
    driver.start()
    assert {r.status for r in driver.wait(*batch)} == {Status.COMPLETED}
    assert calls(prefix) == {f"{prefix}{i}": 1 for i in range(6)}


def test_a_channel_that_fills_in_the_middle_of_the_list(driver: Driver, prefix: str) -> None:
    manager.resize(CHANNEL, 3)
    batch = jobs(prefix, 7)
    results = schedule_many(batch)
    assert results[:3] == [job.id for job in batch[:3]]
    for result in results[3:]:
        assert isinstance(result, ChannelFullError)
        assert "is full (maxsize 3)" in str(result)
    store = get_job_store()
    # Exactly the admitted jobs are stored; the refused ones are rolled back.
    assert [store.get(job.id) is not None for job in batch] == [True] * 3 + [False] * 4
    assert [job.status for job in batch[3:]] == [Status.UNKNOWN] * 4
    assert manager.available(CHANNEL).length() == 3
    driver.start()
    assert {r.status for r in driver.wait(*batch[:3])} == {Status.COMPLETED}
    assert calls(prefix) == {f"{prefix}{i}": 1 for i in range(3)}
    assert all(store.get(job.id) is None for job in batch[3:])


def test_a_stopped_channel_refuses_every_job_and_they_can_be_scheduled_later(
    stub_broker: StubBroker, prefix: str
) -> None:
    channel = manager.available(CHANNEL)
    channel.request_stop()
    batch = jobs(prefix, 3)
    results = schedule_many(batch)
    assert all(isinstance(result, ChannelStoppedError) for result in results)
    assert len(results) == 3
    assert get_job_store().get_many([job.id for job in batch]) == []
    assert channel.length() == 0
    channel.resume()
    assert schedule_many(batch) == [job.id for job in batch]
    assert channel.length() == 3


def test_an_empty_list_does_nothing(stub_broker: StubBroker) -> None:
    assert schedule_many([]) == []
    assert schedule_many(iter(())) == []
    assert manager.available(CHANNEL).length() == 0


def test_a_job_stored_already_is_refused_alone(stub_broker: StubBroker, prefix: str) -> None:
    first, second, third = jobs(prefix, 3)
    assert schedule_many([second]) == [second.id]
    copy = Job.from_record(second.to_record().evolve(version=0))  # same id, never saved here
    results = schedule_many([first, copy, third])
    assert results[0] == first.id and results[2] == third.id
    assert isinstance(results[1], DuplicateJobError)
    assert copy.status is Status.UNKNOWN
    assert manager.available(CHANNEL).length() == 3  # second once, first and third


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(["not a job"], id="a-string-item"),
        pytest.param([None], id="none-item"),
        pytest.param("job-id", id="a-string"),
        pytest.param(42, id="not-iterable"),
    ],
)
def test_an_item_that_is_not_a_job_is_a_type_error_and_nothing_is_done(
    stub_broker: StubBroker, prefix: str, bad: object
) -> None:
    good = jobs(prefix, 1)[0]
    items = [good, *bad] if isinstance(bad, list) else bad
    with pytest.raises(TypeError, match="schedule_many"):
        schedule_many(items)  # type: ignore[arg-type]
    assert good.status is Status.UNKNOWN
    assert get_job_store().get(good.id) is None
    assert manager.available(CHANNEL).length() == 0


def test_a_single_job_is_not_a_list(stub_broker: StubBroker, prefix: str) -> None:
    with pytest.raises(TypeError, match="list of jobs, not Job"):
        schedule_many(jobs(prefix, 1)[0])  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["delay", "unique_key", "after", "connection", "eta"])
def test_per_job_options_are_refused_by_name(
    stub_broker: StubBroker, prefix: str, option: str
) -> None:
    batch = jobs(prefix, 2)
    with pytest.raises(TypeError, match=f"no scheduling options \\(got {option}\\)"):
        schedule_many(batch, **{option: 1})
    assert [job.status for job in batch] == [Status.UNKNOWN] * 2
    assert get_job_store().get_many([job.id for job in batch]) == []


def test_a_job_given_twice_is_a_value_error(stub_broker: StubBroker, prefix: str) -> None:
    job = jobs(prefix, 1)[0]
    with pytest.raises(ValueError, match="given twice"):
        schedule_many([job, job])
    assert job.status is Status.UNKNOWN


def test_a_job_scheduled_already_rolls_the_whole_list_back(
    stub_broker: StubBroker, prefix: str
) -> None:
    first, done, third = jobs(prefix, 3)
    done.scheduled()
    done.version = 0  # as if its snapshot had not persisted: only its status tells
    with pytest.raises(InvalidTransitionError):
        schedule_many([first, done, third])
    assert first.status is Status.UNKNOWN and third.status is Status.UNKNOWN
    assert get_job_store().get_many([first.id, third.id]) == []
