"""The packages' layers point one way: each module imports only from its own package and from
the packages below it, never from a sibling or one above, and no package-level cycle exists.

    elmo_core <- runtime, corpora, formats <- inference <- export, training <- pipelines, serving <- probing <- elmo_cli

Parsed with ``ast`` (every import statement, including those inside functions), so a lazy
import cannot hide an upward dependency.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Package -> layer. A package may import packages of a lower layer only (and itself).
LAYERS = {"elmo_core": 0, "storage": 1, "runtime": 2, "corpora": 2, "formats": 2, "inference": 3, "export": 4,
          "training": 4, "pipelines": 5, "serving": 5, "probing": 6, "elmo_cli": 7}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level project package, line) of every absolute import in a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found |= {(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in LAYERS}
    return found


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package pairs -> where (module:line)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for package in LAYERS:
        for module in sorted((ROOT / package).rglob("*.py")):
            for imported, line in imported_packages(module):
                if imported != package:
                    edges.setdefault((package, imported), []).append(f"{module.relative_to(ROOT)}:{line}")
    return edges


def test_every_package_of_the_tree_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages <= set(LAYERS), f"packages without a layer in LAYERS: {sorted(packages - set(LAYERS))}"


def test_imports_point_down_only():
    bad = [f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}) at {', '.join(where)}"
           for (a, b), where in package_edges().items() if LAYERS[b] >= LAYERS[a]]
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_no_package_level_cycle():
    graph: dict[str, set[str]] = {}
    for a, b in package_edges():
        graph.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    cycles = sorted(p for p in graph if reaches(p, p, set()))
    assert not cycles, f"packages on an import cycle: {cycles}"


def module_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports (relative imports resolved)."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for package in LAYERS for f in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        here = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                deps |= {f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def test_no_module_level_cycle():
    graph = module_graph()

    def path_back(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [" -> ".join(c) for c in map(path_back, sorted(graph)) if c]
    assert not cycles, "modules on an import cycle:\n" + "\n".join(cycles)


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from elmo_cli.main import main\n    import export.build\n")
    assert imported_packages(module) == {("elmo_cli", 2), ("export", 3)}


def test_each_package_says_what_it_may_import():
    """Each package's ``__init__`` docstring ends with ``May import: ...`` naming exactly the
    packages below it, so the two lines a newcomer reads first agree with the layers."""
    for package, layer in LAYERS.items():
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))) or ""
        lines = doc.splitlines()
        assert len(lines) == 2 and lines[1].startswith("May import: "), (package, doc)
        named = lines[1].removeprefix("May import: ").split(" (")[0].split(", ")
        want = [p for p, other in LAYERS.items() if other < layer] or ["no other package of the project"]
        assert named == want, (package, named, want)


def test_the_model_floor_imports_only_torch_numpy_and_the_standard_library():
    """``elmo_core`` is the model's maths: where bytes live (``storage``), Arrow's types
    (``pipelines.schema``) and every other library belong to the layers that use them."""
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "elmo_core", "__future__"}
    found = sorted(f"{path.relative_to(ROOT)}:{line} {name}" for path in (ROOT / "elmo_core").rglob("*.py")
                   for name, line in _imported_modules(path) if name.split(".")[0] not in allowed)
    assert found == [], found


def _imported_modules(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in a module, however deep in its code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
    return out
