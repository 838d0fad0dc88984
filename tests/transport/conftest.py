"""Fixtures of the transport tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq.brokers.redis import RedisBroker


@pytest.fixture
def flushed_redis_broker(redis_url: str) -> Iterator[RedisBroker]:
    """A Redis broker on the session's Redis, its database empty before and after."""
    made = RedisBroker(url=redis_url)
    made.client.flushdb()
    yield made
    made.client.flushdb()
    made.close()
