"""The channels page over Redis: every channel with keys there, as the shell lists them."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from werkzeug.test import Client

from pypepper_dramatiq.channels.broker import transport_of
from pypepper_dramatiq.limits.rates import Rate
from pypepper_dramatiq.transport.base import channel_rate_key
from pypepper_dramatiq.transport.redis import RedisGate
from pypepper_dramatiq.transport.redis.layout import RATE_KEY_PREFIX
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
        # A worker elsewhere applied a limit to the bounded channel's starts.
        transport_of(broker).ask_start(channel_rate_key(bounded), Rate(20, 60.0))
        page = Client(make_app(broker=broker)).get("/channels").get_data(as_text=True)
        assert "As kept in Redis." in page
        row = page.split(f">{bounded}</a>", 1)[1].split("</tr>", 1)[0]
        assert "<td>1</td>" in row and "<td>3</td>" in row and ">no<" in row
        assert "<td>20/m</td>" in row
        row = page.split(f">{stopped}</a>", 1)[1].split("</tr>", 1)[0]
        assert "unbounded" in row and ">stopped<" in row
    finally:
        for gate in gates:
            gate.reset()
        client.delete(*(f"{RATE_KEY_PREFIX}channel:{bounded}{end}" for end in ("", ":starts")))


def test_a_redis_that_cannot_be_reached_is_said_on_the_page() -> None:
    down = RedisBroker(url="redis://127.0.0.1:1/0")  # type: ignore[no-untyped-call]
    try:
        response = Client(make_app(broker=down)).get("/channels")
        assert response.status_code == 200
        assert "Redis cannot be read" in response.get_data(as_text=True)
    finally:
        down.close()


def test_channel_actions_change_the_channel_in_redis_for_every_process(
    broker: RedisBroker,
) -> None:
    client: redis.Redis = broker.client
    name, unknown = (f"web-{uuid.uuid4().hex[:8]}" for _ in range(2))
    gate = RedisGate(client, name, 3)
    gate.connect()
    dashboard = Client(make_app(broker=broker, allow_anonymous_actions=True))
    try:
        page = dashboard.get("/channels").get_data(as_text=True)
        token = re.findall(r'name="csrf_token" value="([^"]+)"', page)[0]

        def post(action: str, channel: str, **form: str) -> int:
            response = dashboard.post(
                f"/actions/channel/{action}/{channel}", data={"csrf_token": token, **form}
            )
            return response.status_code

        assert post("stop", name) == 303
        assert RedisGate(client, name).stopped  # a gate of its own reads Redis
        assert post("resize", name, size="7") == 303 and RedisGate(client, name).maxsize == 7
        assert post("resume", name) == 303 and not RedisGate(client, name).stopped
        # As the CLI: a resume of a channel Redis does not know is refused; a stop
        # creates it stopped (to stop it before its producers start).
        assert post("resume", unknown) == 404
        assert post("stop", unknown) == 303 and RedisGate(client, unknown).stopped
    finally:
        gate.reset()
        RedisGate(client, unknown).reset()
