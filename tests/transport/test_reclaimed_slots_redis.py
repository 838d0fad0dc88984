"""The recovery sweep gives back the channel slots nothing else would.

A worker gives a job's slot back as it takes the job; if Redis is unreachable at
that moment the release is only logged, and the bounded channel would keep one
slot fewer for good. The sweep's ``reclaim_slots`` duty reads each channel's
waiting ids against the store: the slots of jobs InProgress or ended are given
back; those of Scheduled jobs and of ids with no row yet (a producer that
admitted its job and has not inserted the row) are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import restartable_redis, started
from dramatiq.brokers.redis import RedisBroker
from process_state import redis_channel_setup
from services import RedisServer

from pypepper_dramatiq import Status, get_job_store, manager
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import JobRecord, utcnow

pytestmark = pytest.mark.redis

CHANNEL = "reclaimed-slots"
OTHER = "reclaimed-slots-elsewhere"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = started(restartable_redis(tmp_path / "redis", appendonly=True), "Redis")
    yield server
    server.stop(kill=True)


def sweeper(broker: RedisBroker) -> RecoverySweeper:
    return RecoverySweeper(broker, "slots-test", lease_seconds=30, interval=1)


def stored(job_id: str, status: Status, channel: str = CHANNEL) -> None:
    assert get_job_store().put(JobRecord(id=job_id, channel_id=channel, status=status))


def waiting_ids(channel: str) -> set[str]:
    gate = manager.gate_of(channel)
    cursor, ids = gate.waiting_ids(0, 1000)
    assert cursor == 0
    return set(ids)


def test_a_slot_not_given_back_in_an_outage_is_given_back_by_the_sweep(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with redis_channel_setup(own_redis.url, CHANNEL) as broker:
        gate = manager.available(CHANNEL).gate
        gate.resize(1)
        assert gate.admit("taken") == "ok"
        stored("taken", Status.IN_PROGRESS)  # a worker took it...
        own_redis.stop()
        with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.channels.channel"):
            manager.release_slot(CHANNEL, "taken")  # ...and could not give its slot back
        assert "slot of job taken not given back" in caplog.text
        own_redis.start()
        assert gate.admit("next") == "full"  # the slot is still taken
        with caplog.at_level(logging.INFO, logger="pypepper_dramatiq.drivers.dramatiq.recovery"):
            assert sweeper(broker).reclaim_slots(utcnow()) == 1
        assert f"channel {CHANNEL}: 1 slot(s) given back" in caplog.text
        assert gate.admit("next") == "ok"


def test_ended_and_started_jobs_give_their_slots_back_scheduled_and_rowless_keep_them(
    redis_url: str,
) -> None:
    with redis_channel_setup(redis_url, CHANNEL) as broker:
        gate = manager.available(CHANNEL).gate
        kinds = {
            "done": Status.COMPLETED,
            "failed": Status.FAILED,
            "cancelled": Status.CANCELLED,
            "running": Status.IN_PROGRESS,
            "scheduled": Status.SCHEDULED,
        }
        gate.resize(len(kinds) + 1)
        for job_id, status in kinds.items():
            assert gate.admit(job_id) == "ok"
            stored(job_id, status)
        assert gate.admit("no-row-yet") == "ok"
        assert gate.admit("one-more") == "full"
        sweep = sweeper(broker)
        assert sweep.reclaim_slots(utcnow()) == 4
        assert waiting_ids(CHANNEL) == {"scheduled", "no-row-yet"}
        assert sweep.reclaim_slots(utcnow()) == 0  # what is kept stays kept
        assert waiting_ids(CHANNEL) == {"scheduled", "no-row-yet"}
        assert gate.admit("one-more") == "ok"


def test_a_channel_this_process_does_not_serve_is_swept_too(redis_url: str) -> None:
    with redis_channel_setup(redis_url, CHANNEL) as broker:
        other = manager.gate_of(OTHER, broker)  # another deployment's channel: not declared
        try:
            other.reset()
            other.resize(1)
            assert other.admit("elsewhere") == "ok"
            stored("elsewhere", Status.COMPLETED, channel=OTHER)
            assert OTHER not in manager.ids()
            assert sweeper(broker).reclaim_slots(utcnow()) == 1
            assert other.waiting() == 0
        finally:
            other.reset()


def test_a_large_waiting_set_is_swept_a_batch_at_a_time(redis_url: str) -> None:
    with redis_channel_setup(redis_url, CHANNEL) as broker:
        gate = manager.available(CHANNEL).gate
        ids = [f"ended-{i}" for i in range(300)]
        for job_id in ids:
            assert gate.admit(job_id) == "ok"
            stored(job_id, Status.COMPLETED)
        sweep = sweeper(broker)
        sweep.batch = 20
        given = [sweep.reclaim_slots(utcnow())]
        assert 0 < given[0] < len(ids)  # one bounded look a pass, not the whole set
        for _ in range(100):
            if not gate.waiting():
                break
            given.append(sweep.reclaim_slots(utcnow()))
        assert gate.waiting() == 0 and sum(given) == len(ids)
