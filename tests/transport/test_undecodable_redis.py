"""Finding the Redis id of undecodable data in a worker's ack set (real Redis).

Dramatiq's fetch returns the data without its ids; the placeholder needs the id to
dead-letter the data, so it is looked for among this worker's unacknowledged ids
of the queue (``undecodable.find_redis_id``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
import redis
from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker

from pypepper_dramatiq.drivers.dramatiq.undecodable import (
    OPTION_KEY,
    UndecodableMiddleware,
    find_redis_id,
    placeholder,
)
from pypepper_dramatiq.transport.redis.layout import acks_key, messages_key

pytestmark = pytest.mark.redis


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    made = RedisBroker(url=redis_url)
    made.client.flushdb()
    yield made
    made.close()


def fetched(client: redis.Redis, broker: RedisBroker, queue: str, data: bytes) -> str:
    """``data`` as a fetch leaves it: in the queue's hash, its id in this worker's ack set."""
    message_id = str(uuid.uuid4())
    client.hset(messages_key(broker, queue), message_id, data)
    client.sadd(acks_key(broker, queue), message_id)
    return message_id


def test_each_copy_of_the_same_data_gets_its_own_id_and_other_data_none(
    broker: RedisBroker,
) -> None:
    client = broker.client
    first = fetched(client, broker, "q", b"same bad data")
    second = fetched(client, broker, "q", b"same bad data")
    fetched(client, broker, "q", b"same bad dat!")  # same size, other bytes
    fetched(client, broker, "q", b"{}")
    elsewhere = fetched(client, broker, "other", b"same bad data")

    found = {find_redis_id(broker, "q", b"same bad data") for _ in range(2)}

    assert found == {first, second}
    assert find_redis_id(broker, "q", b"same bad data") is None  # both given out
    assert find_redis_id(broker, "other", b"same bad data") == elsewhere
    assert find_redis_id(broker, "q", b"never fetched") is None


def test_without_redis_the_placeholder_says_so_and_dead_letters_nothing(
    broker: RedisBroker, caplog: pytest.LogCaptureFixture
) -> None:
    gone = RedisBroker(url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    try:
        fields = placeholder(gone, "q", b"\x1b not json", "not decodable: ...")
    finally:
        gone.close()
    assert fields["options"]["redis_message_id"] == ""  # in no ack set: a rejection is a no-op
    about = fields["options"][OPTION_KEY]
    assert about["redis_id"] is None
    assert about["lookup"].startswith("ConnectionError")

    message = MessageProxy(Message(**{**fields, "args": ()}))
    with caplog.at_level(logging.ERROR):
        UndecodableMiddleware().before_process_message(broker, message)
    assert message.failed
    (record,) = [r for r in caplog.records if getattr(r, "action", "") == "dead_letter_undecodable"]
    assert "it stays there, and comes back" in record.getMessage()
    assert "\\x1b not json" in record.getMessage()
