"""Alembic migrations for the ``scheduler_jobs`` table, run by :func:`..sql.upgrade_schema`."""
