"""A Redis that is down is a typed error naming the channel, and nothing is queued or saved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import restartable_redis, started  # tests/conftest.py
from services import RedisServer

from pypepper_dramatiq import (
    BrokerUnavailableError,
    CallableExecutor,
    ChannelEnqueueError,
    Job,
    Status,
    Task,
    Workflow,
    manager,
    setup,
)
from pypepper_dramatiq.channels.broker import get_broker

pytestmark = pytest.mark.redis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = started(restartable_redis(tmp_path / "redis"), "Redis")
    yield server
    server.stop(kill=True)


def test_setup_against_an_unreachable_redis_returns_and_scheduling_names_the_channel() -> None:
    # A worker may start before Redis (as a plain Dramatiq worker does); a
    # producer learns of the outage when it sends, as a typed error.
    setup(broker_url="redis://127.0.0.1:1/0", channels=["orders"])
    job = Job(category="t", channel_id="orders")
    job.workflows.append(
        Workflow([Task("orders", "d", "f", "t", "t", "", [], CallableExecutor(lambda t, c: 1))])
    )
    try:
        with pytest.raises(BrokerUnavailableError, match="channel orders"):
            job.scheduled()
        assert job.status is Status.UNKNOWN
    finally:
        get_broker().close()
        manager.clear()


def test_scheduling_while_redis_is_down_queues_and_saves_nothing(own_redis: RedisServer) -> None:
    setup(broker_url=own_redis.url, channels=["orders"])
    job = Job(category="t", channel_id="orders")
    job.workflows.append(
        Workflow([Task("orders", "d", "f", "t", "t", "", [], CallableExecutor(lambda t, c: 1))])
    )
    own_redis.stop(kill=True)
    try:
        with pytest.raises(BrokerUnavailableError) as raised:
            job.scheduled()
        assert isinstance(raised.value, ChannelEnqueueError)  # a pre-enqueue failure
        assert job.status is Status.UNKNOWN  # rolled back: scheduled() can be retried
        assert Job.get_saved(job.id) is None
    finally:
        get_broker().close()
        manager.clear()
