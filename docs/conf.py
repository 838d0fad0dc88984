"""Sphinx configuration of the documentation site (``scripts/test`` builds it with
warnings as errors: ``sphinx-build -W -b html docs <out>``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "pypepper-dramatiq"
author = "the pypepper-dramatiq authors"
copyright = "2026, the pypepper-dramatiq authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "conftest.py"]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "pypepper-dramatiq"
html_static_path: list[str] = []


# napoleon reads the first line of an attribute's or property's docstring as
# "type: description"; ours are sentences ("The planned start: ..."), so their text
# is kept as written: saved before napoleon runs (priority 500), put back after.
_SENTENCE_KINDS = {"attribute", "property", "data"}
_kept: dict[str, list[str]] = {}


def _keep(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    if what in _SENTENCE_KINDS:
        _kept[name] = list(lines)


def _restore(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    if what in _SENTENCE_KINDS and name in _kept:
        lines[:] = _kept.pop(name)


def setup(app: object) -> None:
    app.connect("autodoc-process-docstring", _keep, priority=400)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", _restore, priority=600)  # type: ignore[attr-defined]
