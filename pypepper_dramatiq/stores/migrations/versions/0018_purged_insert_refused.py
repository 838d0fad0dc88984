"""An insert of a purged job's row is refused once it is done, not only before.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04

The stores never insert the row of a job retention deleted while its tombstone is
kept: the insert checks ``scheduler_purged`` itself. That check reads the tombstones
as its statement began, so an insert that waited on the lock of the row a purge was
deleting went on once the purge committed, and stored the purged job again. Here an
``AFTER INSERT`` trigger on ``scheduler_jobs`` reads the tombstone once the row is in
(a statement of its own: under READ COMMITTED it sees the purge that committed
meanwhile) and raises ``PP001``, which rolls the insert back; the store answers that
nothing was stored. The common insert pays one index lookup in the server and no
round trip.

PostgreSQL only: MySQL's inserts read the tombstone again in their own transaction.
"""

from __future__ import annotations

from alembic import op

from pypepper_dramatiq.stores.migrations.postgres_only import postgresql_only

revision: str = "0018"
down_revision: str | None = "0017"

_REFUSE = """
CREATE OR REPLACE FUNCTION pypepper_refuse_purged() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM scheduler_purged WHERE job_id = NEW.id) THEN
        RAISE EXCEPTION 'job % was deleted by retention while it was being inserted', NEW.id
            USING ERRCODE = 'PP001';
    END IF;
    RETURN NULL;
END
$$
"""

_TRIGGER = """
CREATE TRIGGER pypepper_refuse_purged AFTER INSERT ON scheduler_jobs
    FOR EACH ROW EXECUTE FUNCTION pypepper_refuse_purged()
"""


@postgresql_only
def upgrade() -> None:
    op.execute(_REFUSE)
    op.execute(_TRIGGER)


@postgresql_only
def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pypepper_refuse_purged ON scheduler_jobs")
    op.execute("DROP FUNCTION IF EXISTS pypepper_refuse_purged()")
