#!/usr/bin/env python3
"""Move the package's modules into families, on whatever main is when it runs (issue 24).

A repeatable move, not a hand-made one: run it on a clean checkout of main and it
``git mv``s each module of :data:`MOVES`, rewrites every import of the package (in
the package, tests/, examples/, bench/, scripts/), every dotted reference in strings and
comments (monkeypatch targets, logger names, docstrings), leaves the old import paths
of :data:`SEED_PATHS` as thin re-exports, writes the import-linter contracts by package
(:data:`LAYERS`) into setup.cfg, then runs ``ruff check --fix`` and ``ruff format``.

Usage (from the repository's root, on a clean work tree)::

    python tools/relayout.py            # do it
    python tools/relayout.py --dry-run  # print the moves it would make, change nothing

A dev tool: standard library only (ruff is the project's own dev dependency), not part
of the wheel. Imports are found with :mod:`ast`; an import is resolved to the absolute
module it names, mapped, and re-emitted relative when it was relative.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import time
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "pypepper_dramatiq"

#: (old, new), relative to the package: a module, or a package moved whole. An entry
#: whose source is gone when the script runs is skipped and reported.
MOVES: list[tuple[str, str]] = [
    # model/: what users build
    ("job", "model.job"),
    ("task", "model.task"),
    ("workflow", "model.workflow"),
    ("executor", "model.executor"),
    ("context", "model.context"),
    # records/: the stored form of a job (and of a worker)
    ("record", "records.record"),
    ("state", "records.state"),
    ("spec", "records.spec"),
    ("history", "records.history"),
    ("progress", "records.progress"),
    ("links", "records.links"),
    ("results", "records.results"),
    ("storable_job", "records.storable_job"),
    ("paging", "records.paging"),
    ("workers", "records.workers"),
    # rules/: the pure decisions, and the lifecycle they decide on
    ("rules", "rules.steps"),
    ("start_times", "rules.start_times"),
    ("waits", "rules.waits"),
    ("retention", "rules.retention"),
    ("status", "rules.status"),
    ("events", "rules.events"),
    # limits/: what a value may be (stored text, durations)
    ("storable", "limits.storable"),
    ("durations", "limits.durations"),
    # schedules/: recurring schedules as stored, and cron
    ("cron", "schedules.cron"),
    ("recurring", "schedules.recurring"),
    # engine/: where the model meets the stores and the channels
    ("gateway", "engine.job_io"),
    ("schedules", "engine.firing"),
    ("functions", "engine.functions"),
    ("retrying", "engine.retrying"),
    ("outcomes", "engine.outcomes"),  # pure, but decides over records: above them
    # channels/: the job-end notices travel on Redis next to the messages
    ("notices", "channels.end_notices"),
    # transport/: batching writes to a service, and Redis's keys
    ("redis_layout", "transport.redis_layout"),
    ("redis_batch", "transport.redis_batch"),
    ("engine.group_commit", "ops.group_commit"),
    # ops/: what an operator sees: logs, observers, outages, isolated bad rows
    ("logs", "ops.logs"),
    ("display", "ops.display"),
    ("observers", "ops.observers"),
    ("outage", "ops.outage"),
    ("isolation", "ops.isolation"),
    # metrics/: the Prometheus observer (reads channels and stores)
    ("metrics", "metrics.prometheus"),
    # drivers/
    ("inprocess", "drivers.inprocess"),
    ("distributed", "drivers.dramatiq"),
    # cli/ (a package; the console entry point stays pypepper_dramatiq.cli:main)
    ("cli", "cli.commands"),
]

#: The modules that stay at the package's root (besides the seed paths).
ROOT_KEEP = {"__init__", "__main__", "errors", "config", "settings"}

#: The import paths of pypepper.scheduler's API: each keeps importing. A moved one is
#: re-created as a re-export of its new module; the others stay what they are.
SEED_PATHS = [
    "channel",
    "executor",
    "job",
    "task",
    "worker",
    "workflow",
    "store",
    "config",
    "errors",
    "status",
    "events",
    "dashboard",
]

#: A package whose ``__init__`` re-exports names of one of its modules, so that the
#: path it had as a module keeps working: package -> (module, names or None for all its
#: public names).
PACKAGE_REEXPORTS: dict[str, tuple[str, list[str] | None]] = {
    # setup.cfg's console script: pypepper-dramatiq = pypepper_dramatiq.cli:main
    "cli": ("commands", ["main"]),
    # README: from pypepper_dramatiq.metrics import install_metrics
    "metrics": ("prometheus", None),
}

#: The docstring of each package the move creates.
PACKAGE_DOCS = {
    "model": "What users build: jobs, workflows, tasks, their executors and their context.",
    "records": "The stored form: a job's record, state, spec, history, progress and links.",
    "rules": "The pure decisions every driver obeys, and the job lifecycle they decide on.",
    "limits": "What a value may be: text and values a store can hold, durations it bounds.",
    "schedules": "Recurring schedules as stored, and the cron expressions they fire on.",
    "engine": "Where the model meets the stores and the channels: one engine for both drivers.",
    "transport": "Writing to services in batches, and the keys the package keeps in Redis.",
    "ops": "What an operator sees: log lines, observers, outages, bad rows set aside.",
    "metrics": "Metrics of jobs, attempts and channels, as Prometheus gauges and counters.",
    "drivers": "The two drivers of the engine: the in-process Worker and Dramatiq's middleware.",
    "cli": "The ``pypepper-dramatiq`` command line.",
}

#: The layers, top to bottom, by package (``|``: siblings that may not import each
#: other). A name that is no package or module when the script runs is left out.
LAYERS: list[list[str]] = [
    ["cli"],
    ["web", "drivers"],
    ["metrics"],
    ["engine"],
    ["channels"],
    ["model", "stores"],
    ["schedules"],
    ["records", "settings"],
    ["rules"],
    ["config", "transport"],
    ["ops"],
    ["limits"],
    ["errors"],
]

#: Packages whose children may not import each other (import-linter independence).
INDEPENDENT = [["drivers.dramatiq", "drivers.inprocess"]]

#: The directories whose Python files are rewritten (besides the package).
REWRITE_DIRS = ["tests", "examples", "bench", "scripts", "docker"]

#: Files the rewrite leaves alone: this script, and the test that pins the seed paths
#: (it names them on purpose).
REWRITE_SKIP = {"tools/relayout.py", "tests/unit/test_seed_import_paths.py"}

#: Pages checked for references to moved modules (reported, not edited).
PAGES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs", "bench/README.md"]

DOTTED = re.compile(rf"\b{PACKAGE}(?:\.[A-Za-z_]\w*)+")
#: An import written in text (code in a string, an example in a docstring), or a
#: dotted reference: one pass, so that what one rewrites the other does not see again.
_NAMES = r"\w+(?:\s+as\s+\w+)?(?:[ \t]*,[ \t]*\w+(?:\s+as\s+\w+)?)*"
IN_TEXT = re.compile(
    rf"(?P<imp>\bfrom[ \t]+{PACKAGE}(?:\.\w+)*[ \t]+import[ \t]+{_NAMES})"
    rf"|(?P<dotted>\b{PACKAGE}(?:\.[A-Za-z_]\w*)+)"
)
FILE_REF = re.compile(r"(?<=`)((?:[a-z_]+/)*[a-z_]+)\.py(?=`)")
HEADER = re.compile(r"^from\s+\.*[\w.]*\s+import")
RELATIVE_REF = re.compile(r"(?<=`)(~?)(\.+)([A-Za-z_][\w.]*)(?=`)")


@dataclass
class Plan:
    """What one run moves, and what it found it could not."""

    moves: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    shims: dict[str, list[str]] = field(default_factory=dict)  # seed path -> names
    reexports: dict[str, tuple[str, list[str]]] = field(default_factory=dict)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, text=True, capture_output=True)


# --- modules ------------------------------------------------------------------------


def module_of(path: Path, root: Path) -> str:
    """The dotted module a file under the package is."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package (dotted, absolute) and its file."""
    return {
        module_of(path, root): path
        for path in sorted((root / PACKAGE).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


class Mapper:
    """Maps an old absolute module name to its new one (prefix moves included)."""

    def __init__(self, moves: Iterable[tuple[str, str]], old_modules: Iterable[str]) -> None:
        self.moves = {f"{PACKAGE}.{old}": f"{PACKAGE}.{new}" for old, new in moves}
        self.old = set(old_modules)

    def module(self, name: str) -> str:
        parts = name.split(".")
        for i in range(len(parts), 1, -1):
            head = ".".join(parts[:i])
            if head in self.moves:
                return ".".join([self.moves[head], *parts[i:]])
        return name

    def dotted(self, text: str) -> str:
        """A dotted reference (module, maybe followed by attributes), its module mapped."""
        parts = text.split(".")
        for i in range(len(parts), 1, -1):
            head = ".".join(parts[:i])
            if head in self.old:
                return ".".join([self.module(head), *parts[i:]])
        return text


def public_names(source: str) -> list[str]:
    """The names a module exports: its ``__all__`` and the public names it defines."""
    tree = ast.parse(source)
    names: list[str] = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                if target.id == "__all__" and isinstance(node.value, ast.List | ast.Tuple):
                    names.extend(
                        e.value
                        for e in node.value.elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
                else:
                    names.append(target.id)
    seen: dict[str, None] = {}
    for name in names:
        if not name.startswith("_") and name != "logger":
            seen.setdefault(name)
    return list(seen)


def bound_names(source: str) -> set[str]:
    """The names a package's ``__init__`` binds to other things than its submodules."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level <= 1 and node.module:
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


# --- rewriting one file -------------------------------------------------------------


def relative(target: str, from_package: str) -> str:
    """``target`` as a relative import's module, seen from inside ``from_package``."""
    t, f = target.split("."), from_package.split(".")
    common = 0
    while common < min(len(t), len(f)) and t[common] == f[common]:
        common += 1
    return "." * (len(f) - common + 1) + ".".join(t[common:])


@dataclass
class FileContext:
    old_module: str | None  # the file's module before the move (None: not in the package)
    new_module: str | None
    is_package: bool  # an __init__.py


class Rewriter:
    def __init__(self, mapper: Mapper, bound: dict[str, set[str]]) -> None:
        self.mapper = mapper
        self.bound = bound  # package (absolute) -> names its __init__ binds

    def _package_of(self, module: str, is_package: bool) -> str:
        return module if is_package else module.rpartition(".")[0]

    def _is_module(self, base: str, name: str) -> bool:
        full = f"{base}.{name}"
        return full in self.mapper.old and name not in self.bound.get(base, set())

    def _emit(self, target: str, relative_ok: bool, ctx: FileContext) -> str:
        if relative_ok and ctx.new_module is not None and target.startswith(PACKAGE):
            return relative(target, self._package_of(ctx.new_module, ctx.is_package))
        return target

    def import_from(self, node: ast.ImportFrom, ctx: FileContext) -> tuple[str, list[str]] | None:
        """What replaces ``node``: ("header", [new module]) when only the module it
        imports from changes, ("statements", [lines]) when it must be re-emitted;
        None when it stays as it is."""
        if node.level:
            if ctx.old_module is None:
                return None  # a relative import outside the package (tests' helpers)
            package = self._package_of(ctx.old_module, ctx.is_package).split(".")
            up = node.level - 1
            base_parts = package[: len(package) - up] if up else package
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        if base != PACKAGE and not base.startswith(PACKAGE + "."):
            return None
        rel = node.level > 0
        attributes: list[ast.alias] = []
        modules: dict[str, list[str]] = {}  # new parent -> "leaf" / "leaf as alias"
        moved_module = False
        for alias in node.names:
            if alias.name != "*" and self._is_module(base, alias.name):
                old = f"{base}.{alias.name}"
                new = self.mapper.module(old)
                parent, _, leaf = new.rpartition(".")
                local = alias.asname or alias.name
                modules.setdefault(parent, []).append(
                    leaf if leaf == local else f"{leaf} as {local}"
                )
                moved_module |= new != old
            else:
                attributes.append(alias)
        new_base = self.mapper.module(base)
        original = "." * node.level + (node.module or "")
        if not moved_module and len(modules) <= 1:
            # the names stay as they are: at most the module they come from changes
            where = new_base if attributes else next(iter(modules), new_base)
            header = self._emit(where, rel, ctx)
            if attributes and modules and where != next(iter(modules)):
                pass  # names and modules now come from two places: re-emit below
            else:
                return None if header == original else ("header", [header])
        lines: list[str] = []
        if attributes:
            names = ", ".join(
                a.name if a.asname is None else f"{a.name} as {a.asname}" for a in attributes
            )
            lines.append(f"from {self._emit(new_base, rel, ctx)} import {names}")
        for parent, names_ in modules.items():
            lines.append(f"from {self._emit(parent, rel, ctx)} import {', '.join(names_)}")
        return ("statements", lines)

    def import_(self, node: ast.Import) -> tuple[str, list[str]] | None:
        changed = False
        parts = []
        for alias in node.names:
            new = self.mapper.module(alias.name) if alias.name.startswith(PACKAGE) else alias.name
            changed |= new != alias.name
            parts.append(new if alias.asname is None else f"{new} as {alias.asname}")
        return ("statements", [f"import {', '.join(parts)}"]) if changed else None

    def text(self, text: str, ctx: FileContext) -> str:
        """Dotted references in a stretch of source that is no import statement."""
        text = IN_TEXT.sub(self._in_text, text)
        if ctx.old_module is not None and ctx.new_module is not None:
            text = RELATIVE_REF.sub(lambda m: self._relative_ref(m, ctx), text)
        return text

    def _in_text(self, match: re.Match[str]) -> str:
        if match.group("dotted"):
            return self.mapper.dotted(match.group(0))
        statement = match.group(0)
        try:
            node = ast.parse(statement).body[0]
        except SyntaxError:
            return statement
        assert isinstance(node, ast.ImportFrom)
        new = self.import_from(node, FileContext(None, None, False))
        if new is None:
            return statement
        kind, lines = new
        if kind == "header":
            return HEADER.sub(f"from {lines[0]} import", statement, count=1)
        return "; ".join(lines)

    def _relative_ref(self, match: re.Match[str], ctx: FileContext) -> str:
        tilde, dots, rest = match.groups()
        assert ctx.old_module is not None and ctx.new_module is not None
        package = self._package_of(ctx.old_module, ctx.is_package).split(".")
        up = len(dots) - 1
        if up >= len(package):
            return match.group(0)
        absolute = ".".join([*package[: len(package) - up], rest])
        mapped = self.mapper.dotted(absolute)
        if mapped == absolute:
            return match.group(0)
        return tilde + relative(mapped, self._package_of(ctx.new_module, ctx.is_package))

    def file(self, source: str, ctx: FileContext, skip_docstring: bool = False) -> str:
        tree = ast.parse(source)
        lines = source.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))

        def at(lineno: int, col: int) -> int:
            # ast columns are UTF-8 byte offsets
            line = lines[lineno - 1]
            return offsets[lineno - 1] + len(line.encode()[:col].decode())

        edits: list[tuple[int, int, str]] = []  # (start, end, replacement) of import nodes
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                new = self.import_from(node, ctx)
            elif isinstance(node, ast.Import):
                new = self.import_(node)
            else:
                continue
            assert node.end_lineno is not None and node.end_col_offset is not None
            start = at(node.lineno, node.col_offset)
            end = at(node.end_lineno, node.end_col_offset)
            if new is None:
                edits.append((start, end, source[start:end]))
                continue
            kind, new_lines = new
            if kind == "header":
                statement = HEADER.sub(f"from {new_lines[0]} import", source[start:end], count=1)
                edits.append((start, end, statement))
                continue
            new = new_lines
            indent = " " * node.col_offset
            comments = _comments(source[start:end])
            body = ("\n" + indent).join(new)
            if comments:
                body = f"{body}  {' '.join(comments)}"
            edits.append((start, end, body))
        keep_until = 0
        if skip_docstring and tree.body and isinstance(tree.body[0], ast.Expr):
            doc = tree.body[0]
            assert doc.end_lineno is not None and doc.end_col_offset is not None
            keep_until = at(doc.end_lineno, doc.end_col_offset)
        out: list[str] = []
        pos = 0
        for start, end, replacement in sorted(edits):
            out.append(self._outside(source, pos, start, keep_until, ctx))
            out.append(replacement)
            pos = end
        out.append(self._outside(source, pos, len(source), keep_until, ctx))
        return "".join(out)

    def _outside(self, source: str, start: int, end: int, keep_until: int, ctx: FileContext) -> str:
        if end <= keep_until:
            return source[start:end]
        cut = max(start, keep_until)
        return source[start:cut] + self.text(source[cut:end], ctx)


LINE_LIMIT = 100  # pyproject.toml's [tool.ruff] line-length


def _wrap(line: str, continuation: str) -> list[str]:
    """A line of prose cut at its last space (outside backquotes) before the limit."""
    out = []
    while len(line) > LINE_LIMIT:
        quoted, cut = False, -1
        start = len(continuation)
        for i, char in enumerate(line[: LINE_LIMIT + 1]):
            if char == "`":
                quoted = not quoted
            elif char == " " and not quoted and i > start:
                cut = i
        if cut < 0:
            break
        out.append(line[:cut].rstrip())
        line = continuation + line[cut + 1 :].lstrip()
    return [*out, line]


def wrap_long_lines(text: str, before: str) -> tuple[str, list[str]]:
    """Cut the comment and docstring lines the longer names pushed past the limit.

    Returns the text and the long lines it could not cut (in code: strings, names).
    """
    if all(len(line) <= LINE_LIMIT for line in text.splitlines()):
        return text, []
    old = set(before.splitlines())
    prose: dict[int, str] = {}  # row (1-based) -> continuation prefix
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text, []
    lines = text.splitlines(keepends=True)
    for tok in tokens:
        if tok.type == tokenize.COMMENT and not lines[tok.start[0] - 1][: tok.start[1]].strip():
            indent = lines[tok.start[0] - 1][: tok.start[1]]
            marker = "#: " if tok.string.startswith("#:") else "# "
            prose[tok.start[0]] = indent + marker
        elif tok.type == tokenize.STRING and tok.string.lstrip("rRbBuUfF")[:3] in {'"""', "'''"}:
            for row in range(tok.start[0], tok.end[0] + 1):
                line = lines[row - 1]
                prose[row] = line[: len(line) - len(line.lstrip())]
    out: list[str] = []
    left: list[str] = []
    for row, line in enumerate(lines, 1):
        body = line.rstrip("\n")
        ending = line[len(body) :]
        if len(body) <= LINE_LIMIT or body in old or "noqa" in body:
            out.append(line)
            continue
        if row not in prose:
            if not body.lstrip().startswith(("from ", "import ")):  # ruff format cuts those
                left.append(body)
            out.append(line)
            continue
        pieces = _wrap(body, prose[row])
        if len(pieces[-1]) > LINE_LIMIT:
            left.append(body)
        out.append("\n".join(pieces) + ending)
    return "".join(out), left


def _comments(statement: str) -> list[str]:
    """The comments inside a (multi-line) import statement that a re-emit would drop."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(statement).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [t.string for t in tokens if t.type == tokenize.COMMENT]


# --- the move -----------------------------------------------------------------------


def plan(root: Path) -> Plan:
    modules = package_modules(root)
    result = Plan()
    for old, new in MOVES:
        src = f"{PACKAGE}.{old}"
        if src not in modules:
            result.skipped.append((old, new))
        elif f"{PACKAGE}.{new}" in modules:
            result.skipped.append((old, f"{new} (already there)"))
        else:
            result.moves.append((old, new))
    moved = dict(result.moves)
    for seed in SEED_PATHS:
        if seed in moved:
            result.shims[seed] = public_names(modules[f"{PACKAGE}.{seed}"].read_text())
    for package, (module, names) in PACKAGE_REEXPORTS.items():
        old = next((o for o, n in result.moves if n == f"{package}.{module}"), None)
        if old is not None:
            source = modules[f"{PACKAGE}.{old}"].read_text()
            result.reexports[package] = (module, names or public_names(source))
    return result


def old_file(root: Path, name: str, modules: dict[str, Path]) -> Path:
    return modules[f"{PACKAGE}.{name}"]


def new_path(root: Path, old_path: Path, old: str, new: str) -> Path:
    """Where a moved module's file (or package's directory) goes."""
    base = root / PACKAGE / Path(*new.split("."))
    return base if old_path.name == "__init__.py" else base.with_suffix(".py")


def git_moves(root: Path, the_plan: Plan, modules: dict[str, Path]) -> None:
    for old, new in the_plan.moves:
        path = old_file(root, old, modules)
        source = path.parent if path.name == "__init__.py" else path
        target = new_path(root, path, old, new)
        target.parent.mkdir(parents=True, exist_ok=True)
        run("git", "mv", str(source.relative_to(root)), str(target.relative_to(root)))


def ensure_packages(root: Path) -> list[Path]:
    """An ``__init__.py`` in every directory of the package holding Python files."""
    made = []
    for directory in sorted((root / PACKAGE).rglob("*")):
        if not directory.is_dir() or "__pycache__" in directory.parts:
            continue
        if "migrations" in directory.relative_to(root).parts:
            continue  # alembic's scripts are no package
        if not any(directory.glob("*.py")) and not any(directory.glob("*/*.py")):
            continue
        init = directory / "__init__.py"
        if not init.exists():
            name = directory.relative_to(root / PACKAGE).as_posix().replace("/", ".")
            doc = PACKAGE_DOCS.get(name, f"The {name} family of the package.")
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
            run("git", "add", str(init.relative_to(root)))
            made.append(init)
    return made


def _listed(names: list[str]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def write_shims(root: Path, the_plan: Plan) -> None:
    moved = dict(the_plan.moves)
    for seed, names in the_plan.shims.items():
        target = f"{PACKAGE}.{moved[seed]}"
        rel = relative(target, PACKAGE)
        text = (
            f'"""The pypepper.scheduler import path of :mod:`{target}`."""\n\n'
            f"from {rel} import {', '.join(names)}\n\n__all__ = {_listed(names)}\n"
        )
        path = root / PACKAGE / f"{seed}.py"
        path.write_text(text, encoding="utf-8")
        run("git", "add", str(path.relative_to(root)))
    for package, (module, names) in the_plan.reexports.items():
        init = root / PACKAGE / package / "__init__.py"
        doc = PACKAGE_DOCS.get(package, package)
        init.write_text(
            f'"""{doc}\n\nIts names are importable from here, as when it was one module.\n"""'
            f"\n\nfrom .{module} import {', '.join(names)}\n\n__all__ = {_listed(names)}\n",
            encoding="utf-8",
        )
        run("git", "add", str(init.relative_to(root)))


def rewrite(root: Path, mapper: Mapper, old_of: dict[Path, str]) -> list[Path]:
    """Rewrite every Python file; ``old_of`` gives each package file's old module."""
    modules = package_modules(root)
    bound: dict[str, set[str]] = {}
    for path, old in old_of.items():
        if path.name == "__init__.py":
            bound[old] = bound_names(path.read_text(encoding="utf-8"))
    rewriter = Rewriter(mapper, bound)
    changed = []
    files: list[tuple[Path, FileContext]] = []
    for new, path in modules.items():
        old = old_of.get(path)
        files.append((path, FileContext(old, new, path.name == "__init__.py")))
    for directory in REWRITE_DIRS:
        for path in sorted((root / directory).rglob("*.py")) if (root / directory).is_dir() else []:
            files.append((path, FileContext(None, None, False)))
    for path, ctx in files:
        written_here = ctx.old_module is None and ctx.new_module is not None
        if path.relative_to(root).as_posix() in REWRITE_SKIP or written_here:
            continue  # a shim or __init__ this run wrote: already in the new form
        source = path.read_text(encoding="utf-8")
        skip_doc = path == root / PACKAGE / "__init__.py"
        text = rewriter.file(source, ctx, skip_docstring=skip_doc)
        text, left = wrap_long_lines(text, source)
        for line in left:
            print(f"LONG  {path.relative_to(root)}: {line.strip()}")
        if text != source:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def write_contract(root: Path, the_plan: Plan) -> list[list[str]]:
    """Replace setup.cfg's import-linter sections by the contracts by package."""
    top = {p.stem if p.is_file() else p.name for p in (root / PACKAGE).iterdir()}
    layers = [[n for n in layer if n in top] for layer in LAYERS]
    layers = [layer for layer in layers if layer]
    shims = [s for s in SEED_PATHS if s not in {n for layer in layers for n in layer}]
    lines = [
        "# The layers of the package, top to bottom, by package: a module may import only",
        "# from its own package or the layers below (imports inside functions count too).",
        "# Written by tools/relayout.py.",
        "[importlinter]",
        f"root_package = {PACKAGE}",
        "exclude_type_checking_imports = True",
        "",
        "[importlinter:contract:layers]",
        "name = The package's layers",
        "type = layers",
        "layers =",
        *(f"    {' | '.join(f'{PACKAGE}.{n}' for n in layer)}" for layer in layers),
        "",
        "[importlinter:contract:acyclic]",
        "name = No import cycles between the modules of a package",
        "type = acyclic_siblings",
        f"ancestors = {PACKAGE}",
        "",
    ]
    for i, group in enumerate(INDEPENDENT, 1):
        lines += [
            f"[importlinter:contract:independent-{i}]",
            f"name = {' and '.join(group)} do not import each other",
            "type = independence",
            "modules =",
            *(f"    {PACKAGE}.{m}" for m in group),
            "",
        ]
    sources = [n for layer in layers for n in layer]
    lines += [
        "[importlinter:contract:seed-paths]",
        "name = The old import paths are for users: nothing of ours imports them",
        "type = forbidden",
        "source_modules =",
        *(f"    {PACKAGE}.{n}" for n in sources),
        "forbidden_modules =",
        *(f"    {PACKAGE}.{n}" for n in sorted(set(shims)) if n in top),
    ]
    cfg = root / "setup.cfg"
    text = cfg.read_text(encoding="utf-8")
    start = text.index("[importlinter]")
    # the comment lines just above the section belong to it
    head = text[:start].rstrip("\n").split("\n")
    while head and head[-1].startswith("#"):
        head.pop()
    while head and not head[-1].strip():
        head.pop()
    rest = text[start:]
    match = re.search(r"^\[(?!importlinter)", rest, re.M)
    tail = rest[match.start() :] if match else ""
    cfg.write_text(
        "\n".join(head) + "\n\n" + "\n".join(lines) + "\n" + ("\n" + tail if tail else ""),
        encoding="utf-8",
    )
    return layers


def page_references(root: Path, mapper: Mapper, the_plan: Plan) -> list[str]:
    """References in the docs to a moved module: to be edited by hand.

    A reference to a path that still imports (a seed path, a package re-exporting
    the module it was) is not one.
    """
    still = {f"{PACKAGE}.{name}" for name in [*the_plan.shims, *the_plan.reexports]}
    found = []
    for name in PAGES:
        path = root / name
        pages = sorted(path.rglob("*.md")) if path.is_dir() else [path] if path.exists() else []
        for page in pages:
            for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
                for match in DOTTED.finditer(line):
                    new = mapper.dotted(match.group(0))
                    head = ".".join(match.group(0).split(".")[:2])
                    if new != match.group(0) and head not in still:
                        found.append(f"{page.relative_to(root)}:{n}: {match.group(0)} -> {new}")
                for match in FILE_REF.finditer(line):
                    old = f"{PACKAGE}.{match.group(1).replace('/', '.')}"
                    new = mapper.module(old)
                    if old in mapper.old and new != old:
                        moved = new.removeprefix(PACKAGE + ".").replace(".", "/") + ".py"
                        found.append(f"{page.relative_to(root)}:{n}: {match.group(0)} -> {moved}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument("--no-ruff", action="store_true", help="skip ruff check --fix/format")
    args = parser.parse_args(argv)
    began = time.monotonic()
    root = Path(run("git", "rev-parse", "--show-toplevel").stdout.strip())
    if run("git", "-C", str(root), "status", "--porcelain", "--untracked-files=no").stdout:
        print("the work tree has changes: commit them first", file=sys.stderr)
        return 2
    modules = package_modules(root)
    the_plan = plan(root)
    for old, new in the_plan.moves:
        print(f"move  {old:22} -> {new}")
    for old, new in the_plan.skipped:
        print(f"SKIP  {old:22} -> {new}: no such module now")
    if args.dry_run:
        return 0
    if not the_plan.moves:
        print("nothing to move", file=sys.stderr)
        return 1
    mapper = Mapper(the_plan.moves, modules)
    # each file's module before the move, by where it will be
    old_of: dict[Path, str] = {}
    for name, path in modules.items():
        new = mapper.module(name)
        if new == name:
            old_of[path] = name
        else:
            rel = Path(*new.split(".")[1:])
            target = root / PACKAGE / (rel / "__init__.py" if path.name == "__init__.py" else rel)
            old_of[target if path.name == "__init__.py" else target.with_suffix(".py")] = name
    git_moves(root, the_plan, modules)
    made = ensure_packages(root)
    write_shims(root, the_plan)
    changed = rewrite(root, mapper, old_of)
    layers = write_contract(root, the_plan)
    run("git", "add", "-A", PACKAGE, *REWRITE_DIRS, "setup.cfg")
    if not args.no_ruff:
        ruff = str(Path(sys.executable).with_name("ruff"))
        ruff = ruff if Path(ruff).exists() else "ruff"
        targets = [PACKAGE, *[d for d in REWRITE_DIRS if (root / d).is_dir()]]
        run(ruff, "check", "--fix", "--quiet", *targets, check=False)
        run(ruff, "format", "--quiet", *targets, check=False)
        run("git", "add", "-A", PACKAGE, *REWRITE_DIRS)
    unplaced = sorted(
        p.stem if p.is_file() else p.name
        for p in (root / PACKAGE).iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists())
        and (p.stem if p.is_file() else p.name)
        not in ROOT_KEEP | set(SEED_PATHS) | {n for layer in LAYERS for n in layer}
    )
    print(f"packages made: {[str(p.parent.relative_to(root)) for p in made]}")
    print(f"seed paths re-exported: {sorted(the_plan.shims)}")
    print(f"files rewritten: {len(changed)}")
    print("layers:")
    for layer in layers:
        print("    " + " | ".join(layer))
    if unplaced:
        print(f"WARNING: at the root and in no layer: {unplaced}")
    refs = page_references(root, mapper, the_plan)
    if refs:
        print(f"pages naming moved modules ({len(refs)}), to edit by hand:")
        for ref in refs:
            print("    " + ref)
    print(f"done in {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
