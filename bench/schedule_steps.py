"""``python -m bench.schedule_steps``: what one ``Job.scheduled()`` costs, step by step.

Not a scenario: a measuring tool for the single-``scheduled()`` row of scenario 1. On
the benchmark's throwaway servers, in this process, alternately: ``actor.send()`` of
plain Dramatiq, ``Job.scheduled()`` of a one-task job (its construction included, as
in scenario 1) and ``schedule_many`` (100 jobs a call); then the steps of
``scheduled()``, each timed where it is called (the wall and the CPU time of this
process), as microseconds per job. Wall times move with the machine's load; the CPU
times are the steadier figures.

    python -m bench.schedule_steps [--jobs 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .env import Stack

#: The label of the statement of ``store.put`` (a dict cursor's ``_run`` before, a
#: counting cursor's ``_count`` since).
_STATEMENT = "of which the statement"
#: The steps timed: (owner's module, owner's name or "", attribute, label).
STEPS = (
    ("bench.apps.durable", "", "job", "build the Job (one task)"),
    ("pypepper_dramatiq.model.job", "Job", "scheduled", "Job.scheduled(), all of it"),
    ("pypepper_dramatiq.engine.job_io", "", "check_job_record", "check the row's user values"),
    ("pypepper_dramatiq.model.job", "Job", "to_record", "Job.to_record() (every call)"),
    ("pypepper_dramatiq.channels.channel", "Channel", "prepare", "the first message, encoded"),
    ("pypepper_dramatiq.transport.redis.gate", "", "run_offers", "Redis: admit and enqueue"),
    ("pypepper_dramatiq.channels.channel", "Channel", "sent", "after the enqueue"),
    ("pypepper_dramatiq.stores.sql.postgres", "PostgresJobStore", "put", "PostgreSQL: store.put"),
    ("pypepper_dramatiq.stores.sql.postgres", "PostgresJobStore", "_run", _STATEMENT),
    ("pypepper_dramatiq.stores.sql.postgres", "PostgresJobStore", "_count", _STATEMENT),
)


def _timed(totals: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[0] += 1
            totals[1] += time.perf_counter() - wall
            totals[2] += time.process_time() - cpu

    return timed


def _wrap_steps() -> dict[str, list[float]]:
    """Wrap each step found in this tree; its label -> [calls, wall s, CPU s]."""
    import importlib

    totals: dict[str, list[float]] = {}
    for module_name, owner_name, attribute, label in STEPS:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        if not hasattr(owner, attribute):
            continue  # a step this tree does not have
        totals.setdefault(label, [0, 0.0, 0.0])  # a step some trees name otherwise
        setattr(owner, attribute, _timed(totals[label], getattr(owner, attribute)))
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.schedule_steps", description=__doc__)
    parser.add_argument("--jobs", type=int, default=300, help="jobs per measure and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    stack = Stack()
    stack.start()
    try:
        _measure(stack, args.jobs, args.rounds)
    finally:
        stack.stop()


def _measure(stack: Stack, jobs: int, rounds: int) -> None:
    from pypepper_dramatiq import schedule_many

    from .apps import durable, plain

    def send() -> None:
        for _ in range(jobs):
            plain.noop.send(None)

    def scheduled() -> None:
        for _ in range(jobs):
            durable.job(1, None).scheduled()

    def many() -> None:
        for first in range(0, jobs, 100):
            schedule_many([durable.job(1) for _ in range(min(100, jobs - first))])

    ways = {"actor.send()": send, "Job.scheduled()": scheduled, "schedule_many, a job": many}
    for way in ways.values():
        way()  # connections opened, scripts loaded
    figures: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rep in range(rounds):
        stack.reset()
        names = list(ways)
        for name in names[rep % 3 :] + names[: rep % 3]:
            wall, cpu = time.perf_counter(), time.process_time()
            ways[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            figures[name].append((wall / jobs * 1e6, cpu / jobs * 1e6))
    send_wall = [w for w, _ in figures["actor.send()"]]
    print(f"{'measure':24s} {'wall us':>8s} {'CPU us':>7s} {'/ send (wall, each round)':>28s}")
    for name, runs in figures.items():
        ratios = ", ".join(f"{w / s:.2f}" for (w, _), s in zip(runs, send_wall, strict=True))
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:24s} {wall:8.0f} {cpu:7.0f}   {ratios}")
    totals = _wrap_steps()
    stack.reset()
    scheduled()
    print(f"\n{'step of scheduled()':32s} {'calls':>5s} {'wall us':>8s} {'CPU us':>7s}")
    for label, (calls, wall, cpu) in totals.items():
        print(f"{label:32s} {calls / jobs:5.1f} {wall / jobs * 1e6:8.1f} {cpu / jobs * 1e6:7.1f}")


if __name__ == "__main__":
    main()
