"""Fixtures of the transport tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq import Broker
from dramatiq.brokers.redis import RedisBroker
from process_state import redis_channel_setup


@pytest.fixture
def flushed_redis_broker(redis_url: str) -> Iterator[RedisBroker]:
    """A Redis broker on the session's Redis, its database empty before and after."""
    made = RedisBroker(url=redis_url)
    made.client.flushdb()
    yield made
    made.client.flushdb()
    made.close()


@pytest.fixture
def broker(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """``setup()`` on the session's Redis with the test module's one ``CHANNEL``,
    unbounded, its queue empty before and after; the broker."""
    with redis_channel_setup(redis_url, request.module.CHANNEL) as made:
        yield made
