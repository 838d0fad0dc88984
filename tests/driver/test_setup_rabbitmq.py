"""``setup()`` with RabbitMQ: an ``amqp://`` URL builds Dramatiq's RabbitMQ broker, a
user's own one is wired the same way, and what cannot work is refused up front.

No server here: building the broker parses its URL and connects nowhere (port 1
answers nothing), like the Redis broker's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import TimeLimit

from pypepper_dramatiq import (
    ConfigError,
    WorkflowMiddleware,
    config,
    manager,
    reset_job_store,
    setup,
)
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.channels.messages import STEP_ACTOR

#: Nothing listens there: setup() must not try.
NOWHERE = "amqp://guest:guest@127.0.0.1:1/%2F"


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    manager.clear()
    config.clear()
    reset_job_store()
    broker_module.set_broker(None)
    dramatiq.broker.global_broker = None


@pytest.mark.parametrize("url", [NOWHERE, "amqps://guest:guest@127.0.0.1:1/%2F"])
def test_an_amqp_url_builds_dramatiqs_rabbitmq_broker_with_publisher_confirms(url: str) -> None:
    broker = setup(broker_url=url, channels={"rmq-jobs": 3})

    assert isinstance(broker, RabbitmqBroker)
    assert broker.confirm_delivery  # send() returns once RabbitMQ has the message
    assert dramatiq.get_broker() is broker
    kinds = [type(m) for m in broker.middleware]
    assert kinds.index(WorkflowMiddleware) < kinds.index(TimeLimit)
    assert STEP_ACTOR in broker.actors
    assert "rmq-jobs" in broker.get_declared_queues()
    assert broker.parameters.port == 1  # the URL's, parsed by pika


def test_the_yaml_broker_url_may_name_rabbitmq(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(f"scheduler:\n  broker:\n    url: '{NOWHERE}'\n")

    assert isinstance(setup(config_path=path), RabbitmqBroker)


def test_a_rabbitmq_broker_of_ones_own_is_wired_as_is() -> None:
    mine = RabbitmqBroker(url=NOWHERE)

    assert setup(broker=mine) is mine
    assert sum(isinstance(m, WorkflowMiddleware) for m in mine.middleware) == 1
    assert STEP_ACTOR in mine.actors


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("amqp://guest:secret@127.0.0.1:notaport/", "Port could not be cast"),
        ("amqp://guest:secret@127.0.0.1:99999/", "Port out of range"),
        ("amqp://guest:secret@127.0.0.1/?heartbeat=soon", "heartbeat"),
        ("amqp://guest:secret@127.0.0.1/?no_such_option=1", "no_such_option"),
    ],
)
def test_a_malformed_amqp_url_is_a_config_error_naming_it_without_its_password(
    url: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=why) as raised:
        setup(broker_url=url)

    assert "guest:***@127.0.0.1" in str(raised.value)
    assert "secret" not in str(raised.value)
    assert dramatiq.broker.global_broker is None  # nothing was installed


def test_any_other_scheme_is_refused_naming_both_brokers() -> None:
    with pytest.raises(ConfigError, match=r"'kafka://x'.*redis://.*amqp://"):
        setup(broker_url="kafka://x")


MYSQL = "mysql+pymysql://root:secret@127.0.0.1:1/jobs"


def test_rabbitmq_with_the_mysql_store_is_refused_saying_why() -> None:
    with pytest.raises(ConfigError) as raised:
        setup(broker_url=NOWHERE, store_uri=MYSQL)

    text = str(raised.value)
    assert "store_uri 'mysql+pymysql://root:***@127.0.0.1:1/jobs'" in text
    assert "LISTEN/NOTIFY" in text and "Redis" in text
    assert dramatiq.broker.global_broker is None  # nothing was installed


def test_ones_own_rabbitmq_broker_with_a_yaml_mysql_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text("scheduler:\n  jobStore:\n    backend: mysql\n    uri: " + MYSQL + "\n")

    with pytest.raises(ConfigError, match=r"scheduler\.jobStore\.backend 'mysql'.*PostgreSQL"):
        setup(config_path=path, broker=RabbitmqBroker(url=NOWHERE))
    assert dramatiq.broker.global_broker is None


def test_an_amqp_url_without_the_rabbitmq_extra_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['pika'] = None\n"
        "from pypepper_dramatiq import ConfigError, setup\n"
        "try:\n"
        f"    setup(broker_url={NOWHERE!r})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "pip install 'pypepper-dramatiq[rabbitmq]'" in run.stdout
