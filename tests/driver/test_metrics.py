"""Prometheus metrics: what each driver counts, read from a ``CollectorRegistry``.

Both drivers run on the stub broker and the memory store (the in-process
``Worker`` and a ``dramatiq.Worker``); the recovery sweep and the recurring
firings are driven by hand. ``tests/integration/test_metrics_processes.py`` reads the
same metrics from real worker processes through Dramatiq's exposition server.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from process_state import clean_process_state
from prometheus_client import CollectorRegistry

import pypepper_dramatiq
from pypepper_dramatiq import (
    ConfigError,
    Context,
    Job,
    JobRecord,
    Status,
    Task,
    WorkflowMiddleware,
    get_job_store,
    manager,
    pause_channel,
    recurring,
    resume_channel,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import get_transport
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.metrics.prometheus import (
    PrometheusMetrics,
    install_metrics,
    uninstall_metrics,
)
from pypepper_dramatiq.ops import observers
from pypepper_dramatiq.records.pauses import PAUSED_UNTIL
from pypepper_dramatiq.schedules.firing import fire_due
from pypepper_dramatiq.transport.base import channel_slot_key

from .drivers import CHANNEL, DramatiqDriver, InProcessDriver, make_job, run

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


def sweeper_of(broker: StubBroker, owner: str, batch: int | None = None) -> RecoverySweeper:
    """The recovery sweep these tests run by hand, as ``owner`` (its lease 3 s)."""
    if batch is None:
        return RecoverySweeper(broker, owner, lease_seconds=3, interval=0.5)
    return RecoverySweeper(broker, owner, lease_seconds=3, interval=0.5, batch=batch)


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
    # Marked counted with the end: a sweep leader's look at recent ends skips it.
    assert record.state["counted"] is True


def test_an_in_process_deadline_cancel_that_finds_the_job_cancelled_counts_nothing_more(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    """Cancelled by id (counted there) before the in-process worker took it past its
    start deadline: the worker's deadline cancel finds the row Cancelled already and
    counts neither an end nor a missed deadline."""
    late = make_job([work.task(name="late")])
    late.scheduled(max_start_delay=0)
    assert Job.cancel_saved(late.id) is True
    assert ended(registry, "Cancelled") == 1
    driver = InProcessDriver()
    driver.start()
    [record] = driver.wait(late)

    assert record.status is Status.CANCELLED and record.error is None
    assert ended(registry, "Cancelled") == 1
    assert value(registry, "pypepper_start_deadlines_missed_total", channel=CHANNEL) == 0


def test_a_delayed_job_cancelled_without_metrics_is_counted_once_by_the_worker(
    driver: Driver, registry: CollectorRegistry
) -> None:
    """The canceller (a CLI, a script) tells no observer; the worker that meets the
    job (its planned start come, the row Cancelled) counts its end, once."""
    job = make_job([work.task(name="never")])
    job.scheduled(delay=0.5)
    [metrics] = observers.installed()
    observers.remove(metrics)  # the canceller's process: no observer
    try:
        assert Job.cancel_saved(job.id, by="cli") is True
    finally:
        observers.install(metrics)
    assert ended(registry, "Cancelled") == 0
    driver.start()
    [record] = driver.wait(job)

    assert record.status is Status.CANCELLED and record.state["counted"] is True
    assert ended(registry, "Cancelled") == 1
    assert CALLS.get((job.id, "never")) is None


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
    sweeper = sweeper_of(stub_broker, "me")

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
    with caplog.at_level(logging.ERROR, logger="pypepper_dramatiq.ops.observers"):
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
        "from pypepper_dramatiq.ops import observers\n"
        "from pypepper_dramatiq.metrics.prometheus import PrometheusMetrics\n"
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
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.metrics.prometheus"):
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


# -- cancels, scheduled jobs, held jobs, series from the start -------------------------------


def test_a_cancel_from_a_process_without_metrics_is_counted_once_by_the_worker_it_interrupts(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    """The canceller (a CLI, a dashboard without metrics) tells no observer: the
    worker whose attempt loses to the cancel keeps that attempt in the row's
    history, counts it as cancelled and counts the job's end, once."""
    running, release = threading.Event(), threading.Event()

    @workflow_task(name="metrics.held-open")
    def held_open(task: Task, context: Context) -> str:
        running.set()
        assert release.wait(30)
        return "finished anyway"  # it returns normally: the row was cancelled meanwhile

    job = make_job([held_open.task(name="slow")])
    job.scheduled()
    worker = dramatiq.Worker(stub_broker, worker_timeout=50)
    worker.start()
    try:
        assert running.wait(30)
        [metrics] = observers.installed()
        observers.remove(metrics)  # the canceller's process: no observer
        try:
            assert Job.cancel_saved(job.id, by="cli") is True
        finally:
            observers.install(metrics)
        release.set()
        stub_broker.join(CHANNEL, timeout=30_000)
        worker.join()
    finally:
        worker.stop()

    record = get_job_store().get(job.id)
    assert record is not None and record.status is Status.CANCELLED
    [attempt] = record.state["history"]["0.0"]
    assert attempt["outcome"] == "cancelled" and attempt["worker"]
    assert attempt["started"] <= attempt["ended"]
    assert record.state["attempts"] == {"0.0": 1}
    assert record.state["cancelled_by"]["by"] == "cli"
    assert record.state["counted"] is True
    assert ended(registry, "Cancelled") == 1
    task_count = "pypepper_task_duration_seconds_count"
    assert value(registry, task_count, task="slow", outcome="cancelled") == 1
    assert value(registry, task_count, task="slow", outcome="succeeded") == 0


def test_a_job_cancelled_while_scheduled_is_counted_by_the_worker_that_meets_its_message(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    job = make_job([work.task(name="never")])
    job.scheduled()
    [metrics] = observers.installed()
    observers.remove(metrics)
    try:
        assert Job.cancel_saved(job.id, by="cli") is True
    finally:
        observers.install(metrics)
    assert ended(registry, "Cancelled") == 0
    worker = dramatiq.Worker(stub_broker, worker_timeout=50)
    worker.start()
    try:
        stub_broker.join(CHANNEL, timeout=30_000)
        worker.join()
    finally:
        worker.stop()
    assert ended(registry, "Cancelled") == 1
    record = get_job_store().get(job.id)
    assert record is not None and record.state["counted"] is True
    # A second worker meeting the row again (a duplicate message) counts nothing more.
    from pypepper_dramatiq.engine.step_io import StepIO

    assert StepIO(get_job_store, "another", 3).count_end(record.evolve()) is False
    assert ended(registry, "Cancelled") == 1


def test_a_cancel_in_a_process_with_metrics_counts_there_and_marks_the_row(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    job = make_job([work.task(name="never")])
    job.scheduled()
    assert Job.cancel_saved(job.id) is True
    assert ended(registry, "Cancelled") == 1
    record = get_job_store().get(job.id)
    assert record is not None and record.state["counted"] is True
    worker = dramatiq.Worker(stub_broker, worker_timeout=50)
    worker.start()
    try:
        stub_broker.join(CHANNEL, timeout=30_000)
        worker.join()
    finally:
        worker.stop()
    assert ended(registry, "Cancelled") == 1  # the worker meeting its message: counted already


def held_starts(registry: CollectorRegistry, reason: str) -> float:
    return value(registry, "pypepper_starts_held_total", channel=CHANNEL, reason=reason)


def test_starts_held_by_a_rate_limit_are_counted_by_channel(
    driver: Driver, registry: CollectorRegistry
) -> None:
    # 1/s, three jobs queued at once: the second and the third are held at least
    # once each before their turn (again if refused again); none is held by a pause.
    manager.new(CHANNEL, rate_limit="1/s")
    jobs = [make_job([work.task(name="ok")]) for _ in range(3)]
    for job in jobs:
        job.scheduled()
    driver.start()
    assert [r.status for r in driver.wait(*jobs)] == [Status.COMPLETED] * 3
    assert held_starts(registry, "rate_limit") >= 2
    assert held_starts(registry, "paused") == 0


def test_starts_held_by_a_pause_are_counted_once_each_by_channel(
    driver: Driver, registry: CollectorRegistry
) -> None:
    # Each job of a paused channel is held once when a worker picks it up (in the
    # store on Dramatiq, in the worker's hands in process), then runs once resumed.
    assert pause_channel(CHANNEL) is True
    jobs = [make_job([work.task(name="ok")]) for _ in range(2)]
    for job in jobs:
        job.scheduled()
    driver.start()
    deadline = time.monotonic() + 30
    while held_starts(registry, "paused") < 2:
        assert time.monotonic() < deadline, "the jobs were not held"
        time.sleep(0.02)
    assert not [key for key in CALLS if key[0] in {job.id for job in jobs}]  # none ran
    assert resume_channel(CHANNEL) is True
    assert [r.status for r in driver.wait(*jobs)] == [Status.COMPLETED] * 2
    assert held_starts(registry, "paused") == 2
    assert held_starts(registry, "rate_limit") == 0


def test_starts_held_by_a_concurrency_limit_are_counted_by_channel(
    driver: Driver, registry: CollectorRegistry
) -> None:
    # The channel's only slot is held elsewhere (a step of another worker): the job's
    # start is refused, counted, and runs once that slot is given back.
    manager.new(CHANNEL, max_running=1)
    transport = get_transport()
    for holder in transport.slots_held(channel_slot_key(CHANNEL)):  # an earlier run's
        transport.release_slots([channel_slot_key(CHANNEL)], holder)
    assert transport.acquire_slots([(channel_slot_key(CHANNEL), 1)], "elsewhere", 60.0)
    job = make_job([work.task(name="ok")])
    job.scheduled()
    driver.start()
    deadline = time.monotonic() + 30
    while held_starts(registry, "concurrency_limit") < 1:
        assert time.monotonic() < deadline, "the start was not held"
        time.sleep(0.02)
    assert not [key for key in CALLS if key[0] == job.id]  # not run while held
    transport.release_slots([channel_slot_key(CHANNEL)], "elsewhere")
    assert [r.status for r in driver.wait(job)] == [Status.COMPLETED]
    assert held_starts(registry, "rate_limit") == held_starts(registry, "paused") == 0


def test_scheduled_jobs_are_counted_by_channel(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    for _ in range(3):
        make_job([work.task(name="ok")]).scheduled()
    assert value(registry, "pypepper_jobs_scheduled_total", channel=CHANNEL) == 3


def test_the_held_gauge_is_read_by_the_sweep_by_channel_and_reason(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    now = datetime.now(timezone.utc)
    later = JobRecord(
        id="held-for-time",
        channel_id=CHANNEL,
        status=Status.SCHEDULED,
        release_at=now + timedelta(hours=1),
        not_before=now + timedelta(hours=1),
    )
    child = JobRecord(
        id="held-for-jobs",
        channel_id=CHANNEL,
        status=Status.SCHEDULED,
        waiting_since=now,
        waits={"parents": ["someone"], "held": True},
    )
    parent = JobRecord(id="someone", channel_id=CHANNEL, status=Status.IN_PROGRESS)
    paused = JobRecord(
        id="held-for-pause", channel_id=CHANNEL, status=Status.SCHEDULED, release_at=PAUSED_UNTIL
    )
    assert get_job_store().put(parent)  # running: not held
    assert get_job_store().put(later) and get_job_store().put(child)
    assert get_job_store().put(paused)
    sweeper = sweeper_of(stub_broker, "me")

    sweeper.report_depths(now)
    held = "pypepper_jobs_held"
    assert registry.get_sample_value(held, {"channel": CHANNEL, "reason": "time"}) == 1
    assert registry.get_sample_value(held, {"channel": CHANNEL, "reason": "jobs"}) == 1
    assert registry.get_sample_value(held, {"channel": CHANNEL, "reason": "paused"}) == 1

    stored = get_job_store().get("held-for-time")
    assert stored is not None and get_job_store().put(stored.evolve(status=Status.CANCELLED))
    sweeper.report_depths(now)
    assert registry.get_sample_value(held, {"channel": CHANNEL, "reason": "time"}) == 0
    assert registry.get_sample_value(held, {"channel": CHANNEL, "reason": "jobs"}) == 1


def test_a_workers_channels_have_their_series_from_the_start(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    worker = dramatiq.Worker(stub_broker, worker_timeout=50)
    worker.start()  # our middleware's after_worker_boot: worker_started
    worker.stop()
    labels = {"channel": CHANNEL, "category": ""}
    for status in ("Completed", "Failed", "Cancelled"):
        got = registry.get_sample_value("pypepper_jobs_ended_total", {"status": status, **labels})
        assert got == 0, status
    for name in ("pypepper_jobs_scheduled_total", "pypepper_start_deadlines_missed_total"):
        assert registry.get_sample_value(name, {"channel": CHANNEL}) == 0, name
    for kind in ("lease_lapsed", "message_lost"):
        labels = {"channel": CHANNEL, "kind": kind}
        assert registry.get_sample_value("pypepper_recoveries_total", labels) == 0
    for reason in ("jobs", "time", "paused"):
        labels = {"channel": CHANNEL, "reason": reason}
        assert registry.get_sample_value("pypepper_jobs_held", labels) == 0
    for reason in ("rate_limit", "paused", "concurrency_limit"):
        labels = {"channel": CHANNEL, "reason": reason}
        assert registry.get_sample_value("pypepper_starts_held_total", labels) == 0


# -- ends counted once: two cancellers, the sweep leader ----------------------------------------


class _Process:
    """What one process with metrics of its own is to the observers: its metrics
    installed while it acts, alone (the test's ``registry`` fixture is not used)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def __enter__(self) -> CollectorRegistry:
        for observer in observers.installed():
            observers.remove(observer)
        self._metrics = install_metrics(self.registry)
        return self.registry

    def __exit__(self, *exc: object) -> None:
        uninstall_metrics(self._metrics)


def test_two_cancellers_with_metrics_count_the_end_once(stub_broker: StubBroker) -> None:
    """One canceller's write ends the job; the other finds it Cancelled already and
    counts nothing, whichever of ``cancel_saved`` and ``Job.cancel`` comes first."""
    first, second = _Process(), _Process()
    by_id_first = make_job([work.task(name="never")])
    by_id_first.scheduled()
    with first as registry_a:
        assert Job.cancel_saved(by_id_first.id) is True
    with second as registry_b:
        assert by_id_first.cancel() is True  # its stale Job: the row was Cancelled already
    assert ended(registry_a, "Cancelled") + ended(registry_b, "Cancelled") == 1
    assert ended(registry_a, "Cancelled") == 1

    object_first = make_job([work.task(name="never")])
    object_first.scheduled()
    with first:
        assert object_first.cancel() is True
    with second, pytest.raises(pypepper_dramatiq.InvalidTransitionError):
        Job.cancel_saved(object_first.id)
    assert ended(registry_a, "Cancelled") + ended(registry_b, "Cancelled") == 2
    record = get_job_store().get(object_first.id)
    assert record is not None and record.state["counted"] is True


def _held_cancel(job_id: str, updated: datetime) -> JobRecord:
    """The row of a job held in the store (no message in flight) as a canceller
    without metrics leaves it: Cancelled, not marked counted."""
    return JobRecord(
        id=job_id,
        channel_id=CHANNEL,
        category="contract",
        status=Status.CANCELLED,
        created=updated - timedelta(hours=2),
        updated=updated,
        state={"cancelled_by": {"by": "cli", "host": "elsewhere", "at": updated.isoformat()}},
    )


def test_the_sweep_leader_counts_an_end_nobody_counted_once(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    now = datetime.now(timezone.utc)
    store = get_job_store()
    assert store.put(_held_cancel("uncounted", now - timedelta(seconds=5)))
    counted = _held_cancel("counted", now - timedelta(seconds=4))
    assert store.put(counted.evolve(state={**counted.state, "counted": True}))
    sweeper = sweeper_of(stub_broker, "me")

    sweeper.sweep(full=True)
    assert ended(registry, "Cancelled") == 1
    record = store.get("uncounted")
    assert record is not None and record.state["counted"] is True
    sweeper.sweep(full=True)  # read again within the lag: marked, skipped
    assert ended(registry, "Cancelled") == 1
    # A new leader looks back, finds both marked.
    assert sweeper_of(stub_broker, "next").count_ends(now) == 0
    assert ended(registry, "Cancelled") == 1


def test_the_sweep_reads_ends_behind_its_watermark_within_the_lag_and_not_before_the_lookback(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    from pypepper_dramatiq.drivers.dramatiq import recovery

    now = datetime.now(timezone.utc)
    store = get_job_store()
    sweeper = sweeper_of(stub_broker, "me")
    assert store.put(_held_cancel("recent", now - timedelta(seconds=1)))
    assert sweeper.count_ends(now) == 1
    # Written by a host whose clock is behind: older than the last row read, within the lag.
    assert store.put(_held_cancel("late", now - timedelta(seconds=recovery.COUNT_LAG_SECONDS / 2)))
    assert sweeper.count_ends(now + timedelta(seconds=1)) == 1
    # Older than a new leader's look-back: left uncounted.
    lookback = timedelta(seconds=recovery.COUNT_LOOKBACK_SECONDS)
    assert store.put(_held_cancel("ancient", now - lookback - timedelta(minutes=1)))
    assert sweeper_of(stub_broker, "new").count_ends(now) == 0
    assert ended(registry, "Cancelled") == 2


def test_the_sweep_counts_in_batches_and_goes_on_from_its_watermark(
    stub_broker: StubBroker, registry: CollectorRegistry
) -> None:
    now = datetime.now(timezone.utc)
    store = get_job_store()
    for i in range(7):
        assert store.put(_held_cancel(f"cancelled-{i}", now - timedelta(minutes=30, seconds=-i)))
    sweeper = sweeper_of(stub_broker, "me", batch=2)
    sweeper.count_ends(now)  # up to END_BATCHES batches of 2
    assert ended(registry, "Cancelled") == 7
    assert store.put(_held_cancel("one-more", now))
    assert sweeper.count_ends(now) == 1
    assert ended(registry, "Cancelled") == 8


def test_a_sweep_without_observers_counts_nothing_and_marks_nothing(
    stub_broker: StubBroker,
) -> None:
    now = datetime.now(timezone.utc)
    assert get_job_store().put(_held_cancel("uncounted", now))
    sweeper = sweeper_of(stub_broker, "me")
    assert sweeper.count_ends(now) == 0
    record = get_job_store().get("uncounted")
    assert record is not None and "counted" not in record.state


def test_jobs_failed_by_a_worker_with_metrics_are_not_counted_again_by_the_sweep(
    driver: Driver, registry: CollectorRegistry, stub_broker: StubBroker
) -> None:
    failed = [make_job([work.task(name="broken", always_fail=True)]) for _ in range(2)]

    records = run(driver, *failed)

    assert [r.status for r in records] == [Status.FAILED] * 2
    assert all(r.state.get("counted") is True for r in records)
    assert ended(registry, "Failed") == 2
    sweeper = sweeper_of(stub_broker, "leader")
    assert sweeper.count_ends(datetime.now(timezone.utc)) == 0
    assert ended(registry, "Failed") == 2


def test_a_child_failed_by_a_sweep_without_metrics_is_counted_once_by_a_leader_with_them(
    stub_broker: StubBroker,
) -> None:
    """A child waiting for a parent that failed is failed by whoever settles it: a
    worker without metrics leaves its end to a sweep leader that has them."""
    parent = make_job([work.task(name="parent")])
    parent.scheduled()
    stored_parent = get_job_store().get(parent.id)
    assert stored_parent is not None
    # Failed, and counted, by the worker that ran it.
    failed_parent = stored_parent.evolve(
        status=Status.FAILED, error="it failed", state={**stored_parent.state, "counted": True}
    )
    assert get_job_store().put(failed_parent)
    child = make_job([work.task(name="child")])
    child.scheduled(after=[parent.id])
    # This process has no metrics: its sweep settles the child without counting it.
    sweeper_of(stub_broker, "plain").sweep(full=True)
    row = get_job_store().get(child.id)
    assert row is not None and row.status is Status.FAILED and "counted" not in row.state

    with _Process() as registry:
        sweeper = sweeper_of(stub_broker, "leader")
        assert sweeper.count_ends(datetime.now(timezone.utc)) == 1
        assert sweeper.count_ends(datetime.now(timezone.utc)) == 0
    assert ended(registry, "Failed") == 1
    row = get_job_store().get(child.id)
    assert row is not None and row.state["counted"] is True
