"""A job held in the store (a long delay, a wait for other jobs) and its channel's bound.

A held job has no message and takes no slot in its channel: thousands of jobs
planned for later cost Redis nothing. ``scheduled()`` still refuses it on a
stopped or full channel (the caller learns it at once), and the recovery sweep
gives it its slot when it releases it: while the channel is full the job stays
held, and a stop does not hold it back (it was accepted before the stop).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from pypepper_dramatiq import (
    ChannelFullError,
    ChannelStoppedError,
    Job,
    get_job_store,
    manager,
)
from pypepper_dramatiq.channels.messages import DISPATCH_KEY
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import JobRecord, utcnow

from .one_task_jobs import one_task_job

pytestmark = pytest.mark.redis

CHANNEL = "held-jobs"
HOUR = 3600


def waiting() -> int:
    return manager.available(CHANNEL).length()


def stored(job_id: str) -> JobRecord:
    record = get_job_store().get(job_id)
    assert record is not None
    return record


def sweeper(broker: object) -> RecoverySweeper:
    return RecoverySweeper(broker, "test-sweeper", lease_seconds=30, interval=1)  # type: ignore[arg-type]


def release_all_due(sweep: RecoverySweeper) -> int:
    """Release what is due within the next hours (as the sweep would, then)."""
    return sweep.release_due(utcnow() + timedelta(hours=2))


def test_held_jobs_take_no_slot_however_many(broker: object) -> None:
    manager.resize(CHANNEL, 2)
    ids = [one_task_job(CHANNEL).scheduled(delay=HOUR) for _ in range(5)]  # more than the bound
    parent = one_task_job(CHANNEL)
    parent.scheduled(delay=HOUR)
    child = one_task_job(CHANNEL)
    child.scheduled(after=[parent])
    assert waiting() == 0
    assert all(stored(job_id).release_at is not None for job_id in ids)


def test_a_held_job_is_refused_by_a_full_or_stopped_channel_and_nothing_is_stored(
    broker: object,
) -> None:
    manager.resize(CHANNEL, 1)
    one_task_job(CHANNEL).scheduled()  # takes the one slot (nobody consumes it)
    refused = one_task_job(CHANNEL)
    with pytest.raises(ChannelFullError):
        refused.scheduled(delay=HOUR)
    parent = one_task_job(CHANNEL)
    with pytest.raises(ChannelFullError):
        one_task_job(CHANNEL).scheduled(after=[stored_parent(parent)])
    manager.resize(CHANNEL, 0)
    manager.available(CHANNEL).request_stop()
    with pytest.raises(ChannelStoppedError):
        refused.scheduled(delay=HOUR)
    assert get_job_store().get(refused.id) is None
    assert refused.release_at is None and refused.not_before is None


def stored_parent(parent: Job) -> str:
    """A parent stored without taking a slot (held for an hour)."""
    manager.resize(CHANNEL, 0)
    parent.scheduled(delay=HOUR)
    manager.resize(CHANNEL, 1)
    return parent.id


def test_the_sweep_gives_a_released_job_its_slot_and_sends_it(broker: object) -> None:
    held = one_task_job(CHANNEL)
    held.scheduled(delay=HOUR)
    assert waiting() == 0

    assert release_all_due(sweeper(broker)) == 1

    record = stored(held.id)
    assert record.release_at is None
    assert record.state[DISPATCH_KEY]["message_id"]  # which message carries it
    assert waiting() == 1


def test_a_full_channel_keeps_due_jobs_held_until_it_has_room(broker: object) -> None:
    manager.resize(CHANNEL, 2)
    ids = [one_task_job(CHANNEL).scheduled(delay=HOUR) for _ in range(5)]
    sweep = sweeper(broker)

    assert release_all_due(sweep) == 2
    assert waiting() == 2
    held = [job_id for job_id in ids if stored(job_id).release_at is not None]
    assert len(held) == 3  # still held, due again at the next tick

    for job_id in set(ids) - set(held):  # workers take the two released jobs
        manager.release_slot(CHANNEL, job_id)
    assert release_all_due(sweep) == 2
    assert sum(stored(job_id).release_at is not None for job_id in ids) == 1


def test_a_stop_does_not_hold_back_a_job_accepted_before_it(broker: object) -> None:
    held = one_task_job(CHANNEL)
    held.scheduled(delay=HOUR)
    manager.available(CHANNEL).request_stop()

    assert release_all_due(sweeper(broker)) == 1
    assert stored(held.id).release_at is None
    assert waiting() == 1


def test_cancelling_a_held_job_leaves_the_channel_count_alone(broker: object) -> None:
    other = one_task_job(CHANNEL)
    other.scheduled()  # one job really waiting
    delayed = one_task_job(CHANNEL)
    delayed.scheduled(delay=HOUR)
    assert Job.cancel_saved(delayed.id) is True
    parent, child = one_task_job(CHANNEL), one_task_job(CHANNEL)
    parent.scheduled(delay=HOUR)
    child.scheduled(after=[parent])
    assert child.cancel() is True
    assert waiting() == 1


def test_a_cancelled_held_job_is_not_released(broker: object) -> None:
    delayed = one_task_job(CHANNEL)
    delayed.scheduled(delay=HOUR)
    assert Job.cancel_saved(delayed.id) is True
    assert release_all_due(sweeper(broker)) == 0
    assert waiting() == 0
