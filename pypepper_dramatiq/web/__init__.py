"""The web dashboard: jobs, one job's history, schedules and channels, with a few actions.

A WSGI application (Werkzeug, Jinja2, itsdangerous: ``pip install
'pypepper-dramatiq[dashboard]'``) to serve alone (``pypepper-dramatiq dashboard``)
or mount under a prefix of a Flask, Django or any WSGI application::

    from pypepper_dramatiq.web import basic_auth, make_app

    app = make_app(auth=basic_auth("ops", "s3cret"))
"""

from __future__ import annotations

try:
    import itsdangerous  # noqa: F401
    import jinja2  # noqa: F401
    import werkzeug  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"the dashboard needs Werkzeug, Jinja2 and itsdangerous ({exc}); install them "
        "with: pip install 'pypepper-dramatiq[dashboard]'"
    ) from exc

from ..records.paging import decode_cursor, encode_cursor
from .app import Dashboard, make_app
from .security import Auth, basic_auth

__all__ = ["Auth", "Dashboard", "basic_auth", "decode_cursor", "encode_cursor", "make_app"]
