"""Shared inference helpers: broadcasting and dims, with messages that name the op; and the
array helpers kernels share so that one kernel runs on numpy arrays and on device arrays
(the CuPy driver runs an op's numpy kernel over cupy arrays: numpy's functions dispatch to
CuPy, and a kernel must not ask for a numpy array where it has a device one; the CUDA
emulator checks that in CI, ``backends/cuda/cupylike.py``)."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError

try:  # numpy's floating-point error state, a context variable since numpy 2
    from numpy._core._ufunc_config import _extobj_contextvar as _ERRSTATE
    from numpy._core.umath import _make_extobj

    _IGNORE = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):  # another numpy: the context manager
    _ERRSTATE = None

_BCAST: dict = {}


def contiguous(a):
    """``a`` C-contiguous: itself, or a copy by the array's own method, so a device array
    stays one (``np.ascontiguousarray`` converts to numpy)."""
    return a if a.flags.c_contiguous else a.copy()


def host(a) -> np.ndarray:
    """A kernel operand as a numpy array: itself, or a device array's copy (``get()``,
    which waits for the stream the kernel runs on)."""
    return a if isinstance(a, (np.ndarray, np.generic)) else a.get()


def put(dst, h) -> None:
    """Writes host array ``h`` into ``dst``: a numpy array, or a device array (CuPy's
    ``set``, through a contiguous copy where ``dst`` is a strided view)."""
    if dst is h:
        return
    if isinstance(dst, np.ndarray):
        np.copyto(dst, h, casting="unsafe")
    elif dst.flags.c_contiguous:
        dst.set(np.asarray(h, dst.dtype, order="C"))  # (a 0-dim array stays one)
    else:
        tmp = dst.copy()
        tmp.set(np.asarray(h, dst.dtype, order="C"))
        dst[...] = tmp


def add_at(o, key, value) -> None:
    """``np.add.at(o, key, value)``: ``o[key] += value`` with repeated indices summed. A
    device array goes through a host copy (CuPy's ufuncs take no ``at`` from numpy)."""
    if isinstance(o, np.ndarray):  # (then its key and value are numpy's too)
        np.add.at(o, key, value)
        return
    h = host(o)
    np.add.at(
        h,
        tuple(host(k) if is_array(k) else k for k in key),
        host(value) if is_array(value) else value,
    )
    put(o, h)


def is_array(k) -> bool:
    """Whether ``k`` (a part of an index key, an operand) is an array, numpy's or a
    device's, rather than a number, a slice, None or Ellipsis."""
    return isinstance(k, np.ndarray) or (
        not isinstance(k, np.generic) and hasattr(k, "__array_ufunc__") and hasattr(k, "shape")
    )


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
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(
                f"{op}: shapes {a} and {b} cannot be broadcast together "
                f"(dimension {i - n}: {x} vs {y}); make the sizes equal or 1"
            )
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
        raise IndexError(
            f"{op}: dimension out of range (expected to be in range of "
            f"[{-n}, {n - 1}], but got {dim})"
        )
    return dim % n


def normalize_dims(op: str, dim, ndim: int) -> tuple | None:
    """None (all dims), an int or a sequence of ints -> a sorted tuple of dims, or None."""
    if dim is None:
        return None
    if isinstance(dim, int) and not isinstance(dim, bool):
        return (normalize_dim(op, dim, ndim),)
    dims = tuple(normalize_dim(op, d, ndim) for d in dim)
    if not dims:
        return None  # dim=() means every dim, as in PyTorch
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
