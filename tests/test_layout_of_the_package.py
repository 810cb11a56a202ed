"""The package reads as the data flow (issue 26): each folder imports only the folders before it, and no
module imports itself back through another."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "axoplan"
FLOW = ("inputs", "space", "cost", "search", "uncertainty", "records", "export", "executor", "validate", "commands")
"""The packages in data-flow order: a package may import those before it, never one after it."""
SHARED = {"errors", "fileio", "arrays", "report", "allocator", "cli", "__main__"}
"""Top-level modules: errors and fileio are used by all, arrays by the numeric folders (space, cost); report renders
what the search and validation give."""


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module's imports of other axoplan modules, lazy ones inside functions included."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("axoplan"):
                found = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {m for m in found if m in modules and m != name}
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else parts[-1]


def test_every_package_imports_only_the_ones_before_it():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(FLOW)
    late = []
    for module, targets in _imports().items():
        here = _package(module)
        for target in targets:
            there = _package(target)
            if here in FLOW and there in FLOW and FLOW.index(there) > FLOW.index(here):
                late.append(f"{module} -> {target}")
    assert late == []


def test_at_most_a_handful_of_modules_at_the_top():
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top <= SHARED, top - SHARED


def test_no_module_imports_itself_back():
    edges = _imports()
    cycles = []
    for start in edges:
        seen, stack = set(), [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join((*path, nxt)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert cycles == []
