"""Small statements of many threads, sent together: a worker's slot releases and
job-end notices, one statement per batch.

A worker process ends jobs on several threads at once, and each job end gives
back its channel slot and notifies the waiters: a round trip each, whose
answers matter little. :func:`send` hands one to the
:class:`~pypepper_dramatiq.ops.group_commit.Combiner` of its engine: a lone one
goes at once as its own statement; those of other threads that arrive while a
statement is on its way go together in the next one (a ``DELETE ... USING
unnest(...)`` and ``pg_notify`` over ``unnest(...)``, in one statement).

Only what may be sent again without harm belongs here (a release, a notice). A
failed round trip raises to every caller of its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sqlalchemy import Engine, text

from ...ops.group_commit import Combiner
from ..per_client import PerClient
from .outage import run

__all__ = ["StatementBatcher", "batcher_of", "send"]

#: What to send: a release (channel, job id) or a notice (PostgreSQL channel, payload).
Command = tuple[Literal["release", "notify"], str, str]

RELEASE = text("DELETE FROM scheduler_channel_slots WHERE channel = :channel AND job_id = :job")
NOTIFY = text("SELECT pg_notify(:channel, :payload)")
#: Many releases and notices in one statement (a data-modifying WITH always runs).
TOGETHER = text(
    "WITH released AS (DELETE FROM scheduler_channel_slots s"
    " USING unnest(CAST(:release_channels AS text[]), CAST(:release_jobs AS text[]))"
    " AS r(channel, job_id) WHERE s.channel = r.channel AND s.job_id = r.job_id)"
    " SELECT pg_notify(n.channel, n.payload) FROM"
    " unnest(CAST(:notice_channels AS text[]), CAST(:notice_payloads AS text[]))"
    " AS n(channel, payload)"
)


class StatementBatcher:
    """The releases and notices of concurrent callers to ``engine``, coalesced."""

    def __init__(self, engine: Engine, *, max_batch: int = 100) -> None:
        self.engine = engine
        self._combiner: Combiner[Command, None] = Combiner(self.run_together, max_batch=max_batch)

    @property
    def combiner(self) -> Combiner[Command, None]:
        """The combiner behind it (its ``stats`` tell how many shared a statement)."""
        return self._combiner

    def send(self, command: Command) -> None:
        """Send ``command``, with whatever other threads send meanwhile.

        Raises:
            BrokerUnavailableError: PostgreSQL could not be reached.
        """
        self._combiner.submit(command)

    def run_together(self, commands: Sequence[Command]) -> list[None]:
        """Send ``commands`` in one statement (a lone one as its own)."""
        if len(commands) == 1:
            kind, channel, value = commands[0]
            if kind == "release":
                run(self.engine, f"channel {channel}", RELEASE, channel=channel, job=value)
            else:
                run(self.engine, "a notice", NOTIFY, channel=channel, payload=value)
            return [None]
        releases = [(c, v) for kind, c, v in commands if kind == "release"]
        notices = [(c, v) for kind, c, v in commands if kind == "notify"]
        run(
            self.engine,
            "releases and notices",
            TOGETHER,
            release_channels=[c for c, _ in releases],
            release_jobs=[v for _, v in releases],
            notice_channels=[c for c, _ in notices],
            notice_payloads=[v for _, v in notices],
        )
        return [None] * len(commands)


#: The one :class:`StatementBatcher` of an engine in this process.
batcher_of: PerClient[StatementBatcher] = PerClient(StatementBatcher)


def send(engine: Engine, command: Command) -> None:
    """Send ``command`` on ``engine``, in a statement with other threads' commands."""
    batcher_of(engine).send(command)
