"""The dashboard under the name users look for: ``pypepper_dramatiq.dashboard.make_app``.

The application lives in :mod:`pypepper_dramatiq.web`; this module only names it.
"""

from __future__ import annotations

from .web import basic_auth, make_app

__all__ = ["basic_auth", "make_app"]
