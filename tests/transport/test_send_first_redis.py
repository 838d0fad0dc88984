"""A held start a release woke goes to the head of its Redis queue: it is not taken
after the queue's backlog while the slot kept for it waits (bench scenario 21)."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from pypepper_dramatiq.transport.redis import RedisTransport
from pypepper_dramatiq.transport.redis.layout import messages_key, queue_key

pytestmark = pytest.mark.redis


@pytest.fixture
def broker(flushed_redis_broker: RedisBroker) -> RedisBroker:
    return flushed_redis_broker


def message(name: str) -> dramatiq.Message[object]:
    return dramatiq.Message(queue_name="woken", actor_name="a", args=(name,), kwargs={}, options={})


def test_a_woken_start_is_sent_at_the_head_of_its_queue(broker: RedisBroker) -> None:
    broker.declare_queue("woken")
    for name in ("backlog-1", "backlog-2"):
        broker.enqueue(message(name))
    transport = RedisTransport(broker.client, broker)
    transport.send_first(broker, message("woken"))
    ids = [i.decode() for i in broker.client.lrange(queue_key(broker, "woken"), 0, -1)]
    stored = broker.client.hmget(messages_key(broker, "woken"), ids)
    names = [dramatiq.Message.decode(data).args[0] for data in stored]
    assert names == ["woken", "backlog-1", "backlog-2"]
    [first] = [m for m in map(dramatiq.Message.decode, stored) if m.args[0] == "woken"]
    assert first.options["redis_message_id"] == ids[0]
