"""An application's defaults: checked once at ``setup()``, resolved when a task or a job
is built, in the order the job's own > the task's own > the handler class's > the
defaults > the built-in default.

The drivers running jobs with them: ``tests/driver/test_defaults_drivers.py``; a
``dramatiq`` worker whose task module gives them: ``tests/integration/
test_defaults_processes.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CallableExecutor,
    ConfigError,
    Context,
    IExecutor,
    Job,
    Task,
    Workflow,
    executor_registry,
    get_job_store,
    manager,
    setup,
    setup_from_config,
)
from pypepper_dramatiq.defaults import Defaults, installed_defaults

#: The id a test registers :func:`noop` under (the fixtures unregister it).
NOOP_ID = "tests.defaults.noop"


def noop(task: Task, context: Context) -> None:
    return None


class Patient(IExecutor):
    """A handler class whose policy sets a retry delay and a round_timeout."""

    retry_delay = 7.0
    round_timeout = 40.0

    def execute(self, task: Task, context: Context) -> None:
        return None


def task_of(executor: IExecutor | None = None, **options: Any) -> Task:
    """A task naming no channel, run by ``executor`` (a plain callable by default, none
    when ``executor_id`` is given)."""
    if executor is None and "executor_id" not in options:
        executor = CallableExecutor(noop)
    return Task(None, "", "", "t", None, "", None, executor, **options)


def yaml_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text("scheduler:\n  defaults:\n" + body, encoding="utf-8")
    return path


# -- checked once, at setup() -------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ({"retry_cuont": 3}, r"unknown key retry_cuont under defaults; known keys: channel_id"),
        ({"retry_count": -1}, r"defaults\.retry_count must be a whole number >= 0, got -1"),
        ({"retry_count": "3"}, r"defaults\.retry_count must be a whole number >= 0, got '3'"),
        ({"retry_jitter": "yes"}, r"defaults\.retry_jitter must be true or false"),
        ({"retry_backoff": 0.5}, r"defaults\.retry_backoff must be a finite number >= 1"),
        ({"retry_delay": "5 parsecs"}, r"defaults\.retry_delay must be a duration >= 0: "),
        ({"round_timeout": -1}, r"defaults\.round_timeout must be a duration >= 0"),
        ({"max_start_delay": "soon"}, r"defaults\.max_start_delay must be a duration >= 0"),
        ({"max_start_delay": 0.0001}, r"defaults\.max_start_delay: .*whole number of milli"),
        ({"retry_delay": "999999w"}, r"defaults\.retry_delay must be at most"),
        ({"channel_id": ""}, r"defaults\.channel_id must be a non-empty channel id"),
        ({"priority": 10}, r"defaults\.priority must be a whole number from 0 to 9, got 10"),
        ({"priority": "high"}, r"defaults\.priority must be a whole number from 0 to 9"),
        ({"retry_delay": 10, "retry_delay_max": 5}, r"retry_delay_max \(5.0\) must not be below"),
        (["retry_count"], r"defaults must be a mapping"),
    ],
    ids=repr,
)
def test_bad_defaults_are_a_config_error_naming_the_key_at_setup(given: Any, refusal: str) -> None:
    broker = StubBroker()
    with pytest.raises(ConfigError, match=refusal):
        setup(broker=broker, defaults=given)
    assert dramatiq.broker.global_broker is not broker  # nothing installed
    assert installed_defaults.current == Defaults()
    broker.close()


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ("    retryCuont: 3\n", r"unknown key retryCuont under scheduler\.defaults; .*retryCount"),
        ("    retryCount: -1\n", r"scheduler\.defaults\.retryCount must be a whole number >= 0"),
        ("    retryJitter: maybe\n", r"scheduler\.defaults\.retryJitter must be true or false"),
        ("    roundTimeout: 5 parsecs\n", r"scheduler\.defaults\.roundTimeout must be a duration"),
        ("    - retryCount\n", r"scheduler\.defaults must be a mapping"),
        ("    priority: -1\n", r"scheduler\.defaults\.priority must be a whole number from 0"),
    ],
    ids=repr,
)
def test_bad_yaml_defaults_name_their_key(tmp_path: Path, body: str, refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        setup(broker=StubBroker(), config_path=yaml_file(tmp_path, body))
    assert installed_defaults.current == Defaults()


def test_setup_reads_the_defaults_once_into_its_settings_the_yaml_winning_key_by_key(
    tmp_path: Path,
) -> None:
    path = yaml_file(tmp_path, "    retryCount: 4\n    maxStartDelay: 2h\n")

    setup(
        broker=StubBroker(),
        config_path=path,
        defaults={"retry_count": 1, "retry_delay": "30s", "channel_id": "mail"},
    )

    assert installed_defaults.current == Defaults(
        channel_id="mail", retry_count=4, retry_delay=30.0, max_start_delay=7200.0
    )
    assert manager.available("mail").id == "mail"  # declared, as channels= are
    setup(broker=StubBroker())  # a setup() without defaults: the built-in ones again
    assert installed_defaults.current == Defaults()


# -- resolved when a task or a job is built ---------------------------------------------------


def test_a_task_takes_its_own_then_its_handlers_then_the_defaults_then_the_built_in() -> None:
    setup(
        broker=StubBroker(),
        defaults={"retry_count": 3, "retry_delay": 2, "round_timeout": "1m", "retry_jitter": True},
    )

    plain = task_of()
    handled = task_of(Patient())
    own = task_of(Patient(), retry_count=0, retry_delay=1, round_timeout=5)

    assert (plain.retry_count, plain.retry_delay, plain.round_timeout) == (3, 2.0, 60.0)
    assert (handled.retry_count, handled.retry_delay, handled.round_timeout) == (3, 7.0, 40.0)
    assert (own.retry_count, own.retry_delay, own.round_timeout) == (0, 1.0, 5.0)
    assert plain.retry_jitter and own.retry_jitter  # the default, no one said otherwise
    assert plain.retry_backoff == 1.0 and plain.retry_delay_max is None  # built-in


def test_without_defaults_a_task_keeps_the_built_in_ones() -> None:
    plain = task_of()

    assert (plain.retry_count, plain.retry_delay, plain.round_timeout) == (0, 0.0, 0.0)


def test_a_default_cap_never_cuts_a_tasks_own_longer_delay() -> None:
    setup(broker=StubBroker(), defaults={"retry_delay_max": 10, "retry_backoff": 2})

    capped = task_of(retry_delay=1)
    longer = task_of(retry_delay=60)

    assert (capped.retry_delay_max, capped.retry_backoff) == (10.0, 2.0)
    assert longer.retry_delay_max == 60.0  # its own delay wins over the default cap


def test_a_stored_task_keeps_what_it_was_built_with_whatever_the_defaults_here() -> None:
    executor_registry.register(NOOP_ID, CallableExecutor(noop))
    setup(broker=StubBroker(), defaults={"retry_count": 5, "round_timeout": 9})
    stored = task_of(executor_id=NOOP_ID).to_dict("c")

    setup(broker=StubBroker(), defaults={"retry_count": 1, "round_timeout": 2})
    rebuilt = Task.from_dict(stored)

    assert (stored["retry_count"], stored["round_timeout"]) == (5, 9.0)
    assert (rebuilt.retry_count, rebuilt.round_timeout) == (5, 9.0)


def test_setup_from_config_installs_the_yaml_defaults_for_the_in_process_driver() -> None:
    yml = {"scheduler": {"defaults": {"channelId": "inproc", "retryCount": 2}}}

    setup_from_config(yml)

    assert Job().channel_id == "inproc"
    assert task_of().policy.retry_count == 2
    with pytest.raises(ConfigError, match=r"scheduler\.defaults\.retryCount must be a whole"):
        setup_from_config({"scheduler": {"defaults": {"retryCount": -1}}})
    assert task_of().policy.retry_count == 2  # nothing installed by the refused call
    setup_from_config({"scheduler": {"jobStore": {"backend": "memory"}}})
    assert Job().channel_id == "inproc"  # a YAML without defaults leaves them


def test_a_job_naming_no_channel_takes_the_default_one() -> None:
    assert Job().channel_id == "default"  # the built-in channel

    setup(broker=StubBroker(), defaults={"channel_id": "mail"})

    assert Job().channel_id == "mail"
    assert Job(channel_id="reports").channel_id == "reports"  # its own wins
    assert task_of().spec().channel_id == "mail"  # a task outside any job
    assert task_of().spec("reports").channel_id == "reports"  # a task in a job


@pytest.mark.parametrize("channel_id", ["", 3])
def test_a_tasks_channel_is_a_non_empty_string_or_none(channel_id: Any) -> None:
    with pytest.raises(ValueError, match=r"channel_id of task 't' must be a non-empty string"):
        Task(channel_id, "", "", "t", None, "", None, CallableExecutor(noop))


def test_scheduled_takes_the_default_max_start_delay_unless_given_its_own() -> None:
    executor_registry.register(NOOP_ID, CallableExecutor(noop))
    setup(broker=StubBroker(), channels=["c"], defaults={"max_start_delay": "10m"})
    by_default, own = Job(channel_id="c"), Job(channel_id="c")
    for job in (by_default, own):
        job.workflows.append(Workflow([task_of(executor_id=NOOP_ID)]))

    by_default.scheduled(delay=1)
    own.scheduled(delay=1, max_start_delay=0)

    for job, window in ((by_default, 600.0), (own, 0.0)):
        record = get_job_store().get(job.id)
        assert record is not None and record.not_before and record.start_deadline
        assert (record.start_deadline - record.not_before).total_seconds() == window


def test_a_job_takes_the_default_priority_unless_it_or_scheduled_says() -> None:
    assert Job().priority == 0  # the built-in priority, the lowest
    executor_registry.register(NOOP_ID, CallableExecutor(noop))
    setup(broker=StubBroker(), channels=["c"], defaults={"priority": 4})
    assert installed_defaults.current.priority == 4
    by_default, own, at_schedule = (
        Job(channel_id="c"),
        Job(channel_id="c", priority=0),
        Job(channel_id="c"),
    )
    for job in (by_default, own, at_schedule):
        job.workflows.append(Workflow([task_of(executor_id=NOOP_ID)]))
        job.scheduled(**({"priority": 8} if job is at_schedule else {}))
    stored = [get_job_store().get(job.id) for job in (by_default, own, at_schedule)]
    assert [Job.from_record(r).priority for r in stored if r is not None] == [4, 0, 8]
