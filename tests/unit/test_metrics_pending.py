"""The metrics' additions summed in memory and written in bulk (multi-process mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: E402

from pypepper_dramatiq.metrics.pending import PendingWrites  # noqa: E402

BUCKETS = (0.1, 1.0, 10.0)
VALUES = (0.05, 0.1, 0.5, 3.0, 3.0, 99.0)


def test_nothing_is_written_before_a_flush_and_then_what_direct_calls_write() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["k"], registry=registry)
    gauge = Gauge("g", "g", ["k"], registry=registry)
    direct = Histogram("direct", "h", ["k"], buckets=BUCKETS, registry=registry)
    bulk = Histogram("bulk", "h", ["k"], buckets=BUCKETS, registry=registry)
    pending = PendingWrites(interval=3600)  # the flusher thread never writes in this test

    for value in VALUES:
        pending.add(counter.labels("a"))
        pending.add(gauge.labels("a"), 2.0)
        pending.add(gauge.labels("a"), -1.0)
        pending.observe(bulk.labels("a"), value)
        direct.labels("a").observe(value)
    assert registry.get_sample_value("c_total", {"k": "a"}) == 0.0
    assert registry.get_sample_value("bulk_count", {"k": "a"}) == 0.0

    pending.flush()
    assert registry.get_sample_value("c_total", {"k": "a"}) == len(VALUES)
    assert registry.get_sample_value("g", {"k": "a"}) == len(VALUES)
    for suffix in ("count", "sum"):
        assert registry.get_sample_value(f"bulk_{suffix}", {"k": "a"}) == pytest.approx(
            registry.get_sample_value(f"direct_{suffix}", {"k": "a"})
        )
    for bound in ("0.1", "1.0", "10.0", "+Inf"):
        labels = {"k": "a", "le": bound}
        assert registry.get_sample_value("bulk_bucket", labels) == registry.get_sample_value(
            "direct_bucket", labels
        )
    pending.flush()  # nothing added since: nothing written again
    assert registry.get_sample_value("c_total", {"k": "a"}) == len(VALUES)
    pending.close()


#: A worker process in multi-process mode: counts a job's events, then exits
#: without flushing by hand (its exit writes them).
CHILD = """
import sys
from datetime import timedelta
from pypepper_dramatiq.metrics.prometheus import install_metrics
from pypepper_dramatiq.ops import observers
from pypepper_dramatiq.records.record import JobRecord, utcnow
from pypepper_dramatiq.rules.status import Status

install_metrics()
now = utcnow()
started = (now - timedelta(seconds=2)).isoformat()
record = JobRecord(
    id="j", channel_id="ch", category="cat", status=Status.COMPLETED, updated=now,
    created=now - timedelta(seconds=3), state={"history": {"0.0": [{"started": started}]}},
)
for _ in range(3):
    observers.job_started(record, now)
    observers.step_started("ch", "t")
    observers.step_finished("ch", "t")
    observers.task_ended(record, "t", "succeeded", now - timedelta(seconds=2), now)
    observers.job_ended(record)
"""


def test_a_worker_process_in_multiprocess_mode_writes_its_counts_at_exit(tmp_path: Path) -> None:
    files = tmp_path / "metrics"
    files.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(files))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr

    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json\n"
            "from prometheus_client import CollectorRegistry\n"
            "from prometheus_client.multiprocess import MultiProcessCollector\n"
            "registry = CollectorRegistry()\n"
            "MultiProcessCollector(registry)\n"
            "print(json.dumps({s.name + repr(sorted(s.labels.items())): s.value\n"
            "    for m in registry.collect() for s in m.samples}))\n",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    samples = json.loads(read.stdout)
    ended = [("category", "cat"), ("channel", "ch"), ("status", "Completed")]
    assert samples[f"pypepper_jobs_ended_total{ended!r}"] == 3
    assert samples[f"pypepper_job_duration_seconds_count{ended!r}"] == 3
    assert samples[f"pypepper_job_duration_seconds_sum{ended!r}"] == pytest.approx(6.0)
    task = [("outcome", "succeeded"), ("task", "t")]
    assert samples[f"pypepper_task_duration_seconds_bucket{[('le', '2.5'), *task]!r}"] == 3
    assert samples[f"pypepper_task_duration_seconds_bucket{[('le', '1.0'), *task]!r}"] == 0
    assert samples[f"pypepper_job_start_delay_seconds_count{[('channel', 'ch')]!r}"] == 3
    assert samples[f"pypepper_steps_in_progress{[('channel', 'ch')]!r}"] == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_does_not_write_what_its_parent_added() -> None:
    # Dramatiq forks its worker processes: the parent's sums are the parent's to write.
    registry = CollectorRegistry()
    counter = Counter("forked", "c", registry=registry)
    pending = PendingWrites(interval=3600)
    pending.add(counter, 5.0)
    pid = os.fork()
    if pid == 0:  # the child: its flush writes nothing, what it adds is its own
        pending.flush()
        written = registry.get_sample_value("forked_total")
        pending.add(counter, 2.0)
        pending.flush()
        os._exit(0 if (written, registry.get_sample_value("forked_total")) == (0.0, 2.0) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pending.flush()
    assert registry.get_sample_value("forked_total") == 5.0
    pending.close()
