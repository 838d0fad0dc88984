"""What the chaos test plans for each job it submits (shared by ``test_chaos`` and
``chaos_seed002``, so that the scenarios of both go through the same checks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pypepper_dramatiq import Job, Status


def report(title: str, **figures: object) -> None:
    """Print one line of figures (visible with ``pytest -s``)."""
    print(f"\n[{title}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


@dataclass
class Planned:
    """One submitted job and what must become of it."""

    kind: str
    job: Job
    names: tuple[str, ...]
    expected: Status
    #: Exact expected ``state["results"]`` (None: not checked, e.g. cancelled jobs).
    results: dict[str, Any] | None
    #: Task names that must never run.
    never: tuple[str, ...] = ()
    #: Task keys expected in ``state["skipped"]``.
    skipped: tuple[str, ...] = ()
    #: "running": cancel once it runs; "queued": cancel right after submitting.
    cancel: str | None = None
    submitted_at: float = 0.0
    cancelled_at: float | None = None
