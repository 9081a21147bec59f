"""Kernels of integer floor division, remainder and division rounded toward zero (``//``,
``%`` and ``div(..., rounding_mode='trunc')``): a zero divisor raises
DivisionByZeroError, as PyTorch raises 'ZeroDivisionError', instead of numpy's silent 0.
A zero scalar divisor raises at the call (``nonzero_divisor`` wraps the op's inference); a
zero in a divisor tensor raises from the kernel, which checks before it writes anything, so
an in-place ``x //= d`` that fails leaves ``x`` as it was (see errors.InvalidInputError).
Float division by zero gives inf or nan, as in numpy and PyTorch: the float path only pays
one dtype test. For valid inputs these kernels run the same numpy loop as the other
arithmetic kernels (elementwise.py): same casts, same ufunc, same output."""

from __future__ import annotations

import numpy as np

from ..dtype import FLOAT
from ..errors import DivisionByZeroError

INT_DIVISION = {"floor_divide": "//", "remainder": "%", "trunc_divide": "/"}


def trunc_divide(a, b, out):
    """a / b rounded toward zero (``div(..., rounding_mode='trunc')``), into ``out``, which
    may be ``a`` itself: floats as trunc(a / b), integers exactly (floor division, plus one
    where the remainder is not zero and the signs differ)."""
    if out.dtype.kind == "f":
        np.true_divide(a, b, out=out)
        np.trunc(out, out=out)
        return
    fix = np.remainder(a, b) != 0  # (before out is written: it may be a)
    fix &= np.less(a, 0) != np.less(b, 0)
    np.floor_divide(a, b, out=out)
    np.add(out, fix, out=out, casting="unsafe")


def zero_division(name: str, dtype, tensor_divisor: bool) -> DivisionByZeroError:
    """The error of integer division ``name`` by zero in ``dtype`` (the kernels here raise
    it, and a CUDA device's generated kernel when its zero flag is set)."""
    sym = INT_DIVISION[name]
    what = "the divisor holds a 0" if tensor_divisor else f"x {sym} 0"
    return DivisionByZeroError(
        f"{name}: integer division by zero (ZeroDivisionError, as in PyTorch): {what}, in "
        f"{dtype}. Divide by nonzero values (e.g. af.where(d == 0, 1, d)), or convert to "
        f"float first (x.float() {sym} 0 gives inf or nan)"
    )


def division_kernel(name: str, ufunc):
    """The tensor-tensor kernel: an integer divisor is checked for zeros first."""

    def kernel(outs, ins, attrs):
        a, b = ins
        o = outs[0]
        dt = o.dtype
        if a.dtype is not dt or b.dtype is not dt:
            a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        if dt.kind != "f" and not b.all():
            raise zero_division(name, dt, True)
        with np.errstate(all="ignore"):
            ufunc(a, b, out=o)

    return kernel


def division_scalar_kernel(name: str, ufunc, reverse: bool):
    """The tensor-scalar kernels: ``x // s`` checks the scalar, ``s // x`` the tensor."""

    def kernel(outs, ins, attrs):
        o = outs[0]
        dt = o.dtype
        x = ins[0]
        if x.dtype is not dt:
            x = x.astype(dt)
        s = attrs["scalar"]
        if dt.kind != "f":
            if reverse and not x.all():
                raise zero_division(name, dt, True)
            if not reverse and s == 0:
                raise zero_division(name, dt, False)
        with np.errstate(all="ignore"):
            if reverse:
                ufunc(s, x, out=o)
            else:
                ufunc(x, s, out=o)

    return kernel


def nonzero_divisor(name: str, infer):
    """Wraps the inference of ``x // s`` / ``x % s``: a zero ``s`` on an integer (or bool)
    result raises at the call, before anything is issued."""

    def checked(metas, attrs):
        specs = infer(metas, attrs)
        if attrs["scalar"] == 0 and specs[0][1].category != FLOAT:
            raise zero_division(name, specs[0][1].name, False)
        return specs

    return checked
