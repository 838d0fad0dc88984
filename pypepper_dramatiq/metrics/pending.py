"""The metrics' additions held in this process's memory and written to
prometheus_client's per-process files in bulk, in multi-process mode.

There, each ``inc`` or ``observe`` of a prometheus_client metric takes a lock,
asks the kernel for the process id (to notice a fork) and writes the memory-mapped
file: about 5 us each on a shared machine, nine a job, on the worker threads that
hold the GIL. Here a worker thread only adds to a dict; a flusher thread writes
the sums every :data:`FLUSH_SECONDS` (and at the process's exit), so a multi-process
exposition shows them at most that late. Gauges that are set (not added to) are
written at once by their callers.
"""

from __future__ import annotations

import atexit
import os
import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from ..ops.logs import get_logger

logger = get_logger(__name__)

#: How often the flusher writes what was added meanwhile (seconds): the most a
#: multi-process exposition lags behind this process.
FLUSH_SECONDS = 1.0


class _Histogram:
    """What was observed into one labelled histogram since the last write."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0


class PendingWrites:
    """Additions to labelled prometheus_client metrics (children), summed in memory
    by the threads that make them and written by a daemon thread."""

    def __init__(self, interval: float = FLUSH_SECONDS) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._adds: dict[Any, float] = {}
        self._observed: dict[Any, _Histogram] = {}
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        # A forked child starts empty, with a flusher of its own when it adds
        # (the parent's sums are the parent's to write).
        os.register_at_fork(after_in_child=self._forget)

    def add(self, child: Any, amount: float = 1.0) -> None:
        """Add ``amount`` to a counter's or a gauge's child (a gauge: may be negative)."""
        with self._lock:
            self._adds[child] = self._adds.get(child, 0.0) + amount
            if self._flusher is None:
                self._start()

    def observe(self, child: Any, value: float) -> None:
        """Observe ``value`` into a histogram's child."""
        with self._lock:
            pending = self._observed.get(child)
            if pending is None:
                bounds = getattr(child, "_upper_bounds", None)
                if bounds is None or not hasattr(child, "_buckets"):
                    # Another prometheus_client: no bulk write, the plain observe.
                    child.observe(value)
                    return
                pending = self._observed[child] = _Histogram(bounds)
            pending.counts[bisect_left(pending.bounds, value)] += 1
            pending.total += value
            if self._flusher is None:
                self._start()

    def flush(self) -> None:
        """Write what was added since the last write (each child once)."""
        with self._lock:
            adds, self._adds = self._adds, {}
            observed, self._observed = self._observed, {}
        for child, amount in adds.items():
            if amount:
                child.inc(amount)
        for child, pending in observed.items():
            # What Histogram.observe does, once per bucket with the sum of the values.
            child._sum.inc(pending.total)
            for bucket, count in zip(child._buckets, pending.counts, strict=True):
                if count:
                    bucket.inc(count)

    def close(self) -> None:
        """Stop the flusher and write what is left."""
        self._stop.set()
        self.flush()

    def _forget(self) -> None:
        # New locks too: the parent's flusher may have held one at the fork.
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._adds, self._observed, self._flusher = {}, {}, None

    def _start(self) -> None:
        # Under self._lock.
        self._flusher = threading.Thread(
            target=self._run, name="pypepper-metrics-flusher", daemon=True
        )
        self._flusher.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # a metric file unwritable: the next pass tries again
                logger.exception("the metrics' pending additions were not written")
