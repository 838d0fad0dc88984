"""``pypepper-dramatiq channels``: the channels' bounds and stop flags, in a real Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from pypepper_dramatiq.cli.commands import BROKER_ENV, main
from pypepper_dramatiq.limits.rates import Rate
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.transport.base import channel_rate_key, channel_slot_key
from pypepper_dramatiq.transport.postgres import PostgresTransport
from pypepper_dramatiq.transport.postgres.gate import PostgresGate
from pypepper_dramatiq.transport.redis import RedisGate, RedisTransport
from pypepper_dramatiq.transport.redis.layout import RATE_KEY_PREFIX, SLOTS_KEY_PREFIX

pytestmark = pytest.mark.redis


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.fixture
def names(client: redis.Redis) -> Iterator[list[str]]:
    """Fresh channel names for a test; their keys are removed after it."""
    made: list[str] = []

    def fresh() -> str:
        name = f"cli-{uuid.uuid4().hex[:10]}"
        made.append(name)
        return name

    yield [fresh() for _ in range(3)]
    for name in made:
        RedisGate(client, name).reset()


def listed(redis_url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, object]]:
    assert main(["channels", "--broker-url", redis_url, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {str(row.pop("channel")): row for row in rows}


def test_list_shows_waiting_bound_stop_and_rate_limit_of_every_channel(
    redis_url: str, client: redis.Redis, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bounded, stopped, untouched = names
    gate = RedisGate(client, bounded, 3)
    assert gate.admit("a") == gate.admit("b") == "ok"
    RedisGate(client, stopped).request_stop()
    RedisGate(client, untouched).waiting()  # used by a producer only: no bound ever given
    rate_key = RATE_KEY_PREFIX + channel_rate_key(bounded)
    RedisTransport(client).ask_start(channel_rate_key(bounded), Rate(50, 1.0))  # a worker's

    try:
        rows = listed(redis_url, capsys)
    finally:
        client.delete(rate_key)

    none = {"max_running": None, "running": None}
    assert rows[bounded] == {
        "waiting": 2,
        "maxsize": 3,
        "stopped": False,
        "rate_limit": "50/s",
        **none,
    }
    assert rows[stopped] == {
        "waiting": 0,
        "maxsize": 0,
        "stopped": True,
        "rate_limit": None,
        **none,
    }
    assert rows[untouched] == {
        "waiting": 0,
        "maxsize": 0,
        "stopped": False,
        "rate_limit": None,
        **none,
    }
    assert not any(name.endswith(":waiting") for name in rows)  # sets are not channels

    assert main(["channels", "list", "--broker-url", redis_url]) == 0  # the table
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "CHANNEL",
        "WAITING",
        "BOUND",
        "STOPPED",
        "RATE",
        "LIMIT",
        "RUNNING",
        "(LIMIT)",
    ]
    assert [line.split() for line in lines if line.startswith(bounded)] == [
        [bounded, "2", "3", "no", "-", "-"]
    ]
    assert [line.split() for line in lines if line.startswith(stopped)] == [
        [stopped, "0", "unbounded", "yes", "-", "-"]
    ]


def test_list_shows_the_concurrency_limit_and_the_steps_running_as_the_dashboard_does(
    redis_url: str, client: redis.Redis, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A worker took two slots of the channel's max_running=3 (its steps run): the CLI,
    # which declared nothing, reads the limit the worker applied and the slots held.
    limited, idle, _ = names
    RedisGate(client, limited).waiting()
    RedisGate(client, idle).waiting()
    transport = RedisTransport(client)
    key = channel_slot_key(limited)
    assert transport.acquire_slots([(key, 3), ("key:tenant-cli", 1)], "step-1", 60.0)
    assert transport.acquire_slots([(key, 3)], "step-2", 60.0)
    assert transport.acquire_slots([(channel_slot_key(idle), 2)], "step-3", 60.0)
    transport.release_slots([channel_slot_key(idle)], "step-3")
    try:
        rows = listed(redis_url, capsys)
        assert (rows[limited]["max_running"], rows[limited]["running"]) == (3, 2)
        assert (rows[idle]["max_running"], rows[idle]["running"]) == (2, 0)
        assert main(["channels", "list", "--broker-url", redis_url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[-3:] for line in lines if line.startswith(limited)] == [
            ["2", "of", "3"]
        ]
        assert [line.split()[-3:] for line in lines if line.startswith(idle)] == [["0", "of", "2"]]
    finally:
        transport.release_slots([key, "key:tenant-cli"], "step-1")
        transport.release_slots([key], "step-2")
        client.delete(SLOTS_KEY_PREFIX + key, SLOTS_KEY_PREFIX + "key:tenant-cli")


def test_stop_resume_and_resize_change_what_every_process_admits(
    redis_url: str, client: redis.Redis, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    name = names[0]
    gate = RedisGate(client, name, 2)  # as a producer process sees the channel

    assert main(["channels", "stop", name, "--broker-url", redis_url]) == 0
    assert "stopped" in capsys.readouterr().out
    assert gate.admit("a") == "stopped"

    assert main(["channels", "resume", name, "--broker-url", redis_url]) == 0
    assert capsys.readouterr().out == f"channel {name} resumed\n"
    assert [gate.admit(j) for j in ("a", "b", "c")] == ["ok", "ok", "full"]

    assert main(["channels", "resize", name, "5", "--broker-url", redis_url]) == 0
    assert capsys.readouterr().out == f"channel {name}: bound 2 -> 5\n"
    assert [gate.admit(j) for j in ("c", "d", "e", "f")] == ["ok", "ok", "ok", "full"]
    assert listed(redis_url, capsys)[name] == {
        "waiting": 5,
        "maxsize": 5,
        "stopped": False,
        "rate_limit": None,
        "max_running": None,
        "running": None,
    }

    assert main(["channels", "resize", name, "0", "--broker-url", redis_url]) == 0
    assert "bound 5 -> 0 (unbounded)" in capsys.readouterr().out
    assert gate.admit("f") == "ok"


def test_unknown_channels_stop_and_resize_create_them_resume_fails(
    redis_url: str, client: redis.Redis, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    to_resume, to_stop, to_resize = names

    assert main(["channels", "resume", to_resume, "--broker-url", redis_url]) == 1
    assert f"no channel '{to_resume}' is known in Redis" in capsys.readouterr().err
    assert client.exists(f"pypepper:channel:{to_resume}") == 0  # not created

    assert main(["channels", "stop", to_stop, "--broker-url", redis_url]) == 0
    assert "was not known in Redis: created" in capsys.readouterr().err
    assert RedisGate(client, to_stop).admit("a") == "stopped"  # stopped before any producer

    assert main(["channels", "resize", to_resize, "1", "--broker-url", redis_url]) == 0
    assert "created" in capsys.readouterr().err
    producer = RedisGate(client, to_resize)
    assert [producer.admit(j) for j in ("a", "b")] == ["ok", "full"]


def test_the_broker_url_may_come_from_the_environment(
    redis_url: str,
    client: redis.Redis,
    names: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(BROKER_ENV, redis_url)
    assert main(["channels", "stop", names[0]]) == 0
    assert RedisGate(client, names[0]).stopped


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://localhost:6379/0", "expected a redis://, rediss://, unix:// or amqp://"),
        ("redis://:hunter2@127.0.0.1:1/0", "cannot be used"),  # nothing listens on port 1
    ],
)
@pytest.mark.parametrize("argv", [[], ["stop", "x"], ["resize", "x", "3"]])
def test_a_url_that_is_not_redis_or_a_redis_that_is_down_exits_2(
    url: str, said: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["channels", *argv, "--broker-url", url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and said in err and err.startswith("pypepper-dramatiq: ")
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["stop"], "channels stop NAME"),
        (["resume"], "channels resume NAME"),
        (["resize", "x"], "channels resize NAME N"),
        (["resize", "x", "-1"], "whole number >= 0, got '-1'"),
        (["resize", "x", "many"], "got 'many'"),
        (["list", "x"], "channels list takes no argument"),
        (["pause"], "channels pause NAME"),
        (["pause", "x"], "channels pause needs --uri"),
        (["unpause", "x"], "invalid choice: 'unpause'"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["channels", *argv, "--broker-url", "redis://127.0.0.1:1/0"])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_without_a_broker_url_nor_environment_the_usage_names_the_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(BROKER_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["channels"])
    assert exited.value.code == 2
    assert "--broker-url" in capsys.readouterr().err


# -- with RabbitMQ: the channels are kept in the PostgreSQL job store ------------------------

AMQP = "amqp://guest:hunter2@127.0.0.1:1/%2F"  # never dialled: the channels are in PostgreSQL


@pytest.mark.postgres
def test_with_an_amqp_url_the_channels_are_read_and_changed_in_the_postgresql_store(
    pg_store: SqlJobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = pg_store.engine.url.render_as_string(hide_password=False)
    name = f"cli-{uuid.uuid4().hex[:10]}"
    gate = PostgresGate(pg_store.engine, name, 2)
    assert gate.admit("job-a") == "ok"
    base = ["--broker-url", AMQP, "--uri", uri]

    assert main(["channels", "list", *base, "--json"]) == 0
    rows = {
        row.pop("channel"): row for row in map(json.loads, capsys.readouterr().out.splitlines())
    }
    assert rows[name] == {
        "waiting": 1,
        "maxsize": 2,
        "stopped": False,
        "rate_limit": None,
        "max_running": None,
        "running": None,
    }
    # A worker applies max_running=4 and runs one step: the CLI reads both.
    transport = PostgresTransport(pg_store.engine)
    assert transport.acquire_slots([(channel_slot_key(name), 4)], "step-1", 60.0)
    assert main(["channels", "list", *base]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith(name)]
    assert line.split()[-3:] == ["1", "of", "4"]
    transport.release_slots([channel_slot_key(name)], "step-1")
    assert main(["channels", "list", *base, "--json"]) == 0
    [row] = [
        r for r in map(json.loads, capsys.readouterr().out.splitlines()) if r["channel"] == name
    ]
    assert (row["max_running"], row["running"]) == (4, 0)

    assert main(["channels", "stop", name, *base]) == 0
    assert PostgresGate(pg_store.engine, name).admit("job-b") == "stopped"
    assert main(["channels", "resize", name, "5", *base]) == 0
    assert "bound 2 -> 5" in capsys.readouterr().out
    assert main(["channels", "resume", name, "--broker-url", AMQP]) == 2  # no --uri: no store
    assert "give it with --uri" in capsys.readouterr().err
    resumed = main(["channels", "resume", name, *base])
    assert resumed == 0, capsys.readouterr()  # lifts the stop (and no pause)
    assert PostgresGate(pg_store.engine, name).admit("job-b") == "ok"
    assert "hunter2" not in capsys.readouterr().err


@pytest.mark.mysql
def test_with_an_amqp_url_a_store_not_on_postgresql_exits_2(
    mysql_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = mysql_uri
    SqlJobStore(uri, migrate=True).close()
    assert main(["channels", "--broker-url", AMQP, "--uri", uri]) == 2
    err = capsys.readouterr().err
    assert "this --uri is not on PostgreSQL" in err, err
    assert "hunter2" not in err
