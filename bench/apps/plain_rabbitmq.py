"""Plain Dramatiq on RabbitMQ: ``dramatiq bench.apps.plain_rabbitmq`` (queue ``plain_rmq``).

Dramatiq's RabbitMQ broker as a user gets it (no publisher confirms, its default).
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from . import probe

broker = RabbitmqBroker(url=os.environ["BENCH_RABBITMQ_URL"])
dramatiq.set_broker(broker)

#: The probe's tag (and the queue's name).
TAG = "plain_rmq"


@dramatiq.actor(queue_name=TAG, max_retries=0, broker=broker)
def noop(key: str | None = None) -> None:
    probe.mark(TAG, key)
