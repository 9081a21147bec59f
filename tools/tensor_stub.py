"""Writes ``actorflow/tensor/tensor.pyi``, the Tensor as editors and type checkers see it.

``Tensor`` is defined in two halves: ``tensor/tensor.py`` (metadata, views: what needs nothing
above ``tensor/``) and the table ``actorflow.methods`` binds onto the class (``METHODS``,
``autograd.METHODS``, ``OPERATORS``: ops, operators, reading values, conversions, indexing,
autograd). The stub declares both, read from the class once ``actorflow`` is imported:
parameter names, kinds and defaults from the functions themselves, so they cannot drift;
types from the functions' annotations, else from ``TYPES`` (by parameter name) and
``RETURNS`` here. A method bound without a type for each parameter and its result stops the
generator, naming it: add the type here. A functional function bound as it is declares its
first parameter (``input``, the tensor) as ``self``, as methods are written.

Usage: ``python tools/tensor_stub.py`` writes the stub; ``--check`` exits 1 when the file on
disk differs (``tests/test_tensor_stub.py`` checks the same).
"""

from __future__ import annotations

import inspect
import pathlib
import re
import sys

if __name__ == "__main__":  # the actorflow next to this file, not an installed one
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from actorflow import autograd, methods  # noqa: E402 - after the sys.path insert
from actorflow.tensor import tensor as tensor_module  # noqa: E402 - after the sys.path insert

Tensor = tensor_module.Tensor
STUB = pathlib.Path(tensor_module.__file__).with_suffix(".pyi")

HEADER = """\
# The Tensor as editors and type checkers see it: the methods tensor.py defines and those
# actorflow.methods binds from its table (METHODS, autograd.METHODS, OPERATORS).
# Written by tools/tensor_stub.py from the class itself: do not edit by hand; change the
# functions (or the generator's types) and run `python tools/tensor_stub.py`.
# tests/test_tensor_stub.py fails when this file is out of date.
import builtins
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias, overload

import numpy as np

from ..device import Device
from ..dtype import DType
from ..sbp import SBP, Placement
from .impl import TensorImpl
from .meta import TensorMeta

_Number: TypeAlias = bool | int | float
_Operand: TypeAlias = Tensor | _Number | np.ndarray | np.generic
_DTypeLike: TypeAlias = DType | str
_DeviceLike: TypeAlias = Device | str
_Dims: TypeAlias = int | tuple[int, ...] | list[int]
_Shape: TypeAlias = int | Sequence[int]

class _MinMax(NamedTuple):
    values: Tensor
    indices: Tensor

GRAD_VIEW: list[Any]
"""

# A parameter's type by its name, where the function does not annotate it.
TYPES = {
    "other": "_Operand",
    "exponent": "_Operand",
    "alpha": "_Number",
    "value": "_Number",
    "min": "_Operand | None",
    "max": "_Operand | None",
    "condition": "Tensor",
    "rounding_mode": "str | None",
    "out": "None",
    "memory_format": "Any",
    "dim": "int | None",
    "axis": "int | None",
    "keepdims": "bool | None",
    "dtype": "_DTypeLike | None",
    "device": "_DeviceLike | None",
    "tensor": "Tensor | None",
    "copy": "bool",
    "non_blocking": "bool",
    "key": "Any",
    "args": "Any",
    "kwargs": "Any",
    "sizes": "_Shape",
    "shape": "_Shape",
    "dims": "_Shape",
    "gradient": "Tensor | None",
    "impl": "TensorImpl",
    "fn": "Any",
    "name": "str",
    "stream": "Any",
    "t": "Tensor",
    "arg": "Any",
    "index": "Tensor",
    "src": "Tensor",
    "descending": "bool",
    "stable": "bool",
    "k": "int",
    "largest": "bool",
    "sorted": "bool",
    "sparse_grad": "bool",
}

# (function, parameter) -> type, where the name alone does not say it.
TYPES_IN = {
    ("sum", "dim"): "_Dims | None",
    ("mean", "dim"): "_Dims | None",
    ("amax", "dim"): "_Dims | None",
    ("amin", "dim"): "_Dims | None",
    ("sum", "axis"): "_Dims | None",
    ("mean", "axis"): "_Dims | None",
    ("amax", "axis"): "_Dims | None",
    ("amin", "axis"): "_Dims | None",
    ("max", "other"): "Tensor | None",
    ("min", "other"): "Tensor | None",
    ("copy_", "other"): "Tensor",
    ("__setitem__", "value"): "Any",
    ("grad", "value"): "Tensor | None",
    ("expand_as", "other"): "Tensor",
    ("__array__", "dtype"): "Any",
    ("__array__", "copy"): "bool | None",
    ("type", "dtype"): "_DTypeLike",
    ("reshape", "shape"): "Sequence[int] | None",
    ("shape_args", "args"): "tuple[Any, ...]",
    ("cumsum", "dim"): "int | None",
    ("gather", "dim"): "int | None",
    ("scatter_add", "dim"): "int | None",
    ("scatter_add_", "dim"): "int | None",
    ("gather", "index"): "Tensor | None",
    ("scatter_add", "index"): "Tensor | None",
    ("scatter_add_", "index"): "Tensor | None",
    ("scatter_add", "src"): "Tensor | None",
    ("scatter_add_", "src"): "Tensor | None",
    ("cumsum", "axis"): "int | None",
    ("sort", "dim"): "int",
    ("argsort", "dim"): "int",
    ("topk", "dim"): "int",
    ("masked_fill", "mask"): "Tensor",
    ("masked_fill", "value"): "_Number | Tensor",
}

# A result's type, where the function does not annotate it (or says less than this).
RETURNS = {
    "_meta": "TensorMeta",
    "shape": "tuple[int, ...]",
    "dtype": "DType",
    "device": "Device",
    "_read": "Any",
    "numpy": "np.ndarray",
    "numpy_async": "np.ndarray",
    "__array__": "np.ndarray",
    "tolist": "Any",
    "item": "_Number",
    "__repr__": "str",
    "__str__": "str",
    "__dlpack__": "Any",
    "__dlpack_device__": "tuple[int, int]",
    "__iter__": "Iterator[Tensor]",
    "grad": "Tensor | None",
    "grad_fn": "Any",
    "backward": "None",
    "shape_args": "tuple[int, ...]",
    "stride": "tuple[int, ...] | int",
    "sort": "tuple[Tensor, Tensor]",
    "topk": "tuple[Tensor, Tensor]",
}

# Overloads: per variant, what some parameters are declared as (type, and default if
# any: one without is required) and the result.
OVERLOADS = {
    "size": [({"dim": "None = None"}, "tuple[int, ...]"), ({"dim": "int"}, "int")],
    "stride": [({"dim": "None = None"}, "tuple[int, ...]"), ({"dim": "int"}, "int")],
    "max": [
        ({"dim": "None = None"}, "Tensor"),
        ({"dim": "int"}, "_MinMax"),
        ({"dim": "Tensor"}, "Tensor"),
    ],
    "min": [
        ({"dim": "None = None"}, "Tensor"),
        ({"dim": "int"}, "_MinMax"),
        ({"dim": "Tensor"}, "Tensor"),
    ],
    "nonzero": [
        ({"as_tuple": "Literal[False] = False"}, "Tensor"),
        ({"as_tuple": "Literal[True]"}, "tuple[Tensor, ...]"),
    ],
}

# Operators whose result is not what ``object`` declares (a Tensor, not a bool).
IGNORE_OVERRIDE = {"__eq__", "__ne__"}

# What the class holds that is no method or attribute a user reaches.
NOT_DECLARED = {
    "__module__",
    "__doc__",
    "__slots__",
    "__weakref__",
    "__qualname__",
    "__dict__",
    "__firstlineno__",
    "__static_attributes__",
}


def bound_names() -> dict:
    """Each name the binding table puts on Tensor -> where it comes from."""
    names = {n: "METHODS" for n in methods.METHODS}
    names.update({n: "autograd.METHODS" for n in autograd.METHODS})
    for _op, method, reflected in methods.OPERATORS:
        names.update({n: "OPERATORS" for n in (method, reflected) if n})
    return names


def _default(value) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return "..."


class MissingType(Exception):
    pass


# Tensor's methods int, float, bool and type hide the builtins inside its class body: a type
# there names them as builtins.int...
_BUILTIN = re.compile(r"(?<![\w.])(int|float|bool|type)(?!\w)")


def _qualify(t: str) -> str:
    return _BUILTIN.sub(r"builtins.\1", t)


def _annotation(ann) -> str:
    """An annotation as the stub writes it: ``"Tensor"`` (a string already) as ``Tensor``."""
    if not isinstance(ann, str):
        return "None" if ann is None else ann.__name__
    return ann[1:-1] if ann[:1] in "'\"" and ann[-1:] == ann[:1] else ann


def _param_type(fn_name: str, p: inspect.Parameter) -> str:
    if (fn_name, p.name) in TYPES_IN:
        return TYPES_IN[(fn_name, p.name)]
    if p.annotation is not inspect.Parameter.empty:
        return _annotation(p.annotation)
    if p.name in TYPES:
        return TYPES[p.name]
    raise MissingType(
        f"Tensor.{fn_name}: parameter '{p.name}' has no type; annotate it or "
        f"add it to TYPES / TYPES_IN in tools/tensor_stub.py"
    )


def _return_type(name: str, fn) -> str:
    if name in RETURNS:
        return RETURNS[name]
    ann = inspect.signature(fn).return_annotation
    if ann is not inspect.Signature.empty:
        return _annotation(ann)
    if fn.__module__.startswith("actorflow.functional"):
        return "Tensor"  # functional's functions and prebuilt operators return tensors
    raise MissingType(
        f"Tensor.{name}: the result has no type; annotate it or add it to "
        f"RETURNS in tools/tensor_stub.py"
    )


def _params(name: str, fn, method: bool, types: dict | None = None) -> list:
    """``["self", "a: T = d", "*", "b: U = e"]`` for ``fn``; ``types`` declares some
    parameters as it says (an overload's)."""
    out, star = [], False
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        if method and i == 0:
            out.append("self")  # functional's ``input`` is the tensor itself
            continue
        kind = p.kind
        if kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        if types and p.name in types:
            out.append(f"{p.name}: {_qualify(types[p.name])}")
            continue
        t = _qualify(_param_type(name, p))
        if kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}: {t}")
            star = True
        elif kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}: {t}")
        elif p.default is p.empty:
            out.append(f"{p.name}: {t}")
        else:
            out.append(f"{p.name}: {t} = {_default(p.default)}")
    return out


def _doc(fn, indent: str) -> list:
    if not fn.__doc__:  # its own only: never object's ("Return self==value.")
        return []
    doc = inspect.cleandoc(fn.__doc__)
    doc = doc.replace('"""', r"\"\"\"")
    lines = doc.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return (
        [f'{indent}"""{lines[0]}'] + [(indent + ln).rstrip() for ln in lines[1:]] + [f'{indent}"""']
    )


WIDTH = 96


def _def(indent: str, head: str, params: list, result: str, tail: str = "") -> list:
    """``def name(params) -> result:`` in lines of at most WIDTH characters; ``tail``
    follows the colon on the first line (`` ...``, a comment)."""
    line = f"{indent}{head}({', '.join(params)}) -> {result}:"
    if len(line) + len(tail) <= WIDTH:
        return [line + tail]
    # a comment (the type: ignore) belongs on the first line, where checkers report
    comment = tail[tail.index("#") - 2 :] if "#" in tail else ""
    lines, cur, inner = [f"{indent}{head}({comment}"], "", indent + "    "
    for p in params:
        if cur and len(inner) + len(cur) + len(p) + 2 > WIDTH:
            lines.append(inner + cur.rstrip())
            cur = ""
        cur += p + ", "
    lines.append(inner + cur.rstrip())
    return lines + [f"{indent}) -> {result}:{tail.replace(comment, '') if comment else tail}"]


def _function(name: str, fn, indent: str, method: bool = True, ignore: str = "") -> list:
    asyn = "async " if inspect.iscoroutinefunction(fn) else ""
    body = _doc(fn, indent + "    ")
    lines = []
    for types, result in OVERLOADS.get(name, []):
        lines += [f"{indent}@overload"] + _def(
            indent, f"{asyn}def {name}", _params(name, fn, method, types), _qualify(result), " ..."
        )
    if lines:
        return lines
    params, result = _params(name, fn, method), _qualify(_return_type(name, fn))
    if body:
        return _def(indent, f"{asyn}def {name}", params, result, ignore) + body
    return _def(indent, f"{asyn}def {name}", params, result, " ..." + ignore)


def _member(name: str, value) -> list:
    ind = "    "
    ignore = "  # type: ignore[override]" if name in IGNORE_OVERRIDE else ""
    if isinstance(value, property):
        lines = [f"{ind}@property"] + _function(name, value.fget, ind)
        if value.fset is not None:
            lines += [f"{ind}@{name}.setter"] + _def(
                ind, f"def {name}", _params(name, value.fset, True), "None", " ..."
            )
        return lines
    if isinstance(value, staticmethod):
        return [f"{ind}@staticmethod"] + _function(name, value.__func__, ind, method=False)
    if callable(value):
        return _function(name, value, ind, ignore=ignore)
    if type(value).__name__ == "member_descriptor":  # a slot
        return [f"{ind}{name}: TensorImpl"]
    return [f"{ind}{name}: {_qualify(type(value).__name__)}"]


def render() -> str:
    """The stub's text, from the class as bound now."""
    lines = HEADER.splitlines()
    for name in ("wrap", "viewed", "shape_args"):
        lines += [""] + _function(name, getattr(tensor_module, name), "", method=False)
    table = bound_names()
    own = [n for n in Tensor.__dict__ if n not in table and n not in NOT_DECLARED]
    lines += ["", "class Tensor:"] + _doc(Tensor, "    ")
    lines += ["", "    # -- defined in tensor.py"]
    for n in own:
        lines += _member(n, Tensor.__dict__[n])
    for source in ("METHODS", "autograd.METHODS", "OPERATORS"):
        lines += ["", f"    # -- bound by actorflow.methods from {source}"]
        for n, s in table.items():
            if s == source:
                lines += _member(n, Tensor.__dict__[n])
    return "\n".join(lines) + "\n"


def main(argv: list) -> int:
    text = render()
    if "--check" in argv:
        if not STUB.exists() or STUB.read_text() != text:
            print(f"{STUB} is out of date: run python tools/tensor_stub.py")
            return 1
        return 0
    STUB.write_text(text)
    print(f"wrote {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
