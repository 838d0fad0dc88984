"""The messages that carry a job step: ids and positions, never the workflow itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy

from ..errors import MessageError
from ..limits.concurrency import concurrency_key_of
from ..limits.rates import rate_key_of
from ..records.record import JobRecord
from ..records.state import DISPATCH_KEY
from ..rules.priorities import priority_in
from ..rules.steps import Position

__all__ = [
    "DISPATCH_KEY",
    "OPTION_KEY",
    "STEP_ACTOR",
    "StepMessage",
    "dispatch_of",
    "priority_of",
]

#: Actor that runs job steps on Dramatiq workers.
STEP_ACTOR = "pypepper_dramatiq.step"
#: Key of our data in a message's options.
OPTION_KEY = "pypepper"


def dispatch_of(message: dramatiq.Message[Any]) -> dict[str, Any]:
    """What a job row records of the message enqueued for its first step: its
    queue and its id in the broker (Redis's id for this copy, when there is one),
    so that recovery can tell whether the message still exists."""
    return {
        "queue": message.queue_name,
        "message_id": message.options.get("redis_message_id"),
    }


def priority_of(message: dramatiq.Message[Any] | MessageProxy) -> int:
    """The priority of the job a message carries, read from the record it holds without
    decoding it (a message without one, or damaged: the default, decoded later)."""
    data = message.options.get(OPTION_KEY)
    record = data.get("record") if isinstance(data, dict) else None
    return priority_in(record.get("state") if isinstance(record, dict) else None)


@dataclass(frozen=True)
class StepMessage:
    """What a message says: which job, which position, and the record for healing."""

    job_id: str
    position: Position
    #: Present on the first message of a job: the worker heals a missing row from it.
    record: JobRecord | None = None
    #: When a worker first found the step's task unknown (epoch seconds), while
    #: the step waits for a worker that knows it (``unknown_task_grace``).
    unknown_since: float | None = None
    #: The job's rate limit key (``scheduled(rate_key=)``), on every message of its
    #: steps: a worker asks its limit before the claim, without reading the row.
    rate_key: str | None = None
    #: The job's concurrency key (``scheduled(concurrency_key=)``), on every message of
    #: its steps: a worker takes its slot before the claim, without reading the row.
    concurrency_key: str | None = None
    #: How many times a concurrency limit held this step already (its next hold waits
    #: longer: :func:`~pypepper_dramatiq.engine.concurrency.hold_seconds`).
    holds: int = 0
    #: Whether a rate limit told this step a time already (this message comes back at
    #: it): refused again, it keeps its place in line
    #: (:meth:`~pypepper_dramatiq.transport.base.Transport.ask_start`).
    rate_told: bool = False

    @classmethod
    def keyed(
        cls,
        job_id: str,
        position: Position,
        payload: dict[str, Any] | None,
        *,
        unknown_since: float | None = None,
    ) -> StepMessage:
        """A message of a later step of the job whose stored payload is ``payload``:
        it carries the job's rate and concurrency keys."""
        return cls(
            job_id,
            position,
            unknown_since=unknown_since,
            rate_key=rate_key_of(payload),
            concurrency_key=concurrency_key_of(payload),
        )

    @property
    def keys(self) -> tuple[str | None, str | None]:
        """The job's rate limit key and concurrency key, as this message names them or
        its job's record does (a first message carries the record)."""
        if self.record is None:
            return self.rate_key, self.concurrency_key
        payload = self.record.payload
        return (
            self.rate_key if self.rate_key is not None else rate_key_of(payload),
            self.concurrency_key
            if self.concurrency_key is not None
            else concurrency_key_of(payload),
        )

    def to_message(
        self, queue_name: str, options: dict[str, Any] | None = None
    ) -> dramatiq.Message[Any]:
        """The Dramatiq message for ``queue_name``, with ``options`` besides ours (a
        broker's own, e.g. :meth:`~pypepper_dramatiq.transport.base.Transport.message_options`)."""
        data: dict[str, Any] = {"job": self.job_id, "pos": self.position.to_list()}
        if self.record is not None:
            data["record"] = self.record.to_dict()
        if self.unknown_since is not None:
            data["unknown_since"] = self.unknown_since
        if self.rate_key is not None:
            data["rk"] = self.rate_key
        if self.concurrency_key is not None:
            data["ck"] = self.concurrency_key
        if self.holds:
            data["hc"] = self.holds
        if self.rate_told:
            data["rt"] = 1
        return dramatiq.Message(
            queue_name=queue_name,
            actor_name=STEP_ACTOR,
            args=(),
            kwargs={},
            options={OPTION_KEY: data, **(options or {})},
        )

    @classmethod
    def from_message(cls, message: dramatiq.Message[Any]) -> StepMessage:
        """Decode; raises :class:`MessageError` naming what is wrong."""
        data = message.options.get(OPTION_KEY)
        if not isinstance(data, dict):
            raise MessageError(f"message {message.message_id} carries no {OPTION_KEY!r} option")
        try:
            record = data.get("record")
            unknown_since = data.get("unknown_since")
            return cls(
                job_id=str(data["job"]),
                position=Position.from_list(data.get("pos") or [0, 0, 0, 0]),
                record=JobRecord.from_dict(record) if record is not None else None,
                unknown_since=None if unknown_since is None else float(unknown_since),
                rate_key=str(data["rk"]) if data.get("rk") is not None else None,
                concurrency_key=str(data["ck"]) if data.get("ck") is not None else None,
                holds=int(data.get("hc") or 0),
                rate_told=bool(data.get("rt")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(
                f"message {message.message_id} has an undecodable job step: {exc!r}"
            ) from exc
