"""The shape docs/ARCHITECTURE.md describes, checked: imports point down the layers only (lazy
imports inside functions count too), no import circle among modules. Files are split by who
owns the state, never by line count, so no test counts lines."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "actorflow"

# lowest first; a module may import from a lower rank, or from its own top-level package
RANKS = {
    "errors": 0,
    "dtype": 1,
    "code_reads": 1,
    "device": 1,
    "sbp": 2,
    "eventloop": 1,
    "trace_events": 1,
    "backends": 2,
    "ops": 3,
    "tensor": 4,
    "vm": 5,
    "runtime": 5,  # side by side: neither imports the other
    "eager": 6,
    "creation": 7,
    "parallel": 7,
    "runtime_api": 7,
    "functional": 8,
    "autograd": 9,
    "indexing": 10,
    "methods": 11,
    "tracing": 12,
    "pipeline": 13,
    "experiments": 13,
    "nn": 13,
    "optim": 13,
    "serialization": 13,
    "data": 13,
    "plots": 13,
    "distributed": 13,
    "lowlevel": 14,
    "testing": 14,
    "__init__": 15,
    "__main__": 16,
}


def module_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict:
    return {module_of(p): p for p in ROOT.rglob("*.py")}


def imports() -> set:
    """``(importer, imported)`` module pairs inside actorflow, lazy imports included."""
    mods = modules()
    edges = set()
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # `from . import x` names a module
                    sub = f"{target}.{alias.name}"
                    targets.append(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t.split(".")[0] == "actorflow" and t != name:
                    edges.add((name, t))
    return edges


def rank(module: str) -> tuple:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return RANKS[top], top


def test_every_module_has_a_layer():
    tops = {m.split(".")[1] for m in modules() if "." in m}
    assert tops - set(RANKS) == set(), "give these a rank here and in docs/ARCHITECTURE.md"


def test_imports_point_down_the_layers():
    upward = set()
    for a, b in imports():
        (ra, ta), (rb, tb) = rank(a), rank(b)
        if ta != tb and rb >= ra:
            upward.add((a, b))
    assert upward == set(), "imports from a lower layer to a higher one"


def test_no_import_circle():
    """No circle among modules (within a package too)."""
    graph: dict = {}
    for a, b in imports():
        graph.setdefault(a, set()).add(b)
    state: dict = {}

    def visit(m, path):
        if state.get(m) == 2:
            return
        if state.get(m) == 1:
            cycle = path[path.index(m) :] + [m]
            pytest.fail("import circle: " + " -> ".join(cycle))
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_the_layer_checks_read_real_imports():
    """The import reader sees module-level and lazy imports, relative and absolute."""
    edges = imports()
    assert ("actorflow.eager.interpreter", "actorflow.vm") in edges or any(
        a == "actorflow.eager.interpreter" and b.startswith("actorflow.vm") for a, b in edges
    )
    assert ("actorflow.methods", "actorflow.functional") in edges
    assert ("actorflow.tensor.tensor", "actorflow.tensor.views") in edges  # a lazy one
    assert rank("actorflow.runtime.graph.actor_graph")[0] < rank("actorflow.tracing.trace")[0]


def test_the_benchmark_harness_reads_the_runtime_it_describes():
    """The benchmarks reach into the runtime for what they report (the graph loop's type):
    a move in the package must not leave them broken."""
    import importlib.util

    path = ROOT.parent / "benchmarks" / "harness.py"
    spec = importlib.util.spec_from_file_location("bench_harness", path)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    assert "Loop" in harness.graph_event_loop()
    env = harness.environment()
    assert env["python"] and "numpy" in str(env)
