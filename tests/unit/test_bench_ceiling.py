"""The pure arithmetic of the benchmark's scale-out ceiling (scenario 18): what it reads
from the servers' counters, and how it turns a run's differences into per-job costs and
the projected jobs/s per server core."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

# The benchmark is a folder of the repository, not of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.ceiling import (
    Usage,
    job_figures,
    jobs_per_core,
    lsn_bytes,
    redis_cpu_seconds,
)


def usage(**values: float) -> Usage:
    fields = dict.fromkeys(Usage.__dataclass_fields__, 0)
    fields.update(values)
    return Usage(**fields)  # type: ignore[arg-type]


def test_redis_cpu_is_the_main_process_s_system_and_user_time() -> None:
    info = {
        "used_cpu_sys": 1.25,
        "used_cpu_user": 2.5,
        "used_cpu_sys_children": 9.0,
        "used_cpu_user_children": 9.0,
        "used_cpu_sys_main_thread": 1.0,
    }
    assert redis_cpu_seconds(info) == pytest.approx(3.75)


def test_a_pg_lsn_is_its_high_word_shifted_past_its_low_word() -> None:
    assert lsn_bytes("0/0") == 0
    assert lsn_bytes("0/1A") == 26
    assert lsn_bytes("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert lsn_bytes("1/0") - lsn_bytes("0/FFFFFFFF") == 1
    with pytest.raises(ValueError, match="not a pg_lsn"):
        lsn_bytes("1234")


def test_a_core_carries_the_inverse_of_the_cpu_a_job_costs() -> None:
    assert jobs_per_core(0.0005) == pytest.approx(2000)
    assert jobs_per_core(0.0) is None
    assert jobs_per_core(None) is None


def test_a_run_s_figures_add_both_phases_and_project_from_the_sum() -> None:
    # 1,000 jobs enqueued: 0.2 s of PostgreSQL CPU; 800 jobs done in a 2 s window: 0.32 s.
    enqueue = usage(pg_cpu=0.2, pg_calls=1000, wal=2_000_000, redis_cpu=0.05)
    window = usage(
        at=2.0,
        done=800,
        pg_cpu=0.32,
        pg_calls=640,
        pg_exec_ms=160.0,
        pg_plan_ms=40.0,
        wal=4_000_000,
        redis_cpu=0.08,
        worker_cpu=1.6,
        ours_cpu=2.2,
        machine_cpu=3.0,
    )
    figures = job_figures(enqueue, 1000, window)
    assert figures["pg_cpu_us_enqueue"] == pytest.approx(200)
    assert figures["pg_cpu_us_process"] == pytest.approx(400)
    assert figures["pg_cpu_us"] == pytest.approx(600)
    assert figures["pg_calls"] == pytest.approx(1.8)
    assert figures["pg_exec_us"] == pytest.approx(200)
    assert figures["pg_plan_us"] == pytest.approx(50)
    assert figures["wal_bytes"] == pytest.approx(2000 + 5000)
    assert figures["redis_cpu_us"] == pytest.approx(50 + 100)
    assert figures["rate"] == pytest.approx(400)
    assert figures["per_pg_core"] == pytest.approx(1 / 600e-6)
    assert figures["per_redis_core"] == pytest.approx(1 / 150e-6)
    # Cores kept busy over the window; "others" is the machine's busy time that is not ours.
    assert figures["pg_cores"] == pytest.approx(0.16)
    assert figures["worker_cores"] == pytest.approx(0.8)
    assert figures["others_cores"] == pytest.approx(0.4)


def test_no_projection_for_a_competitor_that_never_reaches_postgresql() -> None:
    # Plain Dramatiq: PostgreSQL's background processes tick, but no statement is its.
    enqueue = usage(pg_cpu=0.01, redis_cpu=0.05)
    window = usage(at=1.0, done=500, pg_cpu=0.01, redis_cpu=0.02)
    figures = job_figures(enqueue, 1000, window)
    assert math.isnan(figures["per_pg_core"])
    assert figures["per_redis_core"] == pytest.approx(1 / 90e-6)
