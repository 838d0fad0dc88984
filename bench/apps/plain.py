"""Plain Dramatiq: ``dramatiq bench.apps.plain`` (queue ``plain``)."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import probe

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)
if os.environ.get("BENCH_COUNT_TRIPS") == "1":  # scenario 20 counts blocking calls
    from . import trips

    trips.install()


@dramatiq.actor(queue_name="plain", max_retries=0, broker=broker)
def noop(key: str | None = None) -> None:
    probe.mark("plain", key)
