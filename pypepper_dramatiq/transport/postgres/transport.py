"""The PostgreSQL transport: coordination in the job store's database, next to a
broker that redelivers what dead consumers held (RabbitMQ)."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from ...limits.rates import IDLE_KEEP_SECONDS, Rate
from ...limits.storable import (
    CONCURRENCY_HOLDER_LENGTH,
    CONCURRENCY_SLOT_KEY_LENGTH,
    ID_LENGTH,
    RATE_KEY_LENGTH,
    check_text,
)
from ..base import ChannelState, Gate, HeldStart, SlotLimits, Subscription, Topic, Transport
from . import batch
from .connections import dedicated
from .gate import PostgresGate, channel_states
from .leader import LeaderLock
from .notices import CHANNELS, PostgresSubscription, check_payload
from .outage import run

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")
#: Asks for a start under a rate limit (``Transport.ask_start``): one call of the
#: function of migration 0015, which locks the key's row, then reads the clock.
_ASK_START = text("SELECT pypepper_rate_ask(:key, :count, :period, :limit, :told)")
#: Deletes the rows of the keys idle for ``:idle`` seconds (their newest start and the
#: last time told, both on the server's clock), skipping a row a start holds locked
#: (in use); ``pypepper_rate_ask`` (0016) makes the row again when it asks.
_PRUNE = text(
    "DELETE FROM scheduler_rate_turns WHERE key IN ("
    " SELECT key FROM scheduler_rate_turns"
    " WHERE greatest(tail_at, coalesce(starts[array_upper(starts, 1)], 0))"
    " < extract(epoch FROM clock_timestamp()) - :idle"
    " LIMIT :limit FOR UPDATE SKIP LOCKED) RETURNING key"
)

#: Takes a slot of each of some concurrency limits, all or none
#: (``Transport.acquire_slots``): one call of the function of migration 0017.
_ACQUIRE_SLOTS = text(
    "SELECT pypepper_slots_acquire(:keys, :limits, :holder, :lease, :job, :priority, :data)"
)
#: Gives a holder's slots back and wakes the first start in each one's line (0019).
_RELEASE_WAKING = text(
    "SELECT woken_job, woken_priority, woken_data"
    " FROM pypepper_slots_release(:keys, :holder, :reserve)"
)
#: Gives a holder's slots back.
_RELEASE_SLOTS = text(
    "DELETE FROM scheduler_concurrency_slots WHERE key = ANY(:keys) AND holder = :holder"
)
#: Renews slots whose lease has not lapsed.
_RENEW_SLOTS = text(
    "UPDATE scheduler_concurrency_slots AS s"
    " SET expires_at = extract(epoch FROM clock_timestamp()) + :lease"
    " FROM unnest(CAST(:keys AS text[]), CAST(:holders AS text[])) AS h(key, holder)"
    " WHERE s.key = h.key AND s.holder = h.holder"
    " AND s.expires_at > extract(epoch FROM clock_timestamp())"
)
#: A key's holders whose lease has not lapsed.
_SLOTS_HELD = text(
    "SELECT holder FROM scheduler_concurrency_slots WHERE key = :key"
    " AND expires_at > extract(epoch FROM clock_timestamp()) ORDER BY holder"
)


class PostgresTransport(Transport):
    """Coordination through PostgreSQL (psycopg 3).

    Args:
        engine: the SQL store's engine (PostgreSQL, schema 0012 or later); its pool
            carries the gates' statements and the notices sent; the subscription
            and the leader lock hold connections of their own.
        broker: the broker the messages go to (unused here: RabbitMQ redelivers
            what dead consumers held by itself).
    """

    where = "PostgreSQL"
    shared = True
    # Dramatiq's RabbitmqBroker declares the queue itself as it enqueues
    # (``declare_queue(..., ensure=True)``): no message is dropped for want of one.
    takes_undeclared_queues = True

    def __init__(self, engine: Engine, broker: Any = None) -> None:
        self.engine = engine
        self.broker = broker
        self._leader = LeaderLock(functools.partial(dedicated, engine))

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """What the driver raises when PostgreSQL cannot be used (the transport's own
        methods raise :class:`~pypepper_dramatiq.errors.BrokerUnavailableError`)."""
        return (psycopg.Error,)

    def close(self) -> None:
        """Give up the leader lock and its connection (the pool is the engine's)."""
        self._leader.release()

    # -- admission -----------------------------------------------------------------------

    def gate(self, channel_id: str, maxsize: int | None = None) -> Gate:
        return PostgresGate(self.engine, channel_id, maxsize)

    def enqueues_with(self, gate: Gate) -> bool:
        return False  # admitted here, then enqueued by the broker

    def channel_states(self) -> list[ChannelState] | None:
        return channel_states(self.engine)

    # -- rate limits ---------------------------------------------------------------------

    def ask_start(self, key: str, rate: Rate, told: bool = False) -> float:
        check_text("rate limit key", key, RATE_KEY_LENGTH)
        rows = run(
            self.engine,
            f"rate limit {key}",
            _ASK_START,
            key=key,
            count=rate.count,
            period=rate.period,
            limit=str(rate),
            told=told,
        )
        return max(0.0, float(rows[0][0]))

    def prune_rate_keys(self, idle_seconds: float = IDLE_KEEP_SECONDS, limit: int = 1000) -> int:
        rows = run(self.engine, "pruning rate limit keys", _PRUNE, idle=idle_seconds, limit=limit)
        return len(rows)

    # -- concurrency limits --------------------------------------------------------------

    def acquire_slots(
        self, limits: SlotLimits, holder: str, lease_seconds: float, held: HeldStart | None = None
    ) -> bool:
        keys = [
            check_text("concurrency limit key", k, CONCURRENCY_SLOT_KEY_LENGTH) for k, _ in limits
        ]
        check_text("concurrency slot holder", holder, CONCURRENCY_HOLDER_LENGTH)
        rows = run(
            self.engine,
            "concurrency limits " + ", ".join(keys),
            _ACQUIRE_SLOTS,
            keys=keys,
            limits=[limit for _, limit in limits],
            holder=holder,
            lease=float(lease_seconds),
            job=None if held is None else check_text("job_id", held.job_id, ID_LENGTH),
            priority=0 if held is None else held.priority,
            data=None if held is None else held.data,
        )
        return bool(rows[0][0])

    def release_slots(
        self, keys: Sequence[str], holder: str, reserve_seconds: float = 0.0
    ) -> list[HeldStart]:
        doing = "concurrency limits " + ", ".join(keys)
        if reserve_seconds <= 0:
            run(self.engine, doing, _RELEASE_SLOTS, keys=list(keys), holder=holder)
            return []
        rows = run(
            self.engine,
            doing,
            _RELEASE_WAKING,
            keys=list(keys),
            holder=holder,
            reserve=float(reserve_seconds),
        )
        woken = {
            str(job): HeldStart(str(job), int(priority), str(data)) for job, priority, data in rows
        }
        return list(woken.values())

    def renew_slots(self, held: Sequence[tuple[str, str]], lease_seconds: float) -> None:
        if not held:
            return
        run(
            self.engine,
            "concurrency slots' renewal",
            _RENEW_SLOTS,
            keys=[key for key, _ in held],
            holders=[holder for _, holder in held],
            lease=float(lease_seconds),
        )

    def slots_held(self, key: str) -> list[str]:
        rows = run(self.engine, f"concurrency limit {key}", _SLOTS_HELD, key=key)
        return [str(row[0]) for row in rows]

    # -- notices -------------------------------------------------------------------------

    def publish(self, topic: Topic, text: str) -> int | None:
        """One ``pg_notify`` (a job end's goes with other threads' in one statement);
        None: PostgreSQL does not tell how many heard it.

        Raises:
            ValueError: ``text`` is no payload NOTIFY carries.
            BrokerUnavailableError: PostgreSQL could not be reached.
        """
        payload = check_payload(topic, text)
        if topic is Topic.ENDED:  # one per job end: coalesced with the other threads'
            batch.send(self.engine, ("notify", CHANNELS[topic], payload))
        else:
            doing = f"a {topic.value} notice"
            run(self.engine, doing, _NOTIFY, channel=CHANNELS[topic], payload=payload)
        return None

    @property
    def carries_notices(self) -> bool:
        return True

    def subscribe(self, topics: Collection[Topic]) -> Subscription:
        return PostgresSubscription(functools.partial(dedicated, self.engine), topics)

    @property
    def connection(self) -> Any:
        return self.engine

    # -- the recovery sweep --------------------------------------------------------------

    def lead(self, owner: str, ttl_seconds: float) -> bool:
        return self._leader.lead(owner, ttl_seconds)

    @property
    def leader_backend_pid(self) -> int | None:
        """The server process holding this transport's leader connection, if any."""
        return self._leader.backend_pid

    def requeue_dead_workers(self, queue_name: str) -> None:
        return None  # RabbitMQ requeues a dropped consumer's unacknowledged messages

    def queues_held_by_dead_workers(self) -> set[str]:
        return set()

    def messages_exist(self, messages: Sequence[tuple[str, str | None]]) -> list[bool] | None:
        return None  # RabbitMQ cannot be asked; its messages are not lost with a worker
