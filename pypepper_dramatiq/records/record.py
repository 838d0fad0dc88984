"""The job record: one row per job, the stored form of a :class:`~pypepper_dramatiq.model.job.Job`.

Part of the model: the job, the stores and the messages all speak it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from ..errors import AmbiguousTaskNameError, NoTaskResultError
from ..limits.storable import ID_LENGTH, check_text
from ..rules.status import Status
from ..rules.waits import Waits, describe
from .pauses import held_for_pause
from .progress import ENTRY_FIELDS, PROGRESS_KEY
from .spec import TaskSpec

#: Longest job id the stores accept.
MAX_ID_LENGTH = ID_LENGTH


def check_job_id(job_id: object, field: str = "job id") -> str:
    """``job_id`` if it is a string of 1 to :data:`MAX_ID_LENGTH` characters a row can
    hold, else ValueError (naming ``field``)."""
    if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_ID_LENGTH:
        raise ValueError(f"a {field} needs 1 to {MAX_ID_LENGTH} characters, got {job_id!r}")
    return check_text(field, job_id)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime; naive values are taken as UTC."""
    if value.tzinfo is timezone.utc:  # the common case, e.g. utcnow(): no new object
        return value
    return (
        value.replace(tzinfo=timezone.utc)
        if value.tzinfo is None
        else value.astimezone(timezone.utc)
    )


@dataclass(frozen=True)
class JobRecord:
    """A snapshot of one job, as stored.

    ``version`` is the version the writer last saw (0 for a job never stored);
    a store accepts a write only if it still holds that version, and then
    stores ``version + 1``.
    """

    id: str
    channel_id: str = "default"
    category: str | None = None
    status: Status = Status.UNKNOWN
    version: int = 0
    created: datetime = field(default_factory=utcnow)
    updated: datetime = field(default_factory=utcnow)
    #: The workflows as JSON when every task has an ``executor_id``; else None.
    payload: dict[str, Any] | None = None
    #: Progress of a distributed run: cursor, task results, attempts.
    state: dict[str, Any] = field(default_factory=dict)
    #: The last error, as ``Type: message``.
    error: str | None = None
    #: The worker process holding the current step (None: free, or dispatched).
    lease_owner: str | None = None
    #: When the current step may be handed to another worker, unless renewed.
    lease_expires: datetime | None = None
    #: The planned start: no step is claimed before it (None: at once).
    not_before: datetime | None = None
    #: A job held in the store (a long delay): when its first message is due to
    #: be sent by the recovery sweep (None: its message was sent).
    release_at: datetime | None = None
    #: The latest permitted start; a Scheduled job past it is cancelled (None: none).
    start_deadline: datetime | None = None
    #: The unique key this job holds while Scheduled or InProgress (None: none).
    unique_key: str | None = None
    #: What a Scheduled job waits for besides time (:class:`~pypepper_dramatiq.rules.waits.Waits`
    #: as a dict: parents, a key holder); None once the wait is settled.
    waits: dict[str, Any] | None = None
    #: Since when the job waits (set exactly while it is Scheduled with ``waits``).
    waiting_since: datetime | None = None
    #: Why the stored row could not be read (a listing's placeholder for a damaged
    #: row: the column and what is wrong; the other fields hold what could be read).
    #: None for every row a store reads whole. Never stored; nothing acts on such a
    #: record but to show it or skip it.
    damaged: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_job_id(self.id)
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "created", as_utc(self.created))
        object.__setattr__(self, "updated", as_utc(self.updated))
        for name in _OPTIONAL_TIMES:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_utc(value))
        # Only a job not yet started waits: any later status ends the wait's
        # index entry (the row keeps ``waits`` to show what it waited for).
        if self.waits is None or self.status.rank > Status.SCHEDULED.rank:
            object.__setattr__(self, "waiting_since", None)
        elif self.waiting_since is None:
            object.__setattr__(self, "waiting_since", self.created)

    def evolve(self, **changes: Any) -> JobRecord:
        return replace(self, **changes)

    def keep_payload_text(self, text: str) -> None:
        """Keep ``text``, the JSON text of this record's payload as its check made it,
        for the store to write (see :meth:`payload_text`): encoded once per job."""
        self.__dict__[_PAYLOAD_TEXT] = (self.payload, text)

    def payload_text(self) -> str | None:
        """The JSON text kept by :meth:`keep_payload_text` while this record holds the
        payload it was made of; else None (the store encodes the payload itself).

        A copy that replaces the payload (``evolve``) does not hold the text; one that
        keeps it (:meth:`with_state`, :meth:`scheduled_copy`) does. A record is a
        snapshot: its payload is never changed in place.
        """
        kept = self.__dict__.get(_PAYLOAD_TEXT)
        if kept is None or kept[0] is not self.payload:
            return None
        text: str = kept[1]
        return text

    def with_state(self, state: dict[str, Any]) -> JobRecord:
        """This record with ``state`` in place of its own.

        ``evolve(state=...)`` without its checks, which no field depends on the
        state for: a copy of the fields as they are (scheduling does one per job).
        """
        changed = object.__new__(type(self))
        changed.__dict__.update(self.__dict__)
        changed.__dict__["state"] = state
        return changed

    def scheduled_copy(
        self,
        status: Status,
        updated: datetime,
        state: dict[str, Any],
        *,
        not_before: datetime | None = None,
        release_at: datetime | None = None,
        start_deadline: datetime | None = None,
    ) -> JobRecord:
        """This record as its job is sent and stored by ``scheduled()`` or
        ``schedule_many``: with ``status``, written at ``updated`` (aware UTC), with
        ``state`` and the given planned start, release and deadline (aware UTC).

        ``evolve(...)`` without its checks, which this record passed when it was made
        a moment before (checked before anything is done): a copy of the fields,
        about 1 us against 10 for the job's record made again.
        """
        changed = object.__new__(type(self))
        changed.__dict__.update(self.__dict__)
        changed.__dict__.update(
            status=status,
            updated=updated,
            state=state,
            not_before=not_before,
            release_at=release_at,
            start_deadline=start_deadline,
        )
        return changed

    def waiting_for(self, now: datetime | None = None) -> list[str]:
        """What this job waits for before it may start, in words (empty unless Scheduled)."""
        if self.status is not Status.SCHEDULED:
            return []
        now = now or utcnow()
        reasons: list[str] = []
        if self.not_before is not None and self.not_before > now:
            reasons.append(f"its planned start at {self.not_before.isoformat()}")
        if self.waits is not None:
            reasons.append(describe(Waits.from_dict(self.waits)))
        if held_for_pause(self.release_at):
            reasons.append("a resume: its channel or first task is paused")
        elif self.release_at is not None and not reasons:
            reasons.append(f"its message, sent by the sweep at {self.release_at.isoformat()}")
        if self.start_deadline is not None:
            reasons.append(f"(cancelled if not started by {self.start_deadline.isoformat()})")
        return reasons or ["a free worker (its message is queued)"]

    # -- results by task name -----------------------------------------------------------
    #
    # The state keeps results by position ("workflow.task": ``state["results"]["0.1"]``),
    # which stays right when names repeat; the accessors below map the names of
    # ``payload["workflows"][w]["tasks"][t]["name"]`` onto those positions.

    def task_names(self) -> list[list[str]]:
        """The task names of each workflow, from the payload.

        Raises:
            NoTaskResultError: the record holds no workflows (``payload`` is None).
        """
        if self.payload is None:
            raise NoTaskResultError(
                f"job {self.id} was stored without its workflows (a task has no "
                "executor_id), so its results cannot be looked up by task name"
            )
        return [
            [TaskSpec.from_dict(task).name for task in workflow.get("tasks", [])]
            for workflow in self.payload.get("workflows", [])
        ]

    def positions_of(self, name: str, workflow: int | None = None) -> list[tuple[int, int]]:
        """Where the tasks named ``name`` are, as ``(workflow, task)`` in job order: the
        one mapping of task names to positions (:meth:`result` and retries read it).

        Args:
            name: the task's name.
            workflow: look in this workflow only.

        Raises:
            NoTaskResultError: the job has no workflow ``workflow``, or the record
                holds no workflows (``payload`` is None).
        """
        names = self.task_names()
        if workflow is not None and not 0 <= workflow < len(names):
            raise NoTaskResultError(
                f"job {self.id} has no workflow {workflow} (it has {len(names)})"
            )
        return [
            (w, t)
            for w, tasks in enumerate(names)
            if workflow is None or w == workflow
            for t, task_name in enumerate(tasks)
            if task_name == name
        ]

    def result(self, name: str, workflow: int | None = None) -> Any:
        """The stored result of the task named ``name``.

        Args:
            name: the task's name.
            workflow: the index of its workflow in the job; needed only when
                tasks of several workflows have this name.

        Returns:
            What the task returned (as JSON stored it), possibly None.

        Raises:
            AmbiguousTaskNameError: (a ``LookupError``) ``name`` names tasks of
                several workflows and ``workflow`` is not given, or several
                tasks of the same workflow; the message names their positions.
            NoTaskResultError: (a ``KeyError``) the job has no such task (or no
                such workflow), or the task has not produced a result (not run
                yet, failed, or skipped: the message says which); also when the
                record holds no workflows (``payload`` is None).
        """
        found = self.positions_of(name, workflow)
        where = f"job {self.id}" if workflow is None else f"workflow {workflow} of job {self.id}"
        if not found:
            raise NoTaskResultError(f"{where} has no task named {name!r}")
        if len(found) > 1:
            places = ", ".join(f"{w}.{t}" for w, t in found)
            same_workflow = len({w for w, _ in found}) == 1
            hint = (
                'read record.state["results"] by position'
                if same_workflow
                else "pass workflow= to pick one"
            )
            raise AmbiguousTaskNameError(
                f"task name {name!r} is ambiguous in {where}: tasks {places} "
                f"(workflow.task) have it; {hint}"
            )
        w, t = found[0]
        key = f"{w}.{t}"
        results = self.state.get("results") or {}
        if key in results:
            return results[key]
        task = f"task {name!r} ({key}) of job {self.id}"
        if key in (self.state.get("skipped") or []):
            raise NoTaskResultError(f"{task} has no result: it was skipped (optional, failed)")
        error = (self.state.get("errors") or {}).get(key)
        if error is not None:
            raise NoTaskResultError(f"{task} has not produced a result: it failed ({error})")
        raise NoTaskResultError(f"{task} has not produced a result yet")

    @property
    def progress(self) -> dict[str, dict[str, Any]]:
        """What each task reported last (``context.progress``, ``progress_bar``), by
        task key ``"workflow.task"``: ``task`` (its name), ``done``, ``total``,
        ``failed``, ``note``, ``updated`` (ISO time). Empty when none reported.
        A running task's value is at most about a second old."""
        stored = self.state.get(PROGRESS_KEY) or {}
        return {
            key: {field: entry.get(field) for field in ENTRY_FIELDS}
            for key, entry in stored.items()
            if isinstance(entry, dict)
        }

    def results_by_name(self) -> dict[str, Any]:
        """The stored results, keyed by task name; tasks without a result are left out.

        A name held by one task of the job is the key. A name held by tasks
        of several workflows is never a key on its own (that would hide which
        one it is): each such task is keyed ``"<workflow>.<name>"`` (e.g.
        ``"1.fetch"``), or, if the name also repeats inside its workflow, by
        its position ``"<workflow>.<task>"`` as in ``state["results"]``.

        Raises:
            NoTaskResultError: the record holds no workflows (``payload`` is None).
        """
        names = self.task_names()
        results = self.state.get("results") or {}
        count: dict[str, int] = {}
        per_workflow: dict[tuple[int, str], int] = {}
        for w, tasks in enumerate(names):
            for task_name in tasks:
                count[task_name] = count.get(task_name, 0) + 1
                per_workflow[w, task_name] = per_workflow.get((w, task_name), 0) + 1
        named: dict[str, Any] = {}
        for w, tasks in enumerate(names):
            for t, task_name in enumerate(tasks):
                key = f"{w}.{t}"
                if key not in results:
                    continue
                if count[task_name] == 1:
                    named[task_name] = results[key]
                elif per_workflow[w, task_name] == 1:
                    named[f"{w}.{task_name}"] = results[key]
                else:
                    named[key] = results[key]
        return named

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for messages)."""
        return {
            "id": self.id,
            "channel_id": self.channel_id,
            "category": self.category,
            "status": self.status.value,
            "version": self.version,
            "created": self.created.isoformat(),
            "updated": self.updated.isoformat(),
            "payload": self.payload,
            "state": self.state,
            "error": self.error,
            "lease_owner": self.lease_owner,
            "unique_key": self.unique_key,
            "waits": self.waits,
            **{name: _iso(getattr(self, name)) for name in _OPTIONAL_TIMES},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        return cls(
            id=str(data["id"]),
            channel_id=str(data.get("channel_id") or "default"),
            category=data.get("category"),
            status=Status(data.get("status", Status.UNKNOWN.value)),
            version=int(data.get("version", 0)),
            created=datetime.fromisoformat(data["created"]) if data.get("created") else utcnow(),
            updated=datetime.fromisoformat(data["updated"]) if data.get("updated") else utcnow(),
            payload=data.get("payload"),
            state=dict(data.get("state") or {}),
            error=data.get("error"),
            lease_owner=data.get("lease_owner"),
            unique_key=data.get("unique_key"),
            waits=data.get("waits"),
            lease_expires=_from_iso(data.get("lease_expires")),
            not_before=_from_iso(data.get("not_before")),
            release_at=_from_iso(data.get("release_at")),
            start_deadline=_from_iso(data.get("start_deadline")),
            waiting_since=_from_iso(data.get("waiting_since")),
        )


#: The key, in a record's ``__dict__`` (no field: never compared, copied by
#: ``evolve`` or stored), of its payload and that payload's checked JSON text.
_PAYLOAD_TEXT = "_payload_text"

#: The record's optional times (each a nullable column of the SQL store).
_OPTIONAL_TIMES = (
    "lease_expires",
    "not_before",
    "release_at",
    "start_deadline",
    "waiting_since",
)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _from_iso(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
