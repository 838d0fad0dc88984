"""Raw data that is no Dramatiq message, in a queue a worker consumes: dead-lettered on the
stub broker, with the jobs queued behind it run; and the encoder that makes it so."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.encoder import JSONEncoder, PickleEncoder
from dramatiq.errors import DecodeError

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    Workflow,
    get_job_store,
    setup,
    workflow_task,
)
from pypepper_dramatiq.drivers.dramatiq.undecodable import (
    OPTION_KEY,
    UNDECODABLE_ACTOR,
    GuardedEncoder,
    UndecodableMiddleware,
    describe_error,
    excerpt,
    problem,
)
from pypepper_dramatiq.errors import MessageError

from .conftest import CHANNEL

#: Upper bound for the worker to get through the queue (a hang, not a speed check).
TIMEOUT = 30.0

#: One of each kind of raw data that is no message.
BAD_DATA = {
    "not JSON": b"\x1b[2Jnot json\n",
    "a JSON list": json.dumps(["pypepper_dramatiq.step", [], {}]).encode(),
    "missing fields": json.dumps({"actor_name": "x", "args": []}).encode(),
    "megabytes of bytes": bytes(range(256)) * 4096,  # 1 MiB; not UTF-8 from byte 128
}
#: What the reason logged for each starts with.
REASONS = {
    "not JSON": "not decodable: JSONDecodeError: Expecting value",
    "a JSON list": "decodes to a list, not a message's fields",
    "missing fields": "missing field(s) queue_name, kwargs, options",
    "megabytes of bytes": "not decodable: UnicodeDecodeError: 'utf-8' codec can't decode",
}


@workflow_task(name="driver-undecodable.echo")
def echo(task: Task, context: Context, *, value: int = 0) -> int:
    return value


@pytest.fixture(autouse=True)
def keep_the_encoder() -> Iterator[None]:
    """Whatever global encoder a test installs is replaced by the one it found."""
    found = dramatiq.get_encoder()
    yield
    dramatiq.set_encoder(found)


def wait_until(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def undecodable_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "dead_letter_undecodable"]


def test_bad_data_ahead_of_jobs_is_dead_lettered_and_every_job_behind_it_runs(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = stub_broker.queues[CHANNEL]
    for data in BAD_DATA.values():
        queue.put(data)
    jobs = []
    for value in range(6):
        job = Job(category="undecodable", channel_id=CHANNEL)
        job.workflows.append(Workflow([echo.task(name="echo", value=value)]))
        job.scheduled()
        jobs.append(job)

    worker = start_worker()
    store = get_job_store()
    wait_until(
        lambda: all(store.get(job.id).status is Status.COMPLETED for job in jobs),
        "every job to complete",
    )
    stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000), fail_fast=False)
    worker.join()

    dead = stub_broker.dead_letters_by_queue[CHANNEL]
    assert [m.actor_name for m in dead] == [UNDECODABLE_ACTOR] * len(BAD_DATA)
    # In the order the worker threads rejected them (not the queue's): each by its size.
    by_size = {m.options[OPTION_KEY]["size"]: m for m in dead}
    assert sorted(by_size) == sorted(len(data) for data in BAD_DATA.values())
    for kind, data in BAD_DATA.items():
        about = by_size[len(data)].options[OPTION_KEY]
        assert about["reason"].startswith(REASONS[kind]), (kind, about)
    logged = undecodable_records(caplog)
    assert sorted(r.reason for r in logged) == sorted(m.options[OPTION_KEY]["reason"] for m in dead)
    assert all(r.queue == CHANNEL for r in logged)
    text = "\n".join(r.getMessage() for r in logged)
    assert "\x1b" not in text and "\\x1b[2Jnot json\\n" in text
    assert len(text) < 2_000  # a MiB of data shows as an excerpt
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    # The stub broker's join raises what the placeholder carries.
    with pytest.raises(MessageError, match="undecodable message on queue"):
        stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000), fail_fast=True)


def test_a_plain_actor_on_its_own_queue_is_untouched_and_so_is_bad_data_there(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[int] = []

    @dramatiq.actor(broker=stub_broker, queue_name="plain", max_retries=0)
    def plain(value: int) -> None:
        got.append(value)

    stub_broker.queues["plain"].put(b"{")
    # A good message naming a queue this worker does not consume: Dramatiq would hand
    # it back to that queue's consumer, and the worker thread would die of a KeyError.
    stub_broker.queues["plain"].put(plain.message(3).copy(queue_name="elsewhere").encode())
    plain.send(1)
    plain.send(2)
    start_worker()
    stub_broker.join("plain", timeout=int(TIMEOUT * 1000), fail_fast=False)

    assert sorted(got) == [1, 2]
    dead = stub_broker.dead_letters_by_queue["plain"]
    assert [m.queue_name for m in dead] == ["plain", "plain"]
    assert [m.options[OPTION_KEY]["reason"] for m in dead][1] == (
        "names queue 'elsewhere', not 'plain'"
    )
    assert len(undecodable_records(caplog)) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]


def test_outside_a_consumer_thread_the_inner_encoder_answers_unchanged() -> None:
    # A results backend or a script decoding with the global encoder sees no placeholder.
    guarded = GuardedEncoder(JSONEncoder())
    assert guarded.decode(b"[1, 2]") == [1, 2]
    assert guarded.decode(b'{"result": 3}') == {"result": 3}
    with pytest.raises(DecodeError):
        guarded.decode(b"not json")
    assert guarded.encode({"a": 1}) == JSONEncoder().encode({"a": 1})


def test_a_new_encoder_of_the_installed_class_works_without_arguments() -> None:
    # Dramatiq's own tests (and users) subclass type(dramatiq.get_encoder()) and make one
    # with no arguments: it wraps Dramatiq's JSON encoder.
    fresh = type(GuardedEncoder(JSONEncoder()))()
    assert fresh.decode(fresh.encode({"a": [1, 2]})) == {"a": [1, 2]}
    assert isinstance(fresh.inner, JSONEncoder)


def test_in_a_consumer_thread_bad_data_decodes_to_a_placeholder_and_good_data_as_before() -> None:
    guarded = GuardedEncoder(JSONEncoder())
    broker = StubBroker()
    good = dramatiq.Message(
        queue_name="q", actor_name="a", args=(1,), kwargs={}, options={}
    ).encode()
    thread = dramatiq.worker.ConsumerThread(
        broker=broker,
        queue_name="q",
        prefetch=1,
        work_queue=None,
        worker_timeout=100,
    )
    results: list[Any] = []
    # Run the decodes in a thread of Dramatiq's consumer class, as its consumer does.
    thread.run = lambda: results.extend([guarded.decode(good), guarded.decode(b"\x00\xff")])
    thread.start()
    thread.join(TIMEOUT)

    assert results[0] == json.loads(good)
    placeholder = results[1]
    assert placeholder["actor_name"] == UNDECODABLE_ACTOR
    assert placeholder["queue_name"] == "q"
    assert "redis_message_id" not in placeholder["options"]  # the stub needs no id
    about = placeholder["options"][OPTION_KEY]
    assert about["size"] == 2
    assert about["excerpt"] == "\\x00\\xff"
    assert about["reason"].startswith("not decodable: UnicodeDecodeError")
    assert dramatiq.Message.decode(json.dumps(placeholder).encode()).actor_name == UNDECODABLE_ACTOR


class Options(dict[str, Any]):
    """A mapping some encoder might decode options to: a dict all the same."""


@pytest.mark.parametrize(
    ("fields", "on_redis", "reason"),
    [
        ([1], False, "decodes to a list, not a message's fields"),
        ("text", False, "decodes to a str, not a message's fields"),
        ({"queue_name": "q"}, False, "missing field(s) actor_name, args, kwargs, options"),
        (
            {"queue_name": "q", "actor_name": "a", "args": [], "kwargs": {}, "options": {}, "x": 1},
            False,
            "unknown field(s) 'x'",
        ),
        (
            {"queue_name": "q", "actor_name": "a", "args": [], "kwargs": {}, "options": "eta"},
            False,
            "field options is a str",
        ),
        (
            {"queue_name": "q", "actor_name": 7, "args": [], "kwargs": {}, "options": {}},
            False,
            "field actor_name is a int",
        ),
        (
            {"queue_name": "q", "actor_name": "a", "args": [], "kwargs": {}, "options": {}},
            True,
            "no redis_message_id option",
        ),
        (
            {"queue_name": "q", "actor_name": "a", "args": [], "kwargs": {}, "options": {}},
            False,
            None,
        ),
        (
            {"queue_name": "q", "actor_name": "a", "args": (), "kwargs": {}, "options": Options()},
            False,
            None,
        ),
    ],
)
def test_problem_names_what_keeps_fields_from_being_a_message(
    fields: Any, on_redis: bool, reason: str | None
) -> None:
    id_option = "redis_message_id" if on_redis else None
    assert problem(fields, id_option=id_option) == reason
    assert problem(fields, queue_name="q", id_option=id_option) == reason


def test_a_message_naming_another_queue_than_the_one_it_sits_in_is_no_message_there() -> None:
    fields = {"queue_name": "q.DQ", "actor_name": "a", "args": [], "kwargs": {}, "options": {}}
    assert problem(fields, queue_name="q.DQ") is None
    assert problem(fields, queue_name="q") == "names queue 'q.DQ', not 'q'"


def test_descriptions_never_carry_the_data_unescaped() -> None:
    big = b"\x1b]0;owned\x07" + b"x" * 10_000_000
    try:
        JSONEncoder().decode(big)
    except DecodeError as exc:
        described = describe_error(exc)
    assert described == "not decodable: JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    shown = excerpt(big)
    assert shown.startswith("\\x1b]0;owned\\x07xxx") and shown.endswith("...")
    assert len(shown) < 100
    assert problem({"\x1b[31m": 1, **dict.fromkeys(_message_fields(), 0)}) == (
        "unknown field(s) '\\x1b[31m'"
    )


def _message_fields() -> list[str]:
    return ["queue_name", "actor_name", "args", "kwargs", "options"]


def test_setup_wraps_the_encoder_it_finds_once_and_adds_one_middleware() -> None:
    dramatiq.set_encoder(PickleEncoder())
    broker = StubBroker()
    setup(broker=broker)
    setup(broker=broker)

    encoder = dramatiq.get_encoder()
    assert isinstance(encoder, GuardedEncoder)
    assert isinstance(encoder.inner, PickleEncoder)
    assert sum(isinstance(m, UndecodableMiddleware) for m in broker.middleware) == 1
    assert broker.get_actor(UNDECODABLE_ACTOR).queue_name not in broker.get_declared_queues()
