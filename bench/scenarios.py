"""The eight scenarios. Each returns plain data (dicts of numbers) for the report.

Every run starts from empty servers (:meth:`Stack.reset`), fills the queue
with no worker running where a rate is measured, then starts real worker
processes. A processing rate is taken from the task probes and the stored
completion times (first task start to last completion), so worker boot is
not in it.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .env import Stack
from .harness import THREADS, Competitor, Durable, Plain, wait_for_count, wait_until


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; ``--quick`` shrinks all of them."""

    reps: int
    throughput_jobs: int
    shapes: tuple[int, ...]
    length_tasks: int  #: tasks per run in scenario 2, whatever the job length
    length_reps: int
    light_rate: float
    light_seconds: float
    saturation_jobs: int
    backlog: tuple[int, int]
    storm_jobs: int
    probe_batch: int
    delayed: tuple[int, int]  #: delayed jobs waiting at once: a small and a large count
    fanin: int  #: parents of the one child in scenario 7
    recurring_seconds: float  #: how long the per-second schedule of scenario 8 runs
    wait_jobs: int = 200  #: jobs waited for in each part of the wait scenario
    purge: tuple[int, int] = (100_000, 30_000)  #: scenario 9: old ended rows, jobs drained
    progress_calls: int = 100_000  #: scenario 11: bar.succeeded() calls in one task
    transactional_jobs: int = 500  #: scenario 12: jobs scheduled each way, per round
    dashboard_rows: int = 1_000_000  #: scenario 13: stored jobs behind the dashboard
    dashboard_requests: int = 100  #: scenario 13: requests timed per page
    metrics_jobs: int = 3_000  #: scenario 14: jobs drained each way, per run
    params_jobs: int = 3_000  #: scenario 16: jobs drained each way, per run
    tracing_jobs: int = 3_000  #: scenario 17: jobs drained each way, per run
    ceiling_jobs: int = 4_000  #: scenario 18: jobs drained per run
    ceiling_shapes: tuple[int, ...] = (1, 2, 3)  #: scenario 18: worker processes per run
    ceiling_reps: int = 2  #: scenario 18: runs of each competitor and shape
    rate_seconds: float = 30.0  #: scenario 19: how long the rate-limited backlog lasts
    inversion: tuple[int, int] = (10_000, 100)  #: scenario 20: low-priority jobs, then high
    concurrency_per_key: int = 20  #: scenario 21: jobs per key (of 50 keys)
    ahead_jobs: int = 3_000  #: scenario 22: jobs drained per run


QUICK = Sizes(2, 100, (1, 2), 100, 1, 100.0, 1.0, 120, (100, 500), 100, 10, (100, 500), 200, 15.0)
FULL = Sizes(
    3, 400, (1, 2), 400, 2, 100.0, 5.0, 500, (1000, 10000), 1000, 20, (100, 10000), 1000, 60.0
)
# Scenario 9 at the quick size (the full one is the field's default, the issue's figure).
QUICK = replace(
    QUICK,
    purge=(10_000, 3_000),
    progress_calls=20_000,
    transactional_jobs=100,
    dashboard_rows=50_000,
    dashboard_requests=20,
)
# Scenario 22 at the quick size.
QUICK = replace(QUICK, ahead_jobs=300)
# Scenario 14 at the quick size.
QUICK = replace(QUICK, metrics_jobs=1_000)
# Scenarios 16 and 17 at the quick size.
QUICK = replace(QUICK, params_jobs=500, tracing_jobs=500)
# Scenario 18 at the quick size: one shape, once (its figures are for seeing it run).
QUICK = replace(QUICK, ceiling_jobs=1_000, ceiling_shapes=(1,), ceiling_reps=1)
# Scenario 19 at the quick size.
QUICK = replace(QUICK, rate_seconds=6.0)
# Scenarios 20 and 21 at the quick size.
QUICK = replace(QUICK, inversion=(500, 10))
QUICK = replace(QUICK, concurrency_per_key=4)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def enqueue(competitor: Competitor, jobs: int, tasks: int = 1) -> float:
    """Send ``jobs`` jobs from this process; returns the seconds it took."""
    start = time.perf_counter()
    for _ in range(jobs):
        competitor.send(tasks=tasks)
    return time.perf_counter() - start


#: Jobs per ``schedule_many`` call in the batch enqueue measure.
BATCH = 100


def batch_enqueue(stack: Stack, durable: Durable, jobs: int) -> dict[str, float]:
    """Schedule ``jobs`` jobs with ``schedule_many`` (``BATCH`` a call), no worker running:
    the cost per job and the statements and commands per job (the jobs stay queued;
    the next run wipes them)."""
    durable.warm()
    stack.reset()
    before = stack.counters()
    start = time.perf_counter()
    for first in range(0, jobs, BATCH):
        durable.send_many(min(BATCH, jobs - first))
    seconds = time.perf_counter() - start
    sent = stack.counters() - before
    return {
        "batch_enqueue_us_per_job": seconds / jobs * 1e6,
        "pg_per_job_batch": sent.pg_statements / jobs,
        "redis_per_job_batch": sent.redis_commands / jobs,
    }


def drain_run(
    stack: Stack,
    competitor: Competitor,
    jobs: int,
    processes: int,
    tasks: int = 1,
    timeout: float = 600,
    cpu: bool = False,
) -> dict[str, float]:
    """Pre-fill ``jobs`` jobs, then start a worker and wait until every one is done.

    ``cpu``: also the worker processes' CPU (user + system) per job, from the first
    job done to the last (boot left out): what a job costs the worker, which the
    other users of a shared machine change less than they change its rate."""
    competitor.warm()
    stack.reset()
    before = stack.counters()
    sent_in = enqueue(competitor, jobs, tasks)
    queued = stack.counters()
    worker = competitor.worker(processes)
    extra: dict[str, float] = {}
    try:
        if cpu:
            wait_until(lambda: competitor.done() >= 1, timeout, f"{competitor.name} start", worker)
            cpu_from, done_from = worker.cpu_seconds(), competitor.done()
        wait_until(lambda: competitor.done() >= jobs, timeout, f"{competitor.name} jobs", worker)
        if cpu:
            used = worker.cpu_seconds() - cpu_from
            extra["cpu_us_per_job"] = used / max(1, jobs - done_from) * 1e6
        finished = stack.counters()
        span = competitor.last_done() - competitor.first_start()
    finally:
        worker.stop()
    sending, running = queued - before, finished - queued
    return {
        **extra,
        "enqueue_rate": jobs / sent_in,
        "enqueue_us_per_job": sent_in / jobs * 1e6,
        "process_rate": jobs / span,
        "pg_per_job_enqueue": sending.pg_statements / jobs,
        "pg_per_job_process": running.pg_statements / jobs,
        "redis_per_job_enqueue": sending.redis_commands / jobs,
        "redis_per_job_process": running.redis_commands / jobs,
    }


def _rotate(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


# -- 1. throughput ----------------------------------------------------------------------------


def throughput(stack: Stack, competitors: list[Competitor], sizes: Sizes) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for rep in range(sizes.reps):
        for processes in sizes.shapes:
            shape = f"{processes}x8"
            for competitor in _rotate(competitors, rep):
                result = drain_run(stack, competitor, sizes.throughput_jobs, processes)
                if isinstance(competitor, Durable):
                    result.update(batch_enqueue(stack, competitor, sizes.throughput_jobs))
                runs.setdefault(shape, {}).setdefault(competitor.name, []).append(result)
                print(
                    f"  throughput {shape} {competitor.name} rep {rep + 1}: "
                    f"enqueue {result['enqueue_rate']:.0f}/s, "
                    f"process {result['process_rate']:.0f}/s",
                    flush=True,
                )
    return {
        shape: {
            name: {key: median([r[key] for r in results]) for key in results[0]}
            for name, results in by_name.items()
        }
        for shape, by_name in runs.items()
    }


# -- 2. workflow length -----------------------------------------------------------------------


def workflow_length(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    runs: dict[int, list[dict[str, float]]] = {}
    for rep in range(sizes.length_reps):
        for tasks in _rotate([1, 10, 50], rep):
            jobs = max(2, sizes.length_tasks // tasks)
            result = drain_run(stack, durable, jobs, 1, tasks=tasks)
            total = jobs * tasks
            span = jobs / result["process_rate"]
            runs.setdefault(tasks, []).append(
                {
                    "jobs": jobs,
                    "ms_per_job": span / jobs * 1000,
                    "ms_per_task": span / total * 1000,
                    "enqueue_ms_per_job": result["enqueue_us_per_job"] / 1000,
                    "pg_per_task": (result["pg_per_job_enqueue"] + result["pg_per_job_process"])
                    / tasks,
                    "redis_per_task": (
                        result["redis_per_job_enqueue"] + result["redis_per_job_process"]
                    )
                    / tasks,
                }
            )
            print(
                f"  length {tasks} tasks x {jobs} jobs: "
                f"{runs[tasks][-1]['ms_per_task']:.1f} ms/task",
                flush=True,
            )
    return {
        str(tasks): {key: median([r[key] for r in results]) for key in results[0]}
        for tasks, results in sorted(runs.items())
    }


# -- 3. latency -------------------------------------------------------------------------------


def _paced(competitor: Competitor, count: int, rate: float | None) -> dict[str, float]:
    """Send ``count`` jobs at ``rate`` per second (None: as fast as possible)."""
    sent: dict[str, float] = {}
    start = time.perf_counter()
    for i in range(count):
        if rate:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        key = uuid.uuid4().hex
        at = time.time()
        competitor.send(key)
        sent[key] = at
    return sent


def _latencies(competitor: Competitor, sent: dict[str, float], wall: float) -> dict[str, float]:
    starts, dones = competitor.start_times(), competitor.done_times()
    to_start = [(starts[k] - at) * 1000 for k, at in sent.items() if k in starts]
    to_done = [(dones[k] - at) * 1000 for k, at in sent.items() if k in dones]
    return {
        "jobs": len(sent),
        "offered_rate": len(sent) / wall,
        "start_p50_ms": percentile(to_start, 50),
        "start_p99_ms": percentile(to_start, 99),
        "done_p50_ms": percentile(to_done, 50),
        "done_p99_ms": percentile(to_done, 99),
        "done_max_ms": max(to_done, default=float("nan")),
    }


def _clear_probe(stack: Stack, competitor: Competitor) -> None:
    stack.probe.delete(*(f"{competitor.tag}:{k}" for k in ("n", "first", "last", "start")))


def _ready(stack: Stack, competitor: Competitor, worker: Any) -> None:
    """Wait until the worker has run one job, then forget it."""
    competitor.warm()
    wait_until(lambda: competitor.done() >= 1, 120, f"{competitor.name} worker boot", worker)


def latency(stack: Stack, competitors: list[Competitor], sizes: Sizes) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    light_jobs = int(sizes.light_rate * sizes.light_seconds)
    for competitor in competitors:
        stack.reset()
        worker = competitor.worker(1)
        try:
            _ready(stack, competitor, worker)
            out: dict[str, Any] = {}
            for load, count, rate in (
                ("light", light_jobs, sizes.light_rate),
                ("saturation", sizes.saturation_jobs, None),
            ):
                _clear_probe(stack, competitor)
                base = competitor.done()
                start = time.perf_counter()
                sent = _paced(competitor, count, rate)
                wall = time.perf_counter() - start
                missing = wait_for_count(
                    competitor.done, base + count, f"{competitor.name} {load} jobs", worker
                )
                out[load] = _latencies(competitor, sent, wall)
                out[load]["never_done"] = missing
                print(
                    f"  latency {load} {competitor.name}: start p50 "
                    f"{out[load]['start_p50_ms']:.0f} ms, done p99 "
                    f"{out[load]['done_p99_ms']:.0f} ms",
                    flush=True,
                )
        finally:
            worker.stop()
        results[competitor.name] = out
    return results


# -- 4. backlog -------------------------------------------------------------------------------


def _store_costs(durable: Durable, samples: int = 200) -> dict[str, float]:
    """Median cost of Job.get_saved and of listing by status, with the backlog stored."""
    from pypepper_dramatiq import Job, get_job_store

    store = get_job_store()
    ids = [row.id for row in store.list(status="Scheduled", limit=samples)]

    def timed(fn: Any, runs: int) -> float:
        times = []
        for i in range(runs):
            start = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - start)
        return median(times) * 1000

    return {
        "get_saved_ms": timed(lambda i: Job.get_saved(ids[i % len(ids)]), samples),
        "list_status_100_ms": timed(lambda i: store.list(status="Scheduled", limit=100), 5),
        "list_status_channel_100_ms": timed(
            lambda i: store.list(status="Scheduled", channel_id="bench", limit=100), 5
        ),
    }


def backlog(stack: Stack, competitors: list[Competitor], sizes: Sizes) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    for size in sizes.backlog:
        for competitor in competitors:
            competitor.warm()
            stack.reset()
            enqueue(competitor, size)
            out: dict[str, float] = {"redis_bytes_waiting": stack.redis_memory()}
            if isinstance(competitor, Durable):
                out.update(_store_costs(competitor))
            worker = competitor.worker(1)
            worker.sample_rss()
            try:
                start = time.perf_counter()
                wait_until(
                    lambda c=competitor, n=size: c.done() >= n,
                    3600,
                    f"{competitor.name} backlog",
                    worker,
                )
                out["drain_s"] = time.perf_counter() - start
                out["drain_rate"] = size / (competitor.last_done() - competitor.first_start())
            finally:
                worker.stop()
            out["worker_peak_rss"] = worker.peak_rss
            results.setdefault(str(size), {})[competitor.name] = out
            print(
                f"  backlog {size} {competitor.name}: drained in {out['drain_s']:.1f}s, "
                f"worker RSS {out['worker_peak_rss'] / 2**20:.0f} MiB, "
                f"Redis {out['redis_bytes_waiting'] / 2**20:.1f} MiB",
                flush=True,
            )
    return results


# -- 5. retry storm ---------------------------------------------------------------------------


def _probe_batch(stack: Stack, durable: Durable, count: int, worker: Any) -> dict[str, float]:
    """Latency of ``count`` quick jobs sent now (the worker is running)."""
    _clear_probe(stack, durable)
    base = durable.done()
    sent = _paced(durable, count, None)
    missing = wait_for_count(durable.done, base + count, "probe batch", worker)
    lat = _latencies(durable, sent, 1.0)
    return {"p50_ms": lat["done_p50_ms"], "max_ms": lat["done_max_ms"], "never_done": missing}


def retry_storm(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    stack.reset()
    worker = durable.worker(1)
    try:
        _ready(stack, durable, worker)
        idle = _probe_batch(stack, durable, sizes.probe_batch, worker)
        for _ in range(sizes.storm_jobs):
            durable.app.storm_job().scheduled()
        sent_at = time.time()
        # Every job has failed once: now all of them wait out a retry delay.
        wait_until(
            lambda: int(stack.probe.get("stormtry:n") or 0) >= sizes.storm_jobs,
            300,
            "first attempts",
            worker,
        )
        during = _probe_batch(stack, durable, sizes.probe_batch, worker)
        wait_until(lambda: durable.terminal("storm") >= sizes.storm_jobs, 600, "storm jobs", worker)
        last = float(
            stack.scalar(
                "SELECT extract(epoch FROM max(updated)) FROM scheduler_jobs "
                "WHERE category = 'storm'"
            )
        )
        failed = int(
            stack.scalar(
                "SELECT count(*) FROM scheduler_jobs "
                "WHERE category = 'storm' AND status <> 'Completed'"
            )
        )
    finally:
        worker.stop()
    first = float(stack.probe.get("stormtry:first") or sent_at)
    return {
        "jobs": sizes.storm_jobs,
        "wall_s": last - first,
        "floor_s": 2.0,
        "not_completed": failed,
        "probe_idle_p50_ms": idle["p50_ms"],
        "probe_storm_p50_ms": during["p50_ms"],
        "probe_storm_max_ms": during["max_ms"],
        "probe_never_done": idle["never_done"] + during["never_done"],
    }


# -- 6. delayed jobs --------------------------------------------------------------------------

#: Seconds over which the etas of one run are spread (jobs rarely share one instant).
ETA_SPREAD = 10.0


def delayed(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """Jobs held for a delay longer than Dramatiq's delayed messages carry: what they
    cost while they wait (worker RSS, Redis memory), and how late they run."""
    from datetime import datetime, timezone

    results: dict[str, Any] = {}
    for size in sizes.delayed:
        stack.reset()
        worker = durable.worker(1)
        worker.sample_rss()
        try:
            # The first eta comes once every job is sent (about 1 ms each), plus margin.
            first_eta = time.time() + 12 + size * 0.002
            etas: dict[str, float] = {}
            for i in range(size):
                key = uuid.uuid4().hex
                etas[key] = first_eta + ETA_SPREAD * i / size
                job = durable.app.job(1, key)
                job.scheduled(eta=datetime.fromtimestamp(etas[key], timezone.utc))
            # Read while every job waits: before the sweep's release window (it sends
            # a job's message about two seconds before its eta).
            time.sleep(max(0.0, first_eta - time.time() - 3))
            redis_waiting = stack.redis_memory()
            rss_waiting = worker.peak_rss
            wait_until(lambda n=size: durable.done() >= n, 600, f"delayed {size}", worker)
            done = durable.done_times()
        finally:
            worker.stop()
        lags = [done[key] - eta for key, eta in etas.items() if key in done]
        out = {
            "redis_bytes_waiting": redis_waiting,
            "worker_rss_waiting": rss_waiting,
            "lag_p50_ms": percentile(lags, 50) * 1000,
            "lag_p99_ms": percentile(lags, 99) * 1000,
            "earliest_ms": min(lags) * 1000,
        }
        results[str(size)] = out
        print(
            f"  delayed {size}: waiting Redis {redis_waiting / 2**20:.1f} MiB, worker RSS "
            f"{rss_waiting / 2**20:.0f} MiB; done after eta p50 {out['lag_p50_ms']:.0f} ms, "
            f"p99 {out['lag_p99_ms']:.0f} ms, earliest {out['earliest_ms']:.0f} ms",
            flush=True,
        )
    return results


# -- 7. fan-in --------------------------------------------------------------------------------


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def fanin(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """One child waiting for N parents (``scheduled(after=[N ids])``): what the call
    costs, and how soon the child starts once the last parent has ended."""
    durable.warm()
    stack.reset()
    count = sizes.fanin
    started = time.perf_counter()
    parents = [durable.send() for _ in range(count)]
    parents_s = time.perf_counter() - started
    child = durable.app.job(1, "fanin-child")
    call = time.perf_counter()
    child.scheduled(after=parents)
    after_ms = (time.perf_counter() - call) * 1000
    # The sweep that ends the wait writes the row (waits cleared, `updated` = the sweep's
    # time) and leaves it Scheduled; a poll that sees it so keeps that time.
    settled: list[float] = []

    def child_ended() -> bool:
        status, waiting, updated = stack.sql(
            "SELECT status, waits IS NOT NULL, extract(epoch FROM updated) "
            "FROM scheduler_jobs WHERE id = %s",
            child.id,
        )[0]
        if status == "Scheduled" and not waiting and not settled:
            settled.append(float(updated))
        return status in ("Completed", "Failed", "Cancelled")

    worker = durable.worker(1)
    try:
        booted = time.perf_counter()
        wait_until(child_ended, 600, "the fan-in child", worker)
        wall_s = time.perf_counter() - booted
    finally:
        worker.stop()
    status, state = stack.sql("SELECT status, state FROM scheduler_jobs WHERE id = %s", child.id)[0]
    parents_end, parents_done = stack.sql(
        "SELECT extract(epoch FROM max(updated)), count(*) FILTER (WHERE status = 'Completed') "
        "FROM scheduler_jobs WHERE id = ANY(%s)",
        parents,
    )[0]
    history = (state or {}).get("history", {}).get("0.0") or [{}]
    child_start = (
        _epoch(history[0]["started"])
        if "started" in history[0]
        else durable.start_times().get("fanin-child", float("nan"))
    )
    out = {
        "parents": count,
        "parents_completed": int(parents_done),
        "child_status": status,
        "schedule_parents_us_per_job": parents_s / count * 1e6,
        "after_call_ms": after_ms,
        "last_parent_to_child_start_ms": (child_start - float(parents_end)) * 1000,
        # NaN when no poll saw the child released and not yet started.
        "last_parent_to_settled_ms": (
            (settled[0] - float(parents_end)) * 1000 if settled else float("nan")
        ),
        "wall_s": wall_s,
    }
    print(
        f"  fan-in {count}: scheduled(after={count} ids) {after_ms:.1f} ms; child {status}, "
        f"started {out['last_parent_to_child_start_ms']:.0f} ms after the last parent ended; "
        f"worker start to child done {wall_s:.1f}s",
        flush=True,
    )
    return out


# -- 8. recurring -----------------------------------------------------------------------------

#: The per-second schedule of scenario 8.
RECURRING_NAME = "bench-every-second"
#: The schedule is removed this long after the last slot measured, so that every slot
#: measured had two sweep ticks (one a second) to fire; slots in between are not counted.
RECURRING_GRACE = 2.0


def recurring(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """A per-second schedule fired by two worker processes at once: each slot fired
    once, each firing run once, and how late after its slot a firing starts."""
    from collections import Counter
    from datetime import datetime, timezone

    import pypepper_dramatiq as pd
    from pypepper_dramatiq.rules.cron import firing_id

    stack.reset()
    stack.probe.delete("tick:n", "tick:runs", "tick:start")
    prefix = firing_id(RECURRING_NAME, datetime.now(timezone.utc)).rsplit("-", 1)[0] + "-"
    worker = durable.workers_apart(2, "durable-recurring")
    try:
        # Both processes are up when both have fetched from the broker.
        wait_until(lambda: durable.brokers_seen() >= 2, 120, "two worker processes", worker)
        stored = pd.recurring(
            RECURRING_NAME, "* * * * * *", durable.app.tick_job(), overlap="allow", catch_up="all"
        )
        first_slot = stored.next_slot.timestamp()
        window = int(sizes.recurring_seconds)
        time.sleep(max(0.0, first_slot + window - 1 + RECURRING_GRACE - time.time()))
        pd.remove_recurring(RECURRING_NAME)

        def rows() -> list[tuple[Any, ...]]:
            return stack.sql(
                "SELECT id, status, extract(epoch FROM created) FROM scheduler_jobs "
                "WHERE id LIKE %s",
                prefix + "%",
            )

        wait_until(
            lambda: all(status == "Completed" for _, status, _ in rows()),
            120,
            "the firings to complete",
            worker,
        )
        time.sleep(1.0)  # a second run of any job would show by now
        fired = rows()
        runners = stack.sql(
            "SELECT DISTINCT state #>> '{history,0.0,0,worker}' FROM scheduler_jobs "
            "WHERE id LIKE %s",
            prefix + "%",
        )
        worker.check()
    finally:
        worker.stop()
        pd.remove_recurring(RECURRING_NAME)
    slot_of = {
        job_id: datetime.strptime(job_id[len(prefix) :], "%Y%m%dT%H%M%SZ")
        .replace(tzinfo=timezone.utc)
        .timestamp()
        for job_id, _, _ in fired
    }
    created = {job_id: float(at) for job_id, _, at in fired}
    per_slot = Counter(slot_of.values())
    runs = {k.decode(): int(v) for k, v in stack.probe.hgetall("tick:runs").items()}
    # Which worker processes fired: each firing logs "recurring <name> fired for ...".
    firing_pids = set(
        re.findall(
            rf"\[PID (\d+)\][^\n]*recurring {RECURRING_NAME} fired for",
            Path(worker.log.name).read_text(errors="replace"),
        )
    )
    starts = {k.decode(): float(v) for k, v in stack.probe.hgetall("tick:start").items()}
    # The window: `window` seconds from the first slot; the slots fired in the grace
    # before the removal are counted apart (not measured).
    expected = {first_slot + i for i in range(window)}
    inside = {j: slot for j, slot in slot_of.items() if slot in expected}
    lags = [(starts[j] - slot) * 1000 for j, slot in inside.items() if j in starts]
    # The part of the lag that is the sweep's: the firing's row is stored when it fires.
    fire_lags = [(created[j] - slot) * 1000 for j, slot in inside.items()]
    out = {
        "seconds": window,
        "slots_expected": len(expected),
        "slots_fired": sum(1 for slot in expected if slot in per_slot),
        "slots_missed": sum(1 for slot in expected if slot not in per_slot),
        "slots_after_window": sum(1 for slot in per_slot if slot not in expected),
        "max_firings_per_slot": max(per_slot.values(), default=0),
        "jobs_run": len(runs),
        "firings_stored": len(slot_of),
        "firing_processes": len(firing_pids),
        "running_processes": sum(1 for (name,) in runners if name),
        "firings_not_run": sum(1 for j in slot_of if j not in runs),
        "max_runs_per_job": max(runs.values(), default=0),
        "not_completed": sum(1 for _, status, _ in fired if status != "Completed"),
        "lag_p50_ms": percentile(lags, 50),
        "lag_p99_ms": percentile(lags, 99),
        "lag_max_ms": max(lags, default=float("nan")),
        "fired_p50_ms": percentile(fire_lags, 50),
        "fired_p99_ms": percentile(fire_lags, 99),
    }
    print(
        f"  recurring {out['seconds']:.0f}s: {out['slots_fired']} of {out['slots_expected']} "
        f"slots fired ({out['slots_missed']} missed), max {out['max_firings_per_slot']} "
        f"firing/slot, max {out['max_runs_per_job']} run/job; start after slot p50 "
        f"{out['lag_p50_ms']:.0f} ms, p99 {out['lag_p99_ms']:.0f} ms",
        flush=True,
    )
    return out


# -- 9. purge ---------------------------------------------------------------------------------

#: The retention scenario 9's worker runs with (the seeded rows ended 10 days ago).
PURGE_RETENTION = {"Completed": "7d"}
#: How often the drain and the purge are sampled.
PURGE_POLL = 0.5


def _seed_ended(stack: Stack, template: tuple[Any, Any], count: int) -> None:
    """``count`` Completed rows that ended 10 days ago (category ``old``), each a copy
    of the payload and state of a job a worker completed."""
    import json

    payload, state = (json.dumps(part).replace("'", "''") for part in template)
    stack.execute(
        "INSERT INTO scheduler_jobs (id, channel_id, category, status, version, created, "
        "updated, payload, state) "
        f"SELECT 'old-' || n, 'bench', 'old', 'Completed', 3, now() - interval '10 days', "
        f"now() - interval '10 days', '{payload}'::jsonb, '{state}'::jsonb "
        f"FROM generate_series(1, {count}) AS n"
    )
    stack.execute("ANALYZE scheduler_jobs")


def _old_left(stack: Stack) -> int:
    # A range of the primary key: the poll reads the index, not the table.
    return int(
        stack.scalar("SELECT count(*) FROM scheduler_jobs WHERE id >= 'old-' AND id < 'old.'")
    )


def _drain_while_sampling(
    stack: Stack, durable: Durable, template: tuple[Any, Any], jobs: int, old: int, retention: bool
) -> dict[str, Any]:
    """``old`` ended rows and ``jobs`` waiting jobs, then a 1x8 worker (with or without
    retention) drains them; the counts of done jobs and old rows are sampled meanwhile."""
    import json
    import os

    durable.warm()
    stack.reset()
    _seed_ended(stack, template, old)
    enqueue(durable, jobs)
    if retention:
        os.environ["BENCH_RETENTION"] = json.dumps(PURGE_RETENTION)
    try:
        worker = durable.worker(1)
    finally:
        os.environ.pop("BENCH_RETENTION", None)
    started = time.perf_counter()
    samples: list[tuple[float, int, int]] = []
    try:
        while True:
            done, left = durable.done(), _old_left(stack)
            samples.append((time.perf_counter() - started, done, left))
            if done >= jobs and (not retention or left == 0):
                break
            if time.perf_counter() - started > 900:
                raise TimeoutError(f"purge run: {done}/{jobs} done, {left} old rows left")
            worker.check()
            time.sleep(PURGE_POLL)
        span = durable.last_done() - durable.first_start()
        log = Path(worker.log.name).read_text(errors="replace")
    finally:
        worker.stop()
    passes = [
        (int(n), float(ms))
        for n, ms in re.findall(
            r"purged (\d+) ended jobs past their retention .*? in (\d+) ms", log
        )
    ]
    return {"rate": jobs / span, "samples": samples, "passes": passes}


def _rate_between(samples: list[tuple[float, int, int]], start: float, end: float) -> float:
    """Jobs done per second between two moments (seconds since the worker started)."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def purge(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """Retention on 100,000 ended jobs: how long the sweep takes to purge them while
    a 1x8 worker drains a backlog, and whether the worker's rate holds meanwhile
    (against the same run without retention); then the same purge back to back, as
    ``pypepper-dramatiq purge`` runs it."""
    from datetime import datetime, timedelta, timezone

    from pypepper_dramatiq import get_job_store
    from pypepper_dramatiq.rules.retention import BATCH

    old, jobs = sizes.purge
    # A real completed job's row, for the seeded rows to be like it.
    stack.reset()
    worker = durable.worker(1)
    try:
        job_id = durable.send()
        wait_until(lambda: durable.done() >= 1, 120, "the template job", worker)
    finally:
        worker.stop()
    template = stack.sql("SELECT payload, state FROM scheduler_jobs WHERE id = %s", job_id)[0]

    kept = _drain_while_sampling(stack, durable, template, jobs, old, retention=False)
    purged = _drain_while_sampling(stack, durable, template, jobs, old, retention=True)
    first = next(t for t, _, left in purged["samples"] if left < old)
    last = next(t for t, _, left in purged["samples"] if left == 0)
    # The worker's rate while it purged and still had jobs to run (NaN: no overlap).
    drained = next(t for t, done, _ in purged["samples"] if done >= jobs)
    during = _rate_between(purged["samples"], first, min(last, drained))
    same_window = _rate_between(kept["samples"], first, min(last, drained))

    # Back to back from this process, as the CLI does: statements of BATCH rows.
    stack.reset()
    _seed_ended(stack, template, old)
    store = get_job_store()
    cutoff = datetime.now(timezone.utc) - timedelta(days=7)
    start = time.perf_counter()
    counted = len(store.purge("Completed", cutoff, old + 1, dry_run=True))
    dry_s = time.perf_counter() - start
    start = time.perf_counter()
    deleted, statements = 0, 0
    while True:
        batch = len(store.purge("Completed", cutoff, BATCH))
        deleted, statements = deleted + batch, statements + 1
        if batch < BATCH:
            break
    cli_s = time.perf_counter() - start
    pass_ms = [ms for n, ms in purged["passes"] if n]
    out = {
        "old_rows": old,
        "jobs": jobs,
        "rate_without": kept["rate"],
        "rate_with": purged["rate"],
        "rate_during_purge": during,
        "rate_same_window_without": same_window,
        "purge_window_s": last - first,
        "purged_after_start_s": last,
        "passes": len(pass_ms),
        "pass_ms_median": median(pass_ms),
        "pass_ms_max": max(pass_ms, default=float("nan")),
        "rows_per_pass": median([float(n) for n, _ in purged["passes"] if n]),
        "dry_run_s": dry_s,
        "dry_run_counted": counted,
        "back_to_back_s": cli_s,
        "back_to_back_deleted": deleted,
        "back_to_back_ms_per_statement": cli_s / statements * 1000,
    }
    print(
        f"  purge {old:,} ended jobs: gone {out['purged_after_start_s']:.1f}s after the worker "
        f"started ({out['passes']} passes, median {out['pass_ms_median']:.0f} ms); worker "
        f"{out['rate_during_purge']:.0f} jobs/s during the purge, {same_window:.0f} without "
        f"(whole drain {out['rate_with']:.0f} vs {out['rate_without']:.0f}); back to back "
        f"{cli_s:.1f}s ({out['back_to_back_ms_per_statement']:.0f} ms per {BATCH:,} rows)",
        flush=True,
    )
    return out


# -- wait: Job.wait() ---------------------------------------------------------------------------


def _wait_figures(late: list[float]) -> dict[str, float]:
    ms = [value * 1000 for value in late]
    return {
        "jobs": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms, default=float("nan")),
    }


def wait(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """``job.wait()`` from this process: the time from a job's end (its stored
    ``updated``, written by the worker) to the caller's return, on a 1x8 worker.

    Two parts: one caller at a time (schedule, wait, next: a job may have ended
    before the wait's first read), and N callers at once, each in a thread,
    all waiting before the worker starts, so that every one is woken by its
    job's notice while the worker drains the N jobs.
    """
    import threading

    from pypepper_dramatiq.channels import end_notices as notices

    count = sizes.wait_jobs
    stack.reset()
    worker = durable.worker(1)
    try:
        _ready(stack, durable, worker)
        one: list[float] = []
        for _ in range(count):
            job = durable.app.job(1)
            job.scheduled()
            record = job.wait(timeout=60)
            one.append(time.time() - record.updated.timestamp())
    finally:
        worker.stop()

    stack.reset()
    jobs = [durable.app.job(1) for _ in range(count)]
    for job in jobs:
        job.scheduled()
    late: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def wait_one(job: Any) -> None:
        try:
            record = job.wait(timeout=300)
            at = time.time()
            with lock:
                late.append(at - record.updated.timestamp())
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=wait_one, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(notices.waiters) >= count, 60, "every caller waiting")
    worker = durable.worker(1)
    try:
        started = time.perf_counter()
        for thread in threads:
            thread.join(600)
        drain_s = time.perf_counter() - started
    finally:
        worker.stop()
    if errors:
        raise errors[0]
    out = {
        "one_at_a_time": _wait_figures(one),
        "at_once": dict(_wait_figures(late), worker_start_to_all_returned_s=drain_s),
        "poll_s": notices.POLL_SECONDS,
    }
    print(
        f"  wait: one at a time p50 {out['one_at_a_time']['p50_ms']:.1f} ms, p99 "
        f"{out['one_at_a_time']['p99_ms']:.1f} ms; {count} at once p50 "
        f"{out['at_once']['p50_ms']:.1f} ms, p99 {out['at_once']['p99_ms']:.1f} ms "
        "(job end -> wait() returned)",
        flush=True,
    )
    return out


def progress(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """One task counting N items with ``bar.succeeded()`` each, against the same loop
    with a plain counter, on a 1x8 worker: the loop's time and the store writes."""
    calls = sizes.progress_calls
    stack.reset()
    worker = durable.worker(1)
    try:
        _ready(stack, durable, worker)
        loops: dict[bool, dict[str, Any]] = {}
        for report in (False, True, False, True):  # twice each, the second kept (warm)
            job = durable.app.progress_job(calls, report)
            job.scheduled()
            record = job.wait(timeout=300)
            loops[report] = record.result("loop")
            loops[report]["stored"] = record.progress.get("0.0")
    finally:
        worker.stop()
    with_bar, plain_loop = loops[True], loops[False]
    out = {
        "calls": calls,
        "seconds_with": with_bar["seconds"],
        "seconds_without": plain_loop["seconds"],
        "us_per_call": (with_bar["seconds"] - plain_loop["seconds"]) / calls * 1e6,
        # The writes while it ran, plus the outcome write that stores the last value.
        "store_writes": with_bar["writes"] + 1,
        "stored_done": (with_bar["stored"] or {}).get("done"),
    }
    print(
        f"  progress: {calls:,} bar.succeeded() in {out['seconds_with'] * 1000:.0f} ms "
        f"(plain loop {out['seconds_without'] * 1000:.1f} ms), "
        f"{out['us_per_call']:.2f} us a call, {out['store_writes']} store writes",
        flush=True,
    )
    return out


def transactional(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """What ``scheduled(connection=...)`` costs against a plain ``scheduled()``: N jobs
    each way, alternated in rounds, each transactional job in its own transaction
    (a Connection: ``begin``, schedule, commit), no worker running."""
    import os

    from sqlalchemy import create_engine

    count = sizes.transactional_jobs
    stack.reset()
    durable.warm()
    engine = create_engine(os.environ["BENCH_STORE_URI"])
    plain_s: list[float] = []
    in_tx_s: list[float] = []
    try:
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(count):
                durable.app.job(1).scheduled()
            plain_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(count):
                with engine.begin() as connection:
                    durable.app.job(1).scheduled(connection=connection)
            in_tx_s.append(time.perf_counter() - started)
    finally:
        engine.dispose()
    plain_us, in_tx_us = median(plain_s) / count * 1e6, median(in_tx_s) / count * 1e6
    print(
        f"  transactional: {in_tx_us:.0f} us a job in the caller's transaction, "
        f"{plain_us:.0f} us plain ({in_tx_us / plain_us:.2f}x)",
        flush=True,
    )
    return {"jobs": count, "plain_us": plain_us, "transactional_us": in_tx_us}


# -- 13. dashboard -----------------------------------------------------------------------------

#: The pages of scenario 13, by label: the first page, filtered pages, a deep page.
DASHBOARD_PAGES = {
    "first page": "/",
    "status + channel": "/?status=Failed&channel=bench-2",
    "category": "/?category=cat-7",
    "created between": "/?created_from={middle}&created_until={later}",
    # A text search reads a window of 20,000 rows: one with matches, one with none.
    "error text search": "/?q=valueerror%3A+row",
    "error text search, no match": "/?q=no+such+text",
    "charts, last hour": "/charts",
    "charts, last day": "/charts?range=day",
    "charts, last week": "/charts?range=week",
}
#: The charts again once the activity rollup holds the last eight days, as the sweep's
#: leader keeps it (the pages above read the jobs table alone: no rollup yet).
ROLLED_UP_PAGES = {
    "charts, last hour, rolled up": "/charts",
    "charts, last day, rolled up": "/charts?range=day",
    "charts, last week, rolled up": "/charts?range=week",
}
#: What a page of scenario 13 holds when it answered (not an error page).
_ANSWERED = (b"<table", b"No stored job matches", b'id="ended-chart"')


def _seed_dashboard(stack: Stack, rows: int) -> None:
    """``rows`` jobs over 30 days: mostly Completed, some Failed, Cancelled, Scheduled
    and InProgress; 4 channels, 10 categories; each with a small two-task state."""
    import json

    state = json.dumps(
        {"cursor": [0, 1, 0, 0], "results": {"0.0": {"rows": 3}, "0.1": 3}, "attempts": {}}
    )
    stack.execute(
        "INSERT INTO scheduler_jobs (id, channel_id, category, status, version, created, "
        "updated, payload, state, error) "
        "SELECT 'job-' || lpad(n::text, 8, '0'), 'bench-' || (n % 4), 'cat-' || (n % 10), "
        "CASE WHEN n % 100 < 5 THEN 'Failed' WHEN n % 100 < 7 THEN 'Cancelled' "
        "WHEN n % 100 < 9 THEN 'Scheduled' WHEN n % 100 < 10 THEN 'InProgress' "
        "ELSE 'Completed' END, 3, "
        f"now() - interval '30 days' + n * interval '30 days' / {rows}, "
        f"now() - interval '30 days' + n * interval '30 days' / {rows} + interval '2 seconds', "
        "NULL, "
        f"'{state}'::jsonb, "
        "CASE WHEN n % 100 < 5 THEN 'ValueError: row ' || n END "
        f"FROM generate_series(1, {rows}) AS n"
    )
    # What autovacuum does to a table that grew over days (the visibility map lets
    # the counts read the index alone); here at once, so that it does not run
    # during the measurement.
    stack.execute("VACUUM (ANALYZE) scheduler_jobs")


def _seed_rollup(stack: Stack) -> None:
    """The activity rollup of the seeded jobs' last eight days, as the sweep's leader
    would have written it: per minute and channel, the ends by status, every wait in
    the 100 ms bucket and every run in the 2.5 s one (the seeded rows ran 2 s), a
    depth; its mark a minute behind the clock (the charts count the rest from the
    jobs table)."""
    for grain in (1, 15, 60):  # records.activity.GRAINS
        at = f"date_bin('{grain} minutes', updated, timestamptz '2000-01-01 00:00:00+00')"
        stack.execute(
            "INSERT INTO scheduler_activity (span_minutes, at_minute, channel_id, completed, "
            "failed, cancelled, "
            + ", ".join(f"wait_{i:02d}" for i in range(21))
            + ", "
            + ", ".join(f"run_{i:02d}" for i in range(21))
            + f", depth) SELECT {grain}, {at} AS m, channel_id, "
            "count(*) FILTER (WHERE status = 'Completed'), "
            "count(*) FILTER (WHERE status = 'Failed'), "
            "count(*) FILTER (WHERE status = 'Cancelled'), "
            + ", ".join("count(*)" if i == 4 else "0" for i in range(21))
            + ", "
            + ", ".join("count(*)" if i == 8 else "0" for i in range(21))
            + ", max(extract(minute FROM updated))::int "
            "FROM scheduler_jobs WHERE status IN ('Completed', 'Failed', 'Cancelled') "
            "AND updated >= date_trunc('hour', now()) - interval '8 days' "
            "AND updated < date_trunc('minute', now()) - interval '1 minute' "
            "GROUP BY m, channel_id"
        )
    stack.execute(
        "INSERT INTO scheduler_activity_mark (id, first_minute, next_minute) VALUES (1, "
        "date_trunc('hour', now()) - interval '8 days', "
        "date_trunc('minute', now()) - interval '1 minute')"
    )
    stack.execute("VACUUM (ANALYZE) scheduler_activity")


def _first_byte_ms(port: int, path: str) -> float:
    """Milliseconds from sending a GET to reading the response's status line."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        started = time.perf_counter()
        connection.request("GET", path)
        response = connection.getresponse()
        elapsed = (time.perf_counter() - started) * 1000
        body = response.read()
        if response.status != 200 or not any(mark in body for mark in _ANSWERED):
            raise RuntimeError(f"dashboard {path}: HTTP {response.status}: {body[-2000:]!r}")
        return elapsed
    finally:
        connection.close()


def dashboard(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """The jobs page over a million stored jobs (PostgreSQL): time to first byte of the
    first page and of filtered pages, served by a real HTTP server in this process."""
    import logging
    import os
    import threading
    from datetime import datetime, timedelta, timezone

    from werkzeug.serving import make_server

    from pypepper_dramatiq.dashboard import make_app
    from pypepper_dramatiq.stores.sql import SqlJobStore

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    stack.reset()
    started = time.perf_counter()
    _seed_dashboard(stack, sizes.dashboard_rows)
    seeded_s = time.perf_counter() - started
    store = SqlJobStore(os.environ["BENCH_STORE_URI"])
    server = make_server("127.0.0.1", 0, make_app(store=store), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    now = datetime.now(timezone.utc)
    middle, later = ((now - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M") for days in (15, 14))
    pages: dict[str, dict[str, float]] = {}
    try:
        for label, path in [*DASHBOARD_PAGES.items(), *ROLLED_UP_PAGES.items()]:
            if label == next(iter(ROLLED_UP_PAGES)):
                _seed_rollup(stack)
            path = path.format(middle=middle, later=later)
            _first_byte_ms(server.port, path)  # warm: the plan cache, the pool
            times = [_first_byte_ms(server.port, path) for _ in range(sizes.dashboard_requests)]
            pages[label] = {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}
            print(
                f"  dashboard {label}: first byte p50 {pages[label]['p50_ms']:.1f} ms, "
                f"p99 {pages[label]['p99_ms']:.1f} ms",
                flush=True,
            )
    finally:
        server.shutdown()
        store.close()
    stack.reset()
    return {"rows": sizes.dashboard_rows, "seed_s": seeded_s, "pages": pages}


# -- 14. metrics -------------------------------------------------------------------------------


def metrics(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """A 1x8 worker draining N one-task jobs with the Prometheus metrics on
    (``setup(metrics=True)``, prometheus_client's multi-process mode, as under
    Dramatiq's Prometheus middleware, whose own metrics are left out) and off,
    alternated: the processing rates and their ratio."""
    import contextlib
    import tempfile

    jobs = sizes.metrics_jobs
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(sizes.reps + 1):
        for on in _rotate([False, True], rep):
            with contextlib.ExitStack() as scope:
                files: Path | None = None
                if on:
                    files = Path(scope.enter_context(tempfile.TemporaryDirectory()))
                    scope.enter_context(
                        _environ(BENCH_METRICS="1", PROMETHEUS_MULTIPROC_DIR=str(files))
                    )
                result = drain_run(stack, durable, jobs, 1, cpu=True)
                if files is not None and not list(files.glob("histogram_*.db")):
                    raise RuntimeError("the worker wrote no metrics: the 'on' run measured nothing")
            rates[on].append(result["process_rate"])
            cpus[on].append(result["cpu_us_per_job"])
            print(
                f"  metrics {'on ' if on else 'off'} rep {rep + 1}: "
                f"process {result['process_rate']:.0f} jobs/s, "
                f"worker CPU {result['cpu_us_per_job']:.0f} us/job",
                flush=True,
            )
    off, on = median(rates[False]), median(rates[True])
    cpu_off, cpu_on = median(cpus[False]), median(cpus[True])
    print(
        f"  metrics: on / off = {on / off:.3f}; worker CPU per job on / off {cpu_on / cpu_off:.3f}",
        flush=True,
    )
    return {
        "jobs": jobs,
        "runs": len(rates[True]),
        "rate_off": off,
        "rate_on": on,
        "ratio": on / off,
        "cpu_us_off": cpu_off,
        "cpu_us_on": cpu_on,
        "rates_off": rates[False],
        "rates_on": rates[True],
    }


# -- 15. RabbitMQ -----------------------------------------------------------------------------


def rabbitmq(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """Plain Dramatiq and durable jobs on RabbitMQ (with PostgreSQL's coordination), drained
    as in scenario 1, once per shape: the figures beside scenario 1's Redis rows."""
    import os

    from .harness import DurableRabbitmq, PlainRabbitmq

    url = stack.start_rabbitmq()
    plain, durable = PlainRabbitmq(stack), DurableRabbitmq(stack)
    runs: dict[str, dict[str, dict[str, float]]] = {}
    durable.use(url)
    try:
        with _environ(BENCH_BROKER_URL=url):
            for processes in sizes.shapes:
                shape = f"{processes}x8"
                for competitor in (plain, durable):
                    result = drain_run(stack, competitor, sizes.throughput_jobs, processes)
                    runs.setdefault(shape, {})[competitor.name] = result
                    print(
                        f"  rabbitmq {shape} {competitor.name}: "
                        f"enqueue {result['enqueue_rate']:.0f}/s, "
                        f"process {result['process_rate']:.0f}/s",
                        flush=True,
                    )
    finally:
        durable.use(os.environ["BENCH_REDIS_URL"])  # this process's broker again
    return runs


# -- 16. typed parameters ---------------------------------------------------------------------

#: Tasks built, stored and read back per figure of the in-process codec measure.
CODEC_ROUNDS = 2_000


def _codec_us(durable: Durable, typed: bool) -> dict[str, float]:
    """Microseconds a task of :func:`~bench.apps.durable.params_job` costs in this process,
    without servers: built and turned into its stored JSON (what ``scheduled()`` adds),
    and rebuilt from it with its parameters decoded (what a worker adds before the call);
    the best of three rounds."""
    from pypepper_dramatiq import Task
    from pypepper_dramatiq.records.payloads import decoder_for

    app = durable.app
    function = app.typed_params if typed else app.json_params
    decoder = decoder_for(function.fn, function.executor_id, 2)

    def build() -> Task:
        if typed:
            return app.typed_params.task(order=app.ORDER, at=app.AT, amount=app.AMOUNT)
        return app.json_params.task(**app.AS_JSON)

    stored = json.loads(json.dumps(build().to_dict(app.CHANNEL)))
    encode, decode = [], []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(CODEC_ROUNDS):
            json.dumps(build().to_dict(app.CHANNEL))
        encode.append((time.perf_counter() - start) / CODEC_ROUNDS * 1e6)
        start = time.perf_counter()
        for _ in range(CODEC_ROUNDS):
            task = Task.from_dict(json.loads(json.dumps(stored)))
            decoder.arguments(task.name, task.params)
        decode.append((time.perf_counter() - start) / CODEC_ROUNDS * 1e6)
    return {"encode_us": min(encode), "decode_us": min(decode)}


def typed_params(stack: Stack, plain: Plain, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """One-task jobs whose task takes a dataclass, a datetime and a Decimal, against the same
    values as plain JSON, and plain Dramatiq's no-op, drained by a 1x8 worker in turn: the
    enqueue cost and the processing rate of each (medians), and the in-process cost of
    encoding and decoding the parameters."""
    from .harness import DurableParams

    as_json, typed = DurableParams(stack, typed=False), DurableParams(stack, typed=True)
    jobs = sizes.params_jobs
    named = {"plain": plain, "json": as_json, "typed": typed}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in named}
    for rep in range(sizes.reps + 1):
        for name in _rotate(list(named), rep):
            result = drain_run(stack, named[name], jobs, 1)
            runs[name].append(result)
            print(
                f"  typed_params {name} rep {rep + 1}: "
                f"enqueue {result['enqueue_us_per_job']:.0f} us/job, "
                f"process {result['process_rate']:.0f} jobs/s",
                flush=True,
            )
    out: dict[str, Any] = {"jobs": jobs, "runs": sizes.reps + 1}
    for name, results in runs.items():
        out[name] = {
            "enqueue_us_per_job": median([r["enqueue_us_per_job"] for r in results]),
            "process_rate": median([r["process_rate"] for r in results]),
        }
    out["codec_json"] = _codec_us(durable, typed=False)
    out["codec_typed"] = _codec_us(durable, typed=True)
    print(
        "  typed_params: typed / JSON enqueue "
        f"{out['typed']['enqueue_us_per_job'] / out['json']['enqueue_us_per_job']:.2f}, "
        f"processing {out['typed']['process_rate'] / out['json']['process_rate']:.2f}; "
        f"codec us JSON {out['codec_json']}, typed {out['codec_typed']}",
        flush=True,
    )
    return out


# -- 17. tracing ------------------------------------------------------------------------------


#: Jobs traced per figure of the in-process tracing measure.
TRACING_ROUNDS = 5_000


def _tracing_us(durable: Durable) -> dict[str, float]:
    """Microseconds the tracing observer adds to a one-task job in this process, without
    servers, on the SDK's provider with an exporter that only counts: the schedule span
    (the producer's part) and the attempt span with its outcome (the worker's part); the
    best of three rounds. With tracing off no observer is installed: nothing is called."""
    from pypepper_dramatiq import JobRecord
    from pypepper_dramatiq.metrics.tracing import TracingObserver

    observer = TracingObserver(durable.app.sdk_tracer_provider(lambda n: None))
    record = JobRecord(id="0" * 32, channel_id=durable.app.CHANNEL)
    producer, worker = [], []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(TRACING_ROUNDS):
            with observer.scheduling(record.id, record.channel_id) or contextlib.nullcontext():
                pass
        producer.append((time.perf_counter() - start) / TRACING_ROUNDS * 1e6)
        start = time.perf_counter()
        for _ in range(TRACING_ROUNDS):
            observer.attempt_started(record, "t", 0, 0)
            observer.task_ended(record, "t", "succeeded")
            observer.job_ended(record)
            observer.attempt_ended(record.id)
        worker.append((time.perf_counter() - start) / TRACING_ROUNDS * 1e6)
    return {"producer_us": min(producer), "worker_us": min(worker)}


def tracing(stack: Stack, plain: Plain, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """One-task jobs with OpenTelemetry tracing on (``setup(tracing=True)`` in the workers,
    the SDK's tracer provider with an exporter that only counts; the same in this process,
    the producer, whose schedule spans are the attempts' parents) and off, and plain
    Dramatiq's no-op, drained by a 1x8 worker in turn: enqueue cost and processing rate
    (medians). A run "on" whose worker exported no span fails the scenario."""
    from pypepper_dramatiq.metrics.tracing import install_tracing, uninstall_tracing

    jobs = sizes.tracing_jobs
    produced = [0]
    provider = durable.app.sdk_tracer_provider(lambda n: produced.__setitem__(0, produced[0] + n))
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "off": [], "on": []}
    spans: list[int] = []
    for rep in range(sizes.reps + 1):
        for name in _rotate(list(runs), rep):
            if name == "on":
                observer = install_tracing(provider)
                with _environ(BENCH_TRACING="1"):
                    try:
                        result = drain_run(stack, durable, jobs, 1)
                    finally:
                        uninstall_tracing(observer)
                seen = int(stack.probe.get("spans:n") or 0)
                if not seen:
                    raise RuntimeError("the worker exported no span: the 'on' run measured nothing")
                spans.append(seen)
            else:
                result = drain_run(stack, plain if name == "plain" else durable, jobs, 1)
            runs[name].append(result)
            print(
                f"  tracing {name} rep {rep + 1}: "
                f"enqueue {result['enqueue_us_per_job']:.0f} us/job, "
                f"process {result['process_rate']:.0f} jobs/s",
                flush=True,
            )
    out: dict[str, Any] = {
        "jobs": jobs,
        "runs": sizes.reps + 1,
        "worker_spans_per_run": median([float(n) for n in spans]),
        "producer_spans": produced[0],
    }
    for name, results in runs.items():
        out[name] = {
            "enqueue_us_per_job": median([r["enqueue_us_per_job"] for r in results]),
            "process_rate": median([r["process_rate"] for r in results]),
        }
    out["in_process"] = _tracing_us(durable)
    print(
        "  tracing: on / off enqueue "
        f"{out['on']['enqueue_us_per_job'] / out['off']['enqueue_us_per_job']:.2f}, "
        f"processing {out['on']['process_rate'] / out['off']['process_rate']:.2f}; "
        f"in process (us/job) {out['in_process']}",
        flush=True,
    )
    return out


# -- 19. a global rate limit ------------------------------------------------------------------

#: The limit of scenario 19, per second, over two worker processes.
RATE_PER_SECOND = 50


def rate_limit(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """A channel limited to 50/s, two worker processes, a backlog of 50/s times
    ``rate_seconds`` jobs queued at once: the rate reached over the run, and the most
    starts in any one-second window (never above 50), from the tasks' start times.
    The workers move delayed messages every 100 ms (``dramatiq_worker_timeout``)."""
    jobs = int(RATE_PER_SECOND * sizes.rate_seconds)
    stack.reset()
    keys = [f"rate-{n}" for n in range(jobs)]
    for key in keys:
        durable.send(key)
    with _environ(BENCH_RATE_LIMIT=f"{RATE_PER_SECOND}/s", dramatiq_worker_timeout="100"):
        worker = durable.workers_apart(2, "durable-rate")
    try:
        wait_until(lambda: durable.done() >= jobs, sizes.rate_seconds * 10 + 120, "jobs", worker)
        worker.check()
    finally:
        worker.stop()
    starts = sorted(durable.start_times().values())
    window_max, j = 0, 0
    for i, start in enumerate(starts):  # the most starts in [start, start + 1 s)
        j = max(j, i)
        while j < len(starts) and starts[j] < start + 1.0:
            j += 1
        window_max = max(window_max, j - i)
    span = starts[-1] - starts[0]
    out = {
        "limit_per_second": RATE_PER_SECOND,
        "jobs": jobs,
        "processes": 2,
        "seconds": span,
        "rate": (len(starts) - 1) / span if span > 0 else float("nan"),
        "max_starts_in_a_second": window_max,
    }
    print(
        f"  rate limit {RATE_PER_SECOND}/s, 2 processes, {jobs} jobs: "
        f"{out['rate']:.1f}/s over {span:.1f}s ({out['rate'] / RATE_PER_SECOND:.0%} of the "
        f"limit), at most {window_max} starts in any second",
        flush=True,
    )
    return out


# -- 20. priority inversion ---------------------------------------------------------------------

#: The priority of scenario 20's late jobs (the backlog's is 0).
HIGH_PRIORITY = 9
#: Jobs per ``schedule_many`` call while the backlog is queued.
INVERSION_BATCH = 1_000
#: The prefetch settings scenario 20 runs under: Dramatiq's default (twice the threads
#: per queue), and as many as the threads (``dramatiq_queue_prefetch``; it counts the
#: messages running too, so below the threads some would stay idle).
INVERSION_PREFETCH = ("default", str(THREADS))


def priority_inversion(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """``inversion[0]`` low-priority jobs queued, a worker (2 processes x 8 threads)
    draining them, then ``inversion[1]`` jobs of priority 9 scheduled at once: the
    seconds until the high ones are all done, against the seconds until the backlog
    is, both from the moment the high ones were scheduled. Without priorities the high
    jobs would be done about when the backlog is (a ratio near 1); with them, once the
    messages the processes had prefetched ran. Once with Dramatiq's prefetch, once
    with ``dramatiq_queue_prefetch`` equal to the threads."""
    from pypepper_dramatiq import schedule_many

    lows, highs = sizes.inversion
    out: dict[str, Any] = {"low_jobs": lows, "high_jobs": highs, "processes": 2, "threads": THREADS}
    for prefetch in INVERSION_PREFETCH:
        stack.reset()
        for first in range(0, lows, INVERSION_BATCH):
            batch = [
                durable.app.job(1, f"low-{n}")
                for n in range(first, min(lows, first + INVERSION_BATCH))
            ]
            assert all(isinstance(r, str) for r in schedule_many(batch))
        settings = {} if prefetch == "default" else {"dramatiq_queue_prefetch": prefetch}
        with _environ(**settings):
            worker = durable.worker(2)
        try:
            # The backlog is being drained: the workers hold (and prefetched) low jobs.
            wait_until(lambda: durable.done() >= max(lows // 20, 16), 120, "lows", worker)
            sent = time.time()
            made = [durable.app.job(1, f"high-{n}") for n in range(highs)]
            assert all(isinstance(r, str) for r in schedule_many(made, priority=HIGH_PRIORITY))
            wait_until(lambda: durable.done() >= lows + highs, lows / 20 + 120, "jobs", worker)
            worker.check()
        finally:
            worker.stop()
        done = durable.done_times()
        high_done = max(at for key, at in done.items() if key.startswith("high-")) - sent
        low_done = max(at for key, at in done.items() if key.startswith("low-")) - sent
        lows_after = sum(
            1 for key, at in done.items() if key.startswith("low-") and at > sent + high_done
        )
        out[prefetch] = {
            "high_done_seconds": high_done,
            "backlog_drained_seconds": low_done,
            "ratio": high_done / low_done if low_done > 0 else float("nan"),
            "lows_done_after_the_highs": lows_after,
        }
        print(
            f"  prefetch {prefetch}: {highs} jobs of priority {HIGH_PRIORITY} done "
            f"{high_done:.2f}s after they were scheduled, the {lows}-job backlog drained "
            f"after {low_done:.2f}s (ratio {high_done / max(low_done, 1e-9):.3f}); "
            f"{lows_after} low jobs ended after the last high one",
            flush=True,
        )
    return out


# -- 21. concurrency limits per key -----------------------------------------------------------

#: Scenario 21: how many keys, the limit of each, and how long each job works.
CONCURRENCY_KEYS = 50
CONCURRENCY_LIMIT = 3
CONCURRENCY_WORK_SECONDS = 0.02


def concurrency(stack: Stack, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """50 keys limited to 3 steps at once each (``setup(concurrency={"tenant-*": 3})``),
    two worker processes of 8 threads, ``concurrency_per_key`` jobs per key queued key
    by key (so that a key's jobs arrive together and its limit binds), each working
    20 ms: the most slots any key held at once, sampled every 10 ms from Redis (never
    above 3), and the rate (first start to last end) against the same jobs without a
    key (no limit)."""
    jobs = CONCURRENCY_KEYS * sizes.concurrency_per_key
    out: dict[str, Any] = {"keys": CONCURRENCY_KEYS, "limit": CONCURRENCY_LIMIT, "jobs": jobs}
    for limited in (False, True):
        stack.reset()
        for k in range(CONCURRENCY_KEYS):
            for n in range(sizes.concurrency_per_key):
                job = durable.app.keyed_job(None, f"c{k}-{n}", CONCURRENCY_WORK_SECONDS)
                job.scheduled(concurrency_key=f"tenant-{k}" if limited else None)
        limits = json.dumps({"tenant-*": CONCURRENCY_LIMIT}) if limited else "null"
        peak = [0]
        sampling = threading.Event()
        sampler = threading.Thread(
            target=_most_slots_held, args=(stack, sampling, peak), daemon=True
        )
        with _environ(BENCH_CONCURRENCY=limits, dramatiq_worker_timeout="100"):
            worker = durable.workers_apart(2, "durable-concurrency")
        sampler.start()
        try:
            wait_until(lambda: durable.done() >= jobs, 300, "jobs", worker)
            # From the first task's start to the last job's end: the workers' boot aside.
            seconds = max(durable.done_times().values()) - min(durable.start_times().values())
            worker.check()
        finally:
            sampling.set()
            sampler.join()
            worker.stop()
        name = "limited" if limited else "unlimited"
        out[f"{name}_rate"] = jobs / seconds
        if limited:
            out["max_running_per_key"] = peak[0]
    out["ratio"] = out["limited_rate"] / out["unlimited_rate"]
    print(
        f"  {CONCURRENCY_KEYS} keys at {CONCURRENCY_LIMIT} each, 2 processes, {jobs} jobs of "
        f"{CONCURRENCY_WORK_SECONDS * 1000:.0f} ms: most running per key "
        f"{out['max_running_per_key']}; {out['limited_rate']:.0f} jobs/s limited, "
        f"{out['unlimited_rate']:.0f} unlimited ({out['ratio']:.2f}x)",
        flush=True,
    )
    return out


def _most_slots_held(stack: Stack, stop: threading.Event, peak: list[int]) -> None:
    """Until ``stop``: every 10 ms, the slots each key of scenario 21 holds in Redis;
    the most seen goes to ``peak[0]``."""
    keys = [f"pypepper:slots:key:tenant-{k}" for k in range(CONCURRENCY_KEYS)]
    while not stop.wait(0.01):
        pipe = stack.broker.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key)
        peak[0] = max(peak[0], *pipe.execute())


# -- 22. claims ahead of the worker threads ----------------------------------------------------

#: The competitors of scenario 22: plain Dramatiq, and the durable worker with
#: ``claim_fetched`` off and on.
AHEAD_VARIANTS = ("plain", "off", "ahead", "on")
#: The environment of each variant of scenario 22's durable worker: ``off`` (the
#: worker threads claim and record), ``ahead`` (claims ahead, the threads record:
#: the prototype), ``on`` (claims ahead and the completion thread records).
AHEAD_ENV = {
    "plain": {"BENCH_CLAIM_FETCHED": "0", "BENCH_COMPLETION_THREAD": "1"},
    "off": {"BENCH_CLAIM_FETCHED": "0", "BENCH_COMPLETION_THREAD": "1"},
    "ahead": {"BENCH_CLAIM_FETCHED": "1", "BENCH_COMPLETION_THREAD": "0"},
    "on": {"BENCH_CLAIM_FETCHED": "1", "BENCH_COMPLETION_THREAD": "1"},
}


def _drain_with_cpu(
    stack: Stack, competitor: Competitor, jobs: int, processes: int
) -> tuple[float, float]:
    """:func:`drain_run`'s processing rate, and the worker processes' CPU seconds per
    job from the first job done to the last (boot left out): under the load of a
    shared machine the rate follows the CPU the worker is given, its CPU per job
    does not."""
    competitor.warm()
    stack.reset()
    enqueue(competitor, jobs)
    worker = competitor.worker(processes)
    try:
        wait_until(lambda: competitor.done() >= 1, 600, f"{competitor.name} first job", worker)
        first, cpu = competitor.done(), _cpu_seconds(worker)
        wait_until(lambda: competitor.done() >= jobs, 600, f"{competitor.name} jobs", worker)
        used = _cpu_seconds(worker) - cpu
        span = competitor.last_done() - competitor.first_start()
    finally:
        worker.stop()
    return jobs / span, used / max(1, jobs - first)


def _cpu_seconds(worker: Any) -> float:
    """User and system CPU seconds of ``worker``'s processes so far."""
    total = 0.0
    for proc in worker.processes():
        try:
            times = proc.cpu_times()
        except Exception:  # gone meanwhile
            continue
        total += times.user + times.system
    return total


def claims_ahead(stack: Stack, plain: Plain, durable: Durable, sizes: Sizes) -> dict[str, Any]:
    """Issue 29's first item: plain Dramatiq and the durable worker with
    ``claim_fetched`` off, with claims ahead only (``ahead``: the prototype) and
    on (claims ahead and the completion thread), alternated, draining N one-task jobs at each
    shape (rates and durable / plain ratios from the same run); then one counted
    1x8 run of each (``BENCH_COUNT_TRIPS``: counting costs CPU, so it is kept
    apart) giving the blocking calls per job made in Dramatiq's worker threads and
    its consumer threads. Each uncounted run also gives the worker processes' CPU
    per job."""
    from .apps import trips

    jobs = sizes.ahead_jobs
    rates: dict[str, dict[str, list[float]]] = {}
    cpus: dict[str, dict[str, list[float]]] = {}
    for rep in range(sizes.reps):
        for processes in sizes.shapes:
            shape = f"{processes}x8"
            for variant in _rotate(list(AHEAD_VARIANTS), rep):
                competitor = plain if variant == "plain" else durable
                with _environ(**AHEAD_ENV[variant]):
                    rate, cpu = _drain_with_cpu(stack, competitor, jobs, processes)
                rates.setdefault(shape, {}).setdefault(variant, []).append(rate)
                cpus.setdefault(shape, {}).setdefault(variant, []).append(cpu)
                print(
                    f"  claims ahead {shape} {variant} rep {rep + 1}: "
                    f"process {rate:.0f} jobs/s, worker CPU {cpu * 1000:.3f} ms/job",
                    flush=True,
                )
    out: dict[str, Any] = {"jobs": jobs, "runs": sizes.reps, "shapes": {}}
    for shape, by_variant in rates.items():
        medians = {variant: median(values) for variant, values in by_variant.items()}
        out["shapes"][shape] = {
            "rates": medians,
            "all_rates": by_variant,
            "cpu_ms": {v: median(values) * 1000 for v, values in cpus[shape].items()},
            "all_cpu_ms": {v: [c * 1000 for c in values] for v, values in cpus[shape].items()},
            "ratio_off": medians["off"] / medians["plain"],
            "ratio_ahead": medians["ahead"] / medians["plain"],
            "ratio_on": medians["on"] / medians["plain"],
        }
        print(
            f"  claims ahead {shape}: durable / plain {out['shapes'][shape]['ratio_off']:.3f}x "
            f"off, {out['shapes'][shape]['ratio_ahead']:.3f}x ahead, "
            f"{out['shapes'][shape]['ratio_on']:.3f}x on",
            flush=True,
        )
    counted: dict[str, dict[str, float]] = {}
    for variant in AHEAD_VARIANTS:
        competitor = plain if variant == "plain" else durable
        competitor.warm()
        stack.reset()
        enqueue(competitor, jobs)
        with _environ(**AHEAD_ENV[variant], BENCH_COUNT_TRIPS="1"):
            worker = competitor.worker(1)
        try:
            wait_until(lambda c=competitor: c.done() >= jobs, 600, f"{variant} jobs", worker)
            time.sleep(0.6)  # the counts are written every 0.2 s
            counts = trips.read(stack.probe)
        finally:
            worker.stop()
        counted[variant] = {kind: n / jobs for kind, n in sorted(counts.items())}
        in_workers = sum(v for k, v in counted[variant].items() if k.startswith("worker:"))
        print(
            f"  claims ahead {variant}: {in_workers:.2f} blocking calls/job in worker threads "
            f"({', '.join(f'{k} {v:.2f}' for k, v in counted[variant].items())})",
            flush=True,
        )
    out["trips_per_job"] = counted
    return out


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by the workers started meanwhile)."""
    import os

    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def run_all(stack: Stack, sizes: Sizes, only: set[str] | None = None) -> dict[str, Any]:
    from .ceiling import ceiling
    from .harness import CeleryCompetitor

    plain, durable, celery = Plain(stack), Durable(stack), CeleryCompetitor(stack)
    results: dict[str, Any] = {}
    steps = [
        ("throughput", lambda: throughput(stack, [plain, durable, celery], sizes)),
        ("workflow_length", lambda: workflow_length(stack, durable, sizes)),
        ("latency", lambda: latency(stack, [plain, durable, celery], sizes)),
        ("backlog", lambda: backlog(stack, [plain, durable], sizes)),
        ("retry_storm", lambda: retry_storm(stack, durable, sizes)),
        ("delayed", lambda: delayed(stack, durable, sizes)),
        ("fanin", lambda: fanin(stack, durable, sizes)),
        ("recurring", lambda: recurring(stack, durable, sizes)),
        ("wait", lambda: wait(stack, durable, sizes)),
        ("purge", lambda: purge(stack, durable, sizes)),
        ("progress", lambda: progress(stack, durable, sizes)),
        ("transactional", lambda: transactional(stack, durable, sizes)),
        ("dashboard", lambda: dashboard(stack, durable, sizes)),
        ("metrics", lambda: metrics(stack, durable, sizes)),
        ("rabbitmq", lambda: rabbitmq(stack, sizes)),
        ("typed_params", lambda: typed_params(stack, plain, durable, sizes)),
        ("tracing", lambda: tracing(stack, plain, durable, sizes)),
        (
            "ceiling",
            lambda: ceiling(
                stack,
                [plain, durable],
                sizes.ceiling_jobs,
                sizes.ceiling_shapes,
                sizes.ceiling_reps,
            ),
        ),
        ("rate_limit", lambda: rate_limit(stack, durable, sizes)),
        ("priority_inversion", lambda: priority_inversion(stack, durable, sizes)),
        ("concurrency", lambda: concurrency(stack, durable, sizes)),
        ("claims_ahead", lambda: claims_ahead(stack, plain, durable, sizes)),
    ]
    for name, step in steps:
        if only and name not in only:
            continue
        print(f"[{name}]", flush=True)
        start = time.perf_counter()
        results[name] = step()
        print(f"  ({time.perf_counter() - start:.1f}s)", flush=True)
    return results
