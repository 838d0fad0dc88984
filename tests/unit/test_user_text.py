"""The words users read speak of the product: no "the seed" (an internal name for the
in-process pypepper scheduler this package grew from) in the README, the docs, the
examples, the package's docstrings and CLI help (its sources) or the dashboard's pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: "seed" as a word ("the seed", "the seed's", "seed 000"), not "seeded" nor a chaos seed
#: variable (PYPEPPER_CHAOS_SEED, a random seed of a test: not in these files).
SEED = re.compile(r"\bseed(?:'s)?\b", re.IGNORECASE)
#: The examples' text files (not their caches).
TEXT = {".py", ".md", ".yaml", ".yml", ".txt", ".sql", ".ini", ".cfg", ".toml"}


def user_files() -> list[Path]:
    files = [ROOT / "README.md"]  # CONTRIBUTING's "seed" is the chaos test's random seed
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in TEXT)
    files += sorted((ROOT / "pypepper_dramatiq").rglob("*.py"))
    files += sorted((ROOT / "pypepper_dramatiq" / "web" / "templates").rglob("*.html"))
    return files


def test_no_user_facing_file_says_the_seed() -> None:
    said = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in user_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if SEED.search(line) and "CHAOS_SEED" not in line
    ]
    assert said == []
