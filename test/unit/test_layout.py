"""The package's layout: no import cycles among its modules, no private names imported across modules,
and every function pass of taso-search in the folder of its role.

Imports are read from the source (``ast``), at module level and inside functions alike: a cycle closed
by a function-level import is still a cycle. Importing a module's parent package is not counted (Python
imports it implicitly; the packages' ``__init__`` files import nothing of the passes but the registry)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"dialect": "taso_mlir.dialect", "generator": "taso_mlir.generator", "verifier": "taso_mlir.verifier",
            "passes": "taso_mlir.passes", "tools": "taso_mlir.tools", "benchmarks": "taso_mlir.benchmarks"}


def _modules(root: pathlib.Path = ROOT) -> dict:
    mods = {}
    for top, pkg in PACKAGES.items():
        for f in (root / top).rglob("*.py"):
            parts = [p for p in f.relative_to(root / top).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg] + parts)] = f
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict):
    """(target module, imported names) for every import statement of module ``name``."""
    is_pkg = path.name == "__init__.py"
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            if n.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            names = [a.name for a in n.names]
            subs = [f"{target}.{a}" for a in names if f"{target}.{a}" in mods]
            if len(subs) == len(names):  # (from package import submodule, ...)
                for s in subs:
                    yield s, []
            else:
                yield target, [a for a in names if f"{target}.{a}" not in mods]
        elif isinstance(n, ast.Import):
            for a in n.names:
                yield a.name, []


def test_no_import_cycles():
    mods = _modules()
    edges = {m: {t for t, _ in _imports(m, f, mods) if t in mods and t != m} for m, f in mods.items()}
    assert len(mods) > 60
    # Tarjan's strongly connected components
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_checker_sees_a_cycle(tmp_path):
    """The cycle test can fail: two modules that import each other inside functions are a cycle."""
    for top in PACKAGES:
        (tmp_path / top).mkdir()
    (tmp_path / "dialect" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "dialect" / "b.py").write_text("def g():\n    from taso_mlir.dialect.a import f\n")
    mods = _modules(tmp_path)
    edges = {m: {t for t, _ in _imports(m, f, mods) if t in mods} for m, f in mods.items()}
    assert edges == {"taso_mlir.dialect.a": {"taso_mlir.dialect.b"}, "taso_mlir.dialect.b": {"taso_mlir.dialect.a"}}


def test_no_private_names_imported_across_modules():
    mods = _modules()
    bad = [(m, t, n) for m, f in mods.items() for t, names in _imports(m, f, mods)
           if t.startswith("taso_mlir.") for n in names if n.startswith("_") and n != "__future__"]
    assert not bad, bad


@pytest.mark.parametrize("group,folder", [("prepare", "prepare"), ("search", "search"), ("cleanup", "cleanup")])
def test_passes_live_in_the_folder_of_their_role(group, folder):
    """Each pass of a taso-search group is defined in passes/<role>/ (taso-dce, a prepare step that the
    cleanup passes also end with, and taso-unflatten-matmuls, the inverse of the search's flattening,
    live with what they share)."""
    import sys

    from taso_mlir.passes.search import taso_search as TS

    shared = {"taso-dce": "cleanup", "taso-unflatten-matmuls": "search"}
    passes = {"prepare": TS.PREPARE, "search": TS.SEARCH, "cleanup": TS.CLEANUP}[group]
    for p in passes:
        module = sys.modules[p.run.__module__].__name__
        assert module.split(".")[2] == shared.get(p.argument, folder), (p.argument, module)
