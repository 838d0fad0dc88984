"""The SQL store's statements, each defined once by name: SQLAlchemy Core
(portable, compiled once per dialect by SQLAlchemy's cache) or PostgreSQL's
hot statements as text."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, insert, literal, or_, select, text, tuple_, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import ColumnElement, Executable, Select

from ...records.links import AFTER
from ...rules.status import Status
from ..base import JobFilter, JobRecord
from ..claims import postgres_condition
from ..schema import activity, jobs, links, purged
from ..schema import workers as worker_rows
from .mapping import ALLOWED, row_values


def status_is(status: Status) -> ColumnElement[bool]:
    """``status = '<value>'`` with the value written into the statement, not bound.

    The statuses are few and fixed, and how many rows each has differs by orders of
    magnitude. Bound, a statement run often on one connection gets PostgreSQL's
    generic plan (psycopg prepares it after a few runs), one plan for every status:
    for a rare status, a scan of the whole table. Written in, each status keeps its
    own plan.
    """
    return jobs.c.status == literal(status.value, literal_execute=True)


#: The escape character of the ``search`` filter's LIKE pattern (the same on every dialect).
_LIKE_ESCAPE = "!"


def _like_pattern(text: str) -> str:
    """``%text%`` with the LIKE wildcards in ``text`` made plain characters."""
    for char in (_LIKE_ESCAPE, "%", "_"):
        text = text.replace(char, _LIKE_ESCAPE + char)
    return f"%{text}%"


def filters(where: JobFilter) -> builtins.list[ColumnElement[bool]]:
    """The conditions of ``where`` other than the status (each listing adds its own,
    one per branch)."""
    found: builtins.list[ColumnElement[bool]] = []
    if where.channel_id is not None:
        found.append(jobs.c.channel_id == where.channel_id)
    if where.category is not None:
        found.append(jobs.c.category == where.category)
    # A plain tuple on the right takes the columns' types (UtcDateTime's binding).
    if where.before is not None:
        found.append(tuple_(jobs.c.created, jobs.c.id) < tuple(where.before))
    if where.after is not None:
        found.append(tuple_(jobs.c.created, jobs.c.id) > tuple(where.after))
    if where.created_from is not None:
        found.append(jobs.c.created >= where.created_from)
    if where.created_until is not None:
        found.append(jobs.c.created < where.created_until)
    if where.search is not None:
        pattern = _like_pattern(where.search)
        found.append(
            or_(
                jobs.c.id.ilike(pattern, escape=_LIKE_ESCAPE),
                jobs.c.category.ilike(pattern, escape=_LIKE_ESCAPE),
                jobs.c.error.ilike(pattern, escape=_LIKE_ESCAPE),
            )
        )
    return found


COLUMNS = (
    "id, channel_id, category, status, version, created, updated, payload, state, error, "
    "lease_owner, lease_expires, not_before, release_at, start_deadline, unique_key, waits, "
    "waiting_since"
)


def _pg_insert_head(version: str) -> str:
    """The insert of a job's row from the parameters, as version ``version`` (an
    expression), unless its id has a tombstone: the head of PG_UPSERT and PG_INSERT."""
    return f"""
INSERT INTO scheduler_jobs ({COLUMNS})
SELECT %(id)s::text, %(channel_id)s, %(category)s, %(status)s, {version},
       %(created)s::timestamptz, %(updated)s::timestamptz, %(payload)s::jsonb,
       %(state)s::jsonb, %(error)s, %(lease_owner)s, %(lease_expires)s::timestamptz,
       %(not_before)s::timestamptz, %(release_at)s::timestamptz,
       %(start_deadline)s::timestamptz, %(unique_key)s, %(waits)s::jsonb,
       %(waiting_since)s::timestamptz
WHERE NOT EXISTS (SELECT 1 FROM scheduler_purged WHERE job_id = %(id)s::text)"""


#: PostgreSQL's hot statements, written out: building them with SQLAlchemy Core
#: on every call cost more CPU than the database spent running them.
#: An id with a tombstone is not inserted again: the tombstone is checked in the
#: insert itself. That check sees a purge committed before the statement began, not
#: one committing while the insert waits on the lock of the row the purge deletes:
#: the insert then goes on, the row gone, and the trigger of migration 0018 reads
#: the tombstone again once the row is in, refusing it (``PP001``,
#: :func:`~pypepper_dramatiq.stores.sql.boundary.purged_meanwhile`).
PG_UPSERT = (
    _pg_insert_head("%(version)s + 1")
    + """
ON CONFLICT (id) DO UPDATE SET
    channel_id = EXCLUDED.channel_id, category = EXCLUDED.category,
    status = EXCLUDED.status, version = scheduler_jobs.version + 1,
    updated = EXCLUDED.updated, payload = EXCLUDED.payload, state = EXCLUDED.state,
    error = EXCLUDED.error, lease_owner = EXCLUDED.lease_owner,
    lease_expires = EXCLUDED.lease_expires, not_before = EXCLUDED.not_before,
    release_at = EXCLUDED.release_at, start_deadline = EXCLUDED.start_deadline,
    unique_key = EXCLUDED.unique_key, waits = EXCLUDED.waits,
    waiting_since = EXCLUDED.waiting_since
WHERE scheduler_jobs.version = %(version)s AND scheduler_jobs.status = ANY(%(allowed)s)
RETURNING (xmax = 0) AS inserted
"""
)

#: A job's first write (its version 0): PG_UPSERT's insert, without the update that
#: no stored row (version 1 or more) could pass.
PG_INSERT = (
    _pg_insert_head("1")
    + """
ON CONFLICT (id) DO NOTHING
RETURNING true AS inserted
"""
)


PG_ADVANCE = """
UPDATE scheduler_jobs SET
    status = %(status)s, version = version + 1, updated = %(updated)s,
    state = %(state)s::jsonb, error = %(error)s, lease_owner = %(lease_owner)s,
    lease_expires = %(lease_expires)s, not_before = %(not_before)s,
    release_at = %(release_at)s, start_deadline = %(start_deadline)s,
    unique_key = %(unique_key)s, waits = %(waits)s::jsonb, waiting_since = %(waiting_since)s
WHERE id = %(id)s AND version = %(version)s AND status = ANY(%(allowed)s)
"""

PG_GET = f"SELECT {COLUMNS} FROM scheduler_jobs WHERE id = %(id)s"

# The claims below leave a row whose state is not an object (a damaged row) as it
# is: jsonb_set would fail on it; the caller's read of the row then names it.
# Their condition is the claim rule of stores.claims rendered (the one the
# memory store evaluates in Python); ``retry`` is start_times.is_retry of the
# cursor (the cursor must equal the row's), so that a late retry is refused by
# the same rule (start_times.late_retry) in every store.

_CLAIMABLE = postgres_condition(
    "", {"cursor": "%(cursor)s", "now": "%(now)s", "start": "%(start)s", "retry": "%(retry)s"}
)
_CLAIMABLE_MANY = postgres_condition(
    "j.", {"cursor": "c.cursor", "now": "c.now", "start": "c.start", "retry": "c.retry"}
)

PG_CLAIM = f"""
UPDATE scheduler_jobs SET
    status = 'InProgress', version = version + 1, updated = %(now)s,
    state = jsonb_set(state, '{{cursor}}', %(cursor)s::jsonb),
    lease_owner = %(owner)s, lease_expires = %(lease_until)s
WHERE id = %(id)s AND jsonb_typeof(state) = 'object' AND {_CLAIMABLE}
RETURNING {COLUMNS}
"""


def _prefixed(columns: str, table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in columns.split(","))


#: The batch statements' rows found by primary key whatever the table's statistics
#: say. Joined with the rows of a function (estimated at 100), the table is read whole
#: by a hash join: after a burst or a TRUNCATE, stale statistics had a claim of 12
#: rows scan a backlog of 30,000 Scheduled rows (18.6 ms against 0.24 with this
#: condition), and with fresh ones a table of 3,000 rows (0.78 ms against 0.16).
#: The ids are the JSON parameter's own (psycopg sends it once).
_BY_KEY = "j.id = ANY(ARRAY(SELECT e ->> 'id' FROM json_array_elements(%(rows)s::json) AS e))"

#: Group commit's claims: the predicate of PG_CLAIM, for each row of one JSON array.
PG_CLAIM_MANY = f"""
UPDATE scheduler_jobs AS j SET
    status = 'InProgress', version = j.version + 1, updated = c.now,
    state = jsonb_set(j.state, '{{cursor}}', c.cursor),
    lease_owner = c.owner, lease_expires = c.lease_until
FROM json_to_recordset(%(rows)s::json)
    AS c(n int, id text, cursor jsonb, owner text, now timestamptz,
         lease_until timestamptz, start bool, retry bool)
WHERE j.id = c.id AND {_BY_KEY} AND jsonb_typeof(j.state) = 'object' AND {_CLAIMABLE_MANY}
RETURNING c.n, {_prefixed(COLUMNS, "j")}
"""

#: Group commit's outcome records: PG_ADVANCE for each row of one JSON array (the
#: allowed statuses of a row as one comma-separated text; a JSON null is SQL NULL).
PG_ADVANCE_MANY = f"""
UPDATE scheduler_jobs AS j SET
    status = a.status, version = j.version + 1, updated = a.updated,
    state = a.state, error = a.error, lease_owner = a.lease_owner,
    lease_expires = a.lease_expires, not_before = a.not_before,
    release_at = a.release_at, start_deadline = a.start_deadline,
    unique_key = a.unique_key, waits = a.waits, waiting_since = a.waiting_since
FROM json_to_recordset(%(rows)s::json)
    AS a(n int, id text, version int, allowed text, status text, updated timestamptz,
         state jsonb, error text, lease_owner text, lease_expires timestamptz,
         not_before timestamptz, release_at timestamptz, start_deadline timestamptz,
         unique_key text, waits jsonb, waiting_since timestamptz)
WHERE j.id = a.id AND {_BY_KEY} AND j.version = a.version
    AND j.status = ANY(string_to_array(a.allowed, ','))
RETURNING a.n
"""


def tombstone_of(job_id: str) -> Select[Any]:
    """The tombstone of ``job_id`` (a row if the purge deleted it). Read after an
    insert, in its transaction: a purge that committed while the insert waited on
    the row it deleted is seen there, not by the insert's own check."""
    return select(purged.c.job_id).where(purged.c.job_id == job_id)


def insert_unless_purged(record: JobRecord) -> Any:
    """The INSERT of ``record``'s row, which inserts nothing when its id has a
    tombstone (the retention purge deleted it): the check is in the statement,
    ``INSERT ... SELECT ... WHERE NOT EXISTS``. Its rowcount: 1 inserted, 0 purged."""
    values = row_values(record)
    row = select(*(literal(value, jobs.c[name].type) for name, value in values.items()))
    tombstone = exists().where(purged.c.job_id == record.id)
    stmt = insert(jobs).from_select(list(values), row.where(~tombstone))
    return stmt.execution_options(preserve_rowcount=True)  # kept for INSERT too


def guarded_update(record: JobRecord, *, payload: bool = False) -> Any:
    """The compare-and-set UPDATE of ``record``'s row under :func:`put_guard`: every
    column but id and created, and but the payload unless ``payload`` (a put
    rewrites it, ``advance`` leaves it)."""
    values = row_values(record)
    for column in ("id", "created", "version", *(() if payload else ("payload",))):
        del values[column]
    values["version"] = jobs.c.version + 1
    return update(jobs).where(jobs.c.id == record.id, put_guard(record)).values(values)


def advance_statement(record: JobRecord) -> Any:
    """The compare-and-set UPDATE of ``advance``: every column but id, created, payload."""
    return guarded_update(record)


def put_guard(record: JobRecord) -> ColumnElement[bool]:
    """The stored row may be replaced by ``record``: seen version, allowed status."""
    return (jobs.c.version == record.version) & jobs.c.status.in_(ALLOWED[record.status])


def lapsed(now: datetime, limit: int) -> Select[Any]:
    """Up to ``limit`` InProgress rows whose lease lapsed before ``now``, oldest first,
    locked for this transaction; rows another recoverer holds are skipped, not awaited."""
    return (
        select(jobs.c.id)
        .where(jobs.c.status == Status.IN_PROGRESS.value, jobs.c.lease_expires < now)
        .order_by(jobs.c.lease_expires, jobs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


#: Each JSON object becomes a row typed as the table's (a JSON null is SQL NULL,
#: a nested object the value of a JSON column).
PG_INSERT_MANY = f"""
INSERT INTO scheduler_jobs ({COLUMNS})
SELECT {COLUMNS} FROM json_populate_recordset(NULL::scheduler_jobs, %(rows)s::json)
ON CONFLICT (id) DO NOTHING
RETURNING id
"""


def unawaited(ids: Sequence[str]) -> ColumnElement[bool]:
    """The rows of ``ids`` no Scheduled job waits for through a link (``after=``).

    Run after the rows are locked for update, in a statement of its own (a fresh
    read under READ COMMITTED): it sees a child whose insert committed meanwhile.
    """
    child = jobs.alias("child")
    waiting_child = (
        select(links.c.parent_id)
        .select_from(links.join(child, child.c.id == links.c.child_id))
        .where(
            links.c.parent_id.in_(ids),
            links.c.kind == AFTER,
            child.c.status == Status.SCHEDULED.value,
            child.c.waiting_since.is_not(None),
        )
    )
    return jobs.c.id.not_in(waiting_child)


#: The purge's lock on PostgreSQL: of the chosen ``ids`` the rows still ended
#: (``status``) before ``older_than``, locked for update, with their versions (the
#: caller keeps those still at the version it read). One array parameter, not a
#: list of 1,000 values: building, sending and planning that cost the worker's
#: process and the server more than the lock itself; and a primary-key lookup, not
#: a join with the pairs (which PostgreSQL planned as a hash join over the whole
#: table). A row another transaction holds (a child's scheduling share-locks its
#: parents) is skipped, not waited for: it is left for the next purge.
PG_PURGE_LOCK = """
SELECT id, version FROM scheduler_jobs
WHERE id = ANY(%(ids)s::text[]) AND status = %(status)s AND updated < %(older_than)s
FOR UPDATE SKIP LOCKED
"""

#: The purge's delete on PostgreSQL, run after :data:`PG_PURGE_LOCK` in the same
#: transaction, as a statement of its own (a fresh read under READ COMMITTED, so
#: it sees a child whose links committed while the lock waited: :func:`unawaited`):
#: the locked ``ids`` that no Scheduled job waits for through a link, and their
#: tombstones written by the same statement (an id purged before gets the new time).
PG_PURGE_DELETE = f"""
WITH gone AS (
  DELETE FROM scheduler_jobs AS j
  WHERE j.id = ANY(%(ids)s::text[]) AND j.status = %(status)s AND j.updated < %(older_than)s
    AND NOT EXISTS (
      SELECT 1 FROM scheduler_job_links AS l
      JOIN scheduler_jobs AS child ON child.id = l.child_id
      WHERE l.parent_id = j.id AND l.kind = '{AFTER}'
        AND child.status = '{Status.SCHEDULED.value}' AND child.waiting_since IS NOT NULL
    )
  RETURNING j.id
)
INSERT INTO scheduler_purged (job_id, purged_at) SELECT id, %(now)s FROM gone
ON CONFLICT (job_id) DO UPDATE SET purged_at = EXCLUDED.purged_at
RETURNING job_id
"""


def purge_guard(
    ended: Status, older_than: datetime, chosen: Sequence[tuple[str, int]]
) -> ColumnElement[bool]:
    """The rows of ``chosen`` (id, version) still at that version, ended ``ended``
    before ``older_than``: the purge's delete checks it all again (PostgreSQL's
    :data:`PG_PURGE_LOCK` checks the same with arrays)."""
    return (
        jobs.c.id.in_([job_id for job_id, _ in chosen])
        & tuple_(jobs.c.id, jobs.c.version).in_(list(chosen))
        & (jobs.c.status == ended.value)
        & (jobs.c.updated < older_than)
    )


#: ``write_progress`` on PostgreSQL: the entry merged into state["progress"] on the
#: server, version and status left alone.
PG_PROGRESS_MERGE = text(
    "UPDATE scheduler_jobs SET state = jsonb_set(state, '{progress}', "
    "COALESCE(state -> 'progress', '{}'::jsonb) || "
    "(CAST(:patch AS jsonb) -> 'progress')) "
    "WHERE id = :id AND status = 'InProgress'"
)
#: ``write_progress`` on MySQL and MariaDB: RFC 7396 merge, objects merged key by key.
MYSQL_PROGRESS_MERGE = text(
    "UPDATE scheduler_jobs SET state = JSON_MERGE_PATCH(state, :patch) "
    "WHERE id = :id AND status = 'InProgress'"
)

#: ``put_many``'s new rows on PostgreSQL in the portable path (a caller's
#: transaction): ids stored already are skipped, the inserted ones returned.
PG_INSERT_NEW = (
    pg_insert(jobs).on_conflict_do_nothing(index_elements=[jobs.c.id]).returning(jobs.c.id)
)


def pg_worker_upsert(values: dict[str, Any], kept: tuple[str, ...]) -> Executable:
    """A worker's row written by PostgreSQL's ON CONFLICT DO UPDATE."""
    stmt = pg_insert(worker_rows).values(values)
    return stmt.on_conflict_do_update(
        index_elements=[worker_rows.c.owner],
        set_={name: stmt.excluded[name] for name in values if name not in kept},
    )


def mysql_worker_upsert(values: dict[str, Any], kept: tuple[str, ...]) -> Executable:
    """A worker's row written by MySQL's and MariaDB's ON DUPLICATE KEY UPDATE."""
    stmt = mysql_insert(worker_rows).values(values)
    return stmt.on_duplicate_key_update(
        {name: stmt.inserted[name] for name in values if name not in kept}
    )


#: The rollup's columns that an upsert adds to (every count); ``depth`` keeps the deeper.
ACTIVITY_SUMS = tuple(
    c.name for c in activity.c if c.name not in ("span_minutes", "at_minute", "channel_id", "depth")
)


def _deeper(kept: Any, added: Any) -> ColumnElement[Any]:
    """The deeper of two depths, either of which may be NULL (not read)."""
    return func.greatest(func.coalesce(kept, added), func.coalesce(added, kept))


def pg_activity_upsert(rows: Sequence[dict[str, Any]]) -> Executable:
    """Rollup rows added to by PostgreSQL's ON CONFLICT DO UPDATE."""
    stmt = pg_insert(activity).values(list(rows))
    added: dict[str, Any] = {name: activity.c[name] + stmt.excluded[name] for name in ACTIVITY_SUMS}
    added["depth"] = _deeper(activity.c.depth, stmt.excluded.depth)
    return stmt.on_conflict_do_update(
        index_elements=[activity.c.span_minutes, activity.c.at_minute, activity.c.channel_id],
        set_=added,
    )


def mysql_activity_upsert(rows: Sequence[dict[str, Any]]) -> Executable:
    """Rollup rows added to by MySQL's and MariaDB's ON DUPLICATE KEY UPDATE (a column
    named on the right is the stored value)."""
    stmt = mysql_insert(activity).values(list(rows))
    added: dict[str, Any] = {name: activity.c[name] + stmt.inserted[name] for name in ACTIVITY_SUMS}
    added["depth"] = _deeper(activity.c.depth, stmt.inserted.depth)
    return stmt.on_duplicate_key_update(added)
