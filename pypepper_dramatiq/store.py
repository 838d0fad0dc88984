"""The pypepper.scheduler import path for the process-wide job store (:mod:`.stores.registry`)."""

from .stores.registry import (
    BACKENDS,
    IJobStore,
    JobRecord,
    PersistenceWarning,
    configure_job_store,
    get_job_store,
    reset_job_store,
    set_job_store,
    setup_from_config,
)

__all__ = [
    "BACKENDS",
    "IJobStore",
    "JobRecord",
    "PersistenceWarning",
    "configure_job_store",
    "get_job_store",
    "reset_job_store",
    "set_job_store",
    "setup_from_config",
]
