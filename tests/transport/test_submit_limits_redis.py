"""On Redis too, a job whose row cannot be stored sends nothing: no message in its
queue, no channel slot taken, no row (the one-call Lua paths of ``scheduled()``
and ``schedule_many()`` are never reached)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from dramatiq.broker import Broker
from process_state import redis_channel_setup

from pypepper_dramatiq import Job, Workflow, get_job_store, manager, schedule_many, workflow_task

pytestmark = pytest.mark.redis

CHANNEL = "submit-limits"


@workflow_task(name="tests.submit_limits_redis.noop")
def noop(task: Any, context: Any, **params: Any) -> None:
    return None


@pytest.fixture
def broker(redis_url: str) -> Iterator[Broker]:
    with redis_channel_setup(redis_url, CHANNEL) as made:
        yield made


def job(**params: Any) -> Job:
    made = Job(channel_id=CHANNEL)
    made.workflows = [Workflow([noop.task(**params)])]
    return made


def assert_nothing_sent(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen(f"dramatiq:{CHANNEL}") == 0
        assert client.zcard(f"dramatiq:{CHANNEL}.DQ") == 0
    finally:
        client.close()
    assert manager.available(CHANNEL).length() == 0
    assert get_job_store().list() == []


def test_scheduled_sends_nothing_for_a_job_whose_row_cannot_be_stored(
    broker: Broker, redis_url: str
) -> None:
    refused = job(text="a\x00b")
    with pytest.raises(ValueError, match=r"\['params'\]\['text'\] holds U\+0000"):
        refused.scheduled()
    with pytest.raises(ValueError, match="delay must be finite and at most"):
        job().scheduled(delay=1e308)
    assert_nothing_sent(redis_url)
    assert job().scheduled()  # the channel still takes a job


def test_schedule_many_sends_nothing_of_a_batch_holding_one(broker: Broker, redis_url: str) -> None:
    bad = Job(channel_id=CHANNEL, category="c" * 129)
    bad.workflows = [Workflow([noop.task()])]
    with pytest.raises(ValueError, match="category is 129 characters long; at most 128"):
        schedule_many([job(), bad, job()])
    assert_nothing_sent(redis_url)
