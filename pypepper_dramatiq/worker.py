"""The in-process driver: takes jobs from a channel and runs their workflows here."""

from __future__ import annotations

import asyncio
import logging

from . import history
from .channel import Channel
from .errors import (
    InvalidTransitionError,
    JobRedeliveryError,
    JobRequeuedError,
    StoreError,
    describe,
)
from .events import COMPLETE, FAIL, RUN
from .job import Job
from .status import Status
from .store import get_job_store
from .stores.base import JobRecord
from .workflow import WorkflowResult

logger = logging.getLogger(__name__)


class Worker:
    """Consumes one channel; each job runs RUN -> workflows -> COMPLETE or FAIL."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    async def run_once(self) -> Job | None:
        """Receive and process one job; None when the channel is stopped and empty.

        Raises:
            JobRequeuedError: the RUN snapshot did not persist; the job went back
                on the channel.
            JobRedeliveryError: it could not go back either; it was marked Failed.
        """
        job = await self.channel.receive()
        if job is None:
            return None
        await self.process(job)
        return job

    async def run_forever(self) -> None:
        """Process jobs until the channel is stopped and drained.

        Job errors are logged and the loop goes on, except that
        :class:`JobRequeuedError` and a ``full`` :class:`JobRedeliveryError` are
        re-raised at once, and a ``stopped`` one after the leftovers drained.
        """
        deferred: JobRedeliveryError | None = None
        while True:
            try:
                job = await self.run_once()
            except JobRequeuedError:
                raise
            except JobRedeliveryError as exc:
                if exc.reason == "full":
                    raise
                deferred = exc
                continue
            except Exception:
                logger.exception("worker on channel %s: job failed", self.channel.id)
                continue
            if job is None:
                break
        if deferred is not None:
            raise deferred

    async def process(self, job: Job) -> None:
        """Carry one job through RUN, its workflows, and COMPLETE or FAIL."""
        if job.is_cancelled:
            self._settle_cancelled(job)
            return
        if not self._start(job):
            return
        _log(job, "start")
        job.share_cancel_event()
        error: str | None = None
        with job.running_here():
            for index, workflow in enumerate(job.workflows):
                if _cancelled(job):
                    break
                try:
                    result = await asyncio.to_thread(workflow.run)
                except Exception as exc:  # a bug outside the executors: fail the job
                    logger.exception("job %s: workflow raised", job.id)
                    error = describe(exc)
                    break
                _keep_history(job, index, result)
                if result.cancelled:
                    break
                if not result.ok:
                    error = result.error
                    break
        self._finish(job, error)

    # -- steps --------------------------------------------------------------

    def _settle_cancelled(self, job: Job) -> None:
        """Skip a cancelled job; make sure Cancelled is stored."""
        _log(job, "skip_cancelled")
        try:
            durable = get_job_store().get(job.id)
        except StoreError:
            durable = None
        if durable is None or durable.status is not Status.CANCELLED:
            job.persist()

    def _start(self, job: Job) -> bool:
        """Heal, follow the durable row, RUN and persist it; True if work may start."""
        before = job.status
        store = get_job_store()
        try:
            durable = store.get(job.id)
            if durable is None:
                if not job.save():
                    return self._start_failed(job, before)
            elif durable.status is not Status.SCHEDULED:
                _log(job, "follow_durable", durable.status)
                job.adopt(durable)
                return False
            elif durable.version != job.version:
                job.version = durable.version
        except StoreError as exc:
            logger.warning("job %s: store failed before RUN: %s", job.id, exc)
            return self._start_failed(job, before)

        job.apply_event(RUN)
        try:
            if job.save():
                return True
            durable = store.get(job.id)
        except StoreError as exc:
            logger.warning("job %s: RUN snapshot failed: %s", job.id, exc)
            return self._start_failed(job, before)
        if durable is not None and durable.status in (
            Status.IN_PROGRESS, Status.COMPLETED, Status.FAILED, Status.CANCELLED,
        ):
            _log(job, "follow_durable", durable.status)
            job.adopt(durable)
            return False
        return self._start_failed(job, before)

    def _start_failed(self, job: Job, before: Status) -> bool:
        """The seed's RUN persist-failure path. Returns False or raises."""
        if _status(job) is Status.CANCELLED:
            job.persist()
            return False
        try:
            job.apply_event(FAIL)
        except InvalidTransitionError:
            if _status(job) is Status.CANCELLED:  # a cancel won the race
                job.persist()
                return False
            raise
        job.error = "the RUN snapshot could not be persisted"
        if job.persist():
            _log(job, "fail_unpersisted_run")
            return False
        job.restore_status(before)
        job.error = None
        result = self.channel.offer(job)
        if result == "ok":
            _log(job, "requeue")
            raise JobRequeuedError(job)
        job.apply_event(FAIL)
        job.error = f"could not be re-enqueued: channel {result}"
        job.persist()
        _log(job, "redelivery_failed", result)
        raise JobRedeliveryError(job, result)

    def _finish(self, job: Job, error: str | None) -> None:
        """COMPLETE or FAIL, unless cancelled; then persist (retried, never re-run)."""
        if not job.is_cancelled:
            try:
                job.apply_event(FAIL if error else COMPLETE)
                job.error = error
            except InvalidTransitionError:
                if not _cancelled(job):
                    raise
        _log(job, "end", job.status)
        if job.persist():
            return
        durable = _stored(job.id)
        if durable is not None and durable.status is Status.CANCELLED:
            # Cancelled by id (Job.cancel_saved) while it ran: follow the row.
            _log(job, "follow_durable", durable.status)
            job.adopt(durable)
            return
        logger.error("job %s ended %s but the snapshot did not persist", job.id, job.status)


def _keep_history(job: Job, workflow: int, result: WorkflowResult) -> None:
    """Add the workflow's attempts to the job's stored history (written with its end)."""
    state = job.state
    for outcome in result.outcomes:
        for item in outcome.history:
            state = history.appended(state, f"{workflow}.{outcome.index}", item)
    job.state = state


def _log(job: Job, action: str, detail: object = None) -> None:
    logger.info(
        "job %s %s%s", job.id, action, "" if detail is None else f" ({detail})",
        extra={"action": action, "job_id": job.id, "status": job.status.value},
    )


def _stored(job_id: str) -> JobRecord | None:
    try:
        return get_job_store().get(job_id)
    except StoreError:
        return None


def _cancelled(job: Job) -> bool:
    # Read through a call: another thread may cancel the job at any moment.
    return job.is_cancelled


def _status(job: Job) -> Status:
    return job.status
