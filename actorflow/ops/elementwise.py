"""Elementwise ops: unary, binary (tensor-tensor and tensor-scalar) with broadcasting,
comparisons (where, clamp and cast are in ``selection.py``). Kernels are numpy ufuncs
writing into the output."""

from __future__ import annotations

import math

import numpy as np

from ..dtype import (
    FLOAT,
    bool_,
    combine_categories,
    default_float,
    from_numpy_dtype,
    promote_types,
    result_type,
)
from ..errors import DTypeError
from .common import broadcast_shapes, host, is_array, put, quietly
from .division import (
    INT_DIVISION,
    division_kernel,
    division_scalar_kernel,
    nonzero_divisor,
    trunc_divide,
)
from .registry import OpDef, register

# -- dtype rules -----------------------------------------------------------------------


def _same(dtype):
    return dtype


def _floating(dtype):
    return dtype if dtype.category == FLOAT else default_float


def _no_bool(op):
    def rule(dtype):
        if dtype is bool_:
            raise DTypeError(
                f"{op}: not supported for bool tensors; convert with .int() or "
                f".float() first (use logical ops to invert a mask)"
            )
        return dtype

    return rule


def _no_float(op):
    def rule(dtype):
        if dtype.category == FLOAT:
            raise DTypeError(f"{op}: only integer and bool tensors are supported, got {dtype}")
        return dtype

    return rule


# -- unary -----------------------------------------------------------------------------


def _k_relu(outs, ins, attrs):
    np.maximum(ins[0], 0, out=outs[0])


def _k_sigmoid(outs, ins, attrs):
    o = outs[0]
    with np.errstate(over="ignore"):
        np.negative(in_dtype(ins[0], o.dtype), out=o)
        np.exp(o, out=o)
    o += 1
    np.reciprocal(o, out=o)


_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_erf_exact = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    """erf: exact (math.erf) for float64, Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7,
    below float32 resolution) for float32/float16."""
    if x.dtype == np.float64:
        r = np.asarray(_erf_exact(host(x)), dtype=np.float64)  # (math.erf: on the host)
        if not is_array(x) or isinstance(x, np.ndarray):
            return r
        d = x.copy()  # a device array: the result goes back to the device
        put(d, r)
        return d
    x = x.astype(np.float32, copy=False)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * a)
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return s * (1.0 - poly * np.exp(-a * a))


def _k_gelu(outs, ins, attrs):
    x = ins[0]
    if x.dtype.kind != "f":
        x = x.astype(outs[0].dtype)
    if attrs.get("approximate", "none") == "tanh":
        inner = np.sqrt(2.0 / np.pi).astype(x.dtype) * (x + x.dtype.type(0.044715) * x**3)
        res = 0.5 * x * (1.0 + np.tanh(inner))
    else:
        res = 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0).astype(x.dtype)))
    np.copyto(outs[0], res, casting="unsafe")


def _k_silu(outs, ins, attrs):
    # x / (1 + exp(-x)), each step rounded to the output dtype (the CUDA C does the same);
    # x is read once more after the temporaries, so an in-place call (o is x) is safe
    o = outs[0]
    x = in_dtype(ins[0], o.dtype)
    with np.errstate(over="ignore"):
        t = np.exp(np.negative(x))
    t += 1
    np.divide(x, t, out=o)


def _k_rsqrt(outs, ins, attrs):
    o = outs[0]
    with np.errstate(all="ignore"):  # 0 gives inf, a negative number nan, as PyTorch
        np.sqrt(in_dtype(ins[0], o.dtype), out=o)
        np.reciprocal(o, out=o)


def _k_erf(outs, ins, attrs):
    o = outs[0]
    np.copyto(o, _erf(in_dtype(ins[0], o.dtype)), casting="unsafe")


def in_dtype(x, dtype):
    """x in ``dtype``: ops compute in their result dtype (as PyTorch), not numpy's choice."""
    return x if x.dtype is dtype else x.astype(dtype)


def _ufunc_kernel(ufunc, quiet=False):
    if quiet:

        def kernel(outs, ins, attrs):
            o = outs[0]
            with np.errstate(all="ignore"):
                ufunc(in_dtype(ins[0], o.dtype), out=o)
    else:

        def kernel(outs, ins, attrs):
            o = outs[0]
            ufunc(in_dtype(ins[0], o.dtype), out=o)

    return kernel


def _ufunc_fresh(ufunc, quiet=False):
    """The fresh form of ``_ufunc_kernel``: the same cast, the same loop, a new output."""
    if quiet:

        def fresh(ins, attrs, dtype):
            x = ins[0]
            if x.dtype is not dtype:
                x = x.astype(dtype)
            return quietly(ufunc, x)
    else:

        def fresh(ins, attrs, dtype):
            x = ins[0]
            if x.dtype is not dtype:
                x = x.astype(dtype)
            return ufunc(x)

    return fresh


_ZERO: dict = {}  # numpy dtype -> its 0-d zero (a Python 0 is converted on every call)


def _f_relu(ins, attrs, dtype):
    x = ins[0]
    zero = _ZERO.get(x.dtype)
    if zero is None:
        zero = _ZERO[x.dtype] = np.zeros((), x.dtype)
    return np.maximum(x, zero)


def _unary_infer(rule):
    last = [(None, None)]  # (meta, specs) of the latest call (see _binary_infer)

    def infer(metas, attrs):
        m = metas[0]
        seen, specs = last[0]
        if seen is not m:
            specs = [(m.shape, rule(m.dtype))]
            last[0] = (m, specs)
        return specs

    return infer


UNARY = {
    # name: (kernel, dtype rule, fresh kernel or None)
    "neg": (_ufunc_kernel(np.negative), _no_bool("neg"), _ufunc_fresh(np.negative)),
    "abs": (_ufunc_kernel(np.absolute), _same, _ufunc_fresh(np.absolute)),
    "exp": (_ufunc_kernel(np.exp, quiet=True), _floating, _ufunc_fresh(np.exp, quiet=True)),
    "log": (_ufunc_kernel(np.log, quiet=True), _floating, _ufunc_fresh(np.log, quiet=True)),
    "sqrt": (_ufunc_kernel(np.sqrt, quiet=True), _floating, _ufunc_fresh(np.sqrt, quiet=True)),
    "tanh": (_ufunc_kernel(np.tanh), _floating, _ufunc_fresh(np.tanh)),
    "sin": (_ufunc_kernel(np.sin, quiet=True), _floating, _ufunc_fresh(np.sin, quiet=True)),
    "cos": (_ufunc_kernel(np.cos, quiet=True), _floating, _ufunc_fresh(np.cos, quiet=True)),
    "rsqrt": (_k_rsqrt, _floating, None),
    "erf": (_k_erf, _floating, None),
    "relu": (_k_relu, _no_bool("relu"), _f_relu),
    "sigmoid": (_k_sigmoid, _floating, None),
    "silu": (_k_silu, _floating, None),
    "gelu": (_k_gelu, _floating, None),
    "logical_not": (_ufunc_kernel(np.logical_not), lambda d: bool_, None),
    "bitwise_not": (_ufunc_kernel(np.invert), _no_float("bitwise_not"), None),
}

for _name, (_kernel, _rule, _fresh) in UNARY.items():
    register(
        OpDef(
            _name,
            ("x",),
            _unary_infer(_rule),
            {"cpu": _kernel},
            fresh={"cpu": _fresh} if _fresh else {},
            elementwise=True,
            attrs=("approximate",) if _name == "gelu" else (),
        )
    )

# -- binary ----------------------------------------------------------------------------

BINARY = {
    # name: (ufunc, kind) ; kind: "arith" keeps the promoted dtype, "div" makes it floating,
    # "cmp" gives bool
    "add": (np.add, "arith"),
    "sub": (np.subtract, "arith"),
    "mul": (np.multiply, "arith"),
    "div": (np.true_divide, "div"),
    "pow": (np.power, "arith"),
    "maximum": (np.maximum, "arith"),
    "minimum": (np.minimum, "arith"),
    "eq": (np.equal, "cmp"),
    "ne": (np.not_equal, "cmp"),
    "lt": (np.less, "cmp"),
    "le": (np.less_equal, "cmp"),
    "gt": (np.greater, "cmp"),
    "ge": (np.greater_equal, "cmp"),
    "logical_and": (np.logical_and, "cmp"),
    "logical_or": (np.logical_or, "cmp"),
    "floor_divide": (np.floor_divide, "arith"),
    "remainder": (np.remainder, "arith"),
    "trunc_divide": (trunc_divide, "arith"),
    "bitwise_and": (np.bitwise_and, "bitwise"),
    "bitwise_or": (np.bitwise_or, "bitwise"),
    "bitwise_xor": (np.bitwise_xor, "bitwise"),
}
_QUIET = {"div", "pow", "floor_divide", "remainder", "trunc_divide"}


_SCALAR_CATEGORY = {bool: 0, int: 1, float: 2}


def binary_dtype(name: str, kind: str, a, b):
    """Output dtype of a binary op over TensorMetas and/or Python scalars."""
    if kind == "cmp":
        return bool_
    da = a.dtype
    if type(b) in _SCALAR_CATEGORY:
        # tensor with a Python scalar: the tensor's dtype unless the scalar's category is higher
        dtype = da if da.category >= _SCALAR_CATEGORY[type(b)] else result_type(a, b)
    elif da is b.dtype:
        dtype = da
    else:
        dtype = result_type(a, b)
    if name == "sub" and (
        da is bool_ or b is True or b is False or getattr(b, "dtype", None) is bool_
    ):
        raise _bool_subtraction(da, b)
    if kind == "bitwise" and dtype.category == FLOAT:
        raise DTypeError(
            f"{name}: only integer and bool tensors are supported, got {dtype}; "
            f"use logical ops on comparisons for floats"
        )
    if kind == "div" and dtype.category != FLOAT:
        return default_float
    if dtype is bool_ and name in INT_DIVISION:
        how = (
            "div(..., rounding_mode='trunc')"
            if name == "trunc_divide"
            else f"the `{INT_DIVISION[name]}` operator"
        )
        raise DTypeError(
            f"{name}: integer division ({how}) of bool operands is not "
            f"supported, as in PyTorch; convert with .int() or .float() first"
        )
    return dtype


def _bool_subtraction(da, b) -> DTypeError:
    """PyTorch refuses ``-`` with a bool operand (a tensor or a Python bool), as here."""
    db = b.dtype if hasattr(b, "dtype") else type(b).__name__
    if da is bool_ and (db is bool_ or db == "bool"):
        return DTypeError(
            "sub: subtraction, the `-` operator, with two bool tensors is not "
            "supported; use the `^` operator (bitwise_xor) instead"
        )
    return DTypeError(
        f"sub: subtraction, the `-` operator, with a bool tensor is not "
        f"supported (operands {da} and {db}); to invert a mask use the `~` "
        f"operator or logical_not(), otherwise convert with .int() or "
        f".float() first"
    )


_CACHE_MAX = 1024


def _binary_infer(name, kind):
    cache: dict = {}  # (shapes, dtypes, dims) -> specs: results depend on nothing else
    # Before the cache, the latest call's (a, b, specs): metas are immutable and tensors of
    # one shape, dtype and device share one (TensorMeta cache), so a chain of ops asks the
    # same question again and again; an identity check is much cheaper than the key's hash.
    # One tuple, replaced whole: threads see a consistent entry.
    last = [(None, None, None)]

    def infer(metas, attrs):
        a, b = metas
        la, lb, specs = last[0]
        if la is a and lb is b:
            return specs
        key = (a.shape, a.dtype, b.shape, b.dtype)
        specs = cache.get(key)
        if specs is None:
            specs = [(broadcast_shapes(name, a.shape, b.shape), binary_dtype(name, kind, a, b))]
            if len(cache) < _CACHE_MAX:
                cache[key] = specs
        last[0] = (a, b, specs)
        return specs

    return infer


def _scalar_infer(name, kind):
    cache: dict = {}  # (shape, dtype, scalar type) -> specs
    last = [(None, None, None)]  # (meta, scalar type, specs): see _binary_infer

    def infer(metas, attrs):
        a = metas[0]
        t = type(attrs["scalar"])
        la, lt, specs = last[0]
        if la is a and lt is t:
            return specs
        key = (a.shape, a.dtype, t)
        specs = cache.get(key)
        if specs is None:
            specs = [(a.shape, binary_dtype(name, kind, a, attrs["scalar"]))]
            if len(cache) < _CACHE_MAX:
                cache[key] = specs
        last[0] = (a, t, specs)
        return specs

    return infer


def _common_np(a, b):
    """The PyTorch common dtype of two arrays (a 0-d array ranks below one with dims)."""
    da, db = from_numpy_dtype(a.dtype), from_numpy_dtype(b.dtype)
    if bool(a.ndim) == bool(b.ndim):
        return promote_types(da, db).np
    dim, zero = (da, db) if a.ndim else (db, da)
    return combine_categories(dim, zero).np


def _binary_kernel(ufunc, kind, quiet):
    def kernel(outs, ins, attrs):
        a, b = ins
        o = outs[0]
        if kind == "cmp":
            if a.dtype is not b.dtype:
                ct = _common_np(a, b)
                a, b = in_dtype(a, ct), in_dtype(b, ct)
        elif a.dtype is not o.dtype or b.dtype is not o.dtype:
            a, b = in_dtype(a, o.dtype), in_dtype(b, o.dtype)
        if quiet:
            with np.errstate(all="ignore"):
                _apply(ufunc, a, b, o)
        else:
            ufunc(a, b, out=o)

    return kernel


def _apply(ufunc, a, b, o):
    if ufunc is np.power and o.dtype.kind in "biu":
        if o.dtype == np.bool_:  # numpy has no bool power loop
            np.copyto(o, np.power(_int8(a), _int8(b)), casting="unsafe")
        else:
            _int_power(a, b, o)
    else:
        ufunc(a, b, out=o)


def _int_power(a, b, o):
    """Integer ``a ** b`` into ``o`` as PyTorch computes it (and a CUDA device's generated
    kernel): a negative exponent gives 0, or +-1 for a base of +-1, where numpy refuses."""
    neg = np.less(b, 0)
    if not neg.any():
        np.power(a, b, out=o)
        return
    minus = np.equal(a, -1)
    odd = np.not_equal(np.bitwise_and(b, 1), 0)
    small = np.where(np.equal(a, 1) | (minus & ~odd), 1, np.where(minus, -1, 0))
    r = np.power(a, np.where(neg, 0, b))  # (before o is written: o may be a)
    np.copyto(o, np.where(neg, small, r), casting="unsafe")


def _int8(v):
    """A bool operand of ``**`` as int8: an array by its own method (a device array stays
    one), a number as a numpy scalar."""
    return v.astype(np.int8) if is_array(v) else np.int8(v)


def _binary_fresh(ufunc, quiet):
    """The fresh form of ``_binary_kernel`` for arithmetic kinds (not comparisons)."""

    def fresh(ins, attrs, dtype):
        a, b = ins
        if a.dtype is not dtype or b.dtype is not dtype:
            a, b = in_dtype(a, dtype), in_dtype(b, dtype)
        if quiet:
            return quietly(ufunc, a, b)
        return ufunc(a, b)

    return fresh


def _scalar_fresh(ufunc, quiet, reverse):
    """The fresh form of ``_scalar_kernel`` for arithmetic kinds (not comparisons)."""

    def fresh(ins, attrs, dtype):
        x = ins[0]
        if x.dtype is not dtype:
            x = x.astype(dtype)
        if quiet:
            s = attrs["scalar"]
            return quietly(ufunc, s, x) if reverse else quietly(ufunc, x, s)
        return ufunc(attrs["scalar"], x) if reverse else ufunc(x, attrs["scalar"])

    return fresh


# ops whose fresh form runs the same numpy loop as the kernel (not pow: its bool special case)
_FRESH_BINARY = {"add", "sub", "mul", "div", "maximum", "minimum"}


def _scalar_kernel(ufunc, kind, quiet, reverse):
    def operands(ins, attrs, o):
        x = ins[0] if kind == "cmp" else in_dtype(ins[0], o.dtype)
        return (attrs["scalar"], x) if reverse else (x, attrs["scalar"])

    if quiet:

        def kernel(outs, ins, attrs):
            o = outs[0]
            a, b = operands(ins, attrs, o)
            with np.errstate(all="ignore"):
                _apply(ufunc, a, b, o)
    elif kind == "cmp":

        def kernel(outs, ins, attrs):
            a, b = operands(ins, attrs, outs[0])
            ufunc(a, b, out=outs[0])
    elif reverse:

        def kernel(outs, ins, attrs):
            o = outs[0]
            x = ins[0]
            if x.dtype is not o.dtype:
                x = x.astype(o.dtype)
            ufunc(attrs["scalar"], x, out=o)
    else:

        def kernel(outs, ins, attrs):  # the common case: kept flat
            o = outs[0]
            x = ins[0]
            if x.dtype is not o.dtype:
                x = x.astype(o.dtype)
            ufunc(x, attrs["scalar"], out=o)

    return kernel


for _name, (_uf, _kind) in BINARY.items():
    _has_fresh = _name in _FRESH_BINARY
    _div = _name in INT_DIVISION
    register(
        OpDef(
            _name,
            ("a", "b"),
            _binary_infer(_name, _kind),
            {
                "cpu": (
                    division_kernel(_name, _uf)
                    if _div
                    else _binary_kernel(_uf, _kind, _name in _QUIET)
                )
            },
            fresh={"cpu": _binary_fresh(_uf, _name in _QUIET)} if _has_fresh else {},
            elementwise=True,
        )
    )
    # tensor op scalar, and scalar op tensor ("r" ops, for the reflected Python operators)
    for _prefix, _rev in (("", False), ("r", True)):
        _infer = _scalar_infer(_name, _kind)
        register(
            OpDef(
                _prefix + _name + "_scalar",
                ("a",),
                nonzero_divisor(_name, _infer) if _div and not _rev else _infer,
                {
                    "cpu": (
                        division_scalar_kernel(_name, _uf, _rev)
                        if _div
                        else _scalar_kernel(_uf, _kind, _name in _QUIET, _rev)
                    )
                },
                fresh=({"cpu": _scalar_fresh(_uf, _name in _QUIET, _rev)} if _has_fresh else {}),
                attrs=("scalar",),
                # (x // s, x % s: a zero s is refused by inference, so by value)
                typed_attrs=() if _div and not _rev else ("scalar",),
                elementwise=True,
            )
        )
