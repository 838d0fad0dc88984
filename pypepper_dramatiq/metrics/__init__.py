"""Metrics of jobs, attempts and channels, as Prometheus gauges and counters.

Its names are importable from here, as when it was one module.
"""

from .prometheus import (
    ENDED_STATUSES,
    JOB_BUCKETS,
    PREFIX,
    START_DELAY_BUCKETS,
    TASK_BUCKETS,
    PrometheusMetrics,
    first_start,
    install_metrics,
    multiprocess_mode,
    uninstall_metrics,
)

__all__ = [
    "PREFIX",
    "JOB_BUCKETS",
    "TASK_BUCKETS",
    "START_DELAY_BUCKETS",
    "ENDED_STATUSES",
    "multiprocess_mode",
    "PrometheusMetrics",
    "first_start",
    "install_metrics",
    "uninstall_metrics",
]
