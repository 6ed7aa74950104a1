"""The package's layering (docs/explanations/architecture.md): no module imports from a layer above its own.

Read from the source with ``ast`` (nothing is imported), including imports inside functions:

    core  <  sources, models  <  data  <  algorithms  <  engine  <  config  <  runs  <  sweeps
          <  report, flower, tune, assess  <  cli

- ``core`` (shared types, rng) imports nothing of fedsl;
- ``sources`` (a reader per dataset) and ``models`` are independent of each other; ``data`` (the federation any
  source becomes) reads the sources;
- ``engine`` includes the run's measurements ``fedsl.engine.diagnostics`` and ``fedsl.engine.metrics``;
- ``config`` holds the config's schema (which reads the algorithm specs and model names), loading and presets;
- ``runs`` a run: built, driven, its folder, checkpoint and resume; ``sweeps`` many runs: groups, parallel, Ray;
- ``report`` (plots, tables, reports of finished runs), ``flower`` (the Flower runtime), ``tune`` (studies on
  validation data: they drive runs and groups) and ``assess`` (server datasets scored before training) are
  independent of each other;
- ``experiments`` is the old names' table (``import fedsl.experiments.config`` warns and gives
  ``fedsl.config.schema``), imports nothing of fedsl itself, and sits with ``cli``;
- ``cli`` (a module per command group: ``runs``, ``data``, ``sweep``, ``tune``, ``flower``, with ``app`` and
  ``common``) and the package's own ``__init__`` (the public API) sit on top.

Within one group, modules import each other freely, except in a loop: no module of a package imports
itself back through the package's other modules (``fedsl.algorithms.base`` -> ``server_learning`` ->
``base``), counting imports under ``if TYPE_CHECKING:`` and inside functions, which only hide a loop.
One exception, the old name of a moved module re-exporting it for a release; a new one must be listed in
``EXCEPTIONS`` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "fedsl"

# group -> rank; a module may import from groups of lower rank, and from its own group.
RANK = {"core": 0, "sources": 1, "models": 1, "data": 2, "algorithms": 3, "engine": 4, "config": 5, "runs": 6,
        "sweeps": 7, "report": 8, "flower": 8, "tune": 8, "assess": 8, "cli": 9, "experiments": 9}
GROUP_OF_TOP_MODULE = {"__init__": "cli"}
EXCEPTIONS: dict[tuple[str, str], str] = {}  # (importer, imported module) -> why it is allowed


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def group(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return GROUP_OF_TOP_MODULE["__init__"]
    if parts[1] in RANK and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return GROUP_OF_TOP_MODULE[parts[1]]  # a KeyError: a new top-level module needs a group here


def fedsl_imports(path: Path) -> set[str]:
    """The fedsl modules ``path`` imports (``from fedsl.engine import metrics`` is fedsl.engine.metrics)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if _is_module(sub) else base)
    return {m for m in found if m == "fedsl" or m.startswith("fedsl.")}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in _modules():
        assert group(_module_name(path)) in RANK, path


def test_no_module_imports_from_a_layer_above_its_own():
    bad = []
    for path in _modules():
        me = _module_name(path)
        mine = group(me)
        for imported in sorted(fedsl_imports(path)):
            theirs = group(imported)
            if theirs == mine or RANK[theirs] < RANK[mine] or (me, imported) in EXCEPTIONS:
                continue
            bad.append(f"{me} ({mine}) imports {imported} ({theirs})")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_core_imports_nothing_of_fedsl():
    for path in (PACKAGE / "core").rglob("*.py"):
        assert not {m for m in fedsl_imports(path) if not m.startswith("fedsl.core")}, path


def test_the_library_does_not_import_the_benchmark_harness_or_tests():
    for path in _modules():
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        assert not names & {"harness", "benchmarks", "tests", "conftest"}, path


def package_of(module: str) -> str:
    """The package a module belongs to: its parent, or itself for a package's ``__init__``."""
    return module if (SRC / Path(*module.split("."))).is_dir() else module.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    """Every fedsl module -> the fedsl modules of its own package that it imports (any import, anywhere in it)."""
    graph = {}
    for path in _modules():
        me = _module_name(path)
        graph[me] = {m for m in fedsl_imports(path) if m != me and package_of(m) == package_of(me)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component of ``graph`` with more than one module (Tarjan's algorithm): its modules,
    and one loop through them (the modules in order, the first repeated at the end)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    loops = []
    for component in components:  # the shortest way from the component's first module back to itself
        start, inside = component[0], set(component)
        paths = {w: [start, w] for w in sorted(graph[start] & inside)}
        frontier = list(paths)
        while start not in paths:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & inside):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        loops.append((component, paths[start]))
    return loops


def test_no_import_loops_within_a_package():
    loops = cycles(import_graph())
    assert not loops, "import loops within a package (each module imports the next; type-only and in-function " \
        "imports count):\n" + "\n".join(f"{' -> '.join(loop)} (all in the loop: {', '.join(c)})"
                                           for c, loop in loops)


def test_the_checker_sees_violations():
    """The parser resolves the import forms used in the package (so the test above can fail)."""
    f = PACKAGE / "data" / "partition.py"
    assert "fedsl.core.rng" in fedsl_imports(f)
    assert group("fedsl.engine.metrics") == "engine" and group("fedsl") == "cli"
    assert group("fedsl.report.tables") == "report"
    runner = fedsl_imports(PACKAGE / "runs" / "runner.py")
    assert "fedsl.engine.metrics" in runner and "fedsl.engine" not in runner  # `from fedsl.engine import metrics`
    assert RANK[group("fedsl.engine.simulator")] > RANK[group("fedsl.algorithms.base")]


def test_the_checker_sees_loops():
    """The loop finder names a loop (so the loop test can fail), and a package's ``__init__`` is in the package."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [(["a", "b", "c"], ["a", "b", "c", "a"])]
    assert [loop for _, loop in cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}})] == [["a", "b", "a"],
                                                                                           ["c", "d", "c"]]
    assert package_of("fedsl.algorithms") == package_of("fedsl.algorithms.base") == "fedsl.algorithms"
    assert package_of("fedsl.cli") == package_of("fedsl.cli.runs") == "fedsl.cli"
    typed = import_graph()["fedsl.algorithms.robust"]  # an ``if TYPE_CHECKING:`` import is an import
    assert "fedsl.algorithms.base" in typed


def test_no_package_holds_more_than_fourteen_modules():
    """A package says what it holds: at most 14 modules besides its ``__init__`` (``algorithms``, a file per rule,
    aside), so that a folder of 27 modules with five jobs does not grow back."""
    big = {p.relative_to(PACKAGE).as_posix(): n for p in PACKAGE.rglob("__init__.py")
           if (n := len([m for m in p.parent.glob("*.py") if m.name != "__init__.py"])) > 14}
    assert set(big) <= {"algorithms/__init__.py"}, f"packages over 14 modules: {big}"


def test_the_old_names_give_the_moved_modules_with_a_warning():
    """``fedsl.experiments.X`` and ``fedsl.data.X`` (a reader) for one release: the new module's object itself, with
    a DeprecationWarning, in both import forms, keeping the new module's own spec (so a reload or a pickle names
    the new place)."""
    import importlib
    import sys
    import warnings

    import pytest

    import fedsl.config.schema
    import fedsl.experiments
    import fedsl.runs.files

    for old, new in fedsl.experiments.MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} -> {new}: no such module"
    sys.modules.pop("fedsl.experiments.config", None)
    with pytest.warns(DeprecationWarning, match="fedsl.experiments.config is now fedsl.config.schema"):
        old = importlib.import_module("fedsl.experiments.config")
    assert old is fedsl.config.schema and old.__spec__.name == "fedsl.config.schema"
    sys.modules.pop("fedsl.experiments.run_files", None)
    with pytest.warns(DeprecationWarning, match="run_files is now fedsl.runs.files"):
        from fedsl.experiments import run_files
    assert run_files is fedsl.runs.files
    import fedsl.data
    import fedsl.sources.idx

    for old, new in fedsl.data.MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} -> {new}: no such module"
    sys.modules.pop("fedsl.data.idx_files", None)
    with pytest.warns(DeprecationWarning, match="fedsl.data.idx_files is now fedsl.sources.idx"):
        from fedsl.data import idx_files
    assert idx_files is fedsl.sources.idx
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for missing in ("fedsl.experiments.no_such_module", "fedsl.data.no_such_module"):
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(missing)


def test_each_package_says_what_it_holds_and_what_it_may_import():
    """Each package's ``__init__`` docstring names what it holds and what it may import (or that it imports nothing
    of fedsl), so that the folders alone say where a thing lives."""
    import ast

    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80 and ("may import" in doc or "imports nothing of fedsl" in doc
                                  or "nothing imports it" in doc), f"{init.relative_to(PACKAGE)}: {doc[:80]!r}"
