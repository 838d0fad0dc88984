"""The transport: chosen once with the broker, its Lua scripts shipped and registered
once, and no module outside it asking which broker carries the messages."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq.channels.broker import get_transport, set_broker, transport_of
from pypepper_dramatiq.channels.channel import Channel, manager
from pypepper_dramatiq.drivers.dramatiq.setup import setup
from pypepper_dramatiq.stores.registry import reset_job_store
from pypepper_dramatiq.transport import LocalGate, LocalTransport, broker_name
from pypepper_dramatiq.transport.redis import RedisGate, RedisTransport
from pypepper_dramatiq.transport.redis.scripts import NAMES, scripts_of, source

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pypepper_dramatiq"


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    manager.clear()
    reset_job_store()
    set_broker(None)
    dramatiq.broker.global_broker = None


def test_the_embedded_default_is_the_in_process_transport() -> None:
    set_broker(StubBroker())
    try:
        transport = get_transport()
        assert isinstance(transport, LocalTransport)
        assert isinstance(Channel("t-local").gate, LocalGate)
    finally:
        set_broker(None)


def test_setup_with_a_redis_url_holds_the_redis_transport_next_to_its_broker() -> None:
    # setup() talks to no Redis: the port need not answer.
    broker = setup(broker_url="redis://127.0.0.1:1/0")
    try:
        transport = get_transport()
        assert isinstance(transport, RedisTransport) and transport.broker is broker
        assert transport_of(broker) is transport  # looked up, not made again
        assert isinstance(Channel("t-redis", declare=False).gate, RedisGate)
    finally:
        set_broker(None)


def test_another_broker_gets_its_own_transport_once() -> None:
    set_broker(StubBroker())
    try:
        other = StubBroker()
        assert transport_of(other) is transport_of(other)
        assert transport_of(other) is not get_transport()
    finally:
        set_broker(None)


def test_the_scripts_are_registered_once_per_client() -> None:
    client = redis.Redis(port=1)  # registering does no I/O
    first, second = RedisGate(client, "a"), RedisGate(client, "b")
    assert first._scripts is second._scripts is scripts_of(client)
    assert scripts_of(redis.Redis(port=1)) is not scripts_of(client)
    assert scripts_of(client).admit.script == source("admit")


def test_the_wheel_ships_every_lua_script() -> None:
    from setuptools.dist import Distribution

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist = Distribution()
            dist.parse_config_files(filenames=["setup.cfg"])
            dist.script_name = "setup.py"
            build = dist.get_command_obj("build_py")
            build.ensure_finalized()
            shipped = {
                Path(src, name).as_posix()
                for _, src, _, names in build.data_files
                for name in names
            }
    finally:
        os.chdir(here)
    for name in NAMES:
        assert f"pypepper_dramatiq/transport/redis/scripts/{name}.lua" in shipped, name


#: What asks which broker carries the messages, or calls Redis itself.
_BROKER_CHECKS = re.compile(
    r"isinstance\([^)]*Redis|redis_client_of|on_redis|__name__ *[!=]= *['\"]RedisBroker|"
    r"^\s*import redis|^\s*from redis|\.pubsub\(|\.pipeline\(|register_script",
    re.MULTILINE,
)


@pytest.mark.parametrize(
    "path",
    sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "transport" not in p.relative_to(PACKAGE).parts
    ),
)
def test_no_module_outside_the_transport_asks_which_broker_it_is(path: str) -> None:
    found = _BROKER_CHECKS.findall((PACKAGE / path).read_text())
    assert not found, f"{path}: {found}"


def test_outages_name_the_server_of_each_broker() -> None:
    assert broker_name(RedisBroker(url="redis://127.0.0.1:1/0")) == "Redis"
    assert broker_name(RabbitmqBroker(url="amqp://127.0.0.1:1/")) == "RabbitMQ"
    assert broker_name(StubBroker()) == "StubBroker"
    assert get_transport().where == "this process"
