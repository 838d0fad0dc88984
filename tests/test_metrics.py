"""Prometheus metrics: what each driver counts, read from a ``CollectorRegistry``.

Both drivers run on the stub broker and the memory store (the in-process
``Worker`` and a ``dramatiq.Worker``); the recovery sweep and the recurring
firings are driven by hand. ``tests/integration/test_metrics.py`` reads the
same metrics from real worker processes through Dramatiq's exposition server.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from driver.drivers import CHANNEL, DramatiqDriver, InProcessDriver, make_job, run
from process_state import clean_process_state
from prometheus_client import CollectorRegistry

import pypepper_dramatiq
from pypepper_dramatiq import (
    ConfigError,
    Context,
    JobRecord,
    Status,
    Task,
    WorkflowMiddleware,
    get_job_store,
    observers,
    recurring,
    workflow_task,
)
from pypepper_dramatiq.distributed.recovery import RecoverySweeper
from pypepper_dramatiq.metrics import PrometheusMetrics, install_metrics, uninstall_metrics
from pypepper_dramatiq.schedules import fire_due

Driver = InProcessDriver | DramatiqDriver

#: How often each test task was called, by (job id, task name).
CALLS: dict[tuple[str | None, str], int] = {}


@workflow_task(name="metrics.work")
def work(task: Task, context: Context, *, fail_first: int = 0, always_fail: bool = False) -> str:
    key = (context.job_id, task.name)
    CALLS[key] = CALLS.get(key, 0) + 1
    if always_fail or CALLS[key] <= fail_first:
        raise RuntimeError(f"{task.name}: planned failure")
    return "done"


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    with clean_process_state():
        yield
    observers.clear()


@pytest.fixture
def stub_broker() -> Iterator[StubBroker]:
    broker = pypepper_dramatiq.setup(
        broker=StubBroker(), channels=[CHANNEL], lease_seconds=3, sweep_interval=0.5
    )
    assert isinstance(broker, StubBroker)
    broker.emit_after("process_boot")
    yield broker
    for middleware in broker.middleware:
        if isinstance(middleware, WorkflowMiddleware):
            middleware.stop_background()
    broker.close()


@pytest.fixture(params=["inprocess", "dramatiq"])
def driver(request: pytest.FixtureRequest, stub_broker: StubBroker) -> Iterator[Driver]:
    started: list[dramatiq.Worker] = []

    def start() -> dramatiq.Worker:
        if not started:
            worker = dramatiq.Worker(stub_broker, worker_timeout=50)
            worker.start()
            started.append(worker)
        return started[0]

    yield InProcessDriver() if request.param == "inprocess" else DramatiqDriver(stub_broker, start)
    for worker in started:
        worker.stop()


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry our metrics count into, for this test alone."""
    registry = CollectorRegistry()
    metrics = install_metrics(registry)
    yield registry
    uninstall_metrics(metrics)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value, 0 when it does not exist (a labelled child never used)."""
    return registry.get_sample_value(name, labels) or 0.0


def ended(registry: CollectorRegistry, status: str) -> float:
    return value(
        registry, "pypepper_jobs_ended_total", status=status, channel=CHANNEL, category="contract"
    )


# -- both drivers ---------------------------------------------------------------------------


def test_a_mix_of_jobs_is_counted_by_status_with_durations_and_retries(
    driver: Driver, registry: CollectorRegistry
) -> None:
    completed = [make_job([work.task(name="ok")]) for _ in range(3)]
    failed = [make_job([work.task(name="broken", always_fail=True)]) for _ in range(2)]
    retried = make_job([work.options(retry_count=1).task(name="flaky", fail_first=1)])
    cancelled = make_job([work.task(name="never")])
    cancelled.scheduled()
    cancelled.cancel()

    records = run(driver, *completed, *failed, retried)

    assert [r.status for r in records] == [Status.COMPLETED] * 3 + [Status.FAILED] * 2 + [
        Status.COMPLETED
    ]
    assert ended(registry, "Completed") == 4
    assert ended(registry, "Failed") == 2
    assert ended(registry, "Cancelled") == 1
    # Only jobs that started have a run time and a start delay.
    labels = {"channel": CHANNEL, "category": "contract"}
    assert value(registry, "pypepper_job_duration_seconds_count", status="Completed", **labels) == 4
    assert value(registry, "pypepper_job_duration_seconds_count", status="Failed", **labels) == 2
    assert value(registry, "pypepper_job_duration_seconds_count", status="Cancelled", **labels) == 0
    assert value(registry, "pypepper_job_start_delay_seconds_count", channel=CHANNEL) == 6
    # Every attempt, by task and outcome; one retry.
    task_count = "pypepper_task_duration_seconds_count"
    assert value(registry, task_count, task="ok", outcome="succeeded") == 3
    assert value(registry, task_count, task="broken", outcome="failed") == 2
    assert value(registry, task_count, task="flaky", outcome="failed") == 1
    assert value(registry, task_count, task="flaky", outcome="succeeded") == 1
    assert value(registry, "pypepper_task_retries_total", task="flaky") == 1
    assert value(registry, "pypepper_task_retries_total", task="broken") == 0
    # Every attempt that started has finished.
    assert value(registry, "pypepper_steps_in_progress", channel=CHANNEL) == 0


def test_a_job_past_its_start_deadline_counts_as_a_missed_deadline(
    driver: Driver, registry: CollectorRegistry
) -> None:
    late = make_job([work.task(name="late")])
    late.scheduled(max_start_delay=0)  # any start is later than that
    driver.start()
    [record] = driver.wait(late)

    assert record.status is Status.CANCELLED
    assert value(registry, "pypepper_start_deadlines_missed_total", channel=CHANNEL) == 1
    assert ended(registry, "Cancelled") == 1
    assert value(registry, "pypepper_job_start_delay_seconds_count", channel=CHANNEL) == 0


def test_steps_in_progress_counts_the_attempt_running_now(
    driver: Driver, registry: CollectorRegistry
) -> None:
    seen: list[float] = []

    @workflow_task(name="metrics.look")
    def look(task: Task, context: Context) -> None:
        seen.append(value(registry, "pypepper_steps_in_progress", channel=CHANNEL))

    run(driver, make_job([look.task(name="look")]))
    assert seen == [1.0]
    assert value(registry, "pypepper_steps_in_progress", channel=CHANNEL) == 0


def test_the_start_delay_counts_from_the_planned_start(
    driver: Driver, registry: CollectorRegistry
) -> None:
    job = make_job([work.task(name="ok")])
    job.scheduled(delay=1.5)
    driver.start()
    driver.wait(job)

    # Started at (or a little after) its planned start, not 1.5 s after it.
    assert value(registry, "pypepper_job_start_delay_seconds_count", channel=CHANNEL) == 1
    assert value(registry, "pypepper_job_start_delay_seconds_sum", channel=CHANNEL) < 1.0


# -- the sweep and the schedules ------------------------------------------------------------


def test_the_recovery_sweep_counts_the_steps_it_sends_again(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    now = datetime.now(timezone.utc)
    dead = JobRecord(
        id=uuid.uuid4().hex,
        channel_id=CHANNEL,
        status=Status.IN_PROGRESS,
        state={"cursor": [0, 0, 0, 0]},
        lease_owner="a-dead-worker",
        lease_expires=now - timedelta(seconds=5),
    )
    assert get_job_store().put(dead)
    sweeper = RecoverySweeper(stub_broker, "me", lease_seconds=3, interval=0.5)

    sweeper.sweep()

    assert value(registry, "pypepper_recoveries_total", channel=CHANNEL, kind="lease_lapsed") == 1
    assert stub_broker.queues[CHANNEL].qsize() == 1


def test_recurring_firings_are_counted_by_schedule(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    template = make_job([work.task(name="tick")])
    recurring("metrics-minutely", "* * * * *", template, catch_up="all", overlap="allow")
    schedule = get_job_store().get_recurring("metrics-minutely")
    assert schedule is not None
    start = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert get_job_store().advance_recurring(schedule.evolve(next_slot=start))

    fired = fire_due(start + timedelta(minutes=2, seconds=30))

    assert len(fired) == 3
    assert value(registry, "pypepper_recurring_firings_total", schedule="metrics-minutely") == 3


def test_channel_depth_is_read_at_scrape_time(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    assert value(registry, "pypepper_channel_depth", channel=CHANNEL) == 0
    for _ in range(2):
        make_job([work.task(name="ok")]).scheduled()
    assert value(registry, "pypepper_channel_depth", channel=CHANNEL) == 2


# -- the seam ---------------------------------------------------------------------------------


def test_an_observer_that_raises_changes_nothing_and_is_logged_once(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(observers.Observer):
        def job_ended(self, record: JobRecord) -> None:
            raise RuntimeError("observer bug")

        def task_ended(self, *args: Any) -> None:
            raise RuntimeError("observer bug")

    observers.install(Broken())
    with caplog.at_level(logging.ERROR, logger="pypepper_dramatiq.observers"):
        records = run(driver, *(make_job([work.task(name="ok")]) for _ in range(2)))

    assert [r.status for r in records] == [Status.COMPLETED] * 2
    complaints = [r.getMessage() for r in caplog.records]
    assert len(complaints) == 2  # one per method, not one per call
    assert all("observer" in c and "ignored" in c for c in complaints)


def test_installing_twice_on_one_registry_reuses_the_observer_and_its_metrics() -> None:
    registry = CollectorRegistry()
    first = install_metrics(registry)
    assert install_metrics(registry) is first
    assert observers.installed() == (first,)
    uninstall_metrics(first)
    again = install_metrics(registry)  # a new observer, the same metrics (no clash)
    assert again is not first and again.collectors() is first.collectors()
    uninstall_metrics(again)
    assert not observers.observing()


def test_setup_with_metrics_installs_them_without_importing_prometheus_client() -> None:
    # prometheus_client picks its value class (in memory, or files for a multi-process
    # exposition) when first imported: Dramatiq's middleware sets the variable at
    # process boot, after setup() ran in the module the worker imports.
    code = (
        "import sys\n"
        "import pypepper_dramatiq\n"
        "from pypepper_dramatiq import observers\n"
        "from pypepper_dramatiq.metrics import PrometheusMetrics\n"
        "pypepper_dramatiq.setup(metrics=True)\n"
        "assert isinstance(observers.installed()[0], PrometheusMetrics)\n"
        "assert 'prometheus_client' not in sys.modules, 'imported too early'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_lazy_metrics_are_created_when_the_worker_has_booted(stub_broker: StubBroker) -> None:
    registry = CollectorRegistry()
    metrics = install_metrics(registry, lazy=True)
    assert registry.get_sample_value("pypepper_steps_in_progress", {"channel": CHANNEL}) is None
    assert list(registry.collect()) == []

    worker = dramatiq.Worker(stub_broker, worker_timeout=50)
    worker.start()  # our middleware's after_worker_boot
    try:
        names = {family.name for family in registry.collect()}
        assert {"pypepper_jobs_ended", "pypepper_task_duration_seconds"} <= names
    finally:
        worker.stop()
        uninstall_metrics(metrics)


def test_metrics_made_before_a_multiprocess_boot_are_named_at_worker_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    install_metrics(CollectorRegistry())  # at once: before the variable below is set
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.metrics"):
        observers.worker_started()
    assert "created before this worker process booted" in caplog.text


def test_without_prometheus_client_install_metrics_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "prometheus_client" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"pypepper-dramatiq\[metrics\]"):
        install_metrics(CollectorRegistry())
    assert not observers.observing()


def test_an_observer_not_installed_hears_nothing(driver: Driver) -> None:
    made: list[str] = []

    class Spy(PrometheusMetrics):
        def collectors(self) -> Any:
            made.append("made")
            return super().collectors()

    Spy(CollectorRegistry(), lazy=True)  # built, never installed
    [record] = run(driver, make_job([work.task(name="ok")]))
    assert record.status is Status.COMPLETED
    assert made == [] and not observers.observing()
