"""The Dramatiq driver: runs job steps as messages under the shared rules.

For each message of the step actor, :class:`WorkflowMiddleware` claims the
step in the job store before the actor runs (a stale or duplicate message is
acknowledged unrun), and records the outcome and enqueues the next step
after it. Messages of other actors pass through untouched.

A next step to run at once (no delay) may instead be claimed in the write that
records the step before it and run right there, in the same thread, without a
message (continuation), within the bound of ``continue_steps`` and
``continue_seconds`` (:func:`~pypepper_dramatiq.rules.steps.may_continue` decides).
Such an attempt runs after Dramatiq's ``TimeLimit`` let go of the message, so its
``round_timeout`` is a deadline the lease keeper enforces
(:class:`~pypepper_dramatiq.engine.running.AttemptTimedOut`).

Failures in our hooks never fail open: Dramatiq logs and ignores ordinary
exceptions from ``before_process_message``, so the step actor runs a task only
when this middleware handed it a claim; every other message returns unrun
(after being deferred, passed on or dead-lettered on purpose).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Interrupt, Middleware, Shutdown

from ...channels.broker import priority_options, queue_for, transport_of
from ...channels.channel import ChannelConnector, channel_of_step, manager
from ...channels.messages import STEP_ACTOR, StepMessage
from ...engine import concurrency, rate_limits
from ...engine.outcomes import Verdict
from ...engine.running import running_here
from ...engine.step_io import Claim, Outcome, Recorded, StepIO, StepSkipped
from ...errors import BrokerUnavailableError, MessageError, StoreError, retry_may_cure
from ...ops import observers
from ...ops.logs import get_logger
from ...ops.outage import JOB_STORE, shared_outage
from ...records.record import utcnow
from ...records.spec import TaskSpec
from ...rules.priorities import priority_in, priority_of_queue
from ...rules.start_times import late_retry
from ...rules.steps import Action, Position, Step, may_continue
from ...settings import Settings
from ...stores.registry import get_job_store
from ...transport import broker_name
from ...transport.base import HeldStart
from . import step_actor
from .cancel_listener import CancelListener
from .completion import Completions, Finished
from .fetch_claims import FetchClaims, fetches_in_batches, raise_prefetch
from .leases import LeaseKeeper
from .orphans import AckKeeper
from .recovery import RecoverySweeper

logger = get_logger(__name__)


class WorkflowMiddleware(Middleware):
    """Runs workflow steps with durable state, leases, cancellation and recovery.

    Args:
        settings: the timing settings (see :class:`~pypepper_dramatiq.settings.Settings`,
            which documents each); or give them one by one as keyword arguments.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        lease_seconds: float | None = None,
        sweep_interval: float | None = None,
        cancel_grace: float | None = None,
        defer_seconds: float | None = None,
        dispatch_seconds: float | None = None,
        shutdown_grace: float | None = None,
        unknown_task_grace: float | None = None,
        continue_steps: int | None = None,
        continue_seconds: float | None = None,
    ) -> None:
        self.logger = get_logger(f"{__name__}.{type(self).__name__}")
        if settings is None:
            settings = Settings.of(
                lease_seconds=lease_seconds,
                sweep_interval=sweep_interval,
                cancel_grace=cancel_grace,
                defer_seconds=defer_seconds,
                dispatch_seconds=dispatch_seconds,
                shutdown_grace=shutdown_grace,
                unknown_task_grace=unknown_task_grace,
                continue_steps=continue_steps,
                continue_seconds=continue_seconds,
            )
        self.settings = settings
        self.lease_seconds = settings.lease_seconds
        self.sweep_interval = settings.sweep_interval
        self.cancel_grace = settings.cancel_grace
        self.defer_seconds = settings.defer_seconds
        self.shutdown_grace = settings.shutdown_grace
        self.unknown_task_grace = settings.unknown_task_grace
        self.inflight = running_here
        self.owner = _owner_id()
        self.book = StepIO(
            get_job_store,
            self.owner,
            settings.lease_seconds,
            dispatch_seconds=settings.next_step_dispatch_seconds,
        )
        self._threads: list[Any] = []
        self._stopping = threading.Event()
        self._shutdown_timer: threading.Timer | None = None
        self._store_outage = shared_outage(JOB_STORE)
        #: The claims taken ahead of the worker threads (``claim_fetched``, on a
        #: broker that fetches in batches), made at the worker's boot; or None.
        self.fetch_claims: FetchClaims | None = None
        #: The completion thread's steps (with :attr:`fetch_claims`): their outcomes
        #: recorded and their messages acknowledged off the worker threads; or None.
        self.completions: Completions | None = None
        self._broker: Broker | None = None

    # -- process lifecycle -----------------------------------------------------

    def after_process_boot(self, broker: Broker) -> None:
        # A fresh id per worker process: leases belong to processes.
        self.owner = _owner_id()
        self.book.owner = self.owner

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        self._broker = broker
        if self.settings.claim_fetched and self.fetch_claims is None:
            if fetches_in_batches(broker):
                self.fetch_claims = FetchClaims(self.book, self.inflight)
                if COMPLETION_THREAD:
                    self.completions = Completions(self._complete)
                    self.fetch_claims.completions = self.completions
            else:
                self.logger.debug(
                    "%s hands out one message at a time: each step is claimed and "
                    "recorded by its worker thread (claim_fetched has nothing to batch)",
                    type(broker).__name__,
                )
        if self.fetch_claims is not None:  # before the consumer threads start
            self.fetch_claims.wrap(broker)
            raise_prefetch(worker)

    def before_consumer_thread_shutdown(self, broker: Broker, thread: Any) -> None:
        # The worker threads are done: the outcomes they handed over are recorded
        # and acknowledged before the consumers close.
        if self.completions is not None:
            self.completions.drain()

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        if not manager.ids():
            self.logger.warning(
                "no channel is declared in this worker process, so it runs no workflow "
                "jobs: pass the channels it serves to setup(channels=...)"
            )
        observers.worker_started()
        self.start_background(broker, worker)

    def start_background(self, broker: Broker, worker: Any = None) -> None:
        """Start lease renewal, the cancel listener and the recovery sweeper (and, on
        Redis with a worker, the check for stranded delayed messages)."""
        if self._threads:
            return
        sweeper = RecoverySweeper(
            broker,
            self.owner,
            self.lease_seconds,
            self.sweep_interval,
            dispatch_seconds=self.book.dispatch_seconds,
            retention=self.settings.purge_after,
        )
        threads: list[Any] = [
            LeaseKeeper(
                self.inflight,
                self.owner,
                self.lease_seconds,
                self.cancel_grace,
                sweep_health=sweeper.health,
            ),
            sweeper,
        ]
        transport = transport_of(broker)
        if transport.carries_notices:
            threads.append(CancelListener(transport, self.inflight))
        if transport.shared:
            threads.append(ChannelConnector(manager))
            if worker is not None:
                threads.append(AckKeeper(broker, worker, max(1.0, self.sweep_interval)))
        for thread in threads:
            thread.start()
        self._threads = threads

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # From now on steps are handed back unrun, and the leases of steps
        # still finishing keep being renewed until the worker threads are done.
        # Running attempts get shutdown_grace to finish and be recorded; then
        # they are interrupted and handed back.
        self._stopping.set()
        timer = threading.Timer(self.shutdown_grace, self._interrupt_running)
        timer.daemon = True
        timer.start()
        self._shutdown_timer = timer

    def _interrupt_running(self) -> None:
        for job_id in self.inflight.interrupt_running(Shutdown):
            self.logger.info(
                "job %s: still running %.1fs after shutdown began; interrupt sent (it lands "
                "when the task next runs Python code), the step is then handed back",
                job_id,
                self.shutdown_grace,
                extra={"action": "shutdown_interrupt", "job_id": job_id},
            )

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        self.stop_background()

    def stop_background(self) -> None:
        if self.completions is not None:
            self.completions.stop()
        for thread in self._threads:
            thread.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    # -- one message -------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: Any) -> None:
        if message.actor_name != STEP_ACTOR:
            return
        # Until a claim is made, the step actor returns without running
        # anything: a message we acknowledge unrun is normal here (a duplicate,
        # a stale redelivery), not worth Dramatiq's "was skipped" WARNING.
        step_actor.current.claim = None
        step_actor.current.outcome = None
        step_actor.current.slots = None
        step_actor.current.handled = True
        claims = self.fetch_claims
        taken = None if claims is None else claims.take(message)
        ahead: Claim | None = None
        if taken is not None:
            ahead, step = taken  # decoded by the consumer thread, which claimed it
        else:
            try:
                step = StepMessage.from_message(message)
            except MessageError as exc:
                self.logger.error("dead-lettering message %s: %s", message.message_id, exc)
                message.fail()
                return
        if self._stopping.is_set():
            if claims is not None and ahead is not None:
                claims.give_back(ahead)
            self._pass_on(broker, step, message)
            return
        claim: Claim | None
        slots: concurrency.Slots | None = None
        if claims is not None and ahead is not None:
            if claims.cancelled(ahead):
                # Cancelled (or its lease lost) while it waited for this thread:
                # the row is no longer this worker's, the step does not start.
                self.inflight.remove(ahead.record.id)
                self.logger.debug("job %s: step claimed ahead not started: cancelled", step.job_id)
                return
            if self._paused(ahead, ahead.position):
                # Paused while it waited for this thread: released unrun, and claimed
                # below as any message is, by a claim that holds it for its pause.
                claims.give_back(ahead)
                ahead = None
        if ahead is not None:
            claim = ahead
        else:
            channel_id = channel_of_step(message.queue_name, step)
            rate_key, concurrency_key = step.keys
            if concurrency.limited(channel_id, concurrency_key):
                slots = self._slots_or_held(broker, step, message, channel_id, concurrency_key)
                if slots is None:
                    return
            if rate_limits.limited(channel_id, rate_key) and (
                self._held_for_its_turn(broker, step, message, channel_id, rate_key)
            ):
                if slots is not None:
                    slots.release()
                return
            outage = None if claims is None else claims.outage(message)
            claim = self._claim(broker, step, message, outage)
            if claim is None:
                if slots is not None:
                    slots.release()
                return
            self._left_channel(message, step)
        step_actor.current.slots = slots
        timeout = claim.spec.round_timeout
        if timeout > 0:
            message.options["time_limit"] = int(timeout * 1000)
        else:
            message.options.pop("time_limit", None)
        step_actor.current.claim = claim
        step_actor.current.since = time.monotonic()
        step_actor.current.inflight = self.inflight
        step_actor.current.reporter = self.book.progress_reporter(claim)

    def _claim(
        self, broker: Broker, step: StepMessage, message: Any, outage: StoreError | None = None
    ) -> Claim | None:
        """Claim the step; None when the message must not run here (already dealt with).

        ``outage``: the store could not be reached when the step was to be claimed
        ahead (``claim_fetched``): the message is deferred as if this claim had failed.
        """
        delay = self.defer_seconds
        while True:
            try:
                if outage is not None:
                    failed, outage = outage, None
                    raise failed
                claim = self.book.claim(step)
            except StepSkipped as exc:
                self._store_outage.ok()
                if exc.retry_at is not None:
                    # Early (the job is planned later): the message comes back when due.
                    wait = max(0.0, (exc.retry_at - utcnow()).total_seconds())
                    if not self._enqueue(
                        broker,
                        step.to_message(message.queue_name, _same_priority(message)),
                        delay=wait,
                    ):
                        self.logger.warning(
                            "job %s: early message not put back; the recovery sweep sends it again",
                            step.job_id,
                        )
                    return None
                self._left_channel(message, step)
                if exc.dead:
                    self.logger.error("dead-lettering message %s: %s", message.message_id, exc)
                    message.fail()
                else:
                    self.logger.debug("acknowledging message unrun: %s", exc)
                return None
            except StoreError as exc:
                if not retry_may_cure(exc):
                    # The store answered, refusing what the claim (or the heal of
                    # the row from this message) holds: deferring would only send
                    # the same write again, forever.
                    self._store_outage.ok()
                    self._left_channel(message, step)
                    self.logger.error(
                        "dead-lettering message %s: the job store refused job %s's step: %s",
                        message.message_id,
                        step.job_id,
                        exc,
                        extra={"action": "claim_refused", "job_id": step.job_id},
                    )
                    message.fail()
                    return None
                self._store_outage.failed(exc)
                # The message may be the only copy of its job (its row could not
                # be written either): it is acknowledged only once a copy is back
                # in the broker, or once the store takes the claim.
                if self._enqueue(
                    broker,
                    step.to_message(message.queue_name, _same_priority(message)),
                    delay=self.defer_seconds,
                    tries=1,
                ):
                    self.logger.debug(
                        "message %s deferred %.1fs: %s", message.message_id, self.defer_seconds, exc
                    )
                    return None
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_HOLD_BACKOFF)
                if self._stopping.is_set():
                    self._pass_on(broker, step, message)
                    return None
                continue
            except Exception:  # a bug: never run the actor past a failed claim
                self.logger.exception("claim of job %s failed; dead-lettering", step.job_id)
                message.fail()
                return None
            self._store_outage.ok()
            return claim

    def _slots_or_held(
        self,
        broker: Broker,
        step: StepMessage,
        message: Any,
        channel_id: str,
        concurrency_key: str | None,
    ) -> concurrency.Slots | None:
        """The slots of the step's concurrency limits, taken; None when a limit is
        reached: then the step waits in its limit's line on the transport with its
        message (sent again at once when a slot frees), its message is sent again due in
        :func:`~pypepper_dramatiq.engine.concurrency.hold_seconds` (longer each time
        it is held: the fallback), and this one is acknowledged unrun, no attempt
        counted. A transport that cannot be reached holds it ``defer_seconds``."""
        wait = concurrency.hold_seconds(step.holds)
        again = replace(step, holds=step.holds + 1)
        copy = again.to_message(message.queue_name, _same_priority(message))
        priority = (
            priority_in(step.record.state)
            if step.record is not None
            else priority_of_queue(message.queue_name)
        )
        held = HeldStart(step.job_id, priority, copy.encode().decode("utf-8"))
        try:
            slots = concurrency.try_start(
                channel_id,
                concurrency_key,
                step.job_id,
                self.owner,
                self.lease_seconds,
                held,
            )
        except BrokerUnavailableError as exc:
            self.logger.warning(
                "job %s: its concurrency limit could not be asked (%s); held %.1fs",
                step.job_id,
                exc,
                self.defer_seconds,
            )
            slots, wait = None, self.defer_seconds
        else:
            if slots is not None:
                return slots
            observers.start_held(channel_id, observers.HELD_BY_CONCURRENCY)
        self.logger.debug(
            "job %s: held %.3fs by a concurrency limit (channel %s, key %s)",
            step.job_id,
            wait,
            channel_id,
            concurrency_key,
            extra={"action": "concurrency_hold", "job_id": step.job_id},
        )
        if not self._enqueue(broker, copy, delay=wait):
            self.logger.warning(
                "job %s: message held by a concurrency limit not put back; the recovery "
                "sweep sends it again",
                step.job_id,
            )
        return None

    def _held_for_its_turn(
        self,
        broker: Broker,
        step: StepMessage,
        message: Any,
        channel_id: str,
        rate_key: str | None,
    ) -> bool:
        """Whether the step may not start yet under its channel's rate limit: then its
        message is sent again, due when the limiter said to ask again, and this one is
        acknowledged unrun, no attempt counted. A transport that cannot be reached
        holds it ``defer_seconds``."""
        try:
            wait = rate_limits.start_or_wait(channel_id, rate_key, told=step.rate_told)
        except BrokerUnavailableError as exc:
            self.logger.warning(
                "job %s: its channel's rate limit could not be asked (%s); held %.1fs",
                step.job_id,
                exc,
                self.defer_seconds,
            )
            wait = self.defer_seconds
        if wait <= 0.0:
            return False
        observers.start_held(channel_id, observers.HELD_BY_RATE_LIMIT)
        self.logger.debug(
            "job %s: held %.3fs by channel %s's rate limit",
            step.job_id,
            wait,
            channel_id,
            extra={"action": "rate_hold", "job_id": step.job_id},
        )
        self._send_held(broker, replace(step, rate_told=True), message, wait, "rate")
        return True

    def _send_held(
        self, broker: Broker, step: StepMessage, message: Any, wait: float, limit: str
    ) -> None:
        """Send ``step`` again, due in ``wait`` seconds, for a start a ``limit`` limit
        held: on the same queue and with the same broker priority, so that it keeps its
        place among the priorities when it comes back. Not sent: the recovery sweep
        sends it (logged)."""
        again = step.to_message(message.queue_name, _same_priority(message))
        if not self._enqueue(broker, again, delay=wait):
            self.logger.warning(
                "job %s: message held by a %s limit not put back; the recovery sweep "
                "sends it again",
                step.job_id,
                limit,
            )

    def _left_channel(self, message: Any, step: StepMessage) -> None:
        """The job no longer waits in its channel (its first step was taken or dropped).

        Only a job's first message (the one carrying its record) counts in the
        channel; later steps were never admitted, so they cost no release.
        """
        if step.record is not None:  # its queue may be a priority's: the record names the channel
            manager.release_slot(step.record.channel_id, step.job_id)

    def _pass_on(self, broker: Broker, step: StepMessage, message: Any) -> None:
        """Give an unclaimed step to another worker.

        The message is acknowledged only once its copy is in the broker: while
        the broker is down this thread keeps trying, and if the process ends
        first, the unacknowledged message returns with the dead worker's.
        """
        self._enqueue(
            broker, step.to_message(message.queue_name, _same_priority(message)), tries=None
        )
        self.logger.debug("job %s: worker stopping, step passed on", step.job_id)

    def _enqueue(
        self, broker: Broker, message: Any, *, delay: float = 0.0, tries: int | None = 3
    ) -> bool:
        """Enqueue ``message``; True once the broker took it.

        Tries ``tries`` times with a short backoff (None: until it works), so
        that a blip of the broker costs a moment, not a recovery sweep.
        """
        backoff = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                broker.enqueue(message, delay=int(delay * 1000) or None)
            except Exception as exc:
                shared_outage(broker_name(broker)).failed(exc)
                if tries is not None and attempt >= tries:
                    return False
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_HOLD_BACKOFF)
                continue
            shared_outage(broker_name(broker)).ok()
            return True

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        # Another middleware skipped a message this process claimed ahead.
        if self.fetch_claims is not None and message.actor_name == STEP_ACTOR:
            self.fetch_claims.give_back_messages([message])

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if message.actor_name != STEP_ACTOR:
            return
        claim: Claim | None = getattr(step_actor.current, "claim", None)
        outcome: Outcome | None = getattr(step_actor.current, "outcome", None)
        try:
            self._after_step(broker, message, claim, outcome, exception)
        finally:
            _release_slots()  # if no outcome was recorded, none will be by this thread
            if claim is not None:
                # Its lease was renewed until here, its outcome recorded or given up
                # (see InFlight.finish); a step claimed ahead or handed over stays.
                self.inflight.drop_finished(claim.record.id)

    def _after_step(
        self,
        broker: Broker,
        message: Any,
        claim: Claim | None,
        outcome: Outcome | None,
        exception: Any,
    ) -> None:
        """Record the outcome of the attempt the message ran (if it ran one) and carry
        the job on, or leave that to the completion thread: :meth:`after_process_message`
        without the slots."""
        reporter = getattr(step_actor.current, "reporter", None)
        since: float = getattr(step_actor.current, "since", None) or time.monotonic()
        if reporter is not None:  # closed already unless the actor never ran
            reporter.close()
        step_actor.current.claim = step_actor.current.outcome = step_actor.current.reporter = None
        step_actor.current.since = None
        step_actor.current.handled = False
        if claim is None:
            return
        if outcome is None:
            outcome = Outcome(False, error=f"{type(exception).__name__}: {exception}")
        verdict: Verdict | None = None
        if self.completions is not None:
            verdict = self._completed_apart(message, claim, outcome, since)
            if verdict is None:
                return  # handed over: recorded and acknowledged by the completion thread
        unknown_since: float | None = None
        if outcome.unknown_task:
            unknown_since = StepMessage.from_message(message).unknown_since
        continued = 0
        while True:
            # Dramatiq's TimeLimit let go of this thread before this hook (it runs
            # after ours): a continued attempt is limited by its own deadline.
            try:
                following = self._settle(
                    broker,
                    message.queue_name,
                    claim,
                    outcome,
                    unknown_since,
                    continued,
                    since,
                    verdict,
                )
            finally:
                observers.attempt_ended(claim.record.id)
            if following is None:
                return
            continued += 1
            claim, unknown_since, verdict = following, None, None
            outcome = self._run_continued(claim)

    def _completed_apart(
        self, message: Any, claim: Claim, outcome: Outcome, since: float
    ) -> Verdict | None:
        """Leave the outcome of ``claim``'s attempt to the completion thread when this
        thread need not know how its record went: None once left there (its message's
        acknowledgement hands it over); otherwise the outcome's verdict, for this
        thread to record it as it always did.

        This thread keeps the outcome when the attempt was handed back or its task is
        unknown here, when it holds concurrency slots, when its task has a
        ``round_timeout``, when a cancel reached it, when the message failed, when
        the outcome calls an ``on_final_failure`` hook, and when the step that follows
        may run here at once (continuation). The observers are told this thread left
        the attempt (tracing detaches its span here, the completion thread ends it).
        """
        if (
            outcome is step_actor.HANDED_BACK
            or outcome.unknown_task
            or message.failed
            or getattr(step_actor.current, "slots", None) is not None
            or claim.spec.round_timeout > 0
        ):
            return self.book.verdict(claim, outcome)
        running = self.inflight.get(claim.record.id)
        if running is None or running.cancel_event.is_set():
            return self.book.verdict(claim, outcome)
        verdict = self.book.verdict(claim, outcome)
        if verdict.hook_due:
            return verdict
        if verdict.step.action is Action.RUN and self._may_run_here(claim, verdict.step, 0, since):
            return verdict
        assert self.completions is not None
        # Its lease is renewed until the record (no interrupt reaches a reserved step).
        self.inflight.reserve(claim.record.id)
        # Before the hand-over: the completion thread may end the attempt at once.
        observers.attempt_left(claim.record.id)
        self.completions.stash(Finished(claim, outcome, verdict, message))
        return None

    def _complete(self, finished: list[Finished]) -> None:
        """Record the outcomes the completion thread took, in one store call, and send
        the steps that follow (its messages are acknowledged after this)."""
        broker = self._broker
        assert broker is not None
        try:
            results = self.book.record_outcomes([(done.claim, done.verdict) for done in finished])
        except Exception as exc:  # a bug: each job is told, and left to its lease
            results = [exc] * len(finished)
        for done, result in zip(finished, results, strict=True):
            claim = done.claim
            self.inflight.remove(claim.record.id)
            try:
                if isinstance(result, BaseException):
                    self.logger.error(
                        "job %s: outcome of %s not recorded (%s); the step runs again after "
                        "its lease",
                        claim.record.id,
                        claim.position.key(),
                        result,
                        extra={"action": "outcome_not_recorded", "job_id": claim.record.id},
                    )
                    continue
                self._send_next(broker, done.message.queue_name, claim, result)
            finally:
                observers.attempt_ended(claim.record.id)

    def _settle(
        self,
        broker: Broker,
        queue_name: str,
        claim: Claim,
        outcome: Outcome,
        unknown_since: float | None,
        continued: int,
        since: float,
        verdict: Verdict | None = None,
    ) -> Claim | None:
        """Record the outcome of ``claim``'s attempt and send the step that follows.

        Returns the next step's claim when it runs here at once (continuation:
        the same write claimed it), None when there is nothing more for this
        thread to do (a message was sent, the job ended, the write lost...).
        """
        if outcome is step_actor.HANDED_BACK:
            _release_slots()
            self._hand_back(
                broker,
                claim,
                StepMessage.keyed(claim.record.id, claim.position, claim.record.payload),
            )
            return None
        if outcome.unknown_task:
            waiting = self._wait_for_a_worker_that_knows(broker, claim, unknown_since, outcome)
            if waiting:
                return None

        def here(step: Step) -> bool:
            return self._may_run_here(claim, step, continued, since)

        try:
            recorded = self.book.record_outcome(claim, outcome, hold_next=here, verdict=verdict)
        except StoreError as exc:
            # An outage; or the store refused even the failure recorded in place of
            # a refused outcome (StepIO.record_outcome): then the row itself is
            # what it cannot take, and the lease's recovery is all that is left.
            self.logger.error(
                "job %s: outcome of %s not recorded (%s); the step runs again after its lease",
                claim.record.id,
                claim.position.key(),
                exc,
            )
            return None
        _release_slots()  # the step ended: its next one (a message) takes a slot of its own
        if (
            recorded is not None
            and recorded.decision.action is Action.RUN
            and recorded.record.lease_owner == self.owner
        ):  # claimed by the write: run it here
            assert recorded.decision.position is not None
            return Claim(recorded.record, recorded.decision.position, claim.tasks)
        self._send_next(broker, queue_name, claim, recorded)
        return None

    def _may_run_here(self, claim: Claim, step: Step, continued: int, since: float) -> bool:
        """Whether ``step``, which follows ``claim``'s, runs at once in this thread
        (continuation) rather than as a message."""
        # A retry past the job's start deadline goes as a message: its claim
        # cancels the job (the one place that rule is applied).
        late = step.position is not None and late_retry(
            claim.record.start_deadline, step.position.to_list(), utcnow()
        )
        # A step of a paused channel or task goes as a message: its claim holds it.
        paused = step.position is not None and self._paused(claim, step.position)
        # A step under a rate or concurrency limit goes as a message: it takes its
        # turn, or its slot.
        rate_key, concurrency_key = _keys(claim)
        limited = rate_limits.limited(claim.record.channel_id, rate_key) or concurrency.limited(
            claim.record.channel_id, concurrency_key
        )
        return (
            not late
            and not paused
            and not limited
            and may_continue(
                step,
                continued=continued,
                elapsed=time.monotonic() - since,
                max_steps=self.settings.continue_steps,
                max_seconds=self.settings.continue_seconds,
                stopping=self._stopping.is_set(),
            )
        )

    def _send_next(
        self, broker: Broker, queue_name: str, claim: Claim, recorded: Recorded | None
    ) -> None:
        """Send the message of the step ``recorded`` decides to run next, if any (not
        sent: recovery sends it when it is due)."""
        if recorded is None or recorded.decision.action is not Action.RUN:
            return
        decision = recorded.decision
        assert decision.position is not None
        next_message = StepMessage.keyed(
            claim.record.id, decision.position, claim.record.payload
        ).to_message(queue_name, priority_options(claim.record.state, broker))
        if not self._enqueue(broker, next_message, delay=decision.delay):
            self.logger.warning(
                "job %s: next step %s not enqueued; recovery sends it when it is due",
                claim.record.id,
                decision.position.key(),
            )
            self.book.due_now(claim.record.id, decision.position, decision.delay)

    def _paused(self, claim: Claim, position: Position) -> bool:
        """Whether the step at ``position`` of ``claim``'s job may not start now (its
        channel or task is paused: the copy read at most once a second)."""
        if not self.book.pauses.current():
            return False  # nothing paused: no work per step
        task = claim.tasks[position.workflow][position.task]
        executor_id = TaskSpec.from_dict(task).executor_id
        return self.book.pauses.holds(claim.record.channel_id, executor_id) is not None

    def _run_continued(self, claim: Claim) -> Outcome:
        """Run a continued attempt in this thread, under its ``round_timeout`` as a
        deadline of the lease keeper (no Dramatiq time limit covers it)."""
        timeout = claim.spec.round_timeout
        try:
            return step_actor.run_attempt(
                claim,
                self.inflight,
                self.book.progress_reporter(claim),
                timeout=timeout if timeout > 0 else None,
            )
        except Interrupt as exc:  # landed after the attempt let go of its thread
            if isinstance(exc, Shutdown):
                return step_actor.HANDED_BACK
            return Outcome.failure(exc)

    def _wait_for_a_worker_that_knows(
        self, broker: Broker, claim: Claim, unknown_since: float | None, outcome: Outcome
    ) -> bool:
        """Hand back a step whose task is unknown here, within ``unknown_task_grace``.

        True if it was handed back (no attempt counted); False once the grace
        has passed since a worker first found it unknown (``unknown_since``, as
        its message carries it; None: now): it then fails.
        """
        now = time.time()
        since = unknown_since if unknown_since is not None else now
        left = self.unknown_task_grace - (now - since)
        if left <= 0:
            return False
        delay = min(UNKNOWN_TASK_RETRY_SECONDS, left)
        self.logger.info(
            "job %s: %s; handed back for a worker that knows it (%.0fs of unknown_task_grace left)",
            claim.record.id,
            outcome.error,
            left,
            extra={"action": "unknown_task", "job_id": claim.record.id},
        )
        self._hand_back(
            broker,
            claim,
            StepMessage.keyed(
                claim.record.id, claim.position, claim.record.payload, unknown_since=since
            ),
            delay=delay,
        )
        return True

    def _hand_back(
        self, broker: Broker, claim: Claim, step: StepMessage, *, delay: float = 0.0
    ) -> None:
        """Let another worker run this step (after ``delay``); no attempt is counted.

        The row is released with a lease expiry, so that if the message cannot
        be enqueued the recovery sweep re-sends the step when it is due.
        """
        now = utcnow()
        try:
            released = self.book.release(
                claim, until=now + timedelta(seconds=delay + self.book.dispatch_seconds)
            )
        except StoreError as exc:
            self.logger.warning(
                "job %s: hand-back not stored (%s); the step runs again after its lease",
                claim.record.id,
                exc,
            )
            return
        if not released:
            return  # cancelled or taken over meanwhile: nothing to hand back
        queue = queue_for(claim.record.channel_id, claim.record.state, broker)
        options = priority_options(claim.record.state, broker)
        if not self._enqueue(broker, step.to_message(queue, options), delay=delay):
            self.logger.warning(
                "job %s: handed-back step not enqueued; recovery sends it", claim.record.id
            )
            self.book.due_now(claim.record.id, claim.position, delay)


def _same_priority(message: Any) -> dict[str, Any] | None:
    """The options that keep ``message``'s broker priority on a copy of it (RabbitMQ)."""
    priority = message.options.get("broker_priority")
    return None if priority is None else {"broker_priority": priority}


#: The completion thread is used when ``claim_fetched`` is on (False: the worker
#: threads record their outcomes themselves, as with the prototype of claims ahead).
COMPLETION_THREAD = True
#: Longest wait between two tries of a thread holding a message it cannot place yet.
MAX_HOLD_BACKOFF = 5.0
#: How often a step whose task is unknown here is offered again to the workers.
UNKNOWN_TASK_RETRY_SECONDS = 1.0


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _release_slots() -> None:
    """Give back the concurrency slots this thread's step holds (none: nothing)."""
    slots: concurrency.Slots | None = getattr(step_actor.current, "slots", None)
    step_actor.current.slots = None
    if slots is not None:
        slots.release()


def _keys(claim: Claim) -> tuple[str | None, str | None]:
    """The rate limit key and the concurrency key of ``claim``'s job."""
    return StepMessage.keyed(claim.record.id, claim.position, claim.record.payload).keys
