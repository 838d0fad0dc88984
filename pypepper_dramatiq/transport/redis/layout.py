"""Every Redis key this package reads or writes, and what it relies on of Dramatiq's.

Ours start with :data:`KEY_PREFIX`. Dramatiq's Redis broker keeps, in its
namespace (``dramatiq`` by default):

* ``<ns>:<queue>``: a list of message ids waiting (``<queue>.DQ`` for delayed ones);
* ``<ns>:<queue>.msgs``: message id -> encoded message, until it is acknowledged;
* what its ``enqueue`` does: a new ``redis_message_id`` option per copy, the
  ``.DQ`` queue and an ``eta`` option for a delayed message, then the id pushed
  on the list and the encoded message set in the hash (:func:`enqueue_options`);
* ``<ns>:__acks__.<broker id>.<queue>``: the ids a worker fetched and has not
  acknowledged yet (the broker id is a UUID: no dot);
* ``<ns>:__heartbeats__``: broker id -> the time (ms) of its last command; one
  older than the heartbeat timeout is a dead worker, whose ack sets the
  maintenance pass puts back on their queues (then drops its heartbeat);
* its ``dispatch`` Lua script, called with the arguments in
  :func:`requeue_dead_workers`'s order.

Knowing this is a dependency on Dramatiq's internals (checked by the
integration tests against the Dramatiq version installed); keeping it in this
one module keeps that dependency in one place. Only the Redis transport
(:mod:`pypepper_dramatiq.transport.redis`) uses it.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import uuid4

from dramatiq.common import current_millis, dq_name

#: Prefix of every Redis key this package writes.
KEY_PREFIX = "pypepper"
#: Prefix of a channel's hash (``maxsize``, ``stopped``): ``<prefix><id>``.
CHANNEL_KEY_PREFIX = f"{KEY_PREFIX}:channel:"
#: Suffix of a channel's set of waiting job ids: ``<prefix><id><suffix>``.
WAITING_SUFFIX = ":waiting"
#: The pub/sub channel cancels are published on.
CANCEL_CHANNEL = f"{KEY_PREFIX}:cancel"
#: The pub/sub channel a job's id is published on when the job ends (Completed,
#: Failed, or Cancelled other than by a cancel call), for ``Job.wait()``.
ENDED_CHANNEL = f"{KEY_PREFIX}:ended"
#: The pub/sub channel a process announces on when it starts listening for job ends
#: (its ended listener subscribed): worker processes that stopped publishing ends,
#: because nobody listened, publish them again.
LISTENING_CHANNEL = f"{KEY_PREFIX}:listening"
#: Prefix of a rate limit's hash (its last retry time told, its limit as written):
#: ``<prefix><key>``; ``<prefix><key>:starts`` is the sorted set of its starts granted
#: within the last period (seconds of Redis's clock).
RATE_KEY_PREFIX = f"{KEY_PREFIX}:rate:"
#: Prefix of a concurrency limit's sorted set: ``<prefix><key>``, its holders scored
#: by when their lease lapses (seconds of Redis's clock).
SLOTS_KEY_PREFIX = f"{KEY_PREFIX}:slots:"
#: Prefix of a concurrency limit's line of held starts: ``<prefix><key>``, a sorted set
#: of job ids by their place (priority, then when first held); ``<prefix><key>:data``
#: the hash of their messages.
LINE_KEY_PREFIX = f"{KEY_PREFIX}:slots-line:"
#: The lock the recovery sweeper's leader holds.
LEADER_KEY = f"{KEY_PREFIX}:recovery:leader"


def messages_key(broker: Any, queue_name: str) -> str:
    """The hash of the messages of ``queue_name`` not yet acknowledged."""
    return f"{broker.namespace}:{queue_name}.msgs"


def acks_key(broker: Any, queue_name: str) -> str:
    """The set of ids this broker (worker process) fetched from ``queue_name``, unacknowledged."""
    return f"{broker.namespace}:__acks__.{broker.broker_id}.{queue_name}"


def heartbeats_key(broker: Any) -> str:
    """The sorted set of broker ids by the time (ms) of their last command."""
    return f"{broker.namespace}:__heartbeats__"


def ack_sets_prefix(broker: Any) -> str:
    """What every ack set's key starts with: ``<prefix><broker id>.<queue>``."""
    return f"{broker.namespace}:__acks__."


#: Keys one SCAN call of :func:`queues_held_by_dead_workers` asks Redis to look at.
SCAN_COUNT = 1000


def queues_held_by_dead_workers(broker: Any) -> set[str]:
    """The queues whose messages a dead worker (heartbeat older than the broker's
    ``heartbeat_timeout``) fetched and never acknowledged, read from its ack sets.

    The ack sets are what a worker holds, whatever channels it served and whether
    or not it ever wrote a worker row: the truth for what must come back. Nothing
    dead, nothing scanned (one ZRANGEBYSCORE); else one SCAN of the ack set keys
    (bounded by the keyspace, :data:`SCAN_COUNT` keys a call).
    """
    client = broker.client
    stale_before = current_millis() - int(broker.heartbeat_timeout)
    dead = {_text(i) for i in client.zrangebyscore(heartbeats_key(broker), 0, stale_before)}
    if not dead:
        return set()
    prefix = ack_sets_prefix(broker)
    dotted = [i for i in dead if "." in i]  # not Dramatiq's UUIDs: matched by prefix
    queues: set[str] = set()
    for key in client.scan_iter(match=_glob_escaped(prefix) + "*", count=SCAN_COUNT):
        rest = _text(key)[len(prefix) :]
        worker, _, queue = rest.partition(".")
        if worker in dead and queue:
            queues.add(queue)
            continue
        for worker in dotted:
            if rest.startswith(worker + ".") and len(rest) > len(worker) + 1:
                queues.add(rest[len(worker) + 1 :])
    return queues


def _text(value: bytes | str) -> str:
    """A key or member as text; bytes that are no UTF-8 are kept (surrogate escapes), so
    that the call naming them fails alone, not the whole scan."""
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _glob_escaped(text: str) -> str:
    """``text`` matched literally in a Redis glob pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def requeue_dead_workers(broker: Any, queue_name: str) -> None:
    """Run the Redis broker's maintenance for ``queue_name`` now.

    It moves messages fetched by workers whose heartbeat is older than the
    broker's ``heartbeat_timeout`` back onto the queue. Dramatiq runs it only
    at random, on a fraction of its fetches.
    """
    scripts = getattr(broker, "scripts", None)
    if not scripts or "dispatch" not in scripts:
        return
    scripts["dispatch"](
        args=[
            "qsize",
            current_millis(),
            queue_name,
            broker.broker_id,
            broker.heartbeat_timeout,
            broker.dead_message_ttl,
            1,
            broker._max_unpack_size(),
        ],
        keys=[broker.namespace],
    )


def queue_key(broker: Any, queue_name: str) -> str:
    """The list of message ids waiting in ``queue_name`` (``<queue>.DQ``: delayed ones)."""
    return f"{broker.namespace}:{queue_name}"


def enqueue_options(queue_name: str, delay: int | None = None) -> tuple[str, dict[str, Any]]:
    """The queue and the options Dramatiq's Redis broker gives a message for
    ``queue_name`` as it enqueues it (delayed by ``delay`` milliseconds), for a
    script that queues the message itself (an admission and an enqueue in one
    round trip).

    ``RedisBroker.enqueue`` gives each copy a new ``redis_message_id`` (its key in
    the queue's message hash; the message id may repeat on a retry), and a message
    delayed by ``delay`` milliseconds goes to the ``.DQ`` queue with its ``eta``:
    so does this. The script then does what the broker's ``enqueue`` command does,
    ``HSET <queue>.msgs <id> <encoded>`` and ``RPUSH <queue> <id>``.
    """
    options: dict[str, Any] = {"redis_message_id": str(uuid4())}
    if delay is None:
        return queue_name, options
    options["eta"] = current_millis() + delay
    return dq_name(queue_name), options
