"""The package's process-wide state lives in named objects (see docs/architecture.md,
"Process-wide state"): no module rebinds its globals with ``global``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pypepper_dramatiq"


def test_no_module_of_the_package_has_a_global_statement() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} global {', '.join(node.names)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    ]
    assert found == []
