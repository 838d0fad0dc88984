"""6-field cron expressions read with the seconds first.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Until this release a 6-field expression was read with its seconds *last*
(croniter's default), although the documentation said first. From now on the
seconds come first. So that a stored schedule keeps firing exactly as it did
until its owner stores it again, each stored 6-field expression is rewritten
for the new reading: its last field moved to the front (``"0 * * * * 30"``, the
minute 0 at second 30, becomes ``"30 0 * * * *"``). A deploy that registers
its schedules at startup then stores its own expression, now read as written.
No row's next slot changes. Downgrade moves the first field back to the end.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"

RECURRING = sa.table("scheduler_recurring", sa.column("name"), sa.column("cron"))


def _rotated(cron: str, *, to_front: bool) -> str:
    fields = cron.split()
    if cron.strip().startswith("@") or len(fields) != 6:
        return cron
    return " ".join([fields[-1], *fields[:-1]] if to_front else [*fields[1:], fields[0]])


def _rewrite(*, to_front: bool) -> None:
    connection = op.get_bind()
    for name, cron in connection.execute(sa.select(RECURRING.c.name, RECURRING.c.cron)).all():
        rotated = _rotated(cron, to_front=to_front)
        if rotated != cron:
            connection.execute(
                RECURRING.update().where(RECURRING.c.name == name).values(cron=rotated)
            )


def upgrade() -> None:
    _rewrite(to_front=True)


def downgrade() -> None:
    _rewrite(to_front=False)
