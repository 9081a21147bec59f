"""actorflow's public functions and Tensor methods that share a name with PyTorch's take
PyTorch's arguments: the same positions, the same keyword names (and PyTorch's numpy
aliases ``axis``/``keepdims``), defaults where both have plain values, and no required
argument PyTorch's calls leave out. ``out=`` counts as taken when the function takes it to
refuse it by name (tests/test_torch_args.py checks that).

PyTorch's signatures come from its own type stubs (``torch/_C/_VariableFunctions.pyi`` for
``torch.X``, class ``TensorBase`` in ``torch/_C/__init__.pyi`` for ``Tensor.X``), which are
generated from the same declarations as its argument parser and list every overload, with
``inspect.signature`` for PyTorch's Python functions, and ``TORCH_CORRECTIONS`` (checked
against PyTorch at run time below) where a stub is hand-written and says otherwise.

Every difference found is either fixed or listed in ``ALLOWED`` with its reason; a test
fails on a difference not listed, and on a listed one that is gone (so the list stays the
list of what is left)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import NamedTuple

import pytest

import actorflow as af

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)

EMPTY = inspect.Parameter.empty
UNKNOWN = object()  # a default that is not a plain value (torch.strided...)


class Param(NamedTuple):
    name: str
    kind: str  # "pos" (positional or keyword), "posonly", "var", "kw", "varkw"
    default: object = EMPTY


# -- reading signatures ------------------------------------------------------------------------


def _value(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return UNKNOWN


def _stub_params(fn: ast.FunctionDef, method: bool) -> tuple[list, bool]:
    """A stub's parameters (without ``self`` for a method), and whether it is one of the
    deprecated overloads PyTorch keeps (a function whose tensor is still aten's
    ``self: Tensor``, e.g. ``add(self, alpha, other)``)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    first_default = len(pos) - len(a.defaults)
    out, deprecated = [], False
    for i, p in enumerate(pos):
        default = _value(a.defaults[i - first_default]) if i >= first_default else EMPTY
        kind = "posonly" if p in a.posonlyargs else "pos"
        out.append(Param(p.arg, kind, default))
        if (
            not method
            and p.arg == "self"
            and p.annotation is not None
            and ast.unparse(p.annotation) == "Tensor"
        ):
            deprecated = True
    if a.vararg:
        out.append(Param(a.vararg.arg, "var"))
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append(Param(p.arg, "kw", EMPTY if d is None else _value(d)))
    if a.kwarg:
        out.append(Param(a.kwarg.arg, "varkw"))
    if method:
        out = out[1:]
        out = [p for p in out if p.name != "out"]  # stubs list out=; methods refuse it
    return out, deprecated


def _load_stubs(path: Path, cls: str | None = None) -> dict:
    body = ast.parse(path.read_text()).body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    defs: dict = {}
    for n in body:
        if isinstance(n, ast.FunctionDef):
            defs.setdefault(n.name, []).append(n)
    return defs


STUB_DIR = Path(torch.__file__).parent / "_C"
if not (STUB_DIR / "_VariableFunctions.pyi").exists():
    pytest.skip(
        "this PyTorch install has no type stubs (torch/_C/*.pyi) to read its signatures from",
        allow_module_level=True,
    )
FUNCTION_STUBS = _load_stubs(STUB_DIR / "_VariableFunctions.pyi")
METHOD_STUBS = _load_stubs(STUB_DIR / "__init__.pyi", "TensorBase")


def _sig(text: str) -> list:
    """Params of a signature written as Python, e.g. ``"(input, *, out=None)"``."""
    fn = ast.parse(f"def f{text}: pass").body[0]
    return _stub_params(fn, False)[0]


# Hand-written PyTorch bindings whose stubs disagree with what PyTorch takes at run time
# (test_torch_corrections_hold_at_run_time checks each), and classes without a signature.
TORCH_CORRECTIONS = {
    "Tensor.requires_grad_": ["(requires_grad=True)"],  # stub: mode=
    "Tensor.to": [
        "(device=None, dtype=None, non_blocking=False, copy=False, *, memory_format=None)",
        "(dtype, non_blocking=False, copy=False, *, memory_format=None)",
        "(tensor, non_blocking=False, copy=False, *, memory_format=None)",
    ],  # other=
    "torch.from_numpy": ["(ndarray, /)"],  # no keywords
    "torch.device": ["(type, index=None)"],  # a class
}


def _inspect_params(obj, method: bool) -> list:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "posonly",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
        inspect.Parameter.VAR_POSITIONAL: "var",
        inspect.Parameter.KEYWORD_ONLY: "kw",
        inspect.Parameter.VAR_KEYWORD: "varkw",
    }
    ps = [
        Param(p.name, kinds[p.kind], p.default) for p in inspect.signature(obj).parameters.values()
    ]
    return ps[1:] if method else ps


def torch_overloads(qual: str) -> list:
    """PyTorch's signatures of ``torch.X`` / ``Tensor.X``: a list of overloads, each a list
    of Params (a method's without ``self``)."""
    if qual in TORCH_CORRECTIONS:
        return [_sig(s) for s in TORCH_CORRECTIONS[qual]]
    method = qual.startswith("Tensor.")
    name = qual.split(".", 1)[1]
    stubs = (METHOD_STUBS if method else FUNCTION_STUBS).get(name)
    if stubs:
        overloads = [
            ps for ps, deprecated in (_stub_params(s, method) for s in stubs) if not deprecated
        ]
        if overloads:
            return overloads
    return [_inspect_params(getattr(torch.Tensor if method else torch, name), method)]


def ours(qual: str) -> list:
    if qual.startswith("Tensor."):
        return _inspect_params(getattr(af.Tensor, qual[7:]), True)
    return _inspect_params(getattr(af, qual[6:]), False)


# -- comparing ---------------------------------------------------------------------------------

# PyTorch's argument parser takes these numpy names for every parameter so named
NUMPY_ALIASES = {
    "dim": ("axis",),
    "keepdim": ("keepdims",),
    "input": ("x", "a", "x1"),
    "other": ("x2",),
}


def _same_default(a, b) -> bool:
    if a is UNKNOWN or b is UNKNOWN:
        return True  # not a plain value: not compared
    if a in (None, ()) and b in (None, ()):
        return True  # "every dim", either way
    return type(a) is type(b) and a == b


def differences(qual: str, mine: list, overloads: list) -> dict:
    """{key: message} for every way a call PyTorch takes would fail here, or mean something
    else. Keys are ``"torch.add(alpha)"``: the function and the parameter."""
    found: dict = {}
    positional = [p for p in mine if p.kind in ("pos", "posonly")]
    by_name = {p.name: p for p in mine if p.kind in ("pos", "kw")}
    any_args = any(p.kind == "var" for p in mine)
    any_kwargs = any(p.kind == "varkw" for p in mine)

    def note(param, message):
        found.setdefault(f"{qual}({param})", f"{qual}: {message}")

    def takes_keyword(name):
        return name in by_name or any_kwargs

    for theirs in overloads:
        shown = "(" + ", ".join(("*" if t.kind == "var" else "") + t.name for t in theirs) + ")"
        index = 0
        for t in theirs:
            if t.kind in ("pos", "posonly"):
                if index >= len(positional) and not any_args:
                    note(t.name, f"no argument at position {index} ('{t.name}'); torch {shown}")
                elif t.kind == "pos" and t.name != "self" and not takes_keyword(t.name):
                    here = positional[index].name if index < len(positional) else "*args"
                    note(
                        t.name,
                        f"no keyword '{t.name}' (position {index} is '{here}' here); torch {shown}",
                    )
                index += 1
            elif t.kind == "var" and not any_args:
                note(t.name, f"no *{t.name}; torch {shown}")
            elif t.kind == "kw" and not takes_keyword(t.name):
                note(t.name, f"no keyword '{t.name}'; torch {shown}")
            mine_p = by_name.get(t.name)
            if mine_p is not None and t.default is not EMPTY:
                if mine_p.default is EMPTY:
                    note(t.name, f"'{t.name}' is required here, optional in torch {shown}")
                elif not _same_default(t.default, mine_p.default):
                    note(
                        t.name,
                        f"'{t.name}' defaults to {mine_p.default!r} here, to "
                        f"{t.default!r} in torch",
                    )
            if t.kind in ("pos", "kw"):
                for alias in NUMPY_ALIASES.get(t.name, ()):
                    if not takes_keyword(alias) and not (
                        qual.startswith("Tensor.") and t.name == "input"
                    ):
                        note(alias, f"no keyword '{alias}' (torch's alias of '{t.name}')")
        # what this overload's calls leave out must not be required here
        n_positional = sum(1 for t in theirs if t.kind in ("pos", "posonly"))
        named = {t.name for t in theirs}
        if not any(t.kind == "var" for t in theirs):
            for p in mine:
                supplied = (
                    p.kind in ("pos", "posonly") and positional.index(p) < n_positional
                ) or p.name in named
                if p.default is EMPTY and p.kind in ("pos", "posonly", "kw") and not supplied:
                    note(p.name, f"'{p.name}' is required here; torch's {shown} leaves it out")
    return found


def public_names() -> list:
    """``torch.X`` / ``Tensor.X`` for every public actorflow function and Tensor method
    whose name PyTorch also has."""
    names = []
    for n in af.__all__:
        obj = getattr(af, n)
        if (
            callable(obj)
            and not inspect.isclass(obj)
            and not inspect.ismodule(obj)
            and callable(getattr(torch, n, None))
        ):
            names.append("torch." + n)
    for n, obj in vars(af.Tensor).items():
        if (
            not n.startswith("_")
            and inspect.isfunction(obj)
            and callable(getattr(torch.Tensor, n, None))
        ):
            names.append("Tensor." + n)
    return sorted(names)


def all_differences() -> dict:
    found: dict = {}
    for qual in public_names():
        if qual in ALLOWED:  # a different function under the same name
            continue
        found.update(differences(qual, ours(qual), torch_overloads(qual)))
    return found


# -- what is left, and why ---------------------------------------------------------------------

_CREATION = (
    "creation functions take dtype=, device= and requires_grad=; PyTorch's layout= "
    "(strided only), pin_memory= (no pinned memory) and out= are not taken yet"
)
_LIKE = (
    "the *_like functions take dtype=, device= and requires_grad=; layout=, "
    "pin_memory= and memory_format= are not taken yet"
)

ALLOWED = {
    # numpy's names for input and other: PyTorch's parser takes them everywhere; actorflow
    # takes only axis= and keepdims=, the ones seen in practice
    "*(x)": "numpy's name for input is not taken (pass input positionally)",
    "*(a)": "numpy's name for input is not taken (pass input positionally)",
    "*(x1)": "numpy's name for input is not taken (pass input positionally)",
    "*(x2)": "numpy's name for other is not taken (pass other positionally)",
    # different functions under PyTorch's names
    "torch.trace": "af.trace traces a function into a program; it is not the matrix trace",
    "torch.save": "af.save(obj, path) writes a dict of tensors to .npz (no pickle): PyTorch's "
    "pickle_module/pickle_protocol do not apply",
    "torch.load": "af.load(path) reads af.save's .npz (no pickle): map_location, "
    "pickle_module, weights_only and mmap do not apply",
    # creation (actorflow/creation.py)
    **{
        f"torch.{n}({p})": _CREATION
        for n in ("zeros", "ones", "empty", "rand", "randn", "full", "arange")
        for p in ("layout", "pin_memory", "out")
    },
    **{
        f"torch.{n}(size)": "the shape is taken as *size or one sequence, not by the keyword size="
        for n in ("zeros", "ones", "empty", "rand", "randn")
    },
    "torch.empty(memory_format)": "tensors are row-major only; memory_format= is not taken",
    "torch.full(names)": "named tensors are not supported",
    "torch.rand(generator)": "one global generator (af.manual_seed); generator= not taken",
    "torch.randn(generator)": "one global generator (af.manual_seed); generator= not taken",
    **{
        f"torch.{n}({p})": _LIKE
        for n in ("zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like")
        for p in ("layout", "pin_memory", "memory_format")
    },
    "torch.rand_like(generator)": "one global generator (af.manual_seed); generator= not taken",
    "torch.randn_like(generator)": "one global generator (af.manual_seed); generator= not taken",
    "torch.tensor(pin_memory)": "no pinned memory; pin_memory= is not taken",
    "torch.from_dlpack(ext_tensor)": "the capsule's keyword is obj= (positional use matches)",
    "torch.from_dlpack(device)": "from_dlpack imports as is; device= and copy= are not taken",
    "torch.from_dlpack(copy)": "from_dlpack imports as is; device= and copy= are not taken",
    # dtypes and devices (actorflow/dtype.py, actorflow/device.py)
    "torch.promote_types(type1)": "its arguments are named a, b (positional use matches)",
    "torch.promote_types(type2)": "its arguments are named a, b (positional use matches)",
    **{
        f"torch.result_type({p})": "result_type(*operands) takes any number of tensors and "
        "numbers, positionally only"
        for p in ("tensor", "other", "scalar", "scalar1", "scalar2")
    },
    "torch.device(type)": "af.device(spec, index=None): the device's name is spec= by keyword",
    # Tensor methods defined in actorflow/tensor/tensor.py, methods.py and autograd
    "Tensor.backward(inputs)": "backward() differentiates towards every leaf; inputs= is not "
    "taken yet",
    "Tensor.backward(retain_graph)": "retain_graph defaults to False, not None (PyTorch's "
    "'as create_graph'): the same, since create_graph=True "
    "is refused (no gradients of gradients yet)",
    "Tensor.cpu(memory_format)": "tensors are row-major only; memory_format= is not taken",
    "Tensor.is_contiguous(memory_format)": "tensors are row-major only; memory_format= is not "
    "taken",
    "Tensor.expand(size)": "the sizes are taken as *sizes or one sequence, not by size=",
    "Tensor.expand(implicit)": "implicit= (a tracing detail of PyTorch's) is not taken",
    "Tensor.permute(dims)": "the dims are taken as *dims or one sequence, not by dims=",
    "Tensor.view(size)": "the shape is taken as *shape or one sequence, not by size=",
    "Tensor.view(dtype)": "view(dtype) (reinterpreting the bytes) is not supported",
    "Tensor.squeeze(dim)": "squeeze takes one dim or None; several dims are not taken yet",
    "Tensor.type(dtype)": "type() with no dtype (the type's name) is not supported",
    "Tensor.type(non_blocking)": "type(dtype) converts at once; non_blocking= is not taken",
    "Tensor.size(axis)": "size(dim): the axis= alias is not taken",
    "Tensor.stride(axis)": "stride(dim): the axis= alias is not taken",
    "Tensor.squeeze(axis)": "squeeze(dim): the axis= alias is not taken",
    "Tensor.unsqueeze(axis)": "unsqueeze(dim): the axis= alias is not taken",
    "torch.conv2d(padding)": "torch's overloads default padding to 0 (ints) and 'valid' "
    "(strings), the same padding; af.conv2d takes both, default 0",
}


def _allowed(key: str) -> bool:
    return key in ALLOWED or "*" + key[key.index("(") :] in ALLOWED


# -- the checks --------------------------------------------------------------------------------


def test_signatures_match_torch_or_are_listed_with_a_reason():
    left = {k: m for k, m in all_differences().items() if not _allowed(k)}
    assert not left, (
        "differences from PyTorch's signatures (fix them, or list them in "
        "ALLOWED with the reason):\n  " + "\n  ".join(sorted(left.values()))
    )


def test_every_listed_difference_still_exists():
    """A gap that was fixed leaves the list: the list is what is left."""
    found = all_differences()
    wildcards = {k[1:] for k in ALLOWED if k.startswith("*")}
    assert any(k[k.index("(") :] in wildcards for k in found)
    qualified = set(public_names())
    stale = [k for k in ALLOWED if not k.startswith("*") and k not in found and k not in qualified]
    assert not stale, f"listed in ALLOWED but no longer different: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_walk_covers_the_functions_and_methods_named_like_torchs():
    names = set(public_names())
    for qual in (
        "torch.add",
        "torch.sub",
        "torch.clamp",
        "torch.nonzero",
        "torch.cat",
        "torch.sum",
        "torch.max",
        "torch.where",
        "torch.zeros",
        "Tensor.add",
        "Tensor.add_",
        "Tensor.clamp",
        "Tensor.clamp_",
        "Tensor.clip",
        "Tensor.to",
        "Tensor.view",
        "Tensor.backward",
        "Tensor.sum",
    ):
        assert qual in names, qual
    assert len(names) > 140


def test_a_deliberate_mismatch_is_caught():
    """The comparison itself: each kind of difference is found."""
    theirs = [_sig("(input, other, *, alpha=1, out=None)")]
    fine = differences("torch.f", _sig("(input, other, *, alpha=1, out=None)"), theirs)
    assert set(fine) == {"torch.f(x)", "torch.f(a)", "torch.f(x1)", "torch.f(x2)"}  # listed
    assert differences("torch.f", _sig("(input, other, *, alpha=1, out=None, **kw)"), theirs) == {}
    bad = differences("torch.f", _sig("(input, y, *, alpha=2, beta)"), theirs)
    assert {k for k in bad if not _allowed(k)} == {
        "torch.f(other)",
        "torch.f(alpha)",
        "torch.f(out)",
        "torch.f(beta)",
    }
    assert "no keyword 'other' (position 1 is 'y' here)" in bad["torch.f(other)"]
    assert "'alpha' defaults to 2 here, to 1 in torch" in bad["torch.f(alpha)"]
    assert "no keyword 'out'" in bad["torch.f(out)"]
    assert "'beta' is required here" in bad["torch.f(beta)"]
    assert "torch.f(other)" in differences("torch.f", _sig("(input)"), theirs)
    assert "torch.f(dim)" in differences(
        "torch.f", _sig("(input, *, dim=None)"), [_sig("(input, dim=None)")]
    )
    assert set(
        differences("Tensor.f", _sig("(dim=None)"), [_sig("(dim=None, keepdim=False)")])
    ) == {"Tensor.f(keepdim)", "Tensor.f(axis)", "Tensor.f(keepdims)"}
    assert differences("Tensor.f", _sig("(*shape)"), [_sig("(*size)"), _sig("(size)")]) == {
        "Tensor.f(size)": "Tensor.f: no keyword 'size' (position 0 is '*args' here); torch (size)"
    }


def test_a_mismatch_in_actorflow_itself_is_caught(monkeypatch):
    """The walk over actorflow: a Tensor method that loses a keyword is reported."""

    def add(self, other):
        return self

    monkeypatch.setattr(af.Tensor, "add", add)
    found = all_differences()
    assert "Tensor.add(alpha)" in found
    assert not _allowed("Tensor.add(alpha)")


def test_torch_stubs_are_read_as_torch_calls_them():
    """Spot checks that the stubs say what PyTorch takes (keywords, overloads)."""
    assert [p.name for p in torch_overloads("torch.add")[0]] == ["input", "other", "alpha", "out"]
    assert len(torch_overloads("torch.add")) == 1  # the deprecated one is left out
    x = torch.arange(6.0).reshape(2, 3)
    torch.add(input=x, other=x, alpha=2)
    torch.clamp(input=x, min=x, max=x)
    torch.nonzero(input=x, as_tuple=True)
    torch.sum(input=x, dim=0, keepdim=True, dtype=torch.float64)
    torch.sum(x, axis=0, keepdims=True)
    torch.cat(tensors=[x], dim=0)
    torch.where(x > 1)
    torch.max(x, other=x)
    x.add(other=x, alpha=2)
    x.clone().copy_(other=x, non_blocking=False)
    x.pow(exponent=2)
    x.reshape(shape=(3, 2))
    with pytest.raises(TypeError, match="out"):
        x.add(x, out=x)  # the stubs' out= for methods: not taken


def test_torch_corrections_hold_at_run_time():
    x = torch.zeros(2)
    x.clone().requires_grad_(requires_grad=True)
    with pytest.raises(TypeError, match="mode"):
        x.clone().requires_grad_(mode=True)
    x.to(tensor=x)
    x.to(
        device="cpu",
        dtype=torch.float64,
        non_blocking=False,
        copy=True,
        memory_format=torch.preserve_format,
    )
    x.to(torch.float64, False, True)
    with pytest.raises(TypeError):
        x.to(other=x)
    with pytest.raises(TypeError, match="no keyword arguments"):
        torch.from_numpy(ndarray=x.numpy())
    torch.device(type="cpu", index=None)
