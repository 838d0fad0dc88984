"""The test suite's placement rule (CONTRIBUTING.md, "How the tests are organised").

Every test file sits in the folder of what it exercises, none is loose at
``tests/``, no two share a name, and the test files the docs name exist.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

#: The folders a test file may sit in, one per kind of test.
FOLDERS = {"unit", "stores", "driver", "transport", "web", "cli", "integration", "acceptance"}

#: Pages that name test files for their readers (the CHANGELOG is history: not checked).
PAGES = ("README.md", "CONTRIBUTING.md", "docs", "bench/README.md")

TEST_PATH = re.compile(r"tests/[\w/]+\.py")


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _pages() -> list[Path]:
    found: list[Path] = []
    for name in PAGES:
        path = ROOT / name
        found.extend(sorted(path.rglob("*.md")) if path.is_dir() else [path])
    return found


def test_every_test_file_sits_in_one_of_the_folders() -> None:
    misplaced = [
        str(path.relative_to(TESTS))
        for path in _test_files()
        if path.relative_to(TESTS).parts[0] not in FOLDERS
    ]
    assert misplaced == [], f"test files outside {sorted(FOLDERS)}: {misplaced}"


def test_no_two_test_files_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _test_files():
        by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}


def test_every_folder_is_a_package() -> None:
    assert [name for name in sorted(FOLDERS) if not (TESTS / name / "__init__.py").is_file()] == []


def test_the_test_files_the_docs_name_exist() -> None:
    pages = _pages()
    assert len(pages) > 3  # the pages were found
    missing = [
        f"{page.relative_to(ROOT)}: {named}"
        for page in pages
        for named in TEST_PATH.findall(page.read_text(encoding="utf-8"))
        if not (ROOT / named).is_file()
    ]
    assert missing == []
