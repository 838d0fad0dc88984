"""One install for the design: what ``pip install pypepper-dramatiq`` brings.

Read from the installed distribution's metadata (``scripts/test`` reinstalls the
package whenever ``setup.cfg`` changes), as pip would resolve it.
"""

from __future__ import annotations

import re
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _requirements() -> list[Requirement]:
    return [Requirement(line) for line in requires("pypepper-dramatiq") or []]


def _extra_of(requirement: Requirement) -> str | None:
    found = re.search(r'extra == "([^"]+)"', str(requirement.marker or ""))
    return found.group(1) if found else None


def test_the_plain_install_has_redis_postgres_and_cron() -> None:
    plain = {canonicalize_name(r.name): r for r in _requirements() if _extra_of(r) is None}
    assert {"dramatiq", "redis", "sqlalchemy", "psycopg", "croniter", "alembic"} <= plain.keys()
    assert "redis" in plain["dramatiq"].extras
    assert "binary" in plain["psycopg"].extras


def test_extras_are_for_what_a_user_may_not_want() -> None:
    by_extra: dict[str, set[str]] = {}
    for requirement in _requirements():
        extra = _extra_of(requirement)
        if extra is not None:
            by_extra.setdefault(extra, set()).add(canonicalize_name(requirement.name))
    assert by_extra["mysql"] == {"pymysql"}
    assert by_extra["dashboard"] >= {"werkzeug", "jinja2", "itsdangerous"}
    assert by_extra["metrics"] == {"prometheus-client"}
    assert by_extra["rabbitmq"] == {"dramatiq"}  # dramatiq[rabbitmq]: pika
    assert by_extra["otel"] == {"opentelemetry-api", "opentelemetry-sdk"}
    assert by_extra["all"] == (
        by_extra["mysql"]
        | by_extra["dashboard"]
        | by_extra["metrics"]
        | by_extra["rabbitmq"]
        | by_extra["otel"]
    )
    # The old names install nothing more: an install line of an earlier release works.
    assert not {"postgres", "redis", "cron"} & by_extra.keys()
