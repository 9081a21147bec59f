"""Arrays that keep CuPy's rules at numpy's API boundary, for the CUDA emulator.

On a GPU, an op without a generated kernel runs its numpy kernel over cupy arrays (the
CuPy driver's reference form, ``vm/opcall.DeviceKernel``): numpy's functions and ufuncs
dispatch to CuPy through ``__array_function__`` / ``__array_ufunc__``, and anything that
needs a numpy array fails there: an implicit conversion (``np.asarray``, numpy's
``as_strided``, a numpy random generator's ``out=``) or a numpy array mixed into a ufunc or a
function with device arrays. The emulator runs the same kernels on the CPU, so without
these rules a kernel that cannot run on a GPU passes every CI run (seen on the first GPU
run: ``rand``'s ``out=``, ``index_add``'s and ``softmax``'s numpy-only paths).

``CupyLikeArray`` wraps a numpy array and refuses what CuPy refuses:

- ``__array__`` raises TypeError (CuPy's "Implicit conversion to a NumPy array is not
  allowed"): ``np.asarray(x)``, ``np.lib.stride_tricks.as_strided(x, ...)``;
- a ufunc or an array function given a numpy array (not a numpy scalar, a Python number
  or a list of numbers) beside it raises TypeError, as CuPy's ("Unsupported type");
- a ufunc's methods (``np.add.at``, ``np.maximum.reduce``...) raise NotImplementedError:
  CuPy took none of them from numpy on the first GPU run;
- everything else goes to numpy on the wrapped arrays, and arrays come back wrapped;
  attributes and methods are the numpy array's (CuPy's mirror them), plus CuPy's ``get()``
  (a numpy copy) and ``set(host)``; the constructor is CuPy's ``(shape, dtype, memptr,
  strides)`` over a ``data`` pointer, so ``vm/opcall._strided`` makes views the same way.

What it does not model: numpy functions CuPy lacks (they would fail on a GPU with
"no implementation found") and CuPy's own dtype rules; a GPU run (``pytest -m gpu``)
checks those.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
    "construct a NumPy array explicitly."
)


class Pointer:
    """A device pointer as CuPy's ``MemoryPointer``: a buffer (a flat uint8 numpy array)
    and a byte offset into it; ``+ n`` moves it."""

    __slots__ = ("buf", "off")

    def __init__(self, buf: np.ndarray, off: int):
        self.buf, self.off = buf, off

    def __add__(self, n: int) -> Pointer:
        return Pointer(self.buf, self.off + int(n))


class CupyLikeArray(NDArrayOperatorsMixin):
    """A numpy array under CuPy's rules (see the module doc). ``CupyLikeArray(shape, dtype,
    memptr, strides)`` views ``memptr``'s buffer; ``CupyLikeArray.of(a, buf, off)`` wraps
    numpy array ``a`` (``buf``/``off``: the buffer it views, for ``data``)."""

    __slots__ = ("a", "_ptr")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr: Pointer | None = None, strides=None):
        if memptr is None:
            self.a, self._ptr = np.empty(shape, dtype), None
        else:
            self.a = np.ndarray(shape, dtype, buffer=memptr.buf, offset=memptr.off, strides=strides)
            self._ptr = memptr

    @classmethod
    def of(cls, a: np.ndarray, buf: np.ndarray | None = None, off: int = 0):
        obj = cls.__new__(cls)
        obj.a, obj._ptr = a, (None if buf is None else Pointer(buf, off))
        return obj

    # -- CuPy's own -----------------------------------------------------------------------
    @property
    def data(self) -> Pointer:
        if self._ptr is None:
            raise TypeError(
                "this array was made by a kernel, not over device memory: it has no pointer to view"
            )
        return self._ptr

    def get(self) -> np.ndarray:
        return self.a.copy()

    def set(self, host) -> None:
        if not isinstance(host, np.ndarray) or host.shape != self.a.shape:
            raise ValueError(f"set: a numpy array of shape {self.a.shape} is needed")
        if host.dtype != self.a.dtype:  # (CuPy's set does not convert either)
            raise TypeError(f"set: a {host.dtype} array into a {self.a.dtype} one")
        if not self.a.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        np.copyto(self.a, host, casting="unsafe")

    # -- numpy's boundary ---------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__":  # (CuPy: "`cupy_maximum.reduce` is not supported
            raise NotImplementedError(  # yet"; no ``at`` through numpy at all)
                f"`cupy_{ufunc.__name__}.{method}` is not supported through numpy"
            )
        args = [_unwrap(x, ufunc.__name__) for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o, ufunc.__name__) for o in out)
        if "where" in kwargs:
            kwargs["where"] = _unwrap(kwargs["where"], ufunc.__name__)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        name = getattr(func, "__name__", str(func))
        args = _unwrap(args, name)
        kwargs = _unwrap(kwargs, name)
        return _wrap(func(*args, **kwargs))

    def __getattr__(self, name):
        if name.startswith("__"):  # (__array_interface__, __array_struct__, __dlpack__:
            raise AttributeError(name)  # numpy would convert through them)
        value = getattr(self.a, name)
        if callable(value):

            def method(*args, **kwargs):
                return _wrap(value(*_unwrap(args, name), **_unwrap(kwargs, name)))

            return method
        return _wrap(value)

    def __getitem__(self, key):
        return _wrap(self.a[_unwrap(key, "indexing", numpy_ok=True)])

    def __setitem__(self, key, value):
        self.a[_unwrap(key, "indexing", numpy_ok=True)] = _unwrap(value, "setitem", numpy_ok=True)

    def __len__(self) -> int:
        return len(self.a)

    def __iter__(self):
        return (_wrap(x) for x in self.a)

    def __bool__(self) -> bool:
        return bool(self.a)

    def __int__(self) -> int:
        return int(self.a)

    def __float__(self) -> float:
        return float(self.a)

    def __index__(self) -> int:
        return self.a.__index__()

    def __repr__(self) -> str:
        return f"CupyLikeArray({self.a!r})"

    __hash__ = None  # type: ignore[assignment]


def _unwrap(x, where: str, numpy_ok: bool = False):
    """``x`` with its CupyLikeArrays unwrapped; a numpy array in it raises TypeError as
    CuPy does (``numpy_ok``: indexing, where CuPy copies a numpy index array or value to
    the device)."""
    cls = x.__class__
    if cls is CupyLikeArray:
        return x.a
    if cls is tuple or cls is list:
        return cls(_unwrap(v, where, numpy_ok) for v in x)
    if cls is dict:
        return {k: _unwrap(v, where, numpy_ok) for k, v in x.items()}
    if isinstance(x, np.ndarray) and not numpy_ok:
        raise TypeError(
            f"Unsupported type {np.ndarray} (a numpy array given to {where} "
            f"beside device arrays: CuPy refuses it)"
        )
    return x


def _wrap(x):
    cls = x.__class__
    if cls is np.ndarray:
        return CupyLikeArray.of(x)
    if cls is tuple or cls is list:
        return cls(_wrap(v) for v in x)
    return x
