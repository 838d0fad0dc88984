"""Scenario 18, the scale-out ceiling: what one job costs the servers, and the rate that allows.

A worker's CPU can be bought by adding machines; the servers' cannot (one
PostgreSQL primary, one broker Redis). So the rate a deployment tops out at is
about ``1 / (server CPU seconds per job)`` per server core. This module reads
those costs from the servers the run owns: the CPU seconds of PostgreSQL's
processes (its backends, its own background processes, and those already
reaped) and of the broker Redis (``INFO cpu``), ``pg_stat_statements``' calls,
execution and planning time, and the WAL written, each per job, for the enqueue phase
(no worker running) and for the processing phase's steady state (from 10 % to
90 % of the jobs done, so worker boot and the tail are left out). The job table
is analyzed between the phases, as autovacuum would have done in a deployment
that has run for a while.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from .env import Stack
    from .harness import Competitor, Worker

#: The share of the jobs done at which the steady-state window opens, and closes.
WINDOW = (0.10, 0.90)

#: Statements kept per shape in the results, by planning and execution time a job.
TOP_STATEMENTS = 6


# -- pure helpers ------------------------------------------------------------------------------


def redis_cpu_seconds(info: Mapping[str, Any]) -> float:
    """The CPU seconds a Redis server has used, from its ``INFO cpu`` section.

    Only the main process counts: ``*_children`` is a fork's (a background save),
    and the benchmark's servers never save.
    """
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def lsn_bytes(lsn: str) -> int:
    """A ``pg_lsn`` such as ``'16/B374D848'`` as a byte offset into the WAL."""
    high, _, low = lsn.partition("/")
    if not low:
        raise ValueError(f"not a pg_lsn: {lsn!r}")
    return (int(high, 16) << 32) + int(low, 16)


def jobs_per_core(cpu_seconds_per_job: float | None) -> float | None:
    """The jobs/s one core of a server can carry at this cost, ``None`` when it costs nothing
    measurable (plain Dramatiq's jobs never reach PostgreSQL)."""
    if cpu_seconds_per_job is None or cpu_seconds_per_job <= 0:
        return None
    return 1.0 / cpu_seconds_per_job


@dataclass(frozen=True)
class Usage:
    """Cumulative counters at one moment; a difference of two is what happened between."""

    at: float  #: perf_counter seconds
    done: float  #: jobs completed
    pg_cpu: float  #: CPU seconds of PostgreSQL's processes, the probe's backend excluded
    pg_clients: float  #: the part of ``pg_cpu`` of live client backends
    pg_exited: float  #: the part of processes the postmaster reaped (autovacuum workers)
    pg_calls: int  #: pg_stat_statements calls, the probe role's excluded
    pg_exec_ms: float  #: pg_stat_statements total_exec_time, the probe role's excluded
    pg_plan_ms: float  #: pg_stat_statements total_plan_time, the probe role's excluded
    wal: int  #: pg_current_wal_lsn() as bytes
    redis_cpu: float  #: the broker Redis's CPU seconds
    redis_commands: int  #: the broker Redis's commands (INFO commandstats)
    worker_cpu: float  #: CPU seconds of the worker processes
    ours_cpu: float  #: CPU seconds of every process of the run (servers, workers, this one)
    machine_cpu: float  #: busy CPU seconds of the whole machine, every core

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )


def per_job(delta: Usage, jobs: float) -> dict[str, float]:
    """What ``delta`` cost per job (CPU in microseconds, WAL in bytes)."""
    return {
        "pg_cpu_us": delta.pg_cpu / jobs * 1e6,
        "pg_clients_us": delta.pg_clients / jobs * 1e6,
        "pg_exited_us": delta.pg_exited / jobs * 1e6,
        "pg_exec_us": delta.pg_exec_ms / jobs * 1e3,
        "pg_plan_us": delta.pg_plan_ms / jobs * 1e3,
        "pg_calls": delta.pg_calls / jobs,
        "wal_bytes": delta.wal / jobs,
        "redis_cpu_us": delta.redis_cpu / jobs * 1e6,
        "redis_commands": delta.redis_commands / jobs,
        "worker_cpu_us": delta.worker_cpu / jobs * 1e6,
    }


def cores_busy(delta: Usage) -> dict[str, float]:
    """How many cores each party kept busy over ``delta``; "others" is the rest of the
    machine's busy time (other engineers' work on a shared machine)."""
    seconds = delta.at
    servers_and_workers = delta.pg_cpu + delta.redis_cpu + delta.worker_cpu
    return {
        "pg_cores": delta.pg_cpu / seconds,
        "redis_cores": delta.redis_cpu / seconds,
        "worker_cores": delta.worker_cpu / seconds,
        "harness_cores": (delta.ours_cpu - servers_and_workers) / seconds,
        "others_cores": max(0.0, delta.machine_cpu - delta.ours_cpu) / seconds,
        "machine_cores": delta.machine_cpu / seconds,
    }


def job_figures(enqueue: Usage, jobs: int, window: Usage) -> dict[str, float]:
    """Per-job costs of both phases, their sum, the projection, and the window's rate."""
    sending, running = per_job(enqueue, jobs), per_job(window, window.done)
    out: dict[str, float] = {}
    for key, value in sending.items():
        out[f"{key}_enqueue"] = value
        out[f"{key}_process"] = running[key]
        out[key] = value + running[key]
    out["rate"] = window.done / window.at
    out.update(cores_busy(window))
    made_statements = out["pg_calls"] > 0
    pg = jobs_per_core(out["pg_cpu_us"] / 1e6) if made_statements else None
    redis = jobs_per_core(out["redis_cpu_us"] / 1e6)
    out["per_pg_core"] = pg if pg is not None else float("nan")
    out["per_redis_core"] = redis if redis is not None else float("nan")
    return out


# -- reading the servers -----------------------------------------------------------------------


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


class Meter:
    """Reads :class:`Usage` from one run's servers, workers and machine."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        data = Path(stack.scalar("SHOW data_directory"))
        pid = int((data / "postmaster.pid").read_text().split()[0])
        self.postmaster = psutil.Process(pid)
        self.probe_backend = int(stack.scalar("SELECT pg_backend_pid()"))
        self.this = psutil.Process()

    def clients(self) -> set[int]:
        """The process ids of PostgreSQL's client backends."""
        return {
            int(pid)
            for (pid,) in self.stack.sql(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
            )
        }

    def children(self) -> set[int]:
        """The process ids of the postmaster's children, the unreaped included."""
        return {child.pid for child in self.postmaster.children()}

    def pg_cpu(self) -> tuple[float, float, float]:
        """PostgreSQL's CPU seconds: in all, of its live client backends, of its reaped
        processes. All is the postmaster's own and its reaped children's, plus every live
        child's but the probe's backend (the harness's polling)."""
        clients = self.clients()
        times = self.postmaster.cpu_times()
        exited = float(times.children_user + times.children_system)
        total, in_clients = _cpu(self.postmaster) + exited, 0.0
        for child in self.postmaster.children():
            if child.pid == self.probe_backend:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                used = _cpu(child)
                total += used
                if child.pid in clients:
                    in_clients += used
        return total, in_clients, exited

    def statements(self) -> tuple[int, float, float]:
        """Calls, execution and planning milliseconds of every statement but the probe's."""
        from .env import PROBE_ROLE

        calls, exec_ms, plan_ms = self.stack.sql(
            "SELECT coalesce(sum(s.calls), 0), coalesce(sum(s.total_exec_time), 0), "
            "coalesce(sum(s.total_plan_time), 0) "
            "FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
            "WHERE r.rolname <> %s",
            PROBE_ROLE,
        )[0]
        return int(calls), float(exec_ms), float(plan_ms)

    def top_statements(self) -> dict[str, tuple[int, float]]:
        """Calls and milliseconds (planning and execution) per statement text, the
        probe's left out."""
        from .env import PROBE_ROLE

        rows = self.stack.sql(
            "SELECT s.query, sum(s.calls), sum(s.total_exec_time + s.total_plan_time) "
            "FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
            "WHERE r.rolname <> %s GROUP BY s.query",
            PROBE_ROLE,
        )
        return {query: (int(calls), float(ms)) for query, calls, ms in rows}

    def read(self, done: float, worker: Worker | None) -> Usage:
        calls, exec_ms, plan_ms = self.statements()
        wal = lsn_bytes(str(self.stack.scalar("SELECT pg_current_wal_lsn()::text")))
        pg_cpu, pg_clients, pg_exited = self.pg_cpu()
        redis_cpu = redis_cpu_seconds(self.stack.broker.info("cpu"))
        probe_cpu = redis_cpu_seconds(self.stack.probe.info("cpu"))
        commands = sum(int(v["calls"]) for v in self.stack.broker.info("commandstats").values())
        worker_cpu = 0.0
        if worker is not None:
            for proc in worker.procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    parent = psutil.Process(proc.pid)
                    worker_cpu += _cpu(parent) + sum(
                        _cpu(child) for child in parent.children(recursive=True)
                    )
        machine = psutil.cpu_times()
        # Linux's busy time (guest time is already inside user; steal is not ours to use).
        busy = machine.user + machine.nice + machine.system
        busy += getattr(machine, "irq", 0.0) + getattr(machine, "softirq", 0.0)
        ours = pg_cpu + redis_cpu + probe_cpu + worker_cpu + _cpu(self.this)
        return Usage(
            at=time.perf_counter(),
            done=done,
            pg_cpu=pg_cpu,
            pg_clients=pg_clients,
            pg_exited=pg_exited,
            pg_calls=calls,
            pg_exec_ms=exec_ms,
            pg_plan_ms=plan_ms,
            wal=wal,
            redis_cpu=redis_cpu,
            redis_commands=commands,
            worker_cpu=worker_cpu,
            ours_cpu=ours,
            machine_cpu=busy,
        )

    def read_at(self, count: Callable[[], int], worker: Worker) -> Usage:
        """A reading while jobs complete: its done count is the mean of one read before
        and one after (the reading itself takes a few milliseconds)."""
        before = count()
        usage = self.read(0, worker)
        after = count()
        return Usage(**{**usage.__dict__, "done": (before + after) / 2})


# -- the scenario ------------------------------------------------------------------------------


def _top(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]], jobs: float
) -> list[dict[str, Any]]:
    """The statements that took the most execution time between two readings, per job."""
    rows = []
    for query, (calls, ms) in after.items():
        was_calls, was_ms = before.get(query, (0, 0.0))
        if calls > was_calls:
            rows.append(
                {
                    "query": " ".join(query.split())[:110],
                    "calls": (calls - was_calls) / jobs,
                    "plan_exec_us": (ms - was_ms) / jobs * 1e3,
                }
            )
    rows.sort(key=lambda r: -r["plan_exec_us"])
    return rows[:TOP_STATEMENTS]


def measure(
    stack: Stack, meter: Meter, competitor: Competitor, jobs: int, processes: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Pre-fill ``jobs`` jobs (the enqueue phase), then drain them with a ``processes`` x 8
    worker and read the steady-state window; the figures and the top statements."""
    from .harness import wait_until

    competitor.warm()
    stack.reset()
    start = meter.read(0, None)
    for _ in range(jobs):
        competitor.send()
    queued = meter.read(0, None)
    if stack.table_exists("scheduler_jobs"):
        # Statistics as a long-running deployment's autovacuum keeps them: after the
        # TRUNCATE of every run they say the table is empty, and the batched claim's
        # plan then scans every Scheduled row (bench/README.md, "Scale-out ceiling").
        # The probe's backend runs it: not counted.
        stack.execute("ANALYZE scheduler_jobs")
    low, high = (int(jobs * share) for share in WINDOW)
    ours = meter.clients()
    worker = competitor.worker(processes)
    theirs: set[int] = set()
    try:
        wait_until(lambda: competitor.done() >= low, 300, "the window's start", worker)
        opened, statements = meter.read_at(competitor.done, worker), meter.top_statements()
        wait_until(lambda: competitor.done() >= high, 600, "the window's end", worker)
        closed, statements_after = meter.read_at(competitor.done, worker), meter.top_statements()
        theirs = meter.clients() - ours
        wait_until(lambda: competitor.done() >= jobs, 600, "every job", worker)
        span = competitor.last_done() - competitor.first_start()
    finally:
        worker.stop()
        # A backend of the killed worker that exits during the next run's reading moves
        # its CPU from the live to the reaped count between two reads: wait them out.
        wait_until(lambda: not theirs & meter.children(), 30, "the worker's backends to exit")
    window = closed - opened
    figures = job_figures(queued - start, jobs, window)
    figures["span_rate"] = jobs / span
    figures["window_jobs"] = window.done
    return figures, _top(statements, statements_after, window.done)


def ceiling(
    stack: Stack, competitors: list[Competitor], jobs: int, shapes: tuple[int, ...], reps: int
) -> dict[str, Any]:
    """Durable one-task jobs and plain Dramatiq's no-op on the same servers: ``jobs`` jobs
    of each drained by each count of worker processes (8 threads each) in ``shapes``,
    ``reps`` times (the order of the competitors rotates each repetition): the servers' cost
    per job, the projected jobs/s per server core, and the measured rates (medians)."""
    meter = Meter(stack)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    tops: dict[str, list[dict[str, Any]]] = {}
    for rep in range(reps):
        for processes in shapes:
            shape = f"{processes}x8"
            turn = rep % len(competitors)
            for competitor in competitors[turn:] + competitors[:turn]:
                figures, top = measure(stack, meter, competitor, jobs, processes)
                runs.setdefault(shape, {}).setdefault(competitor.name, []).append(figures)
                if competitor.name == "durable" and shape not in tops:
                    tops[shape] = top
                print(
                    f"  ceiling {shape} {competitor.name} rep {rep + 1}: "
                    f"{figures['rate']:.0f} jobs/s; per job PG {figures['pg_cpu_us']:.0f} us CPU, "
                    f"{figures['wal_bytes']:.0f} B WAL, "
                    f"Redis {figures['redis_cpu_us']:.0f} us CPU; "
                    f"cores PG {figures['pg_cores']:.2f} Redis {figures['redis_cores']:.2f} "
                    f"workers {figures['worker_cores']:.2f} others {figures['others_cores']:.2f} "
                    f"of {figures['machine_cores']:.2f} busy",
                    flush=True,
                )
    out: dict[str, Any] = {
        "jobs": jobs,
        "reps": reps,
        "nproc": os.cpu_count(),
        "shapes": {
            shape: {
                name: {
                    key: statistics.median(r[key] for r in results)
                    if all(r[key] == r[key] for r in results)
                    else float("nan")
                    for key in results[0]
                }
                for name, results in by_name.items()
            }
            for shape, by_name in runs.items()
        },
        "top_statements": tops,
    }
    _print_summary(out)
    return out


def _print_summary(out: dict[str, Any]) -> None:
    for shape, by_name in out["shapes"].items():
        durable, plain = by_name.get("durable"), by_name.get("plain")
        if not durable:
            continue
        line = (
            f"  ceiling {shape}: durable {durable['rate']:.0f} jobs/s measured; projected "
            f"{durable['per_pg_core']:.0f} jobs/s per PostgreSQL core, "
            f"{durable['per_redis_core']:.0f} per Redis core"
        )
        if plain:
            line += (
                f"; plain Dramatiq {plain['rate']:.0f} jobs/s, "
                f"{plain['per_redis_core']:.0f} per Redis core; durable / plain Redis CPU "
                f"per job {durable['redis_cpu_us'] / plain['redis_cpu_us']:.2f}x"
            )
        print(line, flush=True)
