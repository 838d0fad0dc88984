"""Fixtures for the model and the in-process driver (embedded default, no servers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import broker as broker_module
from pypepper_dramatiq import config, executor_registry, manager, reset_job_store


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[StubBroker]:
    """Each test starts with a new stub broker, no channels, no config, the default store."""
    stub = StubBroker()
    broker_module.set_broker(stub)
    manager.clear()
    config.clear()
    reset_job_store()
    registered = set(executor_registry.ids())
    yield stub
    for executor_id in set(executor_registry.ids()) - registered:
        executor_registry.unregister(executor_id)
    manager.clear()
    config.clear()
    reset_job_store()
    broker_module.set_broker(None)
    stub.close()
