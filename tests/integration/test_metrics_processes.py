"""Metrics from real ``dramatiq`` worker processes, scraped from Dramatiq's own exposition
server: two worker processes with ``setup(..., metrics=True)`` and Dramatiq's
``Prometheus`` middleware, which sets the multi-process directory at boot and serves
every process's values from a forked HTTP server."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from services import free_port

from pypepper_dramatiq import Job, Status, Workflow, recurring, remove_recurring
from pypepper_dramatiq.drivers.dramatiq.recovery import DUTIES

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

SCHEDULE = "it-metrics-every-second"


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample the exposition server serves now, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def start_metrics_worker(cluster: Cluster, tmp_path: Path, *, processes: int) -> int:
    """A worker with Dramatiq's Prometheus middleware and ours; the port its
    exposition server answers on (waited for)."""
    port = free_port()
    prom_db = tmp_path / "prometheus"
    prom_db.mkdir()
    cluster.start_worker(
        processes=processes,
        threads=2,
        metrics=True,
        extra_env={
            "dramatiq_prom_db": str(prom_db),
            "dramatiq_prom_host": "127.0.0.1",
            "dramatiq_prom_port": str(port),
        },
    )
    wait_for(lambda: _answers(port), 30, "Dramatiq's exposition server")
    return port


def job_of(*tasks: object, category: str = "it") -> Job:
    job = Job(category=category, channel_id=CHANNEL)
    job.workflows.append(Workflow(list(tasks)))  # type: ignore[arg-type]
    return job


@pytest.mark.timeout(180)
def test_worker_processes_serve_job_metrics_on_dramatiqs_exposition_server(
    cluster: Cluster, tmp_path: Path
) -> None:
    port = start_metrics_worker(cluster, tmp_path, processes=2)

    completed = [job_of(probe.task(name="ok", value=i)) for i in range(3)]
    failed = [job_of(probe.task(name="broken", fail_times=10)) for _ in range(2)]
    retried = job_of(probe.options(retry_count=1).task(name="flaky", fail_times=1))
    late = job_of(probe.task(name="late"))
    for job in [*completed, *failed, retried]:
        job.scheduled()
    late.scheduled(max_start_delay=0)  # a worker's claim always comes after that

    cluster.wait_status([*completed, retried], timeout=60)
    cluster.wait_status(failed, timeout=60, statuses=[Status.FAILED])
    cluster.wait_status([late], timeout=60, statuses=[Status.CANCELLED])

    template = job_of(probe.task(name="tick"), category="it-recurring")
    recurring(SCHEDULE, "* * * * * *", template, overlap="allow", catch_up="none")
    try:
        wait_for(
            lambda: (
                sample(scrape(port), "pypepper_recurring_firings_total", schedule=SCHEDULE) >= 1
            ),
            30,
            "a recurring firing counted",
        )
    finally:
        remove_recurring(SCHEDULE)

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        samples = scrape(port)
        ended = "pypepper_jobs_ended_total"
        done = (
            sample(samples, ended, status="Completed", channel=CHANNEL, category="it"),
            sample(samples, ended, status="Failed", channel=CHANNEL, category="it"),
            sample(samples, ended, status="Cancelled", channel=CHANNEL, category="it"),
        )
        return samples if done == (4, 2, 1) else None

    samples = wait_for(counted, 15, "the job ends counted by the workers")

    # The same server shows Dramatiq's own metrics: one exposition for both.
    assert any(name == "dramatiq_messages_total" for name, _ in samples)
    assert sample(samples, "pypepper_task_retries_total", task="flaky") == 1
    assert sample(samples, "pypepper_task_retries_total", task="broken") == 0
    assert sample(samples, "pypepper_start_deadlines_missed_total", channel=CHANNEL) == 1
    attempts = "pypepper_task_duration_seconds_count"
    assert sample(samples, attempts, task="ok", outcome="succeeded") == 3
    assert sample(samples, attempts, task="broken", outcome="failed") == 2
    assert sample(samples, attempts, task="flaky", outcome="failed") == 1
    assert sample(samples, attempts, task="flaky", outcome="succeeded") == 1
    runs = "pypepper_job_duration_seconds_count"
    labels = {"channel": CHANNEL, "category": "it"}
    assert sample(samples, runs, status="Completed", **labels) == 4
    assert sample(samples, runs, status="Failed", **labels) == 2
    assert sample(samples, runs, status="Cancelled", **labels) == 0  # never started
    # 6 jobs of ours started, plus the recurring firings that ran meanwhile.
    assert sample(samples, "pypepper_job_start_delay_seconds_count", channel=CHANNEL) >= 6
    # Summed over the live processes: nothing runs now.
    assert ("pypepper_steps_in_progress", frozenset({("channel", CHANNEL)})) in samples
    assert sample(samples, "pypepper_steps_in_progress", channel=CHANNEL) == 0
    # Written by the sweep leader every sweep_interval.
    assert ("pypepper_channel_depth", frozenset({("channel", CHANNEL)})) in samples
    # A series per sweep duty from the start (at 0: nothing failed), so that alerts work.
    for duty in DUTIES:
        failures = ("pypepper_sweep_failures_total", frozenset({("duty", duty.name)}))
        assert samples.get(failures) == 0, duty.name
    # Each worker process wrote its own files (values summed at scrape time).
    assert len(list((tmp_path / "prometheus").glob("counter_*.db"))) >= 1


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True
