"""Any text at all, in every field a user or a task controls, on every store.

For each field the outcome is one of three: a typed error at submit naming the
field (and nothing stored or queued), the value read back as it was written,
or, for text the engine writes (a task's error, its traceback, a progress
note), the text stored with what no store keeps visibly escaped. Whatever the
text, the job ends: Completed or Failed, never stuck or looping.

The jobs run with the in-process :class:`~pypepper_dramatiq.Worker`: many
examples on the memory store, fewer on PostgreSQL and MariaDB.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from dramatiq.brokers.stub import StubBroker
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from process_state import clean_process_state
from sqlalchemy import create_engine, delete, make_url
from sqlalchemy import text as sql_text

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    Worker,
    Workflow,
    get_job_store,
    manager,
    recurring,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import get_broker
from pypepper_dramatiq.errors import ConfigError
from pypepper_dramatiq.limits.storable import (
    CATEGORY_LENGTH,
    CHANNEL_ID_LENGTH,
    CRON_LENGTH,
    ID_LENGTH,
    SCHEDULE_NAME_LENGTH,
    TIMEZONE_LENGTH,
    UNIQUE_KEY_LENGTH,
    storable_text,
    unstorable_in,
)
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.schema import jobs
from pypepper_dramatiq.stores.schema import recurring as recurring_table
from pypepper_dramatiq.stores.sql import SqlJobStore

#: Each store with how many examples it gets (the SQL ones cost a round trip a write).
STORES = [
    pytest.param(("memory", 200), id="memory"),
    pytest.param(("postgres", 40), id="postgres", marks=pytest.mark.postgres),
    pytest.param(("mysql", 25), id="mysql", marks=pytest.mark.mysql),
]
#: The database the MariaDB examples use: utf8mb4, as the README asks (the test
#: server's default database is latin1, which keeps no text outside latin1).
MYSQL_DATABASE = "pypepper_poison_utf8mb4"
#: Upper bound for the examples' jobs to end (a hang, not a speed check).
JOB_TIMEOUT = 30.0
#: Keyword names the task's call itself takes: a parameter cannot be one of them.
TAKEN_NAMES = frozenset({"name", "channel_id", "task", "context"})

# -- text ----------------------------------------------------------------------------------

#: Every code point: lone surrogates, NUL and the other controls included.
ANY_CHARACTER = st.characters(codec=None)
#: What trips a store, a terminal or a log, in small pieces to mix in.
HOSTILE = st.sampled_from(
    ["\x00", "\udc80", "\ud800", "\x1b[2J", "\r\n", "\u202e", "\x7f", "\ufeff", "\U0001f600", "'"]
)

# Replaying a failing example with its (long) texts would warn of an overly large
# repr, and the warning, an error here, would hide the failure it reports.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")


def any_text(*, min_size: int = 0) -> st.SearchStrategy[str]:
    """Any text: short, hostile pieces mixed in, or over every column's limit."""
    short = st.text(ANY_CHARACTER, min_size=min_size, max_size=24)
    mixed = st.lists(st.one_of(HOSTILE, short), min_size=max(min_size, 1), max_size=6).map("".join)
    long = st.text(ANY_CHARACTER, min_size=60, max_size=300)
    very_long = st.tuples(st.integers(10_000, 200_000), st.booleans()).map(
        lambda size_nul: "x" * size_nul[0] + ("\x00" if size_nul[1] else "")
    )
    return st.one_of(short, mixed, long, very_long)


#: Text every store keeps: any code point but NUL and the surrogates (controls, bidi,
#: emoji, combining marks included).
KEEPABLE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)


#: Plain text, of the characters ids and names usually hold.
PLAIN = st.text("abcXYZ09-_.", min_size=1, max_size=12)


def _json_leaf() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        any_text(),
    )


#: A task parameter's value: JSON-shaped, nested, with any text in keys and leaves.
PARAM_VALUE = st.recursive(
    _json_leaf(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(any_text(), inner, max_size=3)
    ),
    max_leaves=8,
)


def refused_in_json(value: Any) -> bool:
    """Whether a JSON column could not hold ``value``: a string (a key too) no store
    keeps, or a float JSON has no form for."""
    if isinstance(value, str):
        return unstorable_in(value) is not None
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(refused_in_json(k) or refused_in_json(v) for k, v in value.items())
    if isinstance(value, list):
        return any(refused_in_json(item) for item in value)
    return False


def unkeepable(text: str, limit: int, *, may_be_empty: bool = True) -> bool:
    """Whether a column of ``limit`` characters cannot hold ``text``."""
    return (not text and not may_be_empty) or len(text) > limit or unstorable_in(text) is not None


# -- the task ------------------------------------------------------------------------------

#: What the running example's task does: its note, its result or its error.
SCRIPT: dict[str, Any] = {}


@workflow_task(name="tests.poison_property.poisoned", retry_count=0)
def poisoned(task: Task, context: Context, **params: Any) -> Any:
    """Reports the scripted note, then fails with the scripted message or returns the result."""
    SCRIPT["seen"] = params
    context.progress(1, 2, note=SCRIPT["note"])
    if SCRIPT["fails"]:
        raise RuntimeError(SCRIPT["error"])
    return SCRIPT["result"]


@workflow_task(name="tests.poison_property.child", retry_count=0)
def child_task(task: Task, context: Context) -> str:
    return "child ran"


# -- the stores ----------------------------------------------------------------------------


def emptied(chosen: IJobStore) -> IJobStore:
    """``chosen`` with no job and no schedule left by an earlier example."""
    if isinstance(chosen, SqlJobStore):
        with chosen.engine.begin() as connection:
            connection.execute(delete(jobs))
            connection.execute(delete(recurring_table))
        return chosen
    return set_job_store(MemoryJobStore())


@pytest.fixture(params=STORES)
def store_and_examples(request: pytest.FixtureRequest) -> tuple[Callable[[], IJobStore], int]:
    """A function giving the installed store emptied, and the examples it gets."""
    name, examples = request.param
    if name == "memory":
        return (lambda: emptied(MemoryJobStore())), examples
    sql: IJobStore = (
        request.getfixturevalue("pg_store")
        if name == "postgres"
        else request.getfixturevalue("utf8mb4_store")
    )
    set_job_store(sql)
    return (lambda: emptied(sql)), examples


@pytest.fixture
def utf8mb4_store(mysql_uri: str) -> Iterator[SqlJobStore]:
    """A migrated store on a utf8mb4 database of the test MariaDB server."""
    admin = create_engine(mysql_uri)
    with admin.begin() as connection:
        connection.execute(
            sql_text(f"CREATE DATABASE IF NOT EXISTS `{MYSQL_DATABASE}` CHARACTER SET utf8mb4")
        )
    admin.dispose()
    store = SqlJobStore(
        make_url(mysql_uri).set(database=MYSQL_DATABASE).render_as_string(hide_password=False),
        migrate=True,
    )
    yield store
    store.close()


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[StubBroker]:
    """Each test starts on a new stub broker, no channels, no config, the default
    store, whatever an earlier test of the session left installed."""
    stub = StubBroker()
    with clean_process_state(stub):
        yield stub
    stub.close()


def queued() -> int:
    """Messages on the stub broker, delayed ones included."""
    return sum(queue.qsize() for queue in get_broker().queues.values())


def drain(channel_id: str) -> None:
    """Run what the channel holds with the in-process Worker until nothing is left."""
    channel = manager.available(channel_id)
    channel.request_stop()
    asyncio.run(asyncio.wait_for(Worker(channel).run_forever(), JOB_TIMEOUT))


def by_example(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# -- jobs ----------------------------------------------------------------------------------


#: The fields of a job a user or its task controls.
JOB_FIELDS = (
    "job_id", "channel_id", "category", "unique_key", "task_name", "param_key",
    "param_value", "note", "error", "result",
)  # fmt: skip


@st.composite
def job_fields(draw: st.DrawFn) -> dict[str, Any]:
    """A job's fields: one or two of them (sometimes none) any text at all, the
    others plain or keepable, so that each field is often the only culprit."""
    hostile = draw(st.sets(st.sampled_from(JOB_FIELDS), max_size=2))

    def text(name: str, plain: st.SearchStrategy[Any]) -> Any:
        if name in hostile:
            return draw(PARAM_VALUE if name == "param_value" else any_text())
        return draw(st.one_of(plain, KEEPABLE))

    plain = PLAIN
    key = text("param_key", plain)  # not one of the call's own keywords (TAKEN_NAMES)
    return {
        "job_id": text("job_id", st.uuids().map(lambda u: u.hex)),
        "channel_id": text("channel_id", st.just("poison-jobs")),
        "category": text("category", st.one_of(st.none(), plain)),
        "unique_key": text("unique_key", st.one_of(st.none(), plain)),
        "task_name": text("task_name", plain),
        "param_key": key if key not in TAKEN_NAMES else f"{key}_",
        "param_value": text("param_value", st.just(1)),
        "note": text("note", st.just("half way")),
        "fails": draw(st.booleans()),
        "error": text("error", st.just("planned")),
        "result": text("result", st.just("done")),
    }


def expected_refusals(f: dict[str, Any]) -> set[str]:
    """The words one of which a refusal at submit must name: one per field no row can hold."""
    bad: set[str] = set()
    if unkeepable(f["job_id"], ID_LENGTH, may_be_empty=False):
        bad.add("job id")
    if unkeepable(f["channel_id"], CHANNEL_ID_LENGTH, may_be_empty=False):
        bad.add("channel_id")
    if f["category"] is not None and unkeepable(f["category"], CATEGORY_LENGTH):
        bad.add("category")
    if f["unique_key"] is not None and unkeepable(
        f["unique_key"], UNIQUE_KEY_LENGTH, may_be_empty=False
    ):
        bad.add("unique_key")
    if f["task_name"] and unstorable_in(f["task_name"]) is not None:
        bad.add("task ")  # "task 'name' (workflow 0, task 0)"
    if refused_in_json(f["param_key"]) or refused_in_json(f["param_value"]):
        bad.add("params")
    return bad


def submit(f: dict[str, Any]) -> Job:
    """The job of ``f`` built and scheduled (raises what construction or submit raises)."""
    job = Job(f["category"], f["channel_id"], id=f["job_id"])
    job.workflows = [
        Workflow([poisoned.task(name=f["task_name"], **{f["param_key"]: f["param_value"]})])
    ]
    job.scheduled(unique_key=f["unique_key"])
    return job


@pytest.mark.timeout(120)
def test_any_text_in_any_job_field_is_refused_named_kept_or_escaped(
    store_and_examples: tuple[Callable[[], IJobStore], int],
) -> None:
    fresh_store, examples = store_and_examples

    @by_example(examples)
    @given(f=job_fields())
    def example(f: dict[str, Any]) -> None:
        store = fresh_store()
        manager.clear()
        SCRIPT.clear()
        SCRIPT.update(note=f["note"], fails=f["fails"], error=f["error"], result=f["result"])
        before = queued()
        refusals = expected_refusals(f)

        try:
            submit(f)
        except (ValueError, TypeError) as exc:
            event(f"refused at submit: {sorted(refusals)}")
            assert refusals, f"refused, but every field is storable: {exc!r}"
            assert any(word in str(exc) for word in refusals), (refusals, str(exc))
            assert store.list() == [] and queued() == before
            # A child waiting for it: an id no row can hold is refused naming after=;
            # a storable one names a job that was never stored.
            orphan = Job(channel_id="poison-jobs")
            orphan.workflows = [Workflow([child_task.task()])]
            with pytest.raises((ValueError, TypeError, LookupError)) as after_refused:
                orphan.scheduled(after=[f["job_id"]])
            if unkeepable(f["job_id"], ID_LENGTH, may_be_empty=False):
                assert "after" in str(after_refused.value)
            assert store.list() == [] and queued() == before
            return
        assert not refusals, f"stored although {refusals} cannot be kept"

        child = Job(channel_id=f["channel_id"])
        child.workflows = [Workflow([child_task.task()])]
        child.scheduled(after=[f["job_id"]])

        # Read back as written, before anything ran.
        stored = store.get(f["job_id"])
        assert stored is not None
        assert (stored.id, stored.channel_id, stored.category, stored.unique_key) == (
            f["job_id"],
            f["channel_id"],
            f["category"],
            f["unique_key"],
        )
        assert stored.payload is not None
        [spec] = stored.payload["workflows"][0]["tasks"]
        assert spec["name"] == (f["task_name"] or "poisoned")
        assert spec["params"] == {f["param_key"]: f["param_value"]}
        waiting = store.get(child.id)
        assert waiting is not None and waiting.waits is not None
        assert waiting.waits["parents"] == [f["job_id"]]

        drain(f["channel_id"])

        ended = store.get(f["job_id"])
        after = store.get(child.id)
        assert ended is not None and after is not None
        event(f"ran: {ended.status.name}")
        assert SCRIPT["seen"] == {f["param_key"]: f["param_value"]}
        result_refused = not f["fails"] and unstorable_in(f["result"]) is not None
        [progress] = ended.progress.values()  # kept when the result is refused too
        assert progress["note"] == storable_text(f["note"])
        if f["fails"] or result_refused:
            assert ended.status is Status.FAILED, ended
            assert after.status is Status.FAILED, after  # propagated from its parent
            assert ended.error is not None and unstorable_in(ended.error) is None
            [entry] = ended.state["history"]["0.0"]
            if f["fails"]:
                assert storable_text(f["error"])[:500] in ended.error
                assert entry["message"].startswith(storable_text(f["error"])[:500])
                assert unstorable_in(entry["traceback"]) is None
            else:
                assert "ResultNotStorableError" in ended.error
        else:
            assert ended.status is Status.COMPLETED, ended
            assert ended.state["results"]["0.0"] == f["result"]
            assert after.status is Status.COMPLETED, after

    example()


# -- recurring schedules -------------------------------------------------------------------

VALID_CRONS = ["0 3 * * *", "*/5 * * * *"]
VALID_ZONES = ["UTC", "Europe/Paris"]


@pytest.mark.timeout(120)
def test_any_text_in_a_schedule_is_refused_named_or_kept(
    store_and_examples: tuple[Callable[[], IJobStore], int],
) -> None:
    pytest.importorskip("croniter")
    fresh_store, examples = store_and_examples

    @by_example(examples)
    @given(hostile=st.sampled_from([None, "name", "cron", "zone"]), data=st.data())
    def example(hostile: str | None, data: st.DataObject) -> None:
        # One field any text at all, the others plain or keepable (or none: all plain).
        name = data.draw(
            any_text() if hostile == "name" else st.one_of(PLAIN, KEEPABLE), label="name"
        )
        cron = data.draw(
            any_text() if hostile == "cron" else st.sampled_from(VALID_CRONS), label="cron"
        )
        zone = data.draw(
            any_text() if hostile == "zone" else st.sampled_from(VALID_ZONES), label="zone"
        )
        store = fresh_store()
        manager.clear()
        template = Job(channel_id="poison-jobs")
        template.workflows = [Workflow([child_task.task()])]
        certain = set()
        if unkeepable(name, SCHEDULE_NAME_LENGTH, may_be_empty=False):
            certain.add("schedule name")
        if unkeepable(cron, CRON_LENGTH):
            certain.add("cron")
        if unkeepable(zone, TIMEZONE_LENGTH):
            certain.add("timezone")
        # Text that is storable may still not be a cron expression or a zone.
        possible = certain | (set() if cron in VALID_CRONS else {"cron"})
        possible |= set() if zone in VALID_ZONES else {"time zone", "timezone"}

        try:
            recurring(name, cron, template, timezone=zone)
        except (ValueError, TypeError, ConfigError) as exc:
            assert possible, f"refused a valid schedule: {exc!r}"
            assert any(word in str(exc) for word in possible), (possible, str(exc))
            assert store.list_recurring() == [] and store.list() == []
            event("schedule refused")
            return
        event("schedule stored")
        assert not certain, f"stored although {certain} cannot be kept"
        [kept] = store.list_recurring()
        assert (kept.name, kept.cron, kept.timezone) == (name, cron, zone)
        again = store.get_recurring(name)
        assert again is not None and (again.cron, again.timezone) == (cron, zone)

    example()


def test_the_strategies_reach_every_outcome() -> None:
    """The text strategies do make fields no row holds, and ones every row holds."""
    seen: set[bool] = set()

    @settings(max_examples=200, deadline=None)
    @given(text=any_text())
    def sample(text: str) -> None:
        seen.add(unstorable_in(text) is not None)

    sample()
    assert seen == {True, False}


def test_a_result_refused_keeps_the_progress_its_task_reported() -> None:
    emptied(MemoryJobStore())
    SCRIPT.clear()
    SCRIPT.update(note="half way", fails=False, error="", result="lone \udc80")
    job = Job(channel_id="poison-jobs")
    job.workflows = [Workflow([poisoned.task(name="load")])]
    job.scheduled()

    drain("poison-jobs")

    ended = get_job_store().get(job.id)
    assert ended is not None and ended.status is Status.FAILED
    assert "ResultNotStorableError" in (ended.error or "")
    assert ended.progress["0.0"]["note"] == "half way"
