"""Job-end notices on real Redis: a worker process stops publishing them while
nobody listens, and starts again when a listener announces itself.

The worker's side is its cancel listener (which hears the announcements); the
waiter's side is the ended listener ``Job.wait()`` starts. PUBLISH calls are
counted on the server (``INFO commandstats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from pypepper_dramatiq.channels.end_notices import EndedListener, audience, publish_ended, waiters
from pypepper_dramatiq.drivers.dramatiq.cancel_listener import CancelListener
from pypepper_dramatiq.engine.running import InFlight
from pypepper_dramatiq.transport.redis import RedisTransport
from pypepper_dramatiq.transport.redis.layout import ENDED_CHANNEL

pytestmark = pytest.mark.redis


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.fixture
def worker_hearing(client: redis.Redis) -> Iterator[CancelListener]:
    """This process as a worker: its cancel listener hears announcements."""
    listener = CancelListener(RedisTransport(client), InFlight(), reconnect_delay=0.1)
    listener.start()
    assert listener.ready.wait(5)
    yield listener
    listener.stop()
    listener.join(5)
    audience.hearing(False)


def publishes(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_publish", {})
    return int(stats.get("calls", 0))


def eventually(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.01)


def test_without_a_listener_a_worker_goes_quiet_and_an_announcement_wakes_it(
    client: redis.Redis, worker_hearing: CancelListener
) -> None:
    # Nobody listens: the first end is published (and reaches nobody)...
    before = publishes(client)
    assert publish_ended("job-1", RedisTransport(client)) is True
    assert publishes(client) == before + 1
    # ...the next ones are not: a round trip each, for nobody.
    assert audience.quiet
    assert publish_ended("job-2", RedisTransport(client)) is False
    assert publish_ended("job-3", RedisTransport(client)) is False
    assert publishes(client) == before + 1

    # A waiter's listener subscribes and announces itself: the worker publishes again.
    heard: list[bytes] = []
    sub = client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(ENDED_CHANNEL)
    listener = EndedListener(RedisTransport(client), reconnect_delay=0.1)
    listener.start()
    try:
        assert listener.ready.wait(5)
        eventually(lambda: not audience.quiet, "the worker heard the announcement", timeout=3)
        assert publish_ended("job-4", RedisTransport(client)) is True
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            message = sub.get_message(timeout=0.5)  # None for the subscribe confirmation
            if message is not None and message["type"] == "message":
                heard.append(message["data"])
        assert heard == [b"job-4"]
    finally:
        listener.stop()
        listener.join(5)
        sub.close()


def test_a_process_that_hears_nothing_publishes_every_end(client: redis.Redis) -> None:
    audience.hearing(False)
    before = publishes(client)
    for n in range(3):
        assert publish_ended(f"job-{n}", RedisTransport(client)) is True
    assert publishes(client) == before + 3
    assert not audience.quiet


def test_a_listener_wakes_its_waiters_again_after_announcing(client: redis.Redis) -> None:
    woken = threading.Semaphore(0)
    waiters.add("job-w", woken.release)
    listener = EndedListener(RedisTransport(client), reconnect_delay=0.1)
    listener.start()
    try:
        assert listener.ready.wait(5)
        # Once when subscribed, once more after the quiet workers heard the announcement.
        assert woken.acquire(timeout=5)
        assert woken.acquire(timeout=5)
    finally:
        waiters.discard("job-w", woken.release)
        listener.stop()
        listener.join(5)


def test_a_worker_whose_hearing_fails_publishes_again(
    client: redis.Redis, worker_hearing: CancelListener
) -> None:
    assert publish_ended("job-1", RedisTransport(client)) is True  # reaches nobody: quiet
    assert audience.quiet
    worker_hearing.stop()
    worker_hearing.join(5)
    assert not audience.quiet  # announcements are no longer heard: publish every end
    before = publishes(client)
    assert publish_ended("job-2", RedisTransport(client)) is True
    assert publishes(client) == before + 1
