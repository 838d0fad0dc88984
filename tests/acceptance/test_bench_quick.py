"""The benchmark's quick mode runs end to end, so that it cannot rot.

It checks that every scenario ran and reported figures, never how fast.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = (
    "throughput",
    "workflow_length",
    "latency",
    "backlog",
    "retry_storm",
    "delayed",
    "fanin",
    "recurring",
    "wait",
    "purge",
    "progress",
    "transactional",
    "dashboard",
    "metrics",
    "rabbitmq",
    "typed_params",
    "tracing",
    "ceiling",
    "rate_limit",
    "priority_inversion",
    "concurrency",
    "claims_ahead",
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.rabbitmq, pytest.mark.slow]


@pytest.mark.bench
@pytest.mark.timeout(1080)
def test_every_scenario_of_the_quick_benchmark_runs(tmp_path: Path) -> None:
    output = tmp_path / "quick.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "all", "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1020,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["mode"] == "quick"
    assert set(report["results"]) == set(SCENARIOS)
    targets = report["targets"]
    assert len(targets) >= 5
    assert all(isinstance(t["value"], (int, float)) and math.isfinite(t["value"]) for t in targets)
    assert "| target |" in run.stdout  # the table was printed


@pytest.mark.timeout(120)
def test_the_benchmark_needs_no_mysql_driver() -> None:
    # `pip install -e '.[bench]'` installs no PyMySQL: the benchmark must not import it.
    code = (
        "import sys; sys.modules['pymysql'] = None\n"
        "import bench.env, bench.harness, bench.scenarios, bench.report\n"
        "print('ok')"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
