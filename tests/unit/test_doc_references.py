"""Every ``pypepper_dramatiq.<name>`` the user pages name exists, and every
``from pypepper_dramatiq... import ...`` in them imports: a moved or renamed module
cannot leave the docs pointing at nothing. (The changelog is history: left out.)"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
DOTTED = re.compile(r"\bpypepper_dramatiq(?:\.[A-Za-z_]\w*)+")
IMPORT = re.compile(r"\bfrom (pypepper_dramatiq(?:\.\w+)*) import \(?([\w, ]+)")
#: Names that are not import paths: the actors the package registers with Dramatiq.
ACTOR_NAMES = {"pypepper_dramatiq.step", "pypepper_dramatiq.undecodable"}


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute reached from the longest module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def references(page: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found += [(number, m.group(0)) for m in DOTTED.finditer(line)]
        for m in IMPORT.finditer(line):
            names = [name.split()[0] for name in m.group(2).split(",") if name.strip()]
            found += [(number, f"{m.group(1)}.{name}") for name in names]
    return [(n, ref) for n, ref in found if ref not in ACTOR_NAMES]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_reference_of_the_page_resolves(page: Path) -> None:
    broken = [f"{page.name}:{n}: {ref}" for n, ref in references(page) if not resolves(ref)]
    assert broken == []


def test_a_reference_to_a_moved_module_is_caught() -> None:
    assert resolves("pypepper_dramatiq.schedules.fire_due")
    assert resolves("pypepper_dramatiq.ops.logs")
    assert not resolves("pypepper_dramatiq.logs")
    assert not resolves("pypepper_dramatiq.rules.no_such_rule")
