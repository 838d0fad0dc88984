"""Every Python block of the README and the documentation site runs, in page order.

Sybil reads the pages (its MyST parsers: ``python`` code blocks, and the
``<!-- skip: next "why" -->`` comments that mark a block not meant to run here). The
blocks of one page share one namespace, as a reader's session would, on the embedded
default (this folder's fixture gives each page a fresh stub broker and store). A
skipped block must say why, and the page's other blocks still run.
"""

from __future__ import annotations

import unittest
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
READER = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def blocks_of(page: Path) -> int:
    return sum(1 for _ in READER.parse(page))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_page_s_python_blocks_run(page: Path) -> None:
    document = READER.parse(page)
    document.namespace["__name__"] = f"docs_{page.stem.replace('-', '_')}"
    skipped: list[str] = []
    for example in document:
        try:
            example.evaluate()
        except unittest.SkipTest as skip:
            reason = str(skip).strip()
            assert reason, f"{page.name}:{example.line}: a skipped block must say why"
            skipped.append(reason)


def test_the_reader_runs_blocks_and_honours_skips(tmp_path: Path) -> None:
    """The runner above would pass on pages it cannot read: pin what it sees."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n"
        '<!-- skip: next "needs a server" -->\n\n'
        "```python\nraise RuntimeError\n```\n\n"
        "```python\nassert x == 2\n```\n",
        encoding="utf-8",
    )
    outcomes: list[str] = []
    for example in READER.parse(page):
        try:
            example.evaluate()
            outcomes.append("ran")
        except unittest.SkipTest:
            outcomes.append("skipped")
        except AssertionError:
            outcomes.append("failed")
    assert outcomes == ["ran", "ran", "skipped", "failed"]
    assert blocks_of(ROOT / "docs" / "tutorial.md") >= 4
