"""Raw data that is no Dramatiq message, pushed into the queues a real worker consumes.

As another application sharing the Redis would: an id in the queue's list, the data in
its message hash. Each kind (not JSON, a JSON list, an object missing fields, 10 MB of
bytes, a message naming another queue) goes in among queued jobs, so that the worker
fetches it in one batch with some of them, and one more into the delay queue.
"""

from __future__ import annotations

import json
import uuid

import pytest

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: Each kind of raw data, and what the worker's log line says of it.
BAD_DATA = {
    "not JSON": (b"\x1b[2Jnot json\n", "JSONDecodeError: Expecting value"),
    "a JSON list": (
        json.dumps(["pypepper_dramatiq.step", [], {}]).encode(),
        "decodes to a list, not a message's fields",
    ),
    "missing fields": (
        json.dumps({"actor_name": "pypepper_dramatiq.step", "args": []}).encode(),
        "missing field(s) queue_name, kwargs, options",
    ),
    "10 MB of bytes": (bytes(range(256)) * 40960, "UnicodeDecodeError"),
    # A whole message, but for a queue this worker does not consume: Dramatiq would hand
    # it back to that queue's consumer after running it, and the worker thread would die.
    "another queue's": (
        json.dumps(
            {
                "queue_name": "elsewhere",
                "actor_name": "pypepper_dramatiq.step",
                "args": [],
                "kwargs": {},
                "options": {"redis_message_id": "elsewhere-1"},
            }
        ).encode(),
        f"names queue 'elsewhere', not '{CHANNEL}'",
    ),
}
#: Raw data pushed into the delay queue ``<channel>.DQ``.
DELAYED_BAD_DATA = b"\x07delayed, and no JSON either"


def push_raw(cluster: Cluster, queue: str, data: bytes, before: bytes | None = None) -> str:
    """Put ``data`` under a new id in ``queue``'s hash and its id in the list (at the
    head, or just before the id ``before``); returns the id."""
    message_id = f"raw-{uuid.uuid4()}"
    cluster.redis.hset(f"dramatiq:{queue}.msgs", message_id, data)
    if before is None:
        cluster.redis.lpush(f"dramatiq:{queue}", message_id)
    else:
        cluster.redis.linsert(f"dramatiq:{queue}", "BEFORE", before, message_id)
    return message_id


def test_undecodable_messages_are_dead_lettered_and_strand_none_of_the_jobs_fetched_with_them(
    cluster: Cluster,
) -> None:
    jobs = [cluster.schedule(probe.task(name="p", value=i)) for i in range(9)]
    queued = cluster.redis.lrange(f"dramatiq:{CHANNEL}", 0, -1)
    assert len(queued) == len(jobs)
    # bad, job, bad, job, job, bad, job, job, bad, job...: a worker's prefetch (4 with
    # 2 threads) takes bad data and jobs in one fetch.
    ids = {
        kind: push_raw(cluster, CHANNEL, data, before=queued[position])
        for (kind, (data, _)), position in zip(BAD_DATA.items(), (0, 1, 3, 5, 7), strict=True)
    }
    delayed_id = push_raw(cluster, f"{CHANNEL}.DQ", DELAYED_BAD_DATA)

    worker = cluster.start_worker(threads=2)
    cluster.wait_status(jobs, timeout=60)

    dead = f"dramatiq:{CHANNEL}.XQ"
    every_id = [*ids.values(), delayed_id]
    wait_for(
        lambda: all(cluster.redis.zscore(dead, i) is not None for i in every_id),
        30,
        "every undecodable message in the dead-letter queue",
    )
    for kind, message_id in ids.items():
        assert cluster.redis.hget(f"{dead}.msgs", message_id) == BAD_DATA[kind][0], kind
    assert cluster.redis.hget(f"{dead}.msgs", delayed_id) == DELAYED_BAD_DATA
    assert [cluster.runs(job, "p") for job in jobs] == [1] * len(jobs)

    log = worker.log()
    assert "CRITICAL" not in log, log[-4000:]
    for kind, message_id in ids.items():
        line = next(
            (row for row in log.splitlines() if f"undecodable message {message_id}" in row), ""
        )
        assert f"on queue {CHANNEL} " in line, (kind, log[-4000:])
        assert BAD_DATA[kind][1] in line, (kind, line)
    assert f"undecodable message {delayed_id} on queue {CHANNEL}.DQ" in log
    assert "\\x1b[2Jnot json\\n" in log and "\\x07delayed" in log  # shown escaped,
    assert "\x1b" not in log and "\x07" not in log  # never raw
    assert len(log) < 100_000  # 10 MB of data shows as an excerpt

    # A restart brings none of it back: no id waits in a queue, in a hash or in an ack set.
    worker.stop_gracefully()
    second = cluster.start_worker(threads=2)
    later = cluster.schedule(probe.task(name="later"))
    cluster.wait_status([later], timeout=30)
    for queue in (CHANNEL, f"{CHANNEL}.DQ"):
        waiting = {i.decode() for i in cluster.redis.lrange(f"dramatiq:{queue}", 0, -1)}
        assert not waiting & set(every_id), queue
        assert not any(cluster.redis.hexists(f"dramatiq:{queue}.msgs", i) for i in every_id)
    for acks in cluster.redis.scan_iter("dramatiq:__acks__.*"):
        assert not {m.decode() for m in cluster.redis.smembers(acks)} & set(every_id), acks
    assert cluster.redis.zcard(dead) == len(every_id)
    assert "undecodable" not in second.log()
    assert "CRITICAL" not in second.log()
