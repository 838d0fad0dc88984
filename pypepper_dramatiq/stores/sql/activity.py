"""The activity rollup's rows (the dashboard's charts): added to with the mark's
compare-and-set, read added up per bucket of time."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from ...records.activity import (
    ENDED,
    TIME_BUCKETS,
    Activity,
    ActivityMark,
    grain_for,
    grained,
)
from ..base import as_utc
from ..schema import UtcDateTime, activity, activity_mark
from .boundary import boundary
from .engine import transaction
from .parts import SqlStorePart

#: The mark's one row.
_MARK_ID = 1
#: The count columns, in :data:`~pypepper_dramatiq.records.activity.ENDED`'s order.
_ENDED_COLUMNS = tuple(status.value.lower() for status in ENDED)
_WAIT_COLUMNS = tuple(f"wait_{i:02d}" for i in range(TIME_BUCKETS))
_RUN_COLUMNS = tuple(f"run_{i:02d}" for i in range(TIME_BUCKETS))
#: Rows per upsert statement.
_ROWS_PER_STATEMENT = 500


def _values(grain: int, start: datetime, channel: str, added: Activity) -> dict[str, Any]:
    values: dict[str, Any] = {
        "span_minutes": grain,
        "at_minute": start,
        "channel_id": channel,
        "depth": added.depth,
    }
    values.update(zip(_ENDED_COLUMNS, added.ended, strict=True))
    values.update(zip(_WAIT_COLUMNS, added.waits, strict=True))
    values.update(zip(_RUN_COLUMNS, added.runs, strict=True))
    return values


class _MarkMoved(Exception):
    """The mark is not where the caller read it: another leader moved it."""


class ActivityRows(SqlStorePart):
    """The ``scheduler_activity`` rows and their mark."""

    keeps_activity = True

    def activity_mark(self) -> ActivityMark | None:
        query = select(activity_mark.c.first_minute, activity_mark.c.next_minute).where(
            activity_mark.c.id == _MARK_ID
        )
        with boundary(self._engine, "reading the activity mark"), self._engine.connect() as c:
            row = c.execute(query).first()
        return None if row is None else ActivityMark(row[0], row[1])

    def add_activity(
        self,
        minutes: Mapping[tuple[datetime, str], Activity],
        moved: tuple[ActivityMark | None, ActivityMark] | None = None,
    ) -> bool:
        # Each minute's row and its quarter's and hour's, in the key's order (two
        # leaders' upserts then lock rows in one order).
        rows = [_values(g, at, ch, a) for (g, at, ch), a in sorted(grained(minutes).items())]
        try:
            with (
                boundary(self._engine, "adding to the activity rollup"),
                transaction(self._engine) as conn,
            ):
                if moved is not None and not self._move_mark(conn, *moved):
                    raise _MarkMoved  # rolls the transaction back
                for start in range(0, len(rows), _ROWS_PER_STATEMENT):
                    batch = rows[start : start + _ROWS_PER_STATEMENT]
                    conn.execute(self._dialect.activity_upsert(batch))
        except _MarkMoved:
            return False
        return True

    @staticmethod
    def _move_mark(conn: Connection, before: ActivityMark | None, after: ActivityMark) -> bool:
        """Compare-and-set of the mark, first in the transaction (its row lock orders
        two leaders: the second finds the mark moved)."""
        values = {"first_minute": after.first_minute, "next_minute": after.next_minute}
        if before is None:
            taken = select(activity_mark.c.id).where(activity_mark.c.id == _MARK_ID)
            if conn.execute(taken).first() is not None:
                return False
            try:
                conn.execute(insert(activity_mark).values(id=_MARK_ID, **values))
            except IntegrityError:  # two first leaders racing: this one lost
                raise _MarkMoved from None
            return True
        stmt = (
            update(activity_mark)
            .where(
                activity_mark.c.id == _MARK_ID,
                activity_mark.c.next_minute == before.next_minute,
            )
            .values(**values)
        )
        return conn.execute(stmt).rowcount == 1

    def activity(
        self, since: datetime, until: datetime, bucket_seconds: int
    ) -> dict[tuple[int, str], Activity]:
        # A range of the primary key (span_minutes, at_minute, channel_id) at the
        # coarsest grain that fits the buckets, added up per bucket in one GROUP BY: a
        # week is 168 hour rows a channel, a day 96 quarters, an hour 60 minutes.
        grain = grain_for(int(bucket_seconds), since)
        bucket = self._dialect.whole_seconds_since(activity.c.at_minute, since) / int(
            bucket_seconds
        )
        bucket = func.floor(bucket).label("bucket")
        sums = [
            func.sum(activity.c[name]) for name in _ENDED_COLUMNS + _WAIT_COLUMNS + _RUN_COLUMNS
        ]
        query = (
            select(bucket, activity.c.channel_id, func.max(activity.c.depth), *sums)
            .where(
                activity.c.span_minutes == grain,
                activity.c.at_minute >= since,
                activity.c.at_minute < until,
            )
            .group_by(bucket, activity.c.channel_id)
        )
        with boundary(self._engine, "reading the activity rollup"), self._engine.connect() as c:
            found = c.execute(query).all()
        ends, waits = len(_ENDED_COLUMNS), len(_ENDED_COLUMNS) + TIME_BUCKETS
        out: dict[tuple[int, str], Activity] = {}
        for index, channel, depth, *counts in found:
            numbers = [int(n or 0) for n in counts]
            out[int(index), str(channel)] = Activity(
                ended=tuple(numbers[:ends]),
                waits=tuple(numbers[ends:waits]),
                runs=tuple(numbers[waits:]),
                depth=None if depth is None else int(depth),
            )
        return out

    def forget_activity(self, before: datetime) -> int:
        cutoff = as_utc(before)
        with boundary(self._engine, "deleting old activity"), transaction(self._engine) as conn:
            deleted = conn.execute(delete(activity).where(activity.c.at_minute < cutoff)).rowcount
            conn.execute(
                update(activity_mark)
                .where(activity_mark.c.id == _MARK_ID, activity_mark.c.first_minute < cutoff)
                .values(
                    first_minute=func.least(
                        literal(cutoff, UtcDateTime()), activity_mark.c.next_minute
                    )
                )
            )
        return int(deleted)
