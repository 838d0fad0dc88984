"""Unique keys and dependencies on both drivers (the ``driver`` fixture runs each test twice).

Jobs are scheduled before any worker runs, so each test sees the whole wait:
a child stored before its parent ran, a key held by a job not started yet.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from pypepper_dramatiq import (
    Context,
    DuplicateJobError,
    Job,
    Status,
    Task,
    UnknownJobError,
    Workflow,
    chain,
    get_job_store,
    workflow_task,
)

from .drivers import Driver, make_job

_lock = threading.Lock()
#: Every call's key, in call order.
LOG: list[str] = []
#: What each call saw of its parents' results.
SEEN: dict[str, Any] = {}
CALLS: dict[str, int] = defaultdict(int)


@workflow_task(name="driver-waits.step")
def step(task: Task, context: Context, key: str, fail: bool = False, seconds: float = 0.0) -> Any:
    """Logs ``key``, keeps what it saw of its parents' results, fails if asked."""
    with _lock:
        LOG.append(key)
        CALLS[key] += 1
        SEEN[key] = dict(context.parent_results)
    if seconds:
        time.sleep(seconds)
    if fail:
        raise RuntimeError(f"{key} failed as planned")
    return {"from": key}


@pytest.fixture
def prefix() -> str:
    return f"{uuid.uuid4().hex[:8]}:"


def job_of(key: str, **options: Any) -> Job:
    return make_job([step.options(retry_count=0).task(name="work", key=key, **options)])


def order(prefix: str) -> list[str]:
    with _lock:
        return [key[len(prefix) :] for key in LOG if key.startswith(prefix)]


# -- dependencies ---------------------------------------------------------------------------


def test_a_child_runs_after_its_parent_and_reads_its_results(driver: Driver, prefix: str) -> None:
    parent, child = job_of(f"{prefix}parent", seconds=0.3), job_of(f"{prefix}child")
    parent.scheduled()
    assert child.scheduled(after=[parent]) == child.id
    stored = get_job_store().get(child.id)
    assert stored is not None and stored.status is Status.SCHEDULED
    assert stored.waits is not None and stored.waits["parents"] == [parent.id]

    driver.start()
    records = driver.wait(parent, child)

    assert [r.status for r in records] == [Status.COMPLETED, Status.COMPLETED]
    assert order(prefix) == ["parent", "child"]
    assert SEEN[f"{prefix}child"] == {parent.id: {"work": {"from": f"{prefix}parent"}}}


@pytest.mark.parametrize(
    ("policy", "status"),
    [("propagate", Status.FAILED), ("cancel", Status.CANCELLED), ("ignore", Status.COMPLETED)],
)
def test_fan_in_fires_once_also_when_a_parent_failed(
    driver: Driver, prefix: str, policy: str, status: Status
) -> None:
    bad, good = job_of(f"{prefix}bad", fail=True), job_of(f"{prefix}good")
    child = job_of(f"{prefix}child")
    bad.scheduled()
    good.scheduled()
    child.scheduled(after=[bad, good.id], on_parent_failure=policy)

    driver.start()
    *_, record = driver.wait(bad, good, child)

    assert record.status is status
    with _lock:
        ran = CALLS[f"{prefix}child"]
    if policy == "ignore":
        assert ran == 1
        assert SEEN[f"{prefix}child"][good.id] == {"work": {"from": f"{prefix}good"}}
        assert SEEN[f"{prefix}child"][bad.id] == {}
    else:
        assert ran == 0
        assert record.error is not None and bad.id in record.error and "Failed" in record.error


def test_chain_runs_in_order_and_a_failure_fails_the_rest(driver: Driver, prefix: str) -> None:
    a, b, c = job_of(f"{prefix}a"), job_of(f"{prefix}b", fail=True), job_of(f"{prefix}c")
    assert chain(a, b, c) == [a.id, b.id, c.id]

    driver.start()
    records = driver.wait(a, b, c)

    assert [r.status for r in records] == [Status.COMPLETED, Status.FAILED, Status.FAILED]
    assert order(prefix) == ["a", "b"]
    assert records[2].error is not None and b.id in records[2].error


def test_a_wait_does_not_move_the_start_deadline(driver: Driver, prefix: str) -> None:
    parent = job_of(f"{prefix}parent", seconds=1.0)
    child = job_of(f"{prefix}child")
    parent.scheduled()
    child.scheduled(after=[parent], max_start_delay=0.3)

    driver.start()
    _, record = driver.wait(parent, child)

    assert record.status is Status.CANCELLED
    assert record.error is not None and "start deadline passed" in record.error
    assert order(prefix) == ["parent"]


# -- unique keys ----------------------------------------------------------------------------


def test_skip_returns_the_holders_id_and_stores_nothing(driver: Driver, prefix: str) -> None:
    key = f"{prefix}report"
    first, second = job_of(f"{prefix}first"), job_of(f"{prefix}second")
    assert first.scheduled(unique_key=key) == first.id
    assert second.scheduled(unique_key=key) == first.id
    assert get_job_store().get(second.id) is None
    assert second.status is Status.UNKNOWN  # rolled back: it may be scheduled again

    driver.start()
    [record] = driver.wait(first)
    assert record.status is Status.COMPLETED
    # The key is free again once its holder ended (on another channel: the
    # in-process driver stopped this one to drain it).
    third = Job(channel_id="driver-waits-other")
    third.workflows.append(Workflow([step.task(name="work", key=f"{prefix}third")]))
    assert third.scheduled(unique_key=key) == third.id


def test_raise_names_the_holder(driver: Driver, prefix: str) -> None:
    key = f"{prefix}report"
    first = job_of(f"{prefix}first")
    first.scheduled(unique_key=key)
    with pytest.raises(DuplicateJobError) as raised:
        job_of(f"{prefix}second").scheduled(unique_key=key, on_conflict="raise")
    assert raised.value.existing_id == first.id
    assert raised.value.unique_key == key
    assert key in str(raised.value) and first.id in str(raised.value)


def test_replace_cancels_a_holder_that_has_not_started(driver: Driver, prefix: str) -> None:
    key = f"{prefix}report"
    old, new = job_of(f"{prefix}old"), job_of(f"{prefix}new")
    old.scheduled(unique_key=key)
    assert new.scheduled(unique_key=key, on_conflict="replace") == new.id

    driver.start()
    old_record, new_record = driver.wait(old, new)

    assert old_record.status is Status.CANCELLED
    assert old_record.error is not None and new.id in old_record.error
    assert new_record.status is Status.COMPLETED and new_record.unique_key == key
    assert order(prefix) == ["new"]


def test_after_runs_the_new_job_once_the_holder_ended(driver: Driver, prefix: str) -> None:
    key = f"{prefix}report"
    holder, queued = job_of(f"{prefix}holder", fail=True), job_of(f"{prefix}queued")
    holder.scheduled(unique_key=key)
    assert queued.scheduled(unique_key=key, on_conflict="after") == queued.id
    waiting = get_job_store().get(queued.id)
    assert waiting is not None and waiting.waits is not None
    assert waiting.waits["holder"] == holder.id and waiting.unique_key is None

    driver.start()
    holder_record, queued_record = driver.wait(holder, queued)

    # Whatever the holder's outcome, the queued job runs after it, holding the key.
    assert holder_record.status is Status.FAILED
    assert queued_record.status is Status.COMPLETED
    assert queued_record.unique_key == key
    assert order(prefix) == ["holder", "queued"]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"after": ["no-such-job"]}, UnknownJobError, "no-such-job"),
        ({"unique_key": "k", "on_conflict": "merge"}, ValueError, "merge"),
        ({"after": [], "on_parent_failure": "retry"}, ValueError, "retry"),
        ({"unique_key": ""}, ValueError, "unique_key"),
        ({"after": [42]}, TypeError, "42"),
    ],
)
def test_bad_wait_options_are_named_and_store_nothing(
    driver: Driver, prefix: str, options: dict[str, Any], error: type[Exception], named: str
) -> None:
    job = job_of(f"{prefix}job")
    with pytest.raises(error, match=named):
        job.scheduled(**options)
    assert get_job_store().get(job.id) is None
    assert job.status is Status.UNKNOWN


def test_a_job_cannot_wait_for_itself(driver: Driver, prefix: str) -> None:
    job = job_of(f"{prefix}job")
    with pytest.raises(ValueError, match="after itself"):
        job.scheduled(after=[job.id])
    assert get_job_store().get(job.id) is None
