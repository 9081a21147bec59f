"""The Tensor's stub, ``actorflow/tensor/tensor.pyi``, and the class agree: every name the
binding table (``methods.METHODS``, ``autograd.METHODS``, ``methods.OPERATORS``) puts on
Tensor is declared, every declared member exists, and the file is what
``tools/tensor_stub.py`` writes from the class now, so the two cannot drift. And
``tensor/tensor.py`` (rank 4) calls no method that only the face layer binds."""

import ast
import importlib
import importlib.util
import pathlib

import numpy as np
import pytest

import actorflow as af
from actorflow import autograd, methods
from actorflow.tensor import tensor as tensor_module

ROOT = pathlib.Path(__file__).resolve().parent.parent
STUB = pathlib.Path(tensor_module.__file__).with_suffix(".pyi")
SOURCE = pathlib.Path(tensor_module.__file__)


def generator():
    path = ROOT / "tools" / "tensor_stub.py"
    spec = importlib.util.spec_from_file_location("tensor_stub", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def class_body(tree: ast.Module, name: str) -> list:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name).body


def declared(text: str) -> set:
    """The members the stub's ``class Tensor`` declares."""
    names = set()
    for node in class_body(ast.parse(text), "Tensor"):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    return names


def disagreements(stub: set, bound: set, on_class: set) -> list:
    """What the stub and the class disagree on, in words."""
    out = []
    if bound - stub:
        out.append(
            f"bound by actorflow.methods but not declared in tensor.pyi: {sorted(bound - stub)}"
        )
    if stub - on_class:
        out.append(f"declared in tensor.pyi but not on Tensor: {sorted(stub - on_class)}")
    if on_class - stub:
        out.append(f"on Tensor but not declared in tensor.pyi: {sorted(on_class - stub)}")
    return out


def bound_names() -> set:
    names = set(methods.METHODS) | set(autograd.METHODS)
    for _op, method, reflected in methods.OPERATORS:
        names |= {n for n in (method, reflected) if n}
    return names


def class_names() -> set:
    return set(af.Tensor.__dict__) - generator().NOT_DECLARED


def test_the_stub_declares_every_bound_method_and_nothing_the_class_lacks():
    problems = disagreements(declared(STUB.read_text()), bound_names(), class_names())
    assert not problems, "\n".join(problems) + "\nrun: python tools/tensor_stub.py"
    assert {
        "numpy",
        "item",
        "add",
        "__add__",
        "__radd__",
        "backward",
        "grad",
        "view",
        "_resolve",
    } <= declared(STUB.read_text())


def test_the_stub_is_what_the_generator_writes_now():
    assert generator().render() == STUB.read_text(), (
        "tensor.pyi is out of date: run python tools/tensor_stub.py"
    )


def test_a_drift_either_way_is_reported():
    """The comparison itself: a method bound but not declared, a declared one the class
    lacks."""
    stub = declared(STUB.read_text())
    bound, on_class = bound_names(), class_names()
    found = disagreements(stub - {"add"}, bound, on_class)
    assert any("not declared in tensor.pyi: ['add']" in p for p in found)
    found = disagreements(stub | {"frobnicate"}, bound, on_class)
    assert found == ["declared in tensor.pyi but not on Tensor: ['frobnicate']"]


def test_a_method_bound_without_types_stops_the_generator(monkeypatch):
    gen = generator()

    def frobnicate(self, amount):
        return self

    monkeypatch.setitem(methods.METHODS, "frobnicate", frobnicate)
    monkeypatch.setattr(af.Tensor, "frobnicate", frobnicate, raising=False)
    with pytest.raises(gen.MissingType, match="Tensor.frobnicate: parameter 'amount'"):
        gen.render()


def test_the_stub_is_a_valid_stub_whose_imports_resolve():
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = (
                node.module
                if not node.level
                else importlib.import_module(
                    "." * node.level + (node.module or ""), "actorflow.tensor"
                ).__name__
            )
            mod = importlib.import_module(base)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"tensor.pyi imports {alias.name} from {base}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
    # every module-level name other modules import from tensor.tensor is declared
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    top |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    assert {"Tensor", "wrap", "viewed", "shape_args", "GRAD_VIEW"} <= top


def test_the_stub_and_the_typed_marker_ship_with_the_package():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["actorflow"]
    assert "py.typed" in data and "tensor/*.pyi" in data
    assert (ROOT / "actorflow" / "py.typed").exists()


def test_tensor_py_calls_only_what_it_defines():
    """tensor.py sits below the layers that compute: its methods reach ``self.x`` (and
    ``self[i]``) only for what its own class body defines. ``_resolve``, the one call
    upward, is declared there (None) and bound by the methods table."""
    body = class_body(ast.parse(SOURCE.read_text()), "Tensor")
    defined = set(dir(object))
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                defined.add(t.id)
                if t.id == "__slots__":
                    defined |= set(ast.literal_eval(node.value))
    used = set()
    for node in body:
        for n in ast.walk(node):
            if (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            ):
                used.add(n.attr)
            elif (
                isinstance(n, ast.Subscript)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            ):
                used.add("__setitem__" if isinstance(n.ctx, ast.Store) else "__getitem__")
    assert used - defined == set(), (
        "tensor.py calls methods only actorflow.methods binds; "
        "move the caller into the methods table"
    )
    assert "_resolve" in used


def test_the_moved_methods_behave_as_before():
    """The methods that read values or convert, now entries of the table."""
    x = af.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and x[1, 1].item() == 4.0
    assert float(x[0, 1]) == 2.0 and int(x[1, 0]) == 3 and bool(x[0, 0])
    assert [r.tolist() for r in x] == [[1.0, 2.0], [3.0, 4.0]]
    assert x.flatten().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert [
        x.float().dtype,
        x.double().dtype,
        x.half().dtype,
        x.int().dtype,
        x.long().dtype,
        x.bool().dtype,
        x.type("int64").dtype,
        x.cpu().dtype,
    ] == [af.float32, af.float64, af.float16, af.int32, af.int64, af.bool, af.int64, af.float32]
    assert [5, 6, 7][af.tensor(1)] == 6
    assert repr(x) == str(x) == "tensor([[1., 2.],\n        [3., 4.]], dtype=actorflow.float32)"
    assert np.asarray(x, dtype="float64").dtype == np.float64
    assert np.from_dlpack(x).tolist() == x.tolist() and x.__dlpack_device__() == (1, 0)
    assert af.Tensor.float.__name__ == "float"
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    with pytest.raises(ValueError, match="4 elements"):
        x.item()
