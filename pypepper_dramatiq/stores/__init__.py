"""Job stores: where a job's snapshot and its optimistic-concurrency version live."""

from .base import IJobStore, JobRecord
from .memory import MemoryJobStore

__all__ = ["IJobStore", "JobRecord", "MemoryJobStore"]
