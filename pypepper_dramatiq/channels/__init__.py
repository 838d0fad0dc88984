"""Channels: named, bounded Dramatiq queues that carry jobs, and what admits jobs to them.

* :mod:`.channel`: :class:`Channel` and the process's :data:`manager`;
* :mod:`.admission`: the gates that admit jobs ("ok" / "full" / "stopped"), local or
  shared through Redis;
* :mod:`.broker`: which Dramatiq broker carries the messages;
* :mod:`.messages`: what a message says (a job and a position).
"""
