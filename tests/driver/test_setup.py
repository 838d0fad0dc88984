"""``setup()``: wiring a process from arguments or from the YAML file."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from pypepper_dramatiq import (
    ConfigError,
    WorkflowMiddleware,
    config,
    get_job_store,
    manager,
    reset_job_store,
    setup,
)
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.channels.messages import STEP_ACTOR
from pypepper_dramatiq.stores.memory import MemoryJobStore


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    manager.clear()
    config.clear()
    reset_job_store()
    broker_module.set_broker(None)
    dramatiq.broker.global_broker = None


def test_setup_installs_middleware_before_time_limit_and_the_step_actor() -> None:
    broker = setup(broker=StubBroker(), channels=["etl"])
    kinds = [type(m) for m in broker.middleware]
    assert kinds.index(WorkflowMiddleware) < kinds.index(TimeLimit)
    assert broker.get_actor(STEP_ACTOR).options["max_retries"] == 0
    assert "etl" in broker.get_declared_queues()
    assert broker_module.get_broker() is broker
    assert dramatiq.get_broker() is broker


def test_setup_twice_does_not_stack_middleware() -> None:
    broker = StubBroker()
    setup(broker=broker)
    setup(broker=broker)
    assert sum(isinstance(m, WorkflowMiddleware) for m in broker.middleware) == 1


def test_setup_reads_the_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(
        "scheduler:\n"
        "  leaseSeconds: 7\n"
        "  cancelGrace: 2\n"
        "  channels: {etl: 5, mail: 0}\n"
        "  jobStore: {backend: memory}\n"
    )
    broker = setup(config_path=path)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert middleware.lease_seconds == 7.0 and middleware.cancel_grace == 2.0
    etl = manager.get("etl")
    assert etl is not None and etl.maxsize == 5
    assert manager.get("mail") is not None
    assert isinstance(get_job_store(), MemoryJobStore)


def test_setup_rejects_a_store_uri_it_cannot_serve() -> None:
    with pytest.raises(ConfigError, match="sqlite"):
        setup(broker=StubBroker(), store_uri="sqlite:///jobs.db")


def test_setup_with_broken_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("scheduler:\n  channels: [a, b\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        setup(config_path=path)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_seconds", 0),
        ("lease_seconds", -1),
        ("lease_seconds", "30"),
        ("sweep_interval", float("nan")),
        ("sweep_interval", float("inf")),
        ("cancel_grace", -0.5),
        ("dispatch_seconds", 0),
    ],
)
def test_setup_refuses_a_bad_timing_option_and_installs_nothing(option: str, value: object) -> None:
    broker = StubBroker()
    with pytest.raises(ConfigError, match=option):
        setup(broker=broker, **{option: value})  # type: ignore[arg-type]
    assert not any(isinstance(m, WorkflowMiddleware) for m in broker.middleware)
    assert broker_module.get_broker() is not broker


def test_setup_accepts_a_zero_cancel_grace() -> None:
    broker = setup(broker=StubBroker(), cancel_grace=0)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert middleware.cancel_grace == 0.0


@pytest.mark.parametrize(
    ("yaml_line", "named"),
    [
        ("leaseSeconds: soon", "scheduler.leaseSeconds"),
        ("sweepInterval: -2", "scheduler.sweepInterval"),
        ("dispatchSeconds: 0", "scheduler.dispatchSeconds"),
        ("channels: {etl: -1}", "'etl'"),
        ("channels: {etl: five}", "'etl'"),
    ],
)
def test_setup_names_the_yaml_key_of_a_bad_value(
    tmp_path: Path, yaml_line: str, named: str
) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(f"scheduler:\n  {yaml_line}\n")
    with pytest.raises(ConfigError, match=named):
        setup(config_path=path, broker=StubBroker())


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379", "nonsense://x"])
def test_setup_refuses_a_broker_url_that_is_not_redis(url: str) -> None:
    with pytest.raises(ConfigError, match="broker_url"):
        setup(broker_url=url)
    assert dramatiq.broker.global_broker is None  # nothing was installed


def test_the_middleware_checks_its_own_options() -> None:
    with pytest.raises(ConfigError, match="lease_seconds"):
        WorkflowMiddleware(lease_seconds=0)
    with pytest.raises(ConfigError, match="defer_seconds"):
        WorkflowMiddleware(defer_seconds=-1)


@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        ("scheduler:\n  leaseSecond: 5\n", "leaseSecond"),
        ("scheduler:\n  broker: {uri: 'redis://localhost'}\n", "uri under scheduler.broker"),
    ],
)
def test_setup_refuses_a_yaml_key_it_does_not_know(
    tmp_path: Path, yaml_text: str, named: str
) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=named) as raised:
        setup(config_path=path, broker=StubBroker())
    assert "leaseSeconds" in str(raised.value) or "url" in str(raised.value)  # the known keys
    assert dramatiq.broker.global_broker is None


def test_setup_declares_only_the_queues_of_declared_channels() -> None:
    # The step actor travels on the channels' queues: no "default" queue of its
    # own that every worker would then consume (and RabbitMQ would create).
    bare = setup(broker=StubBroker())
    assert bare.get_declared_queues() == set()
    assert bare.get_actor(STEP_ACTOR).actor_name == STEP_ACTOR

    broker = setup(broker=StubBroker(), channels=["etl", "reports"])
    assert broker.get_declared_queues() == {"etl", "etl.DQ", "reports", "reports.DQ"}
    assert broker.get_actor(STEP_ACTOR).broker is broker


def test_setup_passes_the_shutdown_and_unknown_task_graces_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text("scheduler:\n  shutdownGrace: 3\n  unknownTaskGrace: 0\n")
    broker = setup(broker=StubBroker(), config_path=path)
    middleware = next(m for m in broker.middleware if isinstance(m, WorkflowMiddleware))
    assert (middleware.shutdown_grace, middleware.unknown_task_grace) == (3.0, 0.0)

    path.write_text("scheduler:\n  shutdownGrace: soon\n")
    with pytest.raises(ConfigError, match=r"scheduler\.shutdownGrace"):
        setup(broker=StubBroker(), config_path=path)


def test_a_redis_url_without_the_redis_extra_names_the_pip_command() -> None:
    # A plain `pip install pypepper-dramatiq` has no Redis client: say which extra.
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from pypepper_dramatiq import ConfigError, setup\n"
        "try:\n"
        "    setup(broker_url='redis://localhost:6379/0')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "pip install 'pypepper-dramatiq[redis]'" in run.stdout
