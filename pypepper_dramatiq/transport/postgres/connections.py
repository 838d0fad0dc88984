"""Connections of their own (not the pool's), for what stays on one session: the
notices' ``LISTEN`` and the leader's advisory lock."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import Engine

#: Seconds a dedicated connection waits for the server before giving up.
CONNECT_TIMEOUT_SECONDS = 5


def dedicated(engine: Engine) -> psycopg.Connection[Any]:
    """A new autocommit psycopg connection to ``engine``'s database (its URL's
    parameters), with TCP keepalives on, so that a peer gone without closing is
    noticed."""
    _, params = engine.dialect.create_connect_args(engine.url)
    params = {key: value for key, value in params.items() if key != "context"}
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 10)
    params.setdefault("keepalives_interval", 5)
    params.setdefault("keepalives_count", 3)
    return psycopg.connect(autocommit=True, **params)
