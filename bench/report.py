"""Turn scenario results into one Markdown table, the target checks and the JSON file."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

NAMES = ("plain", "durable", "celery")


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
    }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    if isinstance(value, str):
        return value
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ratio(value: Any, base: Any) -> str:
    if not value or not base or value != value or base != base:
        return "-"
    return f"{value / base:.2f}x"


def rows(results: dict[str, Any]) -> list[list[str]]:
    """Scenario, metric, plain, durable, celery, durable / plain."""
    out: list[list[str]] = []

    def add(scenario: str, metric: str, values: dict[str, Any], digits: int = 1) -> None:
        cells = [_fmt(values.get(n), digits) for n in NAMES]
        out.append([scenario, metric, *cells, _ratio(values.get("durable"), values.get("plain"))])

    for shape, by_name in results.get("throughput", {}).items():
        scenario = f"1. throughput {shape}"
        for key, label in (
            ("enqueue_rate", "enqueue (jobs/s)"),
            ("enqueue_us_per_job", "enqueue cost (us/job)"),
            ("process_rate", "processing (jobs/s)"),
            ("pg_per_job_enqueue", "PG statements/job, enqueue"),
            ("pg_per_job_process", "PG statements/job, processing"),
            ("redis_per_job_enqueue", "Redis commands/job, enqueue"),
            ("redis_per_job_process", "Redis commands/job, processing"),
        ):
            add(scenario, label, {n: v[key] for n, v in by_name.items()})
        for key, label in (
            ("batch_enqueue_us_per_job", "schedule_many cost (us/job; vs actor.send())"),
            ("pg_per_job_batch", "PG statements/job, schedule_many"),
            ("redis_per_job_batch", "Redis commands/job, schedule_many"),
        ):
            if key in by_name.get("durable", {}):
                values = {"durable": by_name["durable"][key]}
                if key == "batch_enqueue_us_per_job" and "plain" in by_name:
                    values["plain"] = by_name["plain"]["enqueue_us_per_job"]
                add(scenario, label, values)
    for shape, by_name in results.get("rabbitmq", {}).items():
        scenario = f"15. RabbitMQ throughput {shape}"
        for key, label in (
            ("enqueue_rate", "enqueue (jobs/s)"),
            ("enqueue_us_per_job", "enqueue cost (us/job; scheduled() vs actor.send())"),
            ("process_rate", "processing (jobs/s)"),
            ("pg_per_job_enqueue", "PG statements/job, enqueue"),
            ("pg_per_job_process", "PG statements/job, processing"),
        ):
            add(scenario, label, {n: v[key] for n, v in by_name.items()})
    for tasks, r in results.get("workflow_length", {}).items():
        scenario = f"2. {tasks}-task jobs (durable)"
        out.append(
            [
                scenario,
                f"ms/job, ms/task ({r['jobs']:.0f} jobs)",
                "-",
                f"{_fmt(r['ms_per_job'])}, {_fmt(r['ms_per_task'], 2)}",
                "-",
                "-",
            ]
        )
        out.append(
            [
                scenario,
                "PG statements/task, Redis commands/task",
                "-",
                f"{_fmt(r['pg_per_task'])}, {_fmt(r['redis_per_task'])}",
                "-",
                "-",
            ]
        )
    for load in ("light", "saturation"):
        by_name = {n: v[load] for n, v in results.get("latency", {}).items()}
        if not by_name:
            continue
        scenario = f"3. latency, {load}"
        add(scenario, "offered (jobs/s)", {n: v["offered_rate"] for n, v in by_name.items()})
        for key, label in (
            ("start_p50_ms", "schedule->start p50 (ms)"),
            ("start_p99_ms", "schedule->start p99 (ms)"),
            ("done_p50_ms", "schedule->done p50 (ms)"),
            ("done_p99_ms", "schedule->done p99 (ms)"),
        ):
            add(scenario, label, {n: v[key] for n, v in by_name.items()})
        add(
            scenario,
            "jobs never done (stalled 20 s)",
            {n: v.get("never_done", 0) for n, v in by_name.items()},
            0,
        )
    for size, by_name in results.get("backlog", {}).items():
        scenario = f"4. backlog {int(size):,}"
        add(
            scenario,
            "worker peak RSS (MiB)",
            {n: v["worker_peak_rss"] / 2**20 for n, v in by_name.items()},
        )
        add(
            scenario,
            "Redis used_memory (MiB)",
            {n: v["redis_bytes_waiting"] / 2**20 for n, v in by_name.items()},
        )
        add(scenario, "drain time (s)", {n: v["drain_s"] for n, v in by_name.items()})
        durable = by_name.get("durable", {})
        for key, label in (
            ("get_saved_ms", "Job.get_saved (ms)"),
            ("list_status_100_ms", "list(status=Scheduled, limit=100) (ms)"),
            ("list_status_channel_100_ms", "list(status, channel_id, limit=100) (ms)"),
        ):
            if key in durable:
                out.append([scenario, label, "-", _fmt(durable[key], 2), "-", "-"])
    for size, held in results.get("delayed", {}).items():
        scenario = f"6. delayed {int(size):,} (held, etas over 10 s)"
        cells = (
            ("Redis used_memory while waiting (MiB)", _fmt(held["redis_bytes_waiting"] / 2**20)),
            ("worker peak RSS while waiting (MiB)", _fmt(held["worker_rss_waiting"] / 2**20)),
            (
                "done after eta p50 / p99 (ms)",
                f"{_fmt(held['lag_p50_ms'])} / {_fmt(held['lag_p99_ms'])}",
            ),
            ("earliest done after eta (ms; never negative)", _fmt(held["earliest_ms"])),
        )
        for label, cell in cells:
            out.append([scenario, label, "-", cell, "-", "-"])
    storm = results.get("retry_storm")
    if storm:
        scenario = f"5. retry storm {storm['jobs']:,} jobs"
        out.append(
            [
                scenario,
                "wall to all terminal (s; floor 2 x retry_delay)",
                "-",
                _fmt(storm["wall_s"], 2),
                "-",
                "-",
            ]
        )
        out.append(
            [
                scenario,
                "quick jobs done p50: idle / during storm (ms)",
                "-",
                f"{_fmt(storm['probe_idle_p50_ms'])} / {_fmt(storm['probe_storm_p50_ms'])}",
                "-",
                "-",
            ]
        )
        out.append(
            [
                scenario,
                "quick jobs done max during storm (ms)",
                "-",
                _fmt(storm["probe_storm_max_ms"]),
                "-",
                "-",
            ]
        )
        out.append(
            [
                scenario,
                "quick jobs never done (stalled 20 s)",
                "-",
                _fmt(storm.get("probe_never_done", 0), 0),
                "-",
                "-",
            ]
        )
    fan = results.get("fanin")
    if fan:
        scenario = f"7. fan-in {fan['parents']:,} parents -> 1 child"
        fan_cells: tuple[tuple[str, str], ...] = (
            (
                "schedule parents (us/job), scheduled(after=all ids) (ms)",
                f"{_fmt(fan['schedule_parents_us_per_job'])}, {_fmt(fan['after_call_ms'], 2)}",
            ),
            ("last parent ended -> child started (ms)", _fmt(fan["last_parent_to_child_start_ms"])),
            (
                "last parent ended -> sweep ended the wait (ms; - if unseen)",
                _fmt(fan["last_parent_to_settled_ms"]),
            ),
            ("worker start -> child done (s)", _fmt(fan["wall_s"], 2)),
            (
                "parents Completed, child status",
                f"{fan['parents_completed']:,}, {fan['child_status']}",
            ),
        )
        out += _figure_rows(scenario, fan_cells)
    rec = results.get("recurring")
    if rec:
        scenario = f"8. recurring every second, 2 workers, {rec['seconds']:.0f} s"
        rec_cells: tuple[tuple[str, str], ...] = (
            (
                "slots expected, fired, missed",
                f"{rec['slots_expected']}, {rec['slots_fired']}, {rec['slots_missed']}",
            ),
            (
                "max firings per slot, max runs per job (must be 1)",
                f"{rec['max_firings_per_slot']}, {rec['max_runs_per_job']}",
            ),
            (
                "firings stored (incl. grace), never run, not Completed",
                f"{rec['firings_stored']}, {rec['firings_not_run']}, {rec['not_completed']}",
            ),
            (
                "worker processes that fired slots, that ran firings",
                f"{rec['firing_processes']}, {rec['running_processes']}",
            ),
            (
                "stored (fired) after slot p50 / p99 (ms)",
                f"{_fmt(rec['fired_p50_ms'])} / {_fmt(rec['fired_p99_ms'])}",
            ),
            (
                "start after slot p50 / p99 / max (ms)",
                f"{_fmt(rec['lag_p50_ms'])} / {_fmt(rec['lag_p99_ms'])} / "
                f"{_fmt(rec['lag_max_ms'])}",
            ),
        )
        out += _figure_rows(scenario, rec_cells)
    pur = results.get("purge")
    if pur:
        scenario = f"9. purge {pur['old_rows']:,} ended jobs, 1x8 draining {pur['jobs']:,}"
        pur_cells: tuple[tuple[str, str], ...] = (
            (
                "all purged after worker start (s); sweep passes, ms a pass p50 / max",
                f"{_fmt(pur['purged_after_start_s'])}; {pur['passes']}, "
                f"{_fmt(pur['pass_ms_median'])} / {_fmt(pur['pass_ms_max'])}",
            ),
            (
                "worker jobs/s while purging / same window without retention",
                f"{_fmt(pur['rate_during_purge'])} / {_fmt(pur['rate_same_window_without'])}",
            ),
            (
                "worker jobs/s, whole drain: with / without retention",
                f"{_fmt(pur['rate_with'])} / {_fmt(pur['rate_without'])}",
            ),
            (
                "back to back (CLI): all (s), per 1,000-row statement (ms)",
                f"{_fmt(pur['back_to_back_s'], 2)}, {_fmt(pur['back_to_back_ms_per_statement'])}",
            ),
            ("dry run counting them all (s)", _fmt(pur["dry_run_s"], 2)),
        )
        out += _figure_rows(scenario, pur_cells)
    waited = results.get("wait")
    if waited:
        for part, label in (("one_at_a_time", "one caller at a time"), ("at_once", "at once")):
            figures = waited[part]
            out.append(
                [
                    f"10. job.wait(), 1x8, {figures['jobs']:,} jobs",
                    f"job end -> wait() returned p50 / p99 / max (ms), {label}",
                    "-",
                    f"{_fmt(figures['p50_ms'])} / {_fmt(figures['p99_ms'])} / "
                    f"{_fmt(figures['max_ms'])}",
                    "-",
                    "-",
                ]
            )
    prog = results.get("progress")
    if prog:
        scenario = f"11. progress, {prog['calls']:,} bar.succeeded() in one task"
        out += _figure_rows(
            scenario,
            (
                (
                    "loop with / without progress (ms); cost a call (us)",
                    f"{_fmt(prog['seconds_with'] * 1000)} / "
                    f"{_fmt(prog['seconds_without'] * 1000, 1)}; {_fmt(prog['us_per_call'], 2)}",
                ),
                ("store writes (while running + the outcome write)", str(prog["store_writes"])),
            ),
        )
    tx = results.get("transactional")
    if tx:
        out.append(
            [
                f"12. scheduled(connection=...), {tx['jobs']:,} jobs",
                "schedule cost (us/job): in the caller's transaction / plain",
                "-",
                f"{_fmt(tx['transactional_us'])} / {_fmt(tx['plain_us'])}",
                "-",
                f"{tx['transactional_us'] / tx['plain_us']:.2f}x",
            ]
        )
    board = results.get("dashboard")
    if board:
        for label, figures in board["pages"].items():
            out.append(
                [
                    f"13. dashboard, {board['rows']:,} stored jobs",
                    (
                        f"charts page, {label.removeprefix('charts, ')}"
                        if label.startswith("charts")
                        else f"jobs page, {label}"
                    )
                    + ": first byte p50 / p99 (ms)",
                    "< 200" if label.startswith(("charts", "error text")) else "< 100",
                    f"{_fmt(figures['p50_ms'], 1)} / {_fmt(figures['p99_ms'], 1)}",
                    "-",
                    "-",
                ]
            )
    met = results.get("metrics")
    if met:
        out.append(
            [
                f"14. metrics, {met['jobs']:,} jobs, 1x8 ({met['runs']} runs each)",
                "processing (jobs/s): metrics off / on",
                "-",
                f"{_fmt(met['rate_off'])} / {_fmt(met['rate_on'])}",
                "-",
                f"on / off {met['ratio']:.3f}",
            ]
        )
        if "cpu_us_off" in met:
            out.append(
                [
                    f"14. metrics, {met['jobs']:,} jobs, 1x8 ({met['runs']} runs each)",
                    "worker CPU per job (us), first job done to last: metrics off / on",
                    "-",
                    f"{_fmt(met['cpu_us_off'])} / {_fmt(met['cpu_us_on'])}",
                    "-",
                    f"on / off {met['cpu_us_on'] / met['cpu_us_off']:.3f}",
                ]
            )
    params = results.get("typed_params")
    if params:
        scenario = (
            f"16. typed parameters, {params['jobs']:,} jobs, 1x8 ({params['runs']} runs each)"
        )
        out += _against_plain_rows(
            scenario, params, ("json", "JSON"), ("typed", "typed"), "JSON / typed parameters"
        )
        codec_json, codec_typed = params["codec_json"], params["codec_typed"]
        extra = sum(codec_typed.values()) - sum(codec_json.values())
        out.append(
            [
                scenario,
                "in process (us/task): encode, decode; JSON / typed",
                "-",
                f"{_fmt(codec_json['encode_us'])}, {_fmt(codec_json['decode_us'])} / "
                f"{_fmt(codec_typed['encode_us'])}, {_fmt(codec_typed['decode_us'])}",
                "-",
                f"typed - JSON {extra:.0f} us",
            ]
        )
    traced = results.get("tracing")
    if traced:
        scenario = f"17. tracing, {traced['jobs']:,} jobs, 1x8 ({traced['runs']} runs each)"
        out += _against_plain_rows(
            scenario, traced, ("off", "off"), ("on", "on"), "tracing off / on"
        )
        costs = traced["in_process"]
        out += _figure_rows(
            scenario,
            (
                (
                    "in process (us/job): schedule span, attempt span (off: no observer)",
                    f"{_fmt(costs['producer_us'])}, {_fmt(costs['worker_us'])}",
                ),
                (
                    "spans exported: worker per run (by the hundred), producer in all",
                    f"{traced['worker_spans_per_run']:,.0f}, {traced['producer_spans']:,}",
                ),
            ),
        )
    out += _ceiling_rows(results.get("ceiling"))
    out += _ahead_rows(results.get("claims_ahead"))
    return out


def _ahead_rows(ahead: dict[str, Any] | None) -> list[list[str]]:
    """Scenario 22: durable with ``claim_fetched`` off, claims ahead only (the
    prototype) and on (with the completion thread) against plain Dramatiq, and the
    blocking calls per job in the worker threads."""
    if not ahead:
        return []
    out = []
    for shape, figures in ahead["shapes"].items():
        rates = figures["rates"]
        out.append(
            [
                f"22. claims ahead, {ahead['jobs']:,} jobs, {shape} ({ahead['runs']} runs each)",
                "processing (jobs/s): durable off / ahead / on",
                _fmt(rates["plain"], 0),
                f"{_fmt(rates['off'], 0)} / {_fmt(rates['ahead'], 0)} / {_fmt(rates['on'], 0)}",
                "-",
                f"{figures['ratio_off']:.2f}x / {figures['ratio_ahead']:.2f}x / "
                f"{figures['ratio_on']:.2f}x",
            ]
        )
        cpu = figures["cpu_ms"]
        out.append(
            [
                f"22. claims ahead, {ahead['jobs']:,} jobs, {shape} ({ahead['runs']} runs each)",
                "worker CPU (ms/job): durable off / ahead / on",
                _fmt(cpu["plain"], 3),
                f"{_fmt(cpu['off'], 3)} / {_fmt(cpu['ahead'], 3)} / {_fmt(cpu['on'], 3)}",
                "-",
                f"{cpu['off'] / cpu['plain']:.2f}x / {cpu['ahead'] / cpu['plain']:.2f}x / "
                f"{cpu['on'] / cpu['plain']:.2f}x",
            ]
        )
    trips = ahead["trips_per_job"]

    def in_workers(variant: str) -> float:
        return sum(v for k, v in trips[variant].items() if k.startswith("worker:"))

    out.append(
        [
            f"22. claims ahead, {ahead['jobs']:,} jobs, 1x8 (counted run)",
            "blocking calls/job in worker threads: durable off / ahead / on",
            _fmt(in_workers("plain"), 2),
            f"{_fmt(in_workers('off'), 2)} / {_fmt(in_workers('ahead'), 2)} / "
            f"{_fmt(in_workers('on'), 2)}",
            "-",
            "-",
        ]
    )
    return out


def _figure_rows(scenario: str, cells: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Rows of a scenario run once, by pypepper alone: a label and its figures, no ratio."""
    return [[scenario, label, "-", cell, "-", "-"] for label, cell in cells]


#: The two costs a scenario that compares a feature off and on reports against plain
#: Dramatiq: its key in the scenario's figures, and its label.
AGAINST_PLAIN_COSTS = (
    ("enqueue_us_per_job", "enqueue cost (us/job)"),
    ("process_rate", "processing (jobs/s)"),
)


def _against_plain_rows(
    scenario: str, figures: dict[str, Any], off: tuple[str, str], on: tuple[str, str], heading: str
) -> list[list[str]]:
    """A feature's costs off and on, each against plain Dramatiq (scenarios 16 and 17).

    ``off`` and ``on`` are each the key of a run in ``figures`` and the word for it in
    the ratios; ``heading`` names the two runs after each cost's label.
    """
    (off_key, off_word), (on_key, on_word) = off, on
    out: list[list[str]] = []
    for key, label in AGAINST_PLAIN_COSTS:
        plain, before, after = figures["plain"][key], figures[off_key][key], figures[on_key][key]
        out.append(
            [
                scenario,
                f"{label}: {heading}",
                _fmt(plain),
                f"{_fmt(before)} / {_fmt(after)}",
                "-",
                f"{on_word} / {off_word} {after / before:.2f}; "
                f"{on_word} / plain {after / plain:.2f}",
            ]
        )
    return out


#: Scenario 18's per-job figures, summed over the enqueue and processing phases, and
#: whether durable / plain means something (plain Dramatiq never reaches PostgreSQL).
CEILING_COSTS = (
    ("rate", "jobs/s in the 10-90 % window", True),
    ("pg_cpu_us", "PG CPU (us/job)", False),
    ("pg_exec_us", "PG pg_stat_statements exec time (us/job)", False),
    ("pg_plan_us", "PG pg_stat_statements planning time (us/job)", False),
    ("pg_calls", "PG statements/job", False),
    ("wal_bytes", "WAL (bytes/job)", False),
    ("redis_cpu_us", "Redis CPU (us/job)", True),
    ("redis_commands", "Redis commands/job", True),
    ("worker_cpu_us", "worker CPU (us/job)", True),
    ("per_pg_core", "projected jobs/s per PG core", False),
    ("per_redis_core", "projected jobs/s per Redis core", True),
)


#: Who kept the cores busy in scenario 18's window (harness: this process and the probe Redis).
CEILING_PARTIES = ("pg", "redis", "worker", "harness", "others", "machine")


def _ceiling_rows(ceiling: dict[str, Any] | None) -> list[list[str]]:
    """Scenario 18: costs per job, the projection, and the cores each party kept busy."""
    if not ceiling:
        return []
    out: list[list[str]] = []
    for shape, by_name in ceiling["shapes"].items():
        scenario = f"18. ceiling {shape}, {ceiling['jobs']:,} jobs"
        for key, label, compared in CEILING_COSTS:
            values = {n: v[key] for n, v in by_name.items()}
            cells = [_fmt(values.get(n)) for n in NAMES]
            ratio = _ratio(values.get("durable"), values.get("plain")) if compared else "-"
            out.append([scenario, label, *cells, ratio])
        split = {
            n: f"{_fmt(v['pg_cpu_us_enqueue'])} + {_fmt(v['pg_cpu_us_process'])}"
            for n, v in by_name.items()
        }
        parts = {
            n: f"{_fmt(v['pg_clients_us'])} / {_fmt(v['pg_exited_us'])}" for n, v in by_name.items()
        }
        busy = {
            n: " / ".join(f"{v[f'{k}_cores']:.2f}" for k in CEILING_PARTIES)
            for n, v in by_name.items()
        }
        for label, cells in (
            ("PG CPU (us/job): enqueue + processing", split),
            ("PG CPU (us/job): of it client backends / exited processes", parts),
            ("cores busy: " + " / ".join(CEILING_PARTIES), busy),
        ):
            out.append([scenario, label, *(cells.get(n, "-") for n in NAMES), "-"])
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def check(name: str, value: float | None, limit: float, op: str) -> None:
        if value is None or value != value:
            return
        met = {">=": value >= limit, "<=": value <= limit, "<": value < limit}[op]
        found.append(
            {"target": name, "value": round(value, 3), "bound": f"{op} {limit:g}", "met": met}
        )

    for shape, by_name in results.get("throughput", {}).items():
        if "plain" in by_name and "durable" in by_name:
            check(
                f"durable processing / plain ({shape})",
                by_name["durable"]["process_rate"] / by_name["plain"]["process_rate"],
                0.6,
                ">=",
            )
        if "celery" in by_name and "durable" in by_name:
            check(
                f"durable processing / Celery ({shape})",
                by_name["durable"]["process_rate"] / by_name["celery"]["process_rate"],
                3,
                ">=",
            )
    first = next(iter(results.get("throughput", {}).values()), {})
    if "plain" in first and "durable" in first:
        check(
            "schedule cost / plain actor.send()",
            first["durable"]["enqueue_us_per_job"] / first["plain"]["enqueue_us_per_job"],
            3,
            "<=",
        )
    if "plain" in first and "batch_enqueue_us_per_job" in first.get("durable", {}):
        check(
            "schedule_many cost per job / plain actor.send()",
            first["durable"]["batch_enqueue_us_per_job"] / first["plain"]["enqueue_us_per_job"],
            1,
            "<=",
        )
    length = results.get("workflow_length", {})
    if "1" in length and "10" in length:
        check(
            "10-task job cost / 1-task job cost",
            length["10"]["ms_per_job"] / length["1"]["ms_per_job"],
            8,
            "<=",
        )
    held = results.get("delayed", {})
    counts = sorted(held, key=int)
    if len(counts) == 2:
        small, big = (held[c] for c in counts)
        check(
            f"delayed: worker RSS, {int(counts[1]):,} / {int(counts[0]):,} waiting",
            big["worker_rss_waiting"] / small["worker_rss_waiting"],
            1.2,
            "<",
        )
        check(
            f"delayed: Redis memory, {int(counts[1]):,} / {int(counts[0]):,} waiting",
            big["redis_bytes_waiting"] / small["redis_bytes_waiting"],
            1.5,
            "<",
        )
    rec = results.get("recurring")
    if rec:
        check("recurring: slots missed", rec["slots_missed"], 0, "<=")
        check("recurring: max firings per slot", rec["max_firings_per_slot"], 1, "<=")
        check("recurring: max runs per job", rec["max_runs_per_job"], 1, "<=")
    pur = results.get("purge")
    if pur and pur["rate_same_window_without"]:
        check(
            "purge: worker jobs/s while purging / without",
            pur["rate_during_purge"] / pur["rate_same_window_without"],
            0.8,
            ">=",
        )
    waited = results.get("wait")
    if waited:
        check(
            "wait: job end -> wait() returned p99 (ms, at once)",
            waited["at_once"]["p99_ms"],
            1000,
            "<=",
        )
    board = results.get("dashboard")
    if board:
        for label in ("first page", "status + channel"):
            check(
                f"dashboard: {label}, first byte p99 (ms)",
                board["pages"][label]["p99_ms"],
                100,
                "<",
            )
    met = results.get("metrics")
    if met:
        check("metrics: processing rate on / off", met["ratio"], 0.95, ">=")
    backlog = results.get("backlog", {})
    sizes = sorted(backlog, key=int)
    if len(sizes) == 2 and all("durable" in backlog[s] for s in sizes):
        small, big = (backlog[s]["durable"]["worker_peak_rss"] for s in sizes)
        check(f"worker RSS, {int(sizes[1]):,} / {int(sizes[0]):,} waiting", big / small, 1.2, "<")
    return found


def markdown(table: list[list[str]], checks: list[dict[str, Any]]) -> str:
    head = ["scenario", "metric", "plain Dramatiq", "durable", "Celery", "durable / plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    lines += ["", "| target | measured | bound | |", "|---|---|---|---|"]
    lines += [
        f"| {c['target']} | {c['value']:g} | {c['bound']} | {'met' if c['met'] else 'MISSED'} |"
        for c in checks
    ]
    return "\n".join(lines)


def write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
