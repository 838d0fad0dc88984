"""``scheduled()``'s options are one object (``ScheduleOptions``), checked once; the model
reaches its I/O through ``model.job.runtime``, and importing the model imports no engine."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dramatiq.brokers.stub import StubBroker
from driver import test_waits

from pypepper_dramatiq import Job, Status, setup
from pypepper_dramatiq.engine.job_io import JOB_IO
from pypepper_dramatiq.model.job import IJobIO, JobRuntime, ScheduleOptions, runtime
from pypepper_dramatiq.rules.start_times import StartOptions

from . import test_duration_bounds, test_start_times

ROOT = Path(__file__).resolve().parents[2]


def _cases(test: Any) -> Iterator[tuple[dict[str, Any], type[Exception], str]]:
    """The (options, error, pattern) cases an existing test of ``scheduled()`` is
    parametrized with: the same cases, not copies that could drift."""
    (mark,) = test.pytestmark
    for case in mark.args[1]:
        values = case.values if hasattr(case, "values") else case
        if len(values) == 2:  # (options, pattern): a ValueError
            yield values[0], ValueError, values[1]
        else:
            yield values[0], values[1], values[2]


REFUSED = [
    *_cases(test_start_times.test_bad_options_are_refused_naming_them_and_nothing_is_queued_or_stored),
    *_cases(test_duration_bounds.test_a_time_option_beyond_the_bound_is_refused_naming_it_and_the_bound),
    *(
        case
        for case in _cases(test_waits.test_bad_wait_options_are_named_and_store_nothing)
        if case[1] in (ValueError, TypeError)  # the others are the store's answers
    ),
]  # fmt: skip


@pytest.mark.parametrize(("options", "error", "named"), REFUSED)
def test_the_options_object_refuses_what_scheduled_refuses_with_the_same_error(
    options: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named) as by_options:
        ScheduleOptions(**options)
    job = Job(channel_id="refused")
    with pytest.raises(error) as by_scheduled:
        job.scheduled(**options)
    assert type(by_scheduled.value) is type(by_options.value)
    assert str(by_scheduled.value) == str(by_options.value)
    assert job.status is Status.UNKNOWN


def test_every_keyword_of_scheduled_is_a_field_of_the_options_and_back() -> None:
    """The keywords, their order and their defaults: they cannot drift apart."""
    keywords = [
        (p.name, p.default)
        for p in inspect.signature(Job.scheduled).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    fields = [(f.name, f.default) for f in dataclasses.fields(ScheduleOptions) if f.init]
    assert keywords == fields
    assert len(keywords) == 11


def test_the_options_keep_their_checked_forms_and_read_after_once() -> None:
    parents = (job_id for job_id in ["a", "b", "a"])  # a generator: read once
    options = ScheduleOptions(delay=1.5, after=parents, unique_key="k", max_start_delay=2)
    assert options.after == ("a", "b") == options.waits.parents
    assert options.start == StartOptions(delay=1.5, max_start_delay=2.0)
    assert options.key == "k" and options.stored_first
    assert not ScheduleOptions().stored_first
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.delay = 3  # type: ignore[misc]


def test_importing_the_model_imports_no_engine() -> None:
    """In a fresh interpreter: the model alone (and the seed path of ``Job``) loads no
    module of the engine or the drivers; the package's first job method then finds
    the engine's job I/O (the embedded default) and schedules."""
    script = """
import sys
import pypepper_dramatiq.model.job
import pypepper_dramatiq.job
loaded = sorted(m for m in sys.modules if m.startswith(("pypepper_dramatiq.engine",
    "pypepper_dramatiq.drivers", "pypepper_dramatiq.channels", "pypepper_dramatiq.stores")))
assert loaded == [], loaded
from pypepper_dramatiq.job import Job
job = Job(channel_id="fresh")
assert job.scheduled() == job.id
assert Job.get_saved(job.id).status.value == "Scheduled"
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_scheduled_works_after_importing_the_package_normally() -> None:
    import pypepper_dramatiq

    job = pypepper_dramatiq.Job(channel_id="normal")
    assert job.scheduled(delay=0.5) == job.id
    assert job.status is Status.SCHEDULED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.not_before is not None


def test_setup_installs_the_engine_s_job_io(fresh_process_state: StubBroker) -> None:
    setup(broker=fresh_process_state)
    assert runtime.job_io is JOB_IO


def test_a_runtime_with_no_job_io_says_how_to_get_one() -> None:
    empty = JobRuntime()
    with pytest.raises(RuntimeError, match="setup"):
        _ = empty.job_io
    found: list[IJobIO] = []

    def find() -> IJobIO:
        found.append(JOB_IO)
        return JOB_IO

    empty.provide_default(find)
    assert empty.job_io is JOB_IO and empty.job_io is JOB_IO
    assert len(found) == 1  # resolved once
    other = JobRuntime()
    other.provide_default(find)
    other.install(JOB_IO)
    assert other.job_io is JOB_IO and len(found) == 1  # installed: no default asked
