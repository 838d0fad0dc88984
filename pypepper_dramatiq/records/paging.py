"""The jobs list's cursor: the ``(created, id)`` of a page's last row, as an opaque string.

One form for ``pypepper-dramatiq jobs --before`` and the dashboard: a cursor the
shell printed opens that page in the dashboard and the other way round.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime, timezone

from ..limits.storable import unstorable_in


def encode_cursor(created: datetime, job_id: str) -> str:
    """The cursor of the page after the row ``(created, job_id)``."""
    raw = f"{created.astimezone(timezone.utc).isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, str] | None:
    """The ``(created, id)`` a cursor of :func:`encode_cursor` holds; None if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        created, job_id = raw.split("|", 1)
        when = datetime.fromisoformat(created)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if when.tzinfo is None or not job_id or unstorable_in(job_id) is not None:
        return None  # no row has that id (no store keeps a NUL): not a cursor we made
    return when, job_id
