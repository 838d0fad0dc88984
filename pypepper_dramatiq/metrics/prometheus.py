"""Prometheus metrics of jobs (scheduled, held, ended), attempts, retries, recoveries,
deadlines, step starts held (rate limits, pauses), firings, channels and the recovery
sweep's failures.

``pip install 'pypepper-dramatiq[metrics]'`` (prometheus_client), then turn them on
with ``setup(..., metrics=True)`` or :func:`install_metrics`. They are an
:class:`~pypepper_dramatiq.ops.observers.Observer`: the engine tells them what it
decided, where it decided it, on both drivers.

Where they are shown is the exposition's business, as with any prometheus_client
metric:

* **Dramatiq's** ``dramatiq.middleware.prometheus.Prometheus`` middleware: it sets
  ``PROMETHEUS_MULTIPROC_DIR`` in each worker process at boot and serves every
  process's values from a forked HTTP server (port 9191). prometheus_client
  chooses how values are stored (in memory, or per process in memory-mapped
  files) when it is first imported, so ``setup(..., metrics=True)``, which runs
  in the module a worker imports before it boots, installs them *lazily*:
  nothing imports prometheus_client, and no metric is created, before the
  worker has booted (our middleware's ``after_worker_boot``, which follows every
  middleware's ``after_process_boot``) or the first thing to count.
* **A plain** ``prometheus_client.start_http_server(port)`` in a process of one's
  own (a web app, the in-process driver): the metrics live in
  ``prometheus_client.REGISTRY`` (or the ``registry`` given).
* **prometheus_client's multi-process mode** without Dramatiq's middleware: set
  ``PROMETHEUS_MULTIPROC_DIR`` before the processes start and serve a
  ``MultiProcessCollector``; the gauges use ``livesum`` / ``livemostrecent``.

A job's end is counted once across processes. Its writer counts it when it
observes, and only if its own compare-and-set write ended the job (of two
cancellers, the one that finds the row Cancelled already counts nothing). An
end written by a process without metrics (the CLI, a script, a dashboard) is
counted by whichever worker with metrics sets the row's ``state["counted"]``
marker by compare-and-set (:mod:`~pypepper_dramatiq.records.state`): the worker that
meets the ended row (its attempt lost to the cancel, the cancelled job's message
reached it, the in-process driver took it), else the recovery sweep's leader,
whose ``count_ends`` duty reads the Cancelled and Failed rows updated since its
watermark (a job cancelled while held in the store, delayed or waiting, meets no
worker; a job a worker without metrics failed when its parent failed).
That watermark is kept in memory: a new leader looks back an hour, so the ends
of such jobs cancelled while no worker with metrics led the sweep for longer
than that stay uncounted. Run the workers with metrics: a leader without them
counts nothing. A worker creates the series of the channels it serves at 0 when
it starts.

Labels are bounded: statuses, channel ids, job categories, task names, schedule
names (all defined by code), never a job id.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..channels.channel import manager
from ..errors import ConfigError
from ..ops import observers
from ..ops.logs import get_logger
from ..records.record import JobRecord
from ..rules.status import Status
from ..stores.base import HELD_REASONS
from .pending import PendingWrites

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

logger = get_logger(__name__)
#: Any of the prometheus_client metric kinds (Counter, Gauge, Histogram).
_Metric = TypeVar("_Metric")

#: Every metric's name starts with this.
PREFIX = "pypepper_"

#: The seconds every duration histogram has: 50 ms to a minute.
_COMMON_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_INF = float("inf")
#: Two minutes to six hours, for what may run long.
_HOURS = (120.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
#: Seconds, for a job's run (first start to end): a second to a day.
JOB_BUCKETS = (*_COMMON_BUCKETS, *_HOURS, 86400.0, _INF)
#: Seconds, for one attempt of a task.
TASK_BUCKETS = (0.005, 0.01, 0.025, *_COMMON_BUCKETS, 300.0, 900.0, 3600.0, _INF)
#: Seconds from a job's planned start to its first step's claim.
START_DELAY_BUCKETS = (0.01, 0.025, *_COMMON_BUCKETS, 300.0, 900.0, 3600.0, _INF)

#: The ``status`` labels of ``pypepper_jobs_ended_total``.
ENDED_STATUSES = (Status.COMPLETED.value, Status.FAILED.value, Status.CANCELLED.value)

_MULTIPROC_VARIABLES = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def multiprocess_mode() -> bool:
    """Whether prometheus_client stores values in files for a multi-process exposition
    (``PROMETHEUS_MULTIPROC_DIR`` is set, as Dramatiq's middleware sets it at boot)."""
    return any(os.environ.get(name) for name in _MULTIPROC_VARIABLES)


class _Collectors:
    """The prometheus_client metrics, created together in one registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        # Imported here, never at module level: see the module's docstring.
        import prometheus_client
        from prometheus_client import values

        self.multiprocess = multiprocess_mode()
        if self.multiprocess and not getattr(values.ValueClass, "_multiprocess", False):
            logger.warning(
                "PROMETHEUS_MULTIPROC_DIR is set but prometheus_client was imported before it "
                "was: this process's metrics stay in its memory and a multi-process "
                "exposition (Dramatiq's Prometheus middleware) will not show them. Import "
                "prometheus_client only after the process booted."
            )
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        #: In multi-process mode the per-job additions are written in bulk (see
        #: :mod:`~pypepper_dramatiq.metrics.pending`); in memory they cost little.
        self.pending = PendingWrites() if self.multiprocess else None
        reg = self.registry

        def named(kind: Callable[..., _Metric]) -> Callable[..., _Metric]:
            """``kind`` of metric, each named with the package's prefix, in this registry."""

            def make(name: str, documentation: str, labels: list[str], **options: Any) -> _Metric:
                return kind(f"{PREFIX}{name}", documentation, labels, registry=reg, **options)

            return make

        counter = named(prometheus_client.Counter)
        gauge = named(prometheus_client.Gauge)
        histogram = named(prometheus_client.Histogram)

        self.jobs_ended: Counter = counter(
            "jobs_ended",
            "Jobs that ended, by final status, channel and category.",
            ["status", "channel", "category"],
        )
        self.jobs_scheduled: Counter = counter(
            "jobs_scheduled",
            "Jobs stored Scheduled, by channel, counted by the process that scheduled "
            "them (a producer with metrics installed, a worker for recurring firings "
            "and the jobs its tasks schedule).",
            ["channel"],
        )
        self.jobs_held: Gauge = gauge(
            "jobs_held",
            "Jobs held in the store, by channel and reason: jobs (waiting for other "
            "jobs or a key's holder), time (sent at their release time) or paused (a "
            "step held until its channel or task is resumed), as the recovery sweep "
            "last read them.",
            ["channel", "reason"],
            multiprocess_mode="livemostrecent",
        )
        self.starts_held: Counter = counter(
            "starts_held",
            "Step starts held instead of run, unrun and no attempt counted, by channel "
            "and reason: rate_limit (over its channel's or its key's rate limit: it asks "
            "again at its turn, and counts again if refused again), paused (its channel "
            "or task paused: held until resumed) or concurrency_limit (over its channel's "
            "or its key's running limit: it asks again, and counts again if refused).",
            ["channel", "reason"],
        )
        self.job_duration: Histogram = histogram(
            "job_duration_seconds",
            "Seconds from a job's first start (its first attempt) to its end; jobs that "
            "never started are not observed.",
            ["status", "channel", "category"],
            buckets=JOB_BUCKETS,
        )
        self.start_delay: Histogram = histogram(
            "job_start_delay_seconds",
            "Seconds from a job's planned start (its eta or delay, else when it was "
            "scheduled) to the claim of its first step.",
            ["channel"],
            buckets=START_DELAY_BUCKETS,
        )
        self.task_duration: Histogram = histogram(
            "task_duration_seconds",
            "Seconds one attempt of a task ran, by task name and outcome.",
            ["task", "outcome"],
            buckets=TASK_BUCKETS,
        )
        self.steps_in_progress: Gauge = gauge(
            "steps_in_progress",
            "Attempts running now, by channel.",
            ["channel"],
            multiprocess_mode="livesum",
        )
        self.retries: Counter = counter(
            "task_retries",
            "Failed attempts followed by another attempt of the same task.",
            ["task"],
        )
        self.recoveries: Counter = counter(
            "recoveries",
            "Steps the recovery sweep sent again: lease_lapsed (a dead or hung worker's "
            "step) or message_lost (a Scheduled job whose message was gone).",
            ["channel", "kind"],
        )
        self.deadlines_missed: Counter = counter(
            "start_deadlines_missed",
            "Jobs cancelled because they had not started by their start deadline.",
            ["channel"],
        )
        self.firings: Counter = counter(
            "recurring_firings",
            "Jobs fired by recurring schedules, by schedule name.",
            ["schedule"],
        )
        self.sweep_failures: Counter = counter(
            "sweep_failures",
            "Failures of the recovery sweep's duties, by duty: a pass where the duty "
            "raised counts one, and so does each row it skipped (unreadable, or its "
            "handling raised).",
            ["duty"],
        )
        if self.multiprocess:
            # The exposition runs in another process: the sweep leader writes the depths.
            self.channel_depth: Gauge | None = gauge(
                "channel_depth",
                "Jobs waiting in a channel (admitted, not started), as last read.",
                ["channel"],
                multiprocess_mode="livemostrecent",
            )
        else:
            self.channel_depth = None
            reg.register(cast("Collector", _ChannelDepths()))


class _ChannelDepths:
    """``pypepper_channel_depth`` read at each scrape from this process's channels."""

    name = f"{PREFIX}channel_depth"
    documentation = "Jobs waiting in a channel (admitted, not started), read at scrape time."

    def _family(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(self.name, self.documentation, labels=["channel"])

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for channel_id in manager.ids():
            channel = manager.get(channel_id)
            if channel is None:
                continue
            try:
                family.add_metric([channel_id], channel.length())
            except Exception as exc:  # a broker down: no figure, not a failed scrape
                logger.debug("channel %s: depth not read: %s", channel_id, exc)
        yield family


#: The metrics made for each registry (by id; the registry is kept alive with them),
#: so that a second install on one registry reuses them instead of clashing.
_made: dict[int, _Collectors] = {}
_made_lock = threading.Lock()


def _collectors_for(registry: CollectorRegistry | None) -> _Collectors:
    with _made_lock:
        if registry is None:
            import prometheus_client

            registry = prometheus_client.REGISTRY
        made = _made.get(id(registry))
        if made is None or made.registry is not registry:
            made = _made[id(registry)] = _Collectors(registry)
        return made


class PrometheusMetrics(observers.Observer):
    """The observer that counts into prometheus_client metrics.

    Args:
        registry: where the metrics are registered; None: prometheus_client's
            default ``REGISTRY`` (what ``start_http_server`` serves).
        lazy: create the metrics only when a Dramatiq worker has booted here or
            at the first event (see the module's docstring); else now.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, lazy: bool = False) -> None:
        self.registry = registry
        self._made: _Collectors | None = None
        #: Children of labelled metrics, by (metric, labels): ``labels()`` takes a lock.
        self._children: dict[tuple[object, ...], Any] = {}
        #: The ``(channel, reason)`` series of the held gauge set so far.
        self._held_seen: set[tuple[str, str]] = set()
        if not lazy:
            self.collectors()

    def collectors(self) -> _Collectors:
        """The metrics, created now if they were not yet."""
        made = self._made
        if made is None:
            made = self._made = _collectors_for(self.registry)
        return made

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _inc(self, metric: Any, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to the series ``labels`` of a counter or a gauge (``metric``
        is one of :meth:`collectors`, so they were made)."""
        child = self._child(metric, *labels)
        pending = self._made.pending if self._made is not None else None
        if pending is None:
            child.inc(amount)
        else:
            pending.add(child, amount)

    def _observe(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        """Observe ``value`` into the series ``labels`` of a histogram (as :meth:`_inc`)."""
        child = self._child(metric, *labels)
        pending = self._made.pending if self._made is not None else None
        if pending is None:
            child.observe(value)
        else:
            pending.observe(child, value)

    # -- the observer ---------------------------------------------------------------

    def worker_started(self) -> None:
        made = self.collectors()
        self.serve(manager.ids())
        if multiprocess_mode() and not made.multiprocess:
            logger.warning(
                "the metrics were created before this worker process booted, so they stay "
                "in its memory and a multi-process exposition (Dramatiq's Prometheus "
                "middleware) will not show them: install them with setup(..., metrics=True) "
                "or install_metrics(lazy=True)"
            )

    def job_scheduled(self, channel_id: str) -> None:
        self._inc(self.collectors().jobs_scheduled, (channel_id,))

    def job_started(self, record: JobRecord, started: datetime) -> None:
        planned = record.not_before or record.created
        delay = max(0.0, (started - planned).total_seconds())
        made = self.collectors()
        self._observe(made.start_delay, (record.channel_id,), delay)

    def job_ended(self, record: JobRecord) -> None:
        made = self.collectors()
        labels = (record.status.value, record.channel_id, record.category or "")
        self._inc(made.jobs_ended, labels)
        first = first_start(record)
        if first is not None:
            seconds = max(0.0, (record.updated - first).total_seconds())
            self._observe(made.job_duration, labels, seconds)

    def step_started(self, channel_id: str, task: str) -> None:
        self._inc(self.collectors().steps_in_progress, (channel_id,))

    def step_finished(self, channel_id: str, task: str) -> None:
        self._inc(self.collectors().steps_in_progress, (channel_id,), -1.0)

    def task_ended(
        self,
        record: JobRecord,
        task: str,
        outcome: str,
        started: datetime | None,
        ended: datetime | None,
    ) -> None:
        if started is None or ended is None:
            return
        seconds = max(0.0, (ended - started).total_seconds())
        self._observe(self.collectors().task_duration, (task, outcome), seconds)

    def retried(self, record: JobRecord, task: str) -> None:
        self._inc(self.collectors().retries, (task,))

    def recovered(self, record: JobRecord, kind: str) -> None:
        self._inc(self.collectors().recoveries, (record.channel_id, kind))

    def deadline_missed(self, record: JobRecord) -> None:
        self._inc(self.collectors().deadlines_missed, (record.channel_id,))

    def fired(self, schedule: str, job_id: str) -> None:
        self._inc(self.collectors().firings, (schedule,))

    def start_held(self, channel_id: str, reason: str) -> None:
        self._child(self.collectors().starts_held, channel_id, reason).inc()

    def channel_depths(self, depths: Mapping[str, int]) -> None:
        gauge = self.collectors().channel_depth
        if gauge is None:  # one process: the depths are read at scrape time
            return
        for channel_id, depth in depths.items():
            self._child(gauge, channel_id).set(depth)

    def held_jobs(self, counts: Mapping[tuple[str, str], int]) -> None:
        gauge = self.collectors().jobs_held
        # A series read before (or served here) and absent now is at 0.
        for key in self._held_seen - counts.keys():
            self._child(gauge, *key).set(0)
        for key, count in counts.items():
            self._child(gauge, *key).set(count)
        self._held_seen = set(counts) | self._held_seen

    def serve(self, channel_ids: Iterable[str]) -> None:
        """Create the labelled series of ``channel_ids`` at 0 (a worker's channels,
        at its start), so that a rate or an alert sees their first event."""
        made = self.collectors()
        for channel_id in channel_ids:
            self._child(made.jobs_scheduled, channel_id)
            for status in ENDED_STATUSES:
                self._child(made.jobs_ended, status, channel_id, "")
            self._child(made.deadlines_missed, channel_id)
            for held_by in observers.START_HELD_REASONS:
                self._child(made.starts_held, channel_id, held_by)
            for kind in (observers.LEASE_LAPSED, observers.MESSAGE_LOST):
                self._child(made.recoveries, channel_id, kind)
            for reason in HELD_REASONS:
                # Set at each read of the sweep (a multi-process "most recent" gauge
                # shows a series only once it was set).
                self._child(made.jobs_held, channel_id, reason)
                self._held_seen.add((channel_id, reason))

    def sweep_duties(self, duties: Sequence[str]) -> None:
        # Every series exists from the start at 0, so that a rate alert sees the first failure.
        counter = self.collectors().sweep_failures
        for duty in duties:
            self._child(counter, duty)

    def sweep_failed(self, duty: str) -> None:
        self._inc(self.collectors().sweep_failures, (duty,))

    def __repr__(self) -> str:
        return f"PrometheusMetrics(registry={self.registry!r})"


def first_start(record: JobRecord) -> datetime | None:
    """When the job's first attempt started, from its attempt history (which keeps
    each task's first attempt); None if no attempt is recorded."""
    history = record.state.get("history") or {}
    starts = [entries[0].get("started") for entries in history.values() if entries]
    parsed = [datetime.fromisoformat(started) for started in starts if started]
    return min(parsed) if parsed else None


def install_metrics(
    registry: CollectorRegistry | None = None, *, lazy: bool = False
) -> PrometheusMetrics:
    """Count this process's jobs into Prometheus metrics; returns the observer.

    Installing again with the same ``registry`` returns the observer already
    installed. Call it where the work happens, and in producers too if their
    cancels and recurring triggers should count. In the module a ``dramatiq``
    worker imports, pass ``lazy=True`` (``setup(..., metrics=True)`` does):
    the metrics are then created once the worker has booted, after Dramatiq's
    Prometheus middleware chose the multi-process mode.

    Raises:
        ConfigError: prometheus_client is not installed (the ``metrics`` extra).
    """
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError(
            "metrics need prometheus_client, which is not installed; "
            "install it with: pip install 'pypepper-dramatiq[metrics]'"
        )
    for observer in observers.installed():
        if isinstance(observer, PrometheusMetrics) and observer.registry is registry:
            if not lazy:
                observer.collectors()
            return observer
    metrics = PrometheusMetrics(registry, lazy=lazy)
    observers.install(metrics)
    return metrics


def uninstall_metrics(metrics: PrometheusMetrics) -> None:
    """Stop counting into ``metrics`` (their values stay in their registry)."""
    observers.remove(metrics)
