"""The channels page over Redis: every channel with keys there, as the shell lists them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from werkzeug.test import Client

from pypepper_dramatiq.transport.redis import RedisGate
from pypepper_dramatiq.web import make_app

pytestmark = pytest.mark.redis


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    made = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]
    yield made
    made.close()


def test_the_channels_page_reads_redis(broker: RedisBroker) -> None:
    client: redis.Redis = broker.client
    bounded, stopped = (f"web-{uuid.uuid4().hex[:8]}" for _ in range(2))
    gates = [RedisGate(client, bounded, 3), RedisGate(client, stopped)]
    try:
        gates[0].connect()
        assert gates[0].admit("job-1") == "ok"
        gates[1].request_stop()
        page = Client(make_app(broker=broker)).get("/channels").get_data(as_text=True)
        assert "As kept in Redis." in page
        row = page.split(f">{bounded}</a>", 1)[1].split("</tr>", 1)[0]
        assert "<td>1</td>" in row and "<td>3</td>" in row and ">no<" in row
        row = page.split(f">{stopped}</a>", 1)[1].split("</tr>", 1)[0]
        assert "unbounded" in row and ">stopped<" in row
    finally:
        for gate in gates:
            gate.reset()


def test_a_redis_that_cannot_be_reached_is_said_on_the_page() -> None:
    down = RedisBroker(url="redis://127.0.0.1:1/0")  # type: ignore[no-untyped-call]
    try:
        response = Client(make_app(broker=down)).get("/channels")
        assert response.status_code == 200
        assert "Redis cannot be read" in response.get_data(as_text=True)
    finally:
        down.close()
