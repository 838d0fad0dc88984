"""Fixtures for the Dramatiq driver: a stub broker wired by ``setup()`` and a worker;
the ``driver`` fixture also runs each scenario on the session's RabbitMQ.

Every test here starts from clean process state (the same reset as
``tests/unit/conftest.py``) and leaves none behind: no broker, no channels,
no configuration, no store, no executors it registered, and no middleware
background threads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from process_state import clean_process_state

import pypepper_dramatiq
from pypepper_dramatiq import WorkflowMiddleware

from .drivers import CHANNEL, DramatiqDriver, Driver, InProcessDriver

__all__ = ["CHANNEL", "make_driver", "workflow_middleware"]

#: Short enough that a cancel is noticed by lease renewal within about a second.
LEASE_SECONDS = 3.0
SWEEP_INTERVAL = 0.5
#: Milliseconds a worker's consumers and threads wait before looking again.
WORKER_TIMEOUT_MS = 50


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """No broker, channels, config or store from an earlier test; none left after this one."""
    with clean_process_state():
        yield


def workflow_middleware(broker: dramatiq.Broker) -> WorkflowMiddleware:
    """The broker's :class:`WorkflowMiddleware` (``setup()`` adds exactly one)."""
    found = [m for m in broker.middleware if isinstance(m, WorkflowMiddleware)]
    assert len(found) == 1, broker.middleware
    return found[0]


#: "0" in the environment: every Dramatiq driver test runs on the per-message path
#: (``setup(claim_fetched=False)``), as the ``per-message`` driver always does; "1"
#: (or unset): with claims ahead, the default.
CLAIMS_AHEAD_ENV = "PYPEPPER_TEST_CLAIM_FETCHED"


@pytest.fixture
def holds(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The workers' log lines of every level: a held job or start says so (its ``action``)."""
    caplog.set_level(logging.DEBUG, logger="pypepper_dramatiq")
    return caplog


@pytest.fixture
def setup_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """More keyword arguments of the brokers' ``setup()`` (a test module overrides it)."""
    callspec = getattr(request.node, "callspec", None)
    per_message = callspec is not None and callspec.params.get("driver") == "per-message"
    if per_message or os.environ.get(CLAIMS_AHEAD_ENV) == "0":
        return {"claim_fetched": False}
    return {}


@pytest.fixture
def stub_broker(setup_options: dict[str, Any]) -> Iterator[StubBroker]:
    """A fresh :class:`StubBroker` wired by ``setup()``, with the process booted.

    ``process_boot`` is emitted as a ``dramatiq`` worker process would: it
    starts the TimeLimit watchdog that enforces ``round_timeout``.
    """
    broker = pypepper_dramatiq.setup(
        broker=StubBroker(),
        channels=[CHANNEL],
        lease_seconds=LEASE_SECONDS,
        sweep_interval=SWEEP_INTERVAL,
        **setup_options,
    )
    assert isinstance(broker, StubBroker)
    broker.emit_after("process_boot")
    yield broker
    workflow_middleware(broker).stop_background()
    broker.close()


@pytest.fixture
def rabbitmq_broker(rabbitmq_url: str, setup_options: dict[str, Any]) -> Iterator[RabbitmqBroker]:
    """Dramatiq's RabbitMQ broker on the session's node, wired by ``setup(broker_url=)``
    as the stub broker is (the process booted), its queues emptied before and after."""
    broker = pypepper_dramatiq.setup(
        broker_url=rabbitmq_url,
        channels=[CHANNEL],
        lease_seconds=LEASE_SECONDS,
        sweep_interval=SWEEP_INTERVAL,
        **setup_options,
    )
    assert isinstance(broker, RabbitmqBroker)
    broker.flush_all()  # what an earlier test left (a duplicate, a delayed retry)
    broker.emit_after("process_boot")
    yield broker
    workflow_middleware(broker).stop_background()
    broker.flush_all()
    broker.close()


def _worker_starter(broker: dramatiq.Broker) -> Iterator[Callable[[], dramatiq.Worker]]:
    started: list[dramatiq.Worker] = []

    def start() -> dramatiq.Worker:
        if not started:
            worker = dramatiq.Worker(broker, worker_timeout=WORKER_TIMEOUT_MS)
            worker.start()
            started.append(worker)
        return started[0]

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def start_worker(stub_broker: StubBroker) -> Iterator[Callable[[], dramatiq.Worker]]:
    """Start a :class:`dramatiq.Worker` on the stub broker when the test asks for it.

    Lazily, so that a test can queue (or cancel) jobs before anything consumes them.
    """
    yield from _worker_starter(stub_broker)


@pytest.fixture
def start_rabbitmq_worker(
    rabbitmq_broker: RabbitmqBroker,
) -> Iterator[Callable[[], dramatiq.Worker]]:
    """:func:`start_worker` on the RabbitMQ broker."""
    yield from _worker_starter(rabbitmq_broker)


@pytest.fixture
def stub_worker(start_worker: Callable[[], dramatiq.Worker]) -> dramatiq.Worker:
    """A started :class:`dramatiq.Worker` on the stub broker (stopped after the test)."""
    return start_worker()


@pytest.fixture(
    params=["inprocess", "dramatiq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]
)
def driver(request: pytest.FixtureRequest) -> Driver:
    """The same ``setup()`` for each: the stub broker consumed in-process or by a
    ``dramatiq.Worker``, and Dramatiq's RabbitMQ broker consumed by a ``dramatiq.Worker``."""
    return make_driver(request)


def make_driver(request: pytest.FixtureRequest) -> Driver:
    """The driver ``request.param`` names (``per-message``: the stub broker's
    ``dramatiq.Worker`` with ``claim_fetched`` off)."""
    if request.param == "rabbitmq":
        return DramatiqDriver(
            request.getfixturevalue("rabbitmq_broker"),
            request.getfixturevalue("start_rabbitmq_worker"),
        )
    stub_broker: StubBroker = request.getfixturevalue("stub_broker")
    start_worker: Callable[[], dramatiq.Worker] = request.getfixturevalue("start_worker")
    if request.param == "inprocess":
        return InProcessDriver()
    return DramatiqDriver(stub_broker, start_worker)
