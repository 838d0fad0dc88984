"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.model.job`."""

from .model.job import (
    CANCEL_ATTEMPTS,
    CANCEL_EVENT_KEY,
    SAVE_ATTEMPTS,
    IJobIO,
    Job,
    Scheduled,
    chain,
    use_job_io,
)

__all__ = [
    "CANCEL_EVENT_KEY",
    "Job",
    "chain",
    "Scheduled",
    "SAVE_ATTEMPTS",
    "CANCEL_ATTEMPTS",
    "IJobIO",
    "use_job_io",
]
