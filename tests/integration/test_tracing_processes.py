"""One trace from the producer into a real ``dramatiq`` worker process.

The test process schedules with tracing on (the SDK's in-memory exporter); the
worker runs ``setup(tracing=True)`` and writes the spans it ends as JSON lines
(``worker_app``'s ``PYPEPPER_IT_TRACE_DIR``). Each attempt span read back has the
producer's schedule span as its parent, across the process boundary, through the
trace context stored with the job; with ``claim_fetched`` on (outcomes recorded by
the completion thread) and off (by the thread that ran the attempt).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pypepper_dramatiq import Status
from pypepper_dramatiq.metrics import tracing

from .harness import Cluster, wait_for
from .worker_app import ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def producer_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = tracing.install_tracing(provider)
    yield exporter
    tracing.uninstall_tracing(observer)
    provider.shutdown()


def worker_spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("spans-*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("claim_fetched", ["1", "0"], ids=["batched", "per-message"])
def test_a_worker_processes_attempt_spans_are_children_of_the_producers_span(
    cluster: Cluster, tmp_path: Path, producer_spans: InMemorySpanExporter, claim_fetched: str
) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    cluster.start_worker(
        extra_env={ENV["trace_dir"]: str(spans_dir), ENV["claim_fetched"]: claim_fetched}
    )

    job = cluster.schedule(probe.options(retry_count=1).task(name="flaky", fail_times=1))
    cluster.wait_status([job], timeout=60)

    [schedule] = [s for s in producer_spans.get_finished_spans() if s.name == "pypepper.schedule"]
    assert schedule.context is not None

    def two_attempts() -> list[dict[str, Any]] | None:
        found = [s for s in worker_spans(spans_dir) if s["name"] == tracing.ATTEMPT_SPAN]
        return found if len(found) >= 2 else None

    attempts = wait_for(two_attempts, 30, "the worker's two attempt spans")
    assert cluster.saved(job).status is Status.COMPLETED
    assert [a["attributes"][tracing.ATTEMPT] for a in attempts] == [1, 2]
    assert [a["attributes"][tracing.OUTCOME] for a in attempts] == ["failed", "succeeded"]
    assert [a["events"] for a in attempts] == [[tracing.RETRY_EVENT], []]
    for attempt in attempts:
        assert attempt["attributes"][tracing.JOB_ID] == job.id
        assert attempt["attributes"][tracing.TASK] == "flaky"
        assert attempt["trace_id"] == f"{schedule.context.trace_id:032x}"
        assert attempt["parent_id"] == f"{schedule.context.span_id:016x}", cluster.logs()
