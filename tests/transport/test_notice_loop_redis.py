"""One notice loop per process and connection: a worker's cancel listener and a
waiter's ended listener share one subscription on real Redis, each hears its own
topics, and the loop ends with its last listener."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from pypepper_dramatiq.channels.end_notices import EndedListener, audience, waiters
from pypepper_dramatiq.drivers.dramatiq.cancel_listener import CancelListener
from pypepper_dramatiq.engine.running import InFlight
from pypepper_dramatiq.transport import Topic
from pypepper_dramatiq.transport.redis import RedisTransport
from pypepper_dramatiq.transport.redis.layout import CANCEL_CHANNEL, ENDED_CHANNEL

pytestmark = pytest.mark.redis


class SeenCancels(InFlight):
    """The attempts of this process, recording which jobs it was told were cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def cancel(self, job_id: str) -> bool:
        self.seen.append(job_id)
        return super().cancel(job_id)


def eventually(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.01)


def subscribers(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def test_a_worker_and_a_waiter_share_one_subscription(redis_client: redis.Redis) -> None:
    eventually(
        lambda: subscribers(redis_client, CANCEL_CHANNEL) == 0, "no subscriber left by others"
    )
    inflight = SeenCancels()
    cancels = CancelListener(RedisTransport(redis_client), inflight, reconnect_delay=0.1)
    # Another transport object on the same client: the same connection, the same loop.
    ended = EndedListener(RedisTransport(redis_client), reconnect_delay=0.1)
    woken: dict[str, threading.Event] = {job: threading.Event() for job in ("job-c", "job-e")}
    for job_id, event in woken.items():
        waiters.add(job_id, event.set)
    try:
        cancels.start()
        assert cancels.ready.wait(5)
        ended.start()  # joins the running loop: its topics are added to the subscription
        assert ended.ready.wait(5)
        eventually(lambda: not audience.quiet, "the worker heard the waiter announce itself")
        eventually(lambda: ended._settle_at is None, "the waiters woken after announcing")
        assert subscribers(redis_client, CANCEL_CHANNEL) == 1  # both hear it, on one connection
        assert subscribers(redis_client, ENDED_CHANNEL) == 1
        for event in woken.values():
            event.clear()

        RedisTransport(redis_client).publish(Topic.CANCEL, "job-c")
        assert woken["job-c"].wait(5)  # the waiter's listener hears cancels...
        eventually(lambda: inflight.seen == ["job-c"], "the worker's listener heard the cancel")
        RedisTransport(redis_client).publish(Topic.ENDED, "job-e")
        assert woken["job-e"].wait(5)
        assert inflight.seen == ["job-c"]  # ...the worker's does not hear job ends
    finally:
        for job_id, event in woken.items():
            waiters.discard(job_id, event.set)
        cancels.stop()
        ended.stop()
        audience.hearing(False)
    eventually(
        lambda: (
            subscribers(redis_client, CANCEL_CHANNEL) == 0
            and subscribers(redis_client, ENDED_CHANNEL) == 0
        ),
        "the loop ended with its last listener",
    )
    eventually(
        lambda: not [t for t in threading.enumerate() if t.name == "pypepper-notices"],
        "the loop's thread ended",
    )


def test_a_listener_that_joins_later_is_told_it_is_subscribed(redis_client: redis.Redis) -> None:
    first = EndedListener(RedisTransport(redis_client), reconnect_delay=0.1)
    second = CancelListener(RedisTransport(redis_client), InFlight(), reconnect_delay=0.1)
    try:
        first.start()
        assert first.ready.wait(5)
        second.start()  # its CANCEL topic is heard already: told at once, LISTENING added
        assert second.ready.wait(5)
        eventually(
            lambda: subscribers(redis_client, "pypepper:listening") == 1,
            "the announcements are heard too",
        )
    finally:
        first.stop()
        second.stop()
        audience.hearing(False)
