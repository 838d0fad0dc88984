"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.model.job`."""

from .model.job import (
    CANCEL_ATTEMPTS,
    CANCEL_EVENT_KEY,
    SAVE_ATTEMPTS,
    Job,
    JobGateway,
    Scheduled,
    chain,
    use_gateway,
)

__all__ = [
    "CANCEL_EVENT_KEY",
    "Job",
    "chain",
    "Scheduled",
    "SAVE_ATTEMPTS",
    "CANCEL_ATTEMPTS",
    "JobGateway",
    "use_gateway",
]
