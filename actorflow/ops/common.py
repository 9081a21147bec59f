"""Shared inference helpers: broadcasting and dims, with messages that name the op."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError

try:        # numpy's floating-point error state, a context variable since numpy 2
    from numpy._core._ufunc_config import _extobj_contextvar as _ERRSTATE
    from numpy._core.umath import _make_extobj
    _IGNORE = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):     # another numpy: the context manager
    _ERRSTATE = None

_BCAST: dict = {}


def broadcast_shapes(op: str, a: tuple, b: tuple) -> tuple:
    """The broadcast of two shapes (cached); ShapeError names the dimension that clashes."""
    if a == b:
        return a
    key = (a, b)
    r = _BCAST.get(key)
    if r is not None:
        return r
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {a} and {b} cannot be broadcast together "
                             f"(dimension {i - n}: {x} vs {y}); make the sizes equal or 1")
    r = tuple(out)
    if len(_BCAST) < 4096:
        _BCAST[key] = r
    return r


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """A dim in [-ndim, ndim) as a non-negative index (0-dim tensors accept 0 and -1)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return dim % n


def normalize_dims(op: str, dim, ndim: int) -> tuple | None:
    """None (all dims), an int or a sequence of ints -> a sorted tuple of dims, or None."""
    if dim is None:
        return None
    if isinstance(dim, int) and not isinstance(dim, bool):
        return (normalize_dim(op, dim, ndim),)
    dims = tuple(normalize_dim(op, d, ndim) for d in dim)
    if not dims:
        return None                      # dim=() means every dim, as in PyTorch
    if len(set(dims)) != len(dims):
        raise ValueError(f"{op}: dim {tuple(dim)} names a dimension twice")
    return tuple(sorted(dims))


def quietly(ufunc, *args):
    """``ufunc(*args)`` with numpy's floating-point warnings off, as inside
    ``np.errstate(all="ignore")`` (overflow to inf, 0/0 to nan, as PyTorch computes them
    silently), set on numpy's context variable directly where this numpy has one: the
    context manager costs more than a kernel on a thousand elements."""
    if _ERRSTATE is None:
        with np.errstate(all="ignore"):
            return ufunc(*args)
    token = _ERRSTATE.set(_IGNORE)
    try:
        return ufunc(*args)
    finally:
        _ERRSTATE.reset(token)
