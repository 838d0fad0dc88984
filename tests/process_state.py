"""Process-wide state of the package, reset around each test that touches it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dramatiq
from dramatiq.broker import Broker

from pypepper_dramatiq import config, executor_registry, manager
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.stores.registry import reset_job_store


def _forget_everything(broker: Broker | None) -> None:
    broker_module.set_broker(broker)
    if broker is None:
        # set_broker() made the last one Dramatiq's global broker too.
        dramatiq.broker.global_broker = None
    manager.clear()
    config.clear()
    reset_job_store()


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
        _forget_everything(None)
