"""Who may look and who may act: the ``auth`` callables and the CSRF tokens of the forms.

A request is let in when the dashboard's ``auth`` callable answers exactly True
for its WSGI environ (:func:`basic_auth` makes one for HTTP basic auth); any other
answer, truthy or not, keeps it out. Each action is a POST form carrying a token
signed with the dashboard's secret key (itsdangerous) over a random value the
browser keeps in a ``SameSite=Strict``, ``HttpOnly`` cookie: a page of another
site can neither read the token nor send the cookie, so it cannot make a
signed-in browser act. As a second line, a POST whose ``Origin`` (or, without
one, ``Referer``) names another host is refused whatever it carries
(:func:`same_origin`).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from itsdangerous import BadData, URLSafeTimedSerializer
from werkzeug.datastructures import Authorization

#: What decides whether a request may see (and act on) the dashboard: its WSGI environ.
#: Only the answer ``True`` (the bool itself) lets the request in.
Auth = Callable[[Mapping[str, Any]], bool]

#: The cookie holding the browser's CSRF value.
CSRF_COOKIE = "pypepper_dashboard_csrf"
#: The form field holding the signed token.
CSRF_FIELD = "csrf_token"
#: How long a form's token stays good, in seconds (a page left open for a day still acts).
CSRF_MAX_AGE = 24 * 3600
#: Salt of the tokens' signatures (a key used for other signatures too cannot forge them).
_SALT = "pypepper-dramatiq.dashboard.csrf"
#: The realm a 401 names.
REALM = "pypepper-dramatiq"


def basic_auth(user: str, password: str) -> Auth:
    """An ``auth`` callable that lets in requests with these HTTP basic credentials.

    Both are compared in constant time (:func:`hmac.compare_digest`), on their
    UTF-8 bytes.

    Raises:
        ValueError: an empty user or password.
    """
    if not user or not password:
        raise ValueError("basic auth needs a non-empty user and password")
    wanted_user, wanted_password = user.encode(), password.encode()

    def allowed(environ: Mapping[str, Any]) -> bool:
        given = Authorization.from_header(environ.get("HTTP_AUTHORIZATION"))
        if given is None or given.type != "basic":
            return False
        user_ok = hmac.compare_digest((given.username or "").encode(), wanted_user)
        password_ok = hmac.compare_digest((given.password or "").encode(), wanted_password)
        return user_ok and password_ok

    return allowed


class CsrfTokens:
    """Signed form tokens bound to the browser's cookie value."""

    def __init__(self, secret_key: str | bytes) -> None:
        self._serializer = URLSafeTimedSerializer(secret_key, salt=_SALT)

    @staticmethod
    def new_value() -> str:
        """A fresh cookie value."""
        return secrets.token_urlsafe(32)

    def token(self, value: str) -> str:
        """The form token for the cookie ``value``."""
        return self._serializer.dumps(value)

    def valid(self, token: str | None, value: str | None) -> bool:
        """Whether ``token`` was signed by this key, is not too old, and is for ``value``."""
        if not token or not value:
            return False
        try:
            signed = self._serializer.loads(token, max_age=CSRF_MAX_AGE)
        except BadData:
            return False
        return isinstance(signed, str) and hmac.compare_digest(signed.encode(), value.encode())


def _place(netloc: str) -> tuple[str, int | None] | None:
    """A host and port as compared: the host in lower case, the port None when it is
    absent or a default one (80, 443: a proxy may end TLS, so the scheme is not
    compared); None if ``netloc`` names no host."""
    try:
        parts = urlsplit(f"//{netloc}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return None
    if not host:
        return None
    return host, None if port in (None, 80, 443) else port


def same_origin(hosts: Iterable[str], origin: str | None, referer: str | None) -> bool:
    """Whether a POST comes from a page of this dashboard, by the browser's headers.

    The ``Origin`` header decides; without one, the ``Referer``. A browser sends
    them with every form, and a page cannot forge them. A request with neither
    (not a browser's cross-site form: a script, an old client) passes here, and its
    token and cookie still decide. An origin that is ``null`` (an opaque one: a
    sandboxed frame, a ``data:`` page) or not http(s) is foreign.

    Args:
        hosts: the hosts this dashboard is reached by (the request's ``Host``, and
            the ``X-Forwarded-Host`` a proxy set), as ``host[:port]``.
        origin: the request's ``Origin`` header, if any.
        referer: its ``Referer`` header, if any.
    """
    source = origin if origin is not None else referer
    if source is None:
        return True
    try:
        parts = urlsplit(source.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https"):
        return False
    place = _place(parts.netloc.rpartition("@")[2])
    return place is not None and any(place == _place(host.strip()) for host in hosts)
