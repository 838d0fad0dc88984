"""Driver 1: the in-process :class:`~.worker.Worker` (pypepper.scheduler's), feeding the engine."""
