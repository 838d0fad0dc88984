"""Driver 1: the in-process :class:`~.worker.Worker` (the seed's), feeding the engine."""
