"""The Dramatiq driver: runs job steps as messages under the shared rules.

For each message of the step actor, :class:`WorkflowMiddleware` claims the
step in the job store before the actor runs (a stale or duplicate message is
acknowledged unrun), and records the outcome and enqueues the next step
after it. Messages of other actors pass through untouched.

Failures in our hooks never fail open: Dramatiq logs and ignores ordinary
exceptions from ``before_process_message``, so every path that must stop the
actor raises :class:`~dramatiq.middleware.SkipMessage` (after deferring or
dead-lettering the message on purpose).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware, SkipMessage

from . import actors
from .cancellation import CancelListener, redis_client_of
from .channel import manager
from .config import seconds
from .errors import MessageError, StoreError
from .inflight import InFlight, LeaseKeeper
from .messages import STEP_ACTOR, StepMessage
from .recovery import RecoverySweeper
from .rules import Action
from .steps import Claim, Outcome, StepBook, StepSkipped
from .store import get_job_store

logger = logging.getLogger(__name__)


class WorkflowMiddleware(Middleware):
    """Runs workflow steps with durable state, leases, cancellation and recovery.

    Args:
        lease_seconds: how long a step stays reserved without renewal; a
            SIGKILLed worker's step is recovered about this long after it died.
        sweep_interval: seconds between recovery sweeps.
        cancel_grace: seconds a task may ignore its cancel event before its
            thread is interrupted.
        defer_seconds: delay before retrying a message whose claim failed
            because the store was unreachable.
        dispatch_seconds: how long a step's message may wait in its queue
            before recovery sends it again (default: max(60, 2 * lease_seconds)).
    """

    def __init__(
        self,
        *,
        lease_seconds: float = 30.0,
        sweep_interval: float = 5.0,
        cancel_grace: float = 10.0,
        defer_seconds: float = 2.0,
        dispatch_seconds: float | None = None,
    ) -> None:
        self.logger = logging.getLogger(f"{__name__}.{type(self).__name__}")
        self.lease_seconds = lease_seconds = seconds("lease_seconds", lease_seconds)
        self.sweep_interval = seconds("sweep_interval", sweep_interval)
        self.cancel_grace = seconds("cancel_grace", cancel_grace, zero=True)
        self.defer_seconds = seconds("defer_seconds", defer_seconds)
        if dispatch_seconds is not None:
            dispatch_seconds = seconds("dispatch_seconds", dispatch_seconds)
        self.inflight = InFlight()
        self.owner = _owner_id()
        self.book = StepBook(
            get_job_store, self.owner, lease_seconds, dispatch_seconds=dispatch_seconds
        )
        self._threads: list[Any] = []
        self._stopping = False

    # -- process lifecycle -----------------------------------------------------

    def after_process_boot(self, broker: Broker) -> None:
        # A fresh id per worker process: leases belong to processes.
        self.owner = _owner_id()
        self.book.owner = self.owner

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        self.start_background(broker)

    def start_background(self, broker: Broker) -> None:
        """Start lease renewal, the cancel listener and the recovery sweeper."""
        if self._threads:
            return
        threads: list[Any] = [
            LeaseKeeper(self.inflight, self.owner, self.lease_seconds, self.cancel_grace),
            RecoverySweeper(
                broker, self.owner, self.lease_seconds, self.sweep_interval,
                dispatch_seconds=self.book.dispatch_seconds,
            ),
        ]
        client = redis_client_of(broker)
        if client is not None:
            threads.append(CancelListener(client, self.inflight))
        for thread in threads:
            thread.start()
        self._threads = threads

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # From now on steps are handed back unrun, and the leases of steps
        # still finishing keep being renewed until the worker threads are done.
        self._stopping = True

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.stop_background()

    def stop_background(self) -> None:
        for thread in self._threads:
            thread.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    # -- one message -------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: Any) -> None:
        if message.actor_name != STEP_ACTOR:
            return
        actors.current.claim = None
        try:
            step = StepMessage.from_message(message)
        except MessageError as exc:
            self.logger.error("dead-lettering message %s: %s", message.message_id, exc)
            message.fail()
            raise SkipMessage(str(exc)) from exc
        if self._stopping:
            self._pass_on(broker, step, message)
            raise SkipMessage(f"job {step.job_id}: worker stopping, step passed on")
        try:
            claim = self.book.claim(step)
        except StepSkipped as exc:
            self._left_channel(message, step)
            if exc.dead:
                self.logger.error("dead-lettering message %s: %s", message.message_id, exc)
                message.fail()
            else:
                self.logger.info("acknowledging message unrun: %s", exc)
            raise SkipMessage(str(exc)) from exc
        except StoreError as exc:
            self._defer(broker, step, message, exc)
            raise SkipMessage(f"job {step.job_id}: store unreachable, deferred") from exc
        except Exception as exc:  # a bug: never run the actor past a failed claim
            self.logger.exception("claim of job %s failed; dead-lettering", step.job_id)
            message.fail()
            raise SkipMessage(str(exc)) from exc
        self._left_channel(message, step)
        timeout = float(claim.task.get("round_timeout", 0) or 0)
        if timeout > 0:
            message.options["time_limit"] = int(timeout * 1000)
        else:
            message.options.pop("time_limit", None)
        actors.current.claim = claim
        actors.current.inflight = self.inflight
        actors.current.outcome = None

    def _left_channel(self, message: Any, step: StepMessage) -> None:
        """The job no longer waits in its channel (its first step was taken or dropped).

        Only a job's first message (the one carrying its record) counts in the
        channel; later steps were never admitted, so they cost no release.
        """
        if step.record is None:
            return
        channel = manager.get(message.queue_name)
        if channel is not None:
            _quietly(channel.gate.release, step.job_id)

    def _pass_on(self, broker: Broker, step: StepMessage, message: Any) -> None:
        """Give an unclaimed step to another worker; dead-letter it if that fails."""
        try:
            broker.enqueue(step.to_message(message.queue_name))
        except Exception:
            self.logger.exception("message %s cannot be passed on; dead-lettering", message)
            message.fail()

    def _defer(self, broker: Broker, step: StepMessage, message: Any, exc: Exception) -> None:
        """Put the step back with a delay; dead-letter the message if even that fails."""
        try:
            broker.enqueue(
                step.to_message(message.queue_name), delay=int(self.defer_seconds * 1000)
            )
        except Exception:
            self.logger.exception(
                "store unreachable (%s) and message %s cannot be re-enqueued; dead-lettering",
                exc, message.message_id,
            )
            message.fail()
            return
        self.logger.warning(
            "store unreachable (%s); message %s deferred %.1fs", exc, message.message_id,
            self.defer_seconds,
        )

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if message.actor_name != STEP_ACTOR:
            return
        claim: Claim | None = getattr(actors.current, "claim", None)
        outcome: Outcome | None = getattr(actors.current, "outcome", None)
        actors.current.claim = actors.current.outcome = None
        if claim is None:
            return
        self.inflight.remove(claim.record.id)
        if outcome is None:
            outcome = Outcome(False, error=f"{type(exception).__name__}: {exception}")
        if outcome is actors.HANDED_BACK:
            self._hand_back(broker, claim)
            return
        try:
            decision = self.book.record(claim, outcome)
        except StoreError as exc:
            self.logger.error(
                "job %s: outcome of %s not recorded (%s); the step runs again after its lease",
                claim.record.id, claim.position.key(), exc,
            )
            return
        if decision is None or decision.action is not Action.RUN:
            return
        assert decision.position is not None
        next_message = StepMessage(claim.record.id, decision.position).to_message(
            message.queue_name
        )
        try:
            broker.enqueue(next_message, delay=int(decision.delay * 1000) or None)
        except Exception as exc:
            self.logger.error(
                "job %s: next step not enqueued (%s); recovery sends it after the lease",
                claim.record.id, exc,
            )

    def _hand_back(self, broker: Broker, claim: Claim) -> None:
        """Worker shutdown cut the attempt short: let another worker run it now."""
        record = claim.record.evolve(lease_owner=None, lease_expires=None)
        try:
            if get_job_store().put(record):
                broker.enqueue(
                    StepMessage(record.id, claim.position).to_message(record.channel_id)
                )
                return
        except Exception as exc:
            self.logger.warning("job %s: hand-back failed (%s)", record.id, exc)
        self.logger.warning("job %s: step left to lease recovery", record.id)


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        logger.warning("channel bookkeeping failed", exc_info=True)
