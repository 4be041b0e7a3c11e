"""The house's layering, as DESIGN.md draws it: import-linter's contracts, no import cycles, every module placed."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import geolens

ROOT = Path(__file__).resolve().parents[1]
grimp = pytest.importorskip("grimp")


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    run = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{len(_contracts())} kept, 0 broken" in run.stdout


def test_every_top_level_module_has_a_layer():
    layered = {name.strip() for layer in _contracts()[0]["layers"] for name in layer.split("|")}
    top = {f"geolens.{m.name}" for m in pkgutil.iter_modules(geolens.__path__)} - {"geolens.__main__"}
    assert top == layered, f"modules without a layer: {sorted(top - layered)}; stale names: {sorted(layered - top)}"


def strongly_connected(adjacency: dict[str, set[str]]) -> list[set[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan; groups of 2 or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in adjacency.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(adjacency):
        if v not in index:
            visit(v)
    return groups


def test_cycle_finder_on_planted_graphs():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycles_local_imports_included():
    graph = grimp.build_graph("geolens")
    modules = set(graph.modules)
    adjacency = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert strongly_connected(adjacency) == []
