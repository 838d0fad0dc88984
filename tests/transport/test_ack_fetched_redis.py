"""The completion thread's acknowledgements on Redis: the messages a consumer fetched,
acknowledged in one pipeline through the transport, leave its unacked set."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq.transport.local import LocalTransport
from pypepper_dramatiq.transport.redis import RedisTransport

pytestmark = pytest.mark.redis


@pytest.fixture
def broker(flushed_redis_broker: RedisBroker) -> RedisBroker:
    return flushed_redis_broker


def fetched(
    broker: RedisBroker, count: int
) -> tuple[dramatiq.Consumer, list[dramatiq.Message[object]]]:
    broker.declare_queue("acks")
    for n in range(count):
        broker.enqueue(
            dramatiq.Message(queue_name="acks", actor_name="a", args=(n,), kwargs={}, options={})
        )
    consumer = broker.consume("acks", prefetch=count, timeout=100)
    messages = [next(consumer) for _ in range(count)]
    assert all(m is not None for m in messages)
    return consumer, [m for m in messages if m is not None]


def unacked(broker: RedisBroker) -> int:
    return sum(broker.client.scard(key) for key in broker.client.keys("dramatiq:__acks__.*"))


def test_fetched_messages_are_acknowledged_in_one_pipeline(broker: RedisBroker) -> None:
    consumer, messages = fetched(broker, 3)
    assert unacked(broker) == 3
    assert RedisTransport(broker.client, broker).ack_fetched(consumer, messages)
    assert unacked(broker) == 0
    assert not consumer.queued_message_ids  # type: ignore[attr-defined]
    consumer.close()


def test_a_consumer_of_another_broker_is_left_to_one_by_one_acks(broker: RedisBroker) -> None:
    stub = StubBroker()
    stub.declare_queue("acks")
    consumer = stub.consume("acks", timeout=10)
    assert not RedisTransport(broker.client, broker).ack_fetched(consumer, [])
    assert not LocalTransport().ack_fetched(consumer, [])
