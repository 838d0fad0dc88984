"""The one Redis call of ``scheduled()`` (admission and enqueue in one script) sent
through fewer of redis-py's layers: what redis-py's own call would do still happens
when Redis lost the script or the connection was cut.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from .one_task_jobs import one_task_job

pytestmark = pytest.mark.redis

CHANNEL = "script-calls"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def queued(client: redis.Redis) -> list[bytes]:
    """The message ids waiting in the channel's Dramatiq queue."""
    return list(client.lrange(f"dramatiq:{CHANNEL}", 0, -1))


def test_a_script_redis_lost_is_loaded_again_and_the_job_queued(
    broker: object, client: redis.Redis
) -> None:
    one_task_job(CHANNEL).scheduled()  # the script is loaded
    client.script_flush()  # as after a Redis restart without persistence
    second = one_task_job(CHANNEL)
    assert second.scheduled() == second.id
    assert len(queued(client)) == 2
    assert client.sismember(f"pypepper:channel:{CHANNEL}:waiting", second.id)


def test_a_connection_cut_is_made_again_and_the_job_queued_once(
    broker: object, client: redis.Redis
) -> None:
    one_task_job(CHANNEL).scheduled()  # the producer's connection is open and pooled
    assert client.client_kill_filter(_type="normal", skipme=True) >= 1
    second = one_task_job(CHANNEL)
    assert second.scheduled() == second.id
    assert len(queued(client)) == 2  # one message each: the cut call was not run twice
