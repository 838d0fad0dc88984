"""Process-wide state of the package, reset around each test that touches it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dramatiq
import redis
from dramatiq.broker import Broker
from dramatiq.middleware.time_limit import TimeLimit

from pypepper_dramatiq import config, executor_registry, manager, setup
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.defaults import installed_defaults
from pypepper_dramatiq.limits.concurrency import key_concurrency
from pypepper_dramatiq.limits.rates import key_limits
from pypepper_dramatiq.stores.registry import reset_job_store


def _forget_everything(broker: Broker | None) -> None:
    broker_module.set_broker(broker)
    if broker is None:
        # set_broker() made the last one Dramatiq's global broker too.
        dramatiq.broker.global_broker = None
    manager.clear()
    key_limits.configure(None)
    key_concurrency.configure(None)
    config.clear()
    installed_defaults.clear()
    reset_job_store()


def _quiet_time_limit_watchdog(broker: Broker | None) -> None:
    """Quiet the TimeLimit watchdog thread that ``process_boot`` started for ``broker``.

    Dramatiq's watchdog loops for the life of its process and has no stop. Left as it is
    by each test, a thousand of them wake every second by the end of the driver suite,
    and each keeps the deadlines of the worker threads it watched: one of a thread
    stopped mid-message would interrupt whatever later thread reuses its ident. Its
    deadlines are dropped and its next sleep lasts past any test session.
    """
    for middleware in broker.middleware if broker is not None else ():
        watchdog = getattr(middleware, "manager", None)
        if isinstance(middleware, TimeLimit) and isinstance(watchdog, threading.Thread):
            with watchdog.mu:
                watchdog.deadlines.clear()
                watchdog.interval = 7 * 24 * 3600


@contextmanager
def clean_process_state(broker: Broker | None = None) -> Iterator[None]:
    """Start with ``broker`` (or none), no channels, config or store; leave none behind.

    Executors registered during the block are unregistered afterwards.
    """
    _forget_everything(broker)
    registered = set(executor_registry.ids())
    try:
        yield
    finally:
        for executor_id in set(executor_registry.ids()) - registered:
            executor_registry.unregister(executor_id)
        _quiet_time_limit_watchdog(dramatiq.broker.global_broker)
        _forget_everything(None)


@contextmanager
def redis_channel_setup(redis_url: str, channel: str) -> Iterator[Broker]:
    """In clean process state: ``setup()`` on Redis with one unbounded ``channel`` whose
    queue and admission count start (and are left) empty; the broker."""
    client = redis.Redis.from_url(redis_url)
    client.delete(f"dramatiq:{channel}", f"dramatiq:{channel}.DQ", f"dramatiq:{channel}.DQ.msgs")
    client.close()
    with clean_process_state():
        made = setup(redis_url, channels={channel: 0})
        manager.available(channel).gate.reset()
        try:
            yield made
        finally:
            manager.available(channel).gate.reset()
            made.close()
