"""The worker processes a job store knows of: their heartbeat rows, and the steps each runs.

Every ``dramatiq`` worker process running our middleware keeps one row in the
job store (``scheduler_workers`` on PostgreSQL and MySQL), written by its lease
keeper thread once per heartbeat (:func:`heartbeat_seconds`: every
:data:`HEARTBEAT_SECONDS`, or the lease renewal interval when that is longer),
never by a step. A worker that stops cleanly (SIGTERM) deletes its row; one that
dies (SIGKILL, a lost machine) leaves it behind, and the listing calls it gone
once :data:`GONE_AFTER_BEATS` heartbeats were missed. Rows not refreshed for
:data:`FORGET_AFTER_SECONDS` are no longer listed, and the workers' keepers
delete them.

The steps a worker runs now are the InProgress jobs whose lease it holds
(``lease_owner`` is its :attr:`WorkerInfo.owner`), at their cursor
(:class:`RunningStep`). Part of the model: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .record import JobRecord, as_utc

#: The shortest time between two heartbeat writes of one worker process.
HEARTBEAT_SECONDS = 5.0
#: A worker whose row was not refreshed for this many of its heartbeats is gone.
GONE_AFTER_BEATS = 3
#: A row not refreshed for this long (an hour) is no longer listed, and is deleted.
FORGET_AFTER_SECONDS = 3600.0
#: How often each worker's keeper deletes the rows older than that (ten minutes).
PRUNE_SECONDS = 600.0
#: Longest owner id the stores keep (the width of the jobs' ``lease_owner``).
MAX_OWNER_LENGTH = 128
#: What the listing says of a worker.
LIVE, GONE = "live", "gone"


def heartbeat_seconds(renewal_interval: float) -> float:
    """How often a worker whose leases are renewed every ``renewal_interval`` seconds
    writes its row: :data:`HEARTBEAT_SECONDS`, or that interval when it is longer."""
    return max(HEARTBEAT_SECONDS, renewal_interval)


def forget_before(now: datetime) -> datetime:
    """Rows last seen before this are no longer listed (and may be deleted)."""
    return as_utc(now) - timedelta(seconds=FORGET_AFTER_SECONDS)


#: Longest error text a worker row keeps of one failing sweep duty, in characters.
SWEEP_ERROR_LIMIT = 500


@dataclass(frozen=True)
class DutyFailure:
    """One duty of the recovery sweep that fails now (its latest pass raised, or
    skipped rows), as the sweeping process reports it."""

    duty: str
    #: The latest error (``Type: message``, or the latest row skipped), cut to
    #: :data:`SWEEP_ERROR_LIMIT` characters. Raw text: escape it to show it.
    error: str
    #: When it began to fail (the sweeper's clock).
    since: datetime
    #: Failures since then (passes that raised, rows skipped).
    failures: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "since", as_utc(self.since))
        object.__setattr__(self, "error", str(self.error)[:SWEEP_ERROR_LIMIT])

    def to_dict(self) -> dict[str, Any]:
        return {
            "duty": self.duty,
            "error": self.error,
            "since": self.since.isoformat(),
            "failures": self.failures,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DutyFailure:
        return cls(
            duty=str(data["duty"]),
            error=str(data.get("error") or ""),
            since=datetime.fromisoformat(str(data["since"])),
            failures=int(data.get("failures") or 1),
        )


@dataclass(frozen=True)
class SweepHealth:
    """The recovery sweep as one worker process runs it, written with its heartbeat."""

    #: Whether it held the sweep's lock at its latest tick (one process leads at a time).
    leading: bool
    #: When its latest full pass ended (every duty tried); None: none yet.
    last_full_pass: datetime | None = None
    #: The duties failing now, by name.
    failing: tuple[DutyFailure, ...] = ()

    def __post_init__(self) -> None:
        if self.last_full_pass is not None:
            object.__setattr__(self, "last_full_pass", as_utc(self.last_full_pass))
        object.__setattr__(
            self, "failing", tuple(sorted(self.failing, key=lambda failure: failure.duty))
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``sweep`` column of the workers' rows)."""
        return {
            "leading": self.leading,
            "last_full_pass": (
                None if self.last_full_pass is None else self.last_full_pass.isoformat()
            ),
            "failing": [failure.to_dict() for failure in self.failing],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SweepHealth | None:
        """The health :meth:`to_dict` wrote; None for none, or for a value that is
        not one (a row is shown without it rather than not at all)."""
        if not isinstance(data, Mapping):
            return None
        try:
            last = data.get("last_full_pass")
            return cls(
                leading=bool(data.get("leading")),
                last_full_pass=None if last is None else datetime.fromisoformat(str(last)),
                failing=tuple(DutyFailure.from_dict(item) for item in data.get("failing") or ()),
            )
        except (KeyError, TypeError, ValueError):
            return None


def sweep_leader(workers: Iterable[WorkerInfo], now: datetime) -> WorkerInfo | None:
    """The live worker that leads the recovery sweep, as the rows say: among those that
    said they led at their latest heartbeat, the one whose latest full pass is the
    latest (two may say so for a heartbeat while the lock moves)."""
    leading = [w for w in workers if w.sweep is not None and w.sweep.leading and not w.gone(now)]
    if not leading:
        return None
    return max(leading, key=lambda w: (_latest_pass(w), w.last_seen))


def _latest_pass(worker: WorkerInfo) -> float:
    last = worker.sweep.last_full_pass if worker.sweep is not None else None
    return 0.0 if last is None else last.timestamp()


@dataclass(frozen=True)
class WorkerInfo:
    """One worker process, as its row stores it.

    ``owner`` is the lease owner id the process writes into the rows of the
    steps it holds (``host:pid:random``); ``heartbeat`` the seconds between two
    writes of this row, which decide when the listing calls it gone.
    """

    owner: str
    host: str
    pid: int
    #: When the process began to serve (its first heartbeat).
    started: datetime
    #: Its latest heartbeat, on its own clock.
    last_seen: datetime
    heartbeat: float = HEARTBEAT_SECONDS
    #: The channels (Dramatiq queues) declared in the process.
    channels: tuple[str, ...] = ()
    #: The Dramatiq version it runs.
    dramatiq_version: str | None = None
    #: Its recovery sweep's health (None: a worker that writes none, an older release).
    sweep: SweepHealth | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not 0 < len(self.owner) <= MAX_OWNER_LENGTH:
            raise ValueError(
                f"a worker's owner id needs 1 to {MAX_OWNER_LENGTH} characters, got {self.owner!r}"
            )
        if not self.heartbeat > 0:
            raise ValueError(f"a worker's heartbeat must be > 0 seconds, got {self.heartbeat!r}")
        object.__setattr__(self, "started", as_utc(self.started))
        object.__setattr__(self, "last_seen", as_utc(self.last_seen))
        object.__setattr__(self, "channels", tuple(self.channels))

    def gone(self, now: datetime) -> bool:
        """Whether :data:`GONE_AFTER_BEATS` heartbeats were missed by ``now``."""
        silence = (as_utc(now) - self.last_seen).total_seconds()
        return silence > GONE_AFTER_BEATS * self.heartbeat

    def state(self, now: datetime) -> str:
        """:data:`LIVE` or :data:`GONE` at ``now``."""
        return GONE if self.gone(now) else LIVE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``pypepper-dramatiq workers --json``)."""
        return {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "started": self.started.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "heartbeat": self.heartbeat,
            "channels": list(self.channels),
            "dramatiq_version": self.dramatiq_version,
            "sweep": None if self.sweep is None else self.sweep.to_dict(),
        }


@dataclass(frozen=True)
class RunningStep:
    """A step a worker holds now: an InProgress job leased to it, at its cursor."""

    job_id: str
    channel_id: str
    category: str | None
    #: The position ``"workflow.task"`` and the task's name (None: not in the payload).
    key: str | None
    task: str | None
    #: Round and attempt, counted from 0 as the cursor does.
    round: int | None
    attempt: int | None
    #: The job's latest write: for a running step, when it was claimed.
    since: datetime
    #: Until when the lease holds unless renewed.
    lease_expires: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "channel_id": self.channel_id,
            "category": self.category,
            "key": self.key,
            "task": self.task,
            "round": self.round,
            "attempt": self.attempt,
            "since": self.since.isoformat(),
            "lease_expires": None if self.lease_expires is None else self.lease_expires.isoformat(),
        }


def running_step(record: JobRecord) -> RunningStep:
    """What ``record`` (an InProgress row) runs now, read from its cursor and payload."""
    cursor = _cursor(record.state.get("cursor"))
    key = task = None
    round_ = attempt = None
    if cursor is not None:
        workflow, index, round_, attempt = cursor
        key = f"{workflow}.{index}"
        task = _task_name(record.payload, workflow, index)
    return RunningStep(
        job_id=record.id,
        channel_id=record.channel_id,
        category=record.category,
        key=key,
        task=task,
        round=round_,
        attempt=attempt,
        since=record.updated,
        lease_expires=record.lease_expires,
    )


def steps_by_owner(records: Iterable[JobRecord]) -> dict[str, list[RunningStep]]:
    """The steps of ``records`` by lease owner (rows without one are left out), each
    owner's by job id."""
    found: dict[str, list[RunningStep]] = {}
    for record in sorted(records, key=lambda r: r.id):
        if record.lease_owner is not None:
            found.setdefault(record.lease_owner, []).append(running_step(record))
    return found


@dataclass(frozen=True)
class ListedWorker:
    """A worker as the listings show it at one instant: its row, live or gone, and the
    steps it holds."""

    worker: WorkerInfo
    #: :data:`LIVE` or :data:`GONE`.
    state: str
    #: Seconds since its latest heartbeat (on the reader's clock against the worker's).
    silent_for: float
    steps: tuple[RunningStep, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the row's fields, ``state``, ``silent_for`` and ``steps``."""
        return {
            **self.worker.to_dict(),
            "state": self.state,
            "silent_for": round(self.silent_for, 3),
            "steps": [step.to_dict() for step in self.steps],
        }


def listing(
    workers: Iterable[WorkerInfo], held: Iterable[JobRecord], now: datetime
) -> list[ListedWorker]:
    """The workers page and command: each worker row listed at ``now`` with the steps
    of ``held`` (the InProgress jobs leased to them, ``IJobStore.held_by``)."""
    steps = steps_by_owner(held)
    now = as_utc(now)
    return [
        ListedWorker(
            worker=w,
            state=w.state(now),
            silent_for=max(0.0, (now - w.last_seen).total_seconds()),
            steps=tuple(steps.get(w.owner, ())),
        )
        for w in listed(workers, now)
    ]


def listed(workers: Iterable[WorkerInfo], now: datetime) -> list[WorkerInfo]:
    """The rows a listing shows at ``now`` (seen within :data:`FORGET_AFTER_SECONDS`),
    by host, pid and owner: the order every store answers in."""
    cutoff = forget_before(now)
    return sorted(
        (w for w in workers if w.last_seen >= cutoff), key=lambda w: (w.host, w.pid, w.owner)
    )


def _cursor(value: Any) -> tuple[int, int, int, int] | None:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 4:
        return None
    try:
        workflow, task, round_, attempt = (int(v) for v in value)
    except (TypeError, ValueError):
        return None
    return workflow, task, round_, attempt


def _task_name(payload: Mapping[str, Any] | None, workflow: int, task: int) -> str | None:
    """The name of task ``task`` of workflow ``workflow`` in a stored payload, if there."""
    if workflow < 0 or task < 0:
        return None
    try:
        name = (payload or {})["workflows"][workflow]["tasks"][task]["name"]
    except (KeyError, IndexError, TypeError):
        return None
    return name if isinstance(name, str) else None
