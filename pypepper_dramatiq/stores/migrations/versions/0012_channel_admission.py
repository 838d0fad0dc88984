"""The channels' admission state, where PostgreSQL coordinates the processes.

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-02

With a broker that is not Redis (RabbitMQ), the channels' bounds, stop flags and
waiting jobs live in PostgreSQL (:mod:`pypepper_dramatiq.transport.postgres`):

* ``scheduler_channels``: one row per channel (bound, stop flag);
* ``scheduler_channel_slots``: one row per job admitted and not yet taken, with a
  ``seq`` the recovery sweep pages by;
* ``pypepper_channel_admit`` and ``pypepper_channel_admit_released``: admission as
  one call each. Each locks the channel's row, then counts its waiting jobs in a
  statement of its own: inside a PL/pgSQL function every statement reads a new
  snapshot, so the count includes what the admission the lock waited for
  inserted (a single ``INSERT ... SELECT ... WHERE count < maxsize`` would count
  from the snapshot it started with, and two racing admissions could both pass).
  That holds at READ COMMITTED only (at REPEATABLE READ every statement reads the
  transaction's snapshot): at another level they refuse to run.

PostgreSQL only: on MySQL and MariaDB Redis coordinates the processes, and this
migration creates nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pypepper_dramatiq.stores.migrations.postgres_only import postgresql_only

revision: str = "0012"
down_revision: str | None = "0011"

CHANNELS = "scheduler_channels"
SLOTS = "scheduler_channel_slots"
BY_SEQ = "ix_scheduler_channel_slots_channel_seq"

_ADMIT = """
CREATE FUNCTION pypepper_channel_admit(p_channel text, p_job text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_maxsize integer;
    v_stopped boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = 'channel admission needs'
            || ' READ COMMITTED, not ' || current_setting('transaction_isolation');
    END IF;
    SELECT maxsize, stopped INTO v_maxsize, v_stopped
        FROM scheduler_channels WHERE name = p_channel FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO scheduler_channels (name, maxsize, stopped)
            VALUES (p_channel, 0, false) ON CONFLICT (name) DO NOTHING;
        SELECT maxsize, stopped INTO v_maxsize, v_stopped
            FROM scheduler_channels WHERE name = p_channel FOR UPDATE;
    END IF;
    IF v_stopped THEN
        RETURN 'stopped';
    END IF;
    IF EXISTS (SELECT 1 FROM scheduler_channel_slots
               WHERE channel = p_channel AND job_id = p_job) THEN
        RETURN 'ok';
    END IF;
    IF v_maxsize > 0 AND (SELECT count(*) FROM scheduler_channel_slots
                          WHERE channel = p_channel) >= v_maxsize THEN
        RETURN 'full';
    END IF;
    INSERT INTO scheduler_channel_slots (channel, job_id) VALUES (p_channel, p_job);
    RETURN 'ok';
END
$$
"""

_ADMIT_RELEASED = """
CREATE FUNCTION pypepper_channel_admit_released(p_channel text, p_jobs text[])
RETURNS boolean[]
LANGUAGE plpgsql AS $$
DECLARE
    v_maxsize integer;
    v_waiting bigint;
    v_job text;
    v_answers boolean[] := '{}';
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = 'channel admission needs'
            || ' READ COMMITTED, not ' || current_setting('transaction_isolation');
    END IF;
    SELECT maxsize INTO v_maxsize
        FROM scheduler_channels WHERE name = p_channel FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO scheduler_channels (name, maxsize, stopped)
            VALUES (p_channel, 0, false) ON CONFLICT (name) DO NOTHING;
        SELECT maxsize INTO v_maxsize
            FROM scheduler_channels WHERE name = p_channel FOR UPDATE;
    END IF;
    SELECT count(*) INTO v_waiting FROM scheduler_channel_slots WHERE channel = p_channel;
    FOREACH v_job IN ARRAY p_jobs LOOP
        IF EXISTS (SELECT 1 FROM scheduler_channel_slots
                   WHERE channel = p_channel AND job_id = v_job) THEN
            v_answers := v_answers || true;
        ELSIF v_maxsize = 0 OR v_waiting < v_maxsize THEN
            INSERT INTO scheduler_channel_slots (channel, job_id) VALUES (p_channel, v_job);
            v_waiting := v_waiting + 1;
            v_answers := v_answers || true;
        ELSE
            v_answers := v_answers || false;
        END IF;
    END LOOP;
    RETURN v_answers;
END
$$
"""


@postgresql_only
def upgrade() -> None:
    op.create_table(
        CHANNELS,
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("maxsize", sa.Integer, nullable=False),
        sa.Column("stopped", sa.Boolean, nullable=False),
    )
    op.create_table(
        SLOTS,
        sa.Column(
            "channel",
            sa.String(128),
            sa.ForeignKey(f"{CHANNELS}.name", ondelete="CASCADE", name="fk_channel_slots_channel"),
            primary_key=True,
        ),
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    )
    op.create_index(BY_SEQ, SLOTS, ["channel", "seq"])
    op.execute(_ADMIT)
    op.execute(_ADMIT_RELEASED)


@postgresql_only
def downgrade() -> None:
    op.execute("DROP FUNCTION pypepper_channel_admit_released(text, text[])")
    op.execute("DROP FUNCTION pypepper_channel_admit(text, text)")
    op.drop_index(BY_SEQ, table_name=SLOTS)
    op.drop_table(SLOTS)
    op.drop_table(CHANNELS)
