"""The Redis transport: Dramatiq's Redis broker and the keys of :mod:`.layout`.

Every Redis call of the package goes through here (or :mod:`.gate`, :mod:`.batch`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dramatiq.common import dq_name

from ...errors import BrokerUnavailableError
from ...limits.rates import Rate
from ...ops.logs import get_logger
from ..base import (
    CHANNEL_SLOT_PREFIX,
    Admission,
    ChannelState,
    Gate,
    HeldStart,
    Notice,
    SendResult,
    SlotLimits,
    Subscribed,
    Subscription,
    Topic,
    Transport,
)
from . import batch, layout
from .gate import RedisGate, admit_and_enqueue, channel_states, is_redis_error
from .scripts import scripts_of

logger = get_logger(__name__)


@contextmanager
def _unreachable(what: str) -> Iterator[None]:
    """Raise a Redis error of the block as BrokerUnavailableError naming ``what``."""
    try:
        yield
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        raise BrokerUnavailableError(f"Redis unreachable for {what}: {exc}") from exc


#: The pub/sub channel of each topic.
CHANNELS = {
    Topic.CANCEL: layout.CANCEL_CHANNEL,
    Topic.ENDED: layout.ENDED_CHANNEL,
    Topic.LISTENING: layout.LISTENING_CHANNEL,
}
_TOPICS = {name: topic for topic, name in CHANNELS.items()}


class RedisSubscription(Subscription):
    """A redis-py ``PubSub`` subscribed to the channels of some topics."""

    def __init__(self, client: Any, topics: Collection[Topic]) -> None:
        self._pubsub = client.pubsub()
        self._pubsub.subscribe(*(CHANNELS[topic] for topic in topics))

    def poll(self, timeout: float) -> Notice | Subscribed | None:
        message = self._pubsub.get_message(timeout=timeout)
        if not message:
            return None
        kind = message.get("type")
        if kind == "message":
            topic = _TOPICS.get(_text(message.get("channel")))
            if topic is None:
                return None
            return Notice(topic, _text(message["data"]))
        if kind == "subscribe":
            return Subscribed(int(message.get("data") or 0))
        return None

    def add(self, topics: Collection[Topic]) -> None:
        self._pubsub.subscribe(*(CHANNELS[topic] for topic in topics))

    def close(self) -> None:
        self._pubsub.close()


class RedisTransport(Transport):
    """Coordination through Redis.

    Args:
        client: a ``redis.Redis`` client (the broker's).
        broker: Dramatiq's Redis broker on ``client``, whose queues the messages
            go to; None for a tool that only reads or changes channels and
            publishes notices (``pypepper-dramatiq channels``, ``cancel``).
    """

    where = "Redis"
    shared = True
    takes_undeclared_queues = True
    priority_queues = True
    message_id_option = "redis_message_id"

    def __init__(self, client: Any, broker: Any = None) -> None:
        self.client = client
        self.broker = broker

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisTransport:
        """A transport with a client of its own on ``url`` (``options`` go to the
        client), for a tool; :meth:`close` it.

        Raises:
            ValueError: ``url`` is no Redis URL the client can use.
        """
        import redis

        return cls(redis.Redis.from_url(url, **options))

    #: What the client raises when Redis cannot be used.
    @property
    def errors(self) -> tuple[type[Exception], ...]:
        import redis

        return (redis.RedisError,)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    # -- admission -----------------------------------------------------------------------

    def gate(self, channel_id: str, maxsize: int | None = None) -> Gate:
        return RedisGate(self.client, channel_id, maxsize)

    def enqueues_with(self, gate: Gate) -> bool:
        return isinstance(gate, RedisGate)

    def message_options(
        self, queue_name: str, delay: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        return layout.enqueue_options(queue_name, delay)

    def admit_and_enqueue(self, offers: Sequence[Admission]) -> list[SendResult]:
        return admit_and_enqueue(self.broker, offers)

    def channel_states(self) -> list[ChannelState] | None:
        return channel_states(self.client)

    # -- rate limits ---------------------------------------------------------------------

    def ask_start(self, key: str, rate: Rate, told: bool = False) -> float:
        try:
            answer = scripts_of(self.client).ask_start(
                keys=[layout.RATE_KEY_PREFIX + key, layout.RATE_KEY_PREFIX + key + ":starts"],
                args=[rate.count, repr(rate.period), str(rate), "1" if told else "0"],
            )
        except Exception as exc:
            if not is_redis_error(exc):
                raise
            raise BrokerUnavailableError(f"Redis unreachable for rate limit {key}: {exc}") from exc
        return max(0.0, float(answer))

    # -- concurrency limits --------------------------------------------------------------

    def acquire_slots(
        self, limits: SlotLimits, holder: str, lease_seconds: float, held: HeldStart | None = None
    ) -> bool:
        keys = _slot_keys([key for key, _ in limits])
        args: list[str | int] = [
            holder,
            repr(float(lease_seconds)),
            len(limits),
            *(limit for _, limit in limits),
            *(("", 0, "") if held is None else (held.job_id, held.priority, held.data)),
        ]
        # A channel's limit is recorded in its hash, for people (the CLI, the dashboard).
        for key, limit in limits:
            if key.startswith(CHANNEL_SLOT_PREFIX):
                keys.append(layout.CHANNEL_KEY_PREFIX + key[len(CHANNEL_SLOT_PREFIX) :])
                args.append(limit)
        with _unreachable("concurrency limits " + ", ".join(key for key, _ in limits)):
            return bool(scripts_of(self.client).acquire_slots(keys=keys, args=args))

    def release_slots(
        self, keys: Sequence[str], holder: str, reserve_seconds: float = 0.0
    ) -> list[HeldStart]:
        with _unreachable("concurrency limits " + ", ".join(keys)):
            if reserve_seconds <= 0:
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.zrem(layout.SLOTS_KEY_PREFIX + key, holder)
                pipe.execute()
                return []
            answer = scripts_of(self.client).release_slots(
                keys=_slot_keys(keys), args=[holder, repr(float(reserve_seconds))]
            )
        woken: dict[str, HeldStart] = {}
        for n in range(0, len(answer), 3):
            job_id, priority, data = (_text(value) for value in answer[n : n + 3])
            woken[job_id] = HeldStart(job_id, int(priority), data)
        return list(woken.values())

    def send_first(self, broker: Any, message: Any) -> None:
        """At the head of its queue's list (Dramatiq's Redis consumers pop the head):
        the woken start does not wait behind its queue's backlog while its slot is
        kept for it. Dramatiq's enqueue hooks run as for any enqueue."""
        message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
        message_id = message.options["redis_message_id"]
        broker.emit_before("enqueue", message, None)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(layout.messages_key(broker, message.queue_name), message_id, message.encode())
        pipe.lpush(layout.queue_key(broker, message.queue_name), message_id)
        pipe.execute()
        broker.emit_after("enqueue", message, None)

    def ack_fetched(self, consumer: Any, messages: Sequence[Any]) -> bool:
        """One pipeline of the Redis broker's own ``ack`` script calls, by its digest
        (``EVALSHA``): the consumer loaded the script to fetch these messages, and a
        pipeline given the script object would first ask Redis whether it exists, a
        round trip of its own. False when ``consumer`` is not a Redis broker's, or the
        pipeline failed."""
        broker = getattr(consumer, "broker", None)
        scripts = getattr(broker, "scripts", None)
        client = getattr(broker, "client", None)
        if broker is None or not isinstance(scripts, dict) or "dispatch" not in scripts:
            return False
        try:
            dispatch = scripts["dispatch"]
            pipe = client.pipeline(transaction=False)  # type: ignore[union-attr]
            for message in messages:
                args = [
                    "ack",
                    int(time.time() * 1000),
                    consumer.queue_name,
                    broker.broker_id,
                    broker.heartbeat_timeout,
                    broker.dead_message_ttl,
                    broker._should_do_maintenance("ack"),
                    broker._max_unpack_size(),
                    message.options["redis_message_id"],
                ]
                pipe.evalsha(dispatch.sha, 1, broker.namespace, *args)
            pipe.execute()
        except Exception as exc:  # the one-by-one path reports its own errors
            logger.debug("pipelined acknowledgement failed (%s); one by one", exc)
            return False
        for message in messages:
            consumer.queued_message_ids.discard(message.message_id)
        return True

    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        if not held:
            return
        keys = [layout.SLOTS_KEY_PREFIX + key for key, _ in held]
        args = [repr(float(lease_seconds)), *(holder for _, holder in held)]
        with _unreachable("concurrency slots' renewal"):
            scripts_of(self.client).renew_slots(keys=keys, args=args)

    def slots_held(self, key: str) -> list[str]:
        with _unreachable(f"concurrency limit {key}"):
            held = scripts_of(self.client).slots_held(keys=[layout.SLOTS_KEY_PREFIX + key])
        return sorted(h.decode() if isinstance(h, bytes) else str(h) for h in held)

    # -- notices -------------------------------------------------------------------------

    def publish(self, topic: Topic, text: str) -> int | None:
        if topic is Topic.ENDED:  # one per job end: coalesced with the other threads'
            return int(batch.send(self.client, "PUBLISH", CHANNELS[topic], text))
        return int(self.client.publish(CHANNELS[topic], text))

    @property
    def carries_notices(self) -> bool:
        return True

    def subscribe(self, topics: Collection[Topic]) -> Subscription:
        return RedisSubscription(self.client, topics)

    @property
    def connection(self) -> Any:
        return self.client

    # -- the recovery sweep --------------------------------------------------------------

    def lead(self, owner: str, ttl_seconds: float) -> bool:
        ttl = int(ttl_seconds * 1000)
        client = self.client
        if client.set(layout.LEADER_KEY, owner, nx=True, px=ttl):
            return True
        holder = client.get(layout.LEADER_KEY)
        if holder in (owner, owner.encode()):
            client.pexpire(layout.LEADER_KEY, ttl)
            return True
        return False

    def requeue_dead_workers(self, queue_name: str) -> None:
        layout.requeue_dead_workers(self.broker, queue_name)

    def queues_held_by_dead_workers(self) -> set[str]:
        return layout.queues_held_by_dead_workers(self.broker)

    def messages_exist(self, messages: Sequence[tuple[str, str | None]]) -> list[bool] | None:
        with self.client.pipeline(transaction=False) as pipe:
            for queue, message_id in messages:
                pipe.hexists(layout.messages_key(self.broker, queue), message_id or "")
                pipe.hexists(layout.messages_key(self.broker, dq_name(queue)), message_id or "")
            answers = pipe.execute()
        return [bool(answers[2 * i] or answers[2 * i + 1]) for i in range(len(messages))]

    # -- what a worker's consumers hold --------------------------------------------------

    def find_fetched(self, queue_name: str, data: bytes | str) -> list[str]:
        """The ack set is small (the consumer's prefetch and what is being processed);
        the lengths are compared first, so only data of the same size is read again."""
        client = self.client
        hash_key = layout.messages_key(self.broker, queue_name)
        ids = [
            _text(member) for member in client.smembers(layout.acks_key(self.broker, queue_name))
        ]
        if not ids:
            return []
        size = len(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)
        with client.pipeline(transaction=False) as pipe:
            for message_id in ids:
                pipe.hstrlen(hash_key, message_id)
            lengths = pipe.execute()
        same_size = [message_id for message_id, n in zip(ids, lengths, strict=True) if n == size]
        return [
            message_id
            for message_id, stored in zip(
                same_size, client.hmget(hash_key, same_size) if same_size else [], strict=True
            )
            if stored == data
        ]

    def fetched_ids(self, queue_name: str) -> set[str] | None:
        members = self.client.smembers(layout.acks_key(self.broker, queue_name))
        return {_text(member) for member in members}

    def stored_messages(self, queue_name: str, message_ids: Sequence[str]) -> list[Any]:
        return list(self.client.hmget(layout.messages_key(self.broker, queue_name), message_ids))

    def requeue(self, queue_name: str, message_ids: Sequence[str]) -> None:
        """Dramatiq's own "requeue": out of this worker's ack set, back on the queue."""
        self.broker.do_requeue(queue_name, *message_ids)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _slot_keys(keys: Sequence[str]) -> list[str]:
    """The Redis keys of concurrency limits ``keys``: their slots, then their lines,
    then their lines' messages (see ``scripts/acquire_slots.lua``)."""
    return [
        *(layout.SLOTS_KEY_PREFIX + key for key in keys),
        *(layout.LINE_KEY_PREFIX + key for key in keys),
        *(layout.LINE_KEY_PREFIX + key + ":data" for key in keys),
    ]
