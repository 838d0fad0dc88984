"""Sending a job to its channel: INIT, SCHEDULE, send, then persist, with rollback."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .channel import manager
from .errors import ChannelFullError, ChannelStoppedError, InvalidTransitionError
from .events import INIT, SCHEDULE
from .store import get_job_store

if TYPE_CHECKING:
    from .job import Job

logger = logging.getLogger(__name__)


def _require_sync() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "Job.scheduled() must be called from sync code; from async code apply INIT and "
        "SCHEDULE, await channel.send(job), then job.save()"
    )


def dispatch(job: Job) -> None:
    """Schedule ``job`` (see :meth:`Job.scheduled`)."""
    _require_sync()
    store = get_job_store()  # a YAML durable backend never set up fails here, before any change
    if job.version:
        # A job stored before (e.g. rebuilt by from_record) may already have ended:
        # a finished row is never overwritten, so refuse instead of queueing a no-op.
        durable = store.get(job.id)
        if durable is not None and durable.status.is_terminal:
            raise InvalidTransitionError(SCHEDULE.value, durable.status.value)
    before = job.status
    try:
        job.apply_event(INIT)
        job.apply_event(SCHEDULE)
        channel = manager.available(job.channel_id)
        result = channel.offer(job)
    except BaseException:
        job.restore_status(before)
        raise
    if result == "full":
        job.restore_status(before)
        raise ChannelFullError(f"channel {channel.id} is full (maxsize {channel.maxsize})")
    if result == "stopped":
        job.restore_status(before)
        raise ChannelStoppedError(f"channel {channel.id} is stopped")
    logger.info(
        "job %s scheduled on %s",
        job.id,
        channel.id,
        extra={"action": "schedule", "job_id": job.id},
    )
    if not job.persist():
        # The job is on the channel: do not roll back. The worker heals the row.
        logger.warning("job %s is queued but its Scheduled snapshot did not persist", job.id)
