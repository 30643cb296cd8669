"""The package's import graph (design.md "Where the code lives"): the load path's core imports
no wing, every import runs down the layers, no module or package imports itself back through
others, and no import hides inside a function to dodge a cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dedup_pipeline"

# lowest first: a module may import its own layer and the ones below
LAYERS = (
    ("base", ("dedup_pipeline.errors", "dedup_pipeline.units", "dedup_pipeline.hours",
              "dedup_pipeline.uris", "dedup_pipeline.objectstore",
              "dedup_pipeline.redaction")),
    ("config", ("dedup_pipeline.config",)),
    ("core", ("dedup_pipeline.engine.core",)),
    ("wings", ("dedup_pipeline.engine",)),
    ("sample", ("dedup_pipeline.sample",)),
    ("orchestration", ("dedup_pipeline.orchestration",)),
    ("entry", ("dedup_pipeline.cli", "dedup_pipeline.console", "dedup_pipeline")),
)
# imported inside a function on purpose: the package root and the console script import the
# component and the CLI on first use, so importing the engine never imports Dagster (the CLI
# imports a command's module when it is called: design.md K6)
LAZY = ("dedup_pipeline.console", "dedup_pipeline")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def _imports(module: str) -> Iterator[tuple[str, bool]]:
    """(imported module, inside a function) for each import of a package module."""
    tree = ast.parse(MODULES[module].read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        nested = id(node) not in top and not _type_checking_only(tree, node)
        for n in names:
            t = _target(n) if n.startswith("dedup_pipeline") else None
            if t is not None and t != module:
                yield t, nested


def _type_checking_only(tree: ast.Module, node: ast.AST) -> bool:
    return any(isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
               and node in list(ast.walk(n)) for n in tree.body)


def _layer(module: str) -> int:
    best = (-1, -1)
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                best = max(best, (len(p), i))
    assert best[1] >= 0, f"{module} is in no layer"
    return best[1]


def _edges() -> dict[str, set[str]]:
    return {m: {t for t, _ in _imports(m)} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.fast
def test_every_import_runs_down_the_layers() -> None:
    up = [f"{m} -> {t}" for m, ts in _edges().items() for t in ts if _layer(t) > _layer(m)]
    assert up == []


@pytest.mark.fast
def test_no_module_and_no_package_imports_itself_back() -> None:
    """No cycle of modules; and inside every package, none among its modules and subpackages
    (a subpackage counted as one: it is never both below and above one of its siblings)."""
    edges = _edges()
    assert _cycles(edges) == []
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    found = {}
    for pkg in sorted(packages):
        def child(m: str, pkg: str = pkg) -> str | None:
            if not m.startswith(pkg + "."):
                return None
            return pkg + "." + m[len(pkg) + 1:].split(".")[0]

        graph: dict[str, set[str]] = {}
        for m, ts in edges.items():
            a = child(m)
            if a is None:
                continue
            graph.setdefault(a, set()).update(
                b for t in ts if (b := child(t)) is not None and b != a)
        if cycles := _cycles(graph):
            found[pkg] = cycles
    assert found == {}


@pytest.mark.fast
def test_no_import_hides_inside_a_function() -> None:
    nested = sorted({f"{m} -> {t}" for m in MODULES if m not in LAZY
                     for t, inside in _imports(m) if inside})
    assert nested == []


@pytest.mark.fast
def test_the_core_load_reads_in_one_sitting() -> None:
    """The load module imports few package modules: its phases' modules (batch, decide, write),
    the index as one, the commit record and log, storage, the hooks, the config, the hours."""
    mods = {t for t, _ in _imports("dedup_pipeline.engine.core.load")}
    assert len(mods) <= 10, sorted(mods)
