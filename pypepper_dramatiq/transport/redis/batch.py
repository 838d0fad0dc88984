"""Small Redis commands of many threads, sent together: one pipeline per batch.

A worker process ends jobs on several threads at once, and each job end costs
Redis commands whose answers matter little: removing the job from its
channel's waiting set (``SREM``) and announcing its end to the waiters
(``PUBLISH``). Sent one by one, each is a round trip of its own, which on a
worker bound by its GIL costs about as much CPU as the job's own bookkeeping.

:func:`send` hands a command to the :class:`~.engine.group_commit.Combiner`
of its Redis client: a lone command goes at once, as a direct call would;
commands of other threads that arrive while a pipeline is on its way go in the
next one. Each caller gets its own reply, or its own error: a command Redis
refused raises that reply's error; a failed round trip (Redis down) raises its
connection error to every caller of that pipeline, which each handles as it
handled a failed direct call.

Only commands that may be sent again without harm belong here (a removal, a
notice): a pipeline is not a transaction, and redis-py retries a pipeline whose
connection dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...ops.group_commit import Combiner
from ..per_client import PerClient

__all__ = ["CommandBatcher", "batcher_of", "send"]

#: A Redis command: its name, then its arguments.
Command = tuple[Any, ...]


class CommandBatcher:
    """The commands of concurrent callers to ``client``, coalesced into pipelines."""

    def __init__(self, client: Any, *, max_batch: int = 100) -> None:
        self.client = client
        self._combiner: Combiner[Command, Any] = Combiner(self.run_together, max_batch=max_batch)

    @property
    def combiner(self) -> Combiner[Command, Any]:
        """The combiner behind it (its ``stats`` tell how many commands shared pipelines)."""
        return self._combiner

    def send(self, *command: Any) -> Any:
        """Run ``command`` (``"SREM", key, member``...) in a pipeline; its reply."""
        return self._combiner.submit(tuple(command))

    def run_together(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one round trip: one reply per command, in order.

        A reply Redis refused is that command's error, returned in its place (a
        lone command's is raised); a round trip that failed raises (nothing is
        known of any command then).
        """
        if len(commands) == 1:  # a lone command: no pipeline to build; its error is its own
            return [self.client.execute_command(*commands[0])]
        pipeline = self.client.pipeline(transaction=False)
        for command in commands:
            pipeline.execute_command(*command)
        # A command Redis refused is that caller's error alone; a connection
        # error raises here, to every caller of this pipeline.
        return list(pipeline.execute(raise_on_error=False))


#: The one :class:`CommandBatcher` of a Redis client in this process.
batcher_of: PerClient[CommandBatcher] = PerClient(CommandBatcher)


def send(client: Any, *command: Any) -> Any:
    """Run ``command`` on ``client``, in a pipeline with other threads' commands."""
    return batcher_of(client).send(*command)
