"""The step actor: the one Dramatiq actor that runs every job step, one attempt per message."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, TypeVar

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Interrupt, Shutdown
from dramatiq.middleware.time_limit import TimeLimitExceeded

from ...channels.messages import STEP_ACTOR
from ...engine.running import AttemptTimedOut, InFlight, StepCancelled
from ...engine.step_io import Claim, Outcome
from ...errors import UnknownExecutorError, is_retriable
from ...model.context import (
    CANCEL_EVENT_KEY,
    JOB_ID_KEY,
    PARENT_RESULTS_KEY,
    POSITION_KEY,
    PROGRESS_REPORTER_KEY,
    RESULTS_KEY,
    Context,
)
from ...model.task import Task
from ...ops import observers
from ...ops.logs import get_logger
from ...records import history
from ...records.progress import ProgressReporter
from ...records.record import utcnow

R = TypeVar("R")

logger = get_logger(__name__)

#: What the middleware hands the step actor, per worker thread.
current = threading.local()

#: Marks an attempt cut short by worker shutdown: the step is handed back, not counted.
HANDED_BACK = Outcome(False, error="handed back on worker shutdown")

#: Stands for "nothing returned yet" (None is a result like any other).
_NOTHING: Any = object()


def run_attempt(
    claim: Claim,
    inflight: InFlight,
    reporter: ProgressReporter | None = None,
    *,
    timeout: float | None = None,
) -> Outcome:
    """Run the claimed task once in this thread; never raises.

    ``reporter`` receives the task's progress while it runs; its last value
    goes with the outcome, for the write that records the attempt. ``timeout``
    (seconds) is enforced by ``inflight`` (the lease keeper interrupts the
    attempt): for an attempt continued after its message's own, which Dramatiq's
    ``TimeLimit`` does not cover; a message's own attempt leaves it None.

    An interrupt (worker shutdown, a forced cancel, a time limit) that lands
    after the task's function returned does not undo the attempt: Python
    delivers such an interrupt only when the thread runs Python code again,
    which for a task blocked in C (``time.sleep``, a socket read) can be
    after its work finished. The returned value is then recorded as usual.
    """
    reporter = reporter or ProgressReporter(claim.position.key(), claim.spec.name)
    # The name is read only for the observers (it costs a parse of the stored task).
    name = claim.spec.name if observers.observing() else ""
    if observers.observing():  # ended by the middleware once recorded (attempt_ended)
        position = claim.position
        observers.attempt_started(claim.record, name, position.attempt + 1, position.round + 1)
    observers.step_started(claim.record.channel_id, name)
    try:
        outcome = _run_attempt(claim, inflight, reporter, timeout)
    finally:
        progress = reporter.close()
        observers.step_finished(claim.record.channel_id, name)
    if progress is None or outcome is HANDED_BACK:
        # A handed-back attempt is not recorded (its identity tells the middleware so).
        return outcome
    return replace(outcome, progress=progress)


def _run_attempt(
    claim: Claim, inflight: InFlight, reporter: ProgressReporter, timeout: float | None
) -> Outcome:
    started = utcnow()
    running = inflight.start(claim.record.id, timeout=timeout)
    result = _NOTHING
    try:
        try:
            task = Task.from_spec(claim.spec)  # parsed once per claim, read before this
        except UnknownExecutorError as exc:
            # Maybe a rolling deploy: the middleware decides whether to wait for a
            # worker that knows the task or to fail it (unknown_task_grace).
            return replace(
                Outcome.failure(exc, retriable=False, started=started), unknown_task=True
            )
        task.context = Context(
            {
                CANCEL_EVENT_KEY: running.cancel_event,
                JOB_ID_KEY: claim.record.id,
                RESULTS_KEY: claim.results_by_name(),
                POSITION_KEY: claim.position.to_list(),
                PARENT_RESULTS_KEY: claim.record.state.get(PARENT_RESULTS_KEY) or {},
                PROGRESS_REPORTER_KEY: reporter,
            }
        )
        result = task.executor.execute(task, task.context)
        inflight.finish(claim.record.id)
        return Outcome(True, result, started=started, ended=utcnow())
    except Interrupt as exc:
        if running.interrupted_at is not None:
            logger.info(
                "job %s: task stopped %.1fs after the interrupt was sent",
                claim.record.id,
                time.monotonic() - running.interrupted_at,
                extra={"action": "interrupt_landed", "job_id": claim.record.id},
            )
        if result is not _NOTHING:  # landed after the function returned
            return Outcome(True, result, started=started, ended=utcnow())
        if isinstance(exc, Shutdown):
            return HANDED_BACK
        if isinstance(exc, (TimeLimitExceeded, AttemptTimedOut)):
            timeout = claim.spec.round_timeout
            return Outcome.failure(
                exc,
                kind=history.TIMED_OUT,
                started=started,
                error=f"TaskTimeoutError: exceeded round_timeout={timeout:g}s",
            )
        if isinstance(exc, StepCancelled):
            return Outcome.failure(
                exc,
                kind=history.CANCELLED,
                started=started,
                error="cancelled: the task was interrupted after the grace period",
            )
        return Outcome.failure(exc, started=started)
    except Exception as exc:
        return Outcome.failure(
            exc, retriable=is_retriable(exc), kind=history.kind_of(exc), started=started
        )
    finally:
        inflight.finish(claim.record.id)


def _step(*args: Any, **kwargs: Any) -> None:
    """Body of the step actor: run the step the middleware claimed, if it claimed one."""
    claim: Claim | None = getattr(current, "claim", None)
    inflight: InFlight | None = getattr(current, "inflight", None)
    if claim is None or inflight is None:
        if getattr(current, "handled", False):
            return  # the middleware dealt with this message (a duplicate, a deferral...)
        raise RuntimeError("the step actor runs only behind WorkflowMiddleware")
    current.outcome = run_attempt(claim, inflight, getattr(current, "reporter", None))


class _ActorsOnly:
    """A view of a broker on which declaring an actor does not declare its queue.

    The step actor has no queue of its own: its messages travel on the
    channels' queues. Declaring the actor the usual way would add a queue
    every worker then consumes (and a RabbitMQ server then creates).
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    def declare_actor(self, actor: dramatiq.Actor[Any, Any]) -> None:
        broker = self._broker
        broker.emit_before("declare_actor", actor)
        broker.actors[actor.actor_name] = actor
        broker.emit_after("declare_actor", actor)


def declare_queueless_actor(
    broker: Broker, fn: Any, actor_name: str, options: dict[str, Any]
) -> dramatiq.Actor[Any, Any]:
    """Register ``fn`` as actor ``actor_name`` on ``broker`` (once), without declaring a
    queue: its messages travel on queues declared otherwise (the channels')."""
    try:
        existing: dramatiq.Actor[Any, Any] = broker.get_actor(actor_name)
        return existing
    except dramatiq.errors.ActorNotFound:
        pass
    actor: dramatiq.Actor[Any, Any] = dramatiq.Actor(
        fn,
        broker=_ActorsOnly(broker),  # type: ignore[arg-type]
        actor_name=actor_name,
        queue_name="default",
        priority=0,
        options=options,
    )
    actor.broker = broker
    return actor


def declare_step_actor(broker: Broker) -> dramatiq.Actor[Any, Any]:
    """Register the step actor on ``broker`` (once), without declaring a queue."""
    # No Dramatiq retries (the rules retry), no Dramatiq time limit unless the
    # task has a round_timeout, and no immediate interrupt on shutdown: the
    # middleware gives running attempts shutdown_grace, then hands them back.
    return declare_queueless_actor(
        broker,
        _step,
        STEP_ACTOR,
        {"max_retries": 0, "time_limit": float("inf"), "notify_shutdown": False},
    )
