"""A real database refusing a row's content, for the tests of data errors.

:func:`refusing` adds a CHECK constraint to the jobs table for as long as a test
needs: a row whose ``state`` (or ``payload``) holds :data:`POISON` is refused by
the server itself (PostgreSQL: an integrity error, SQLSTATE 23514; MariaDB: error
4025, which PyMySQL raises as an OperationalError), as it would refuse a value
its column cannot take. The job store must then answer ``StoreDataError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text

#: Text no row may hold while :func:`refusing` is in force.
POISON = "poison-7c1e"
#: Two halves of :data:`POISON`: a task's parameters may hold them (its row is
#: stored), and the task joins them into a result the row then refuses.
HALVES = (POISON[:4], POISON[4:])

_NAME = "test_no_poison"


@contextmanager
def refusing(uri: str, *, existing: bool = False) -> Iterator[None]:
    """While in force, the database at ``uri`` refuses rows holding :data:`POISON`.

    ``existing`` (PostgreSQL only): rows stored before may hold it (the check is
    ``NOT VALID``), but any write of them is refused.
    """
    engine = create_engine(uri)
    postgres = engine.dialect.name == "postgresql"
    content = (
        "COALESCE(payload::text, '') || state::text"
        if postgres
        else "CONCAT(COALESCE(payload, ''), state)"
    )
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    f"ALTER TABLE scheduler_jobs ADD CONSTRAINT {_NAME} "
                    f"CHECK ({content} NOT LIKE '%{POISON}%')" + (" NOT VALID" if existing else "")
                )
            )
        yield
    finally:
        drop = "DROP CONSTRAINT" if postgres else "DROP CONSTRAINT IF EXISTS"
        with engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE scheduler_jobs {drop} {_NAME}"))
        engine.dispose()
