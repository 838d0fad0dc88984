"""docs/architecture.md's layout and layers are the package's own: they cannot go stale.

The tree in "The layout" names every package and every module of ``pypepper_dramatiq``
(by indentation: two spaces a level; the migrations' own files are left out), and its
layers paragraph lists the layers of ``setup.cfg``'s import-linter contract in order.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pypepper_dramatiq"
PAGE = ROOT / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_tree() -> tuple[set[str], set[str]]:
    """The packages and the modules the layout's tree names, as paths in the package."""
    block = _section("The layout").split("```")[1]
    packages: set[str] = set()
    modules: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines()[1:]:
        tokens = line.split()
        if not tokens:
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        if tokens[0].endswith("/"):
            stack = [*stack[: depth - 1], tokens[0].rstrip("/")] if depth else []
            if depth:
                packages.add("/".join(stack))
            continue
        for token in tokens:
            if not token.endswith(".py"):
                break
            modules.add("/".join([*stack[: depth - 1], token]))
    return packages, modules


def code_tree() -> tuple[set[str], set[str]]:
    packages = {
        path.parent.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("__init__.py")
        if path.parent != PACKAGE
    }
    modules = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "versions" not in path.relative_to(PACKAGE).parts
        and (path.name != "__init__.py" or path.parent == PACKAGE)
    }
    return packages, modules


def test_the_layout_names_every_package_and_module_and_nothing_else() -> None:
    documented_packages, documented_modules = documented_tree()
    packages, modules = code_tree()
    assert sorted(packages - documented_packages) == [], "packages missing from the page"
    assert sorted(documented_packages - packages) == [], "packages the code does not have"
    assert sorted(modules - documented_modules) == [], "modules missing from the page"
    assert sorted(documented_modules - modules) == [], "modules the code does not have"


def test_the_parser_sees_the_tree_it_checks() -> None:
    """A tree the parser misread would pass the test above by accident: pin a few."""
    packages, modules = documented_tree()
    assert {"model", "stores/sql", "drivers/dramatiq", "transport/redis"} <= packages
    assert {"errors.py", "model/job.py", "stores/sql/purge.py"} <= modules
    assert "drivers/dramatiq/cancel_listener.py" in modules


def _configured_layers() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    lines = parser["importlinter:contract:layers"]["layers"].strip().splitlines()
    prefix = "pypepper_dramatiq."
    return [
        " | ".join(name.strip().removeprefix(prefix) for name in line.split("|")) for line in lines
    ]


def test_the_layers_paragraph_lists_setup_cfg_s_layers_in_order() -> None:
    layout = _section("The layout")
    paragraph = layout[layout.index("The layers, top to bottom") :].split("\n\n")[0]
    chain = paragraph[paragraph.index("`cli`") : paragraph.index(". A module")]
    documented = [
        " | ".join(re.findall(r"`([\w.]+)`", part)) for part in " ".join(chain.split()).split(" > ")
    ]
    assert documented == _configured_layers()
