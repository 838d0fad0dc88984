"""Channels: named, bounded Dramatiq queues that carry jobs, and what admits jobs to them.

* :mod:`.channel`: :class:`Channel` and the process's :data:`manager`;
* :mod:`.broker`: which Dramatiq broker carries the messages, and its transport (whose
  gates admit jobs, "ok" / "full" / "stopped": :mod:`pypepper_dramatiq.transport`);
* :mod:`.messages`: what a message says (a job and a position).
"""
