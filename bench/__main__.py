"""``python -m bench all [--quick]``: run the scenarios, print the table, write the JSON."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
import time
from pathlib import Path

from . import report
from .env import ROOT, Stack
from .harness import LIVE, LOGS
from .scenarios import FULL, QUICK, run_all

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "which", nargs="+", choices=("all", *SCENARIOS), help="'all', or scenario names"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (about 90 s for all)")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "latest.json"))
    parser.add_argument(
        "--backlog",
        type=int,
        metavar="N",
        help="the large backlog of scenario 4 (the issue's figure: 100000)",
    )
    args = parser.parse_args(argv)
    only = None if "all" in args.which else set(args.which)
    sizes = QUICK if args.quick else FULL
    if args.backlog:
        sizes = dataclasses.replace(sizes, backlog=(sizes.backlog[0], args.backlog))
    started = time.perf_counter()
    # A SIGTERM (tox, CI, timeout) unwinds like Ctrl-C, so workers and servers stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shutil.rmtree(LOGS, ignore_errors=True)
    stack = Stack()
    try:
        stack.start()
        results = run_all(stack, sizes, only)
    finally:
        for worker in list(LIVE):
            worker.stop()
        stack.stop()
    elapsed = time.perf_counter() - started
    table, checks = report.rows(results), report.targets(results)
    text = report.markdown(table, checks)
    print()
    print(text)
    print(f"\n{'quick' if args.quick else 'full'} run, {elapsed:.0f}s")
    report.write(
        Path(args.output),
        {
            "mode": "quick" if args.quick else "full",
            "seconds": round(elapsed, 1),
            "machine": report.machine(),
            "sizes": dataclasses.asdict(sizes),
            "results": results,
            "targets": checks,
            "table": text,
        },
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
