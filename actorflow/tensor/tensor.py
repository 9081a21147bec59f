"""Tensor: the user-facing object, a thin bridge over a TensorImpl.

Ops return at once: the work is queued on the VM. Reading values (``numpy()``, ``item()``,
``tolist()``, ``repr``) waits for the writes before it; ``await t.numpy_async()`` waits
without blocking a running event loop.
"""

from __future__ import annotations

import numpy as np

from ..errors import DeviceError, ShapeError
from .meta import is_contiguous, numel
from .impl import detached


def wrap(impl) -> "Tensor":
    t = Tensor.__new__(Tensor)
    t._impl = impl
    return t


GRAD_VIEW: list = [None]    # autograd's recorder of views, set when it is armed


def viewed(t: "Tensor", impl, kind: str, arg) -> "Tensor":
    """``impl`` (a view of ``t``) as a Tensor; when ``t`` is in autograd, the view gets its
    backward node (``kind``: "reshape", "permute", "expand" or "index"; ``arg`` its key)."""
    out = wrap(impl)
    if t._impl.ag is not None:          # (set only by autograd, so it is armed)
        GRAD_VIEW[0](t, out, kind, arg)
    return out


class _Export:
    """Access callback for DLPack: the storage itself, never to be reused by the cache."""
    __slots__ = ("blob",)

    def __init__(self, blob):
        self.blob = blob

    def __call__(self, array):
        self.blob.owned = False
        return array


class Tensor:
    """An n-dimensional array on a device. Make one with ``af.tensor``, ``af.zeros``..."""

    __slots__ = ("_impl", "__weakref__")
    __array_priority__ = 1000          # numpy defers binary operators to Tensor

    def __init__(self, *args, **kwargs):
        raise TypeError("make tensors with actorflow.tensor(data), actorflow.zeros(...), "
                        "actorflow.from_numpy(array), ...")

    # -- metadata -----------------------------------------------------------------------
    @property
    def _meta(self):
        impl = self._impl
        if impl.meta.shape is None:
            self._resolve(impl)             # a value-dependent shape: wait for it
        return impl.meta

    @property
    def shape(self) -> tuple:
        return self._meta.shape

    def size(self, dim: int | None = None):
        shape = self._meta.shape
        if dim is None:
            return shape
        from ..ops.common import normalize_dim
        return shape[normalize_dim("size", dim, len(shape))]

    @property
    def dtype(self):
        return self._impl.meta.dtype

    @property
    def device(self):
        return self._impl.meta.device

    @property
    def ndim(self) -> int:
        return len(self._meta.shape)

    def dim(self) -> int:
        return len(self._meta.shape)

    def numel(self) -> int:
        return numel(self._meta.shape)

    def stride(self, dim: int | None = None):
        s = self._meta.strides
        return s if dim is None else s[dim]

    def is_contiguous(self) -> bool:
        m = self._meta
        return is_contiguous(m.shape, m.strides)

    def __len__(self) -> int:
        shape = self._meta.shape
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    # -- reading values -----------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        a = self.numpy()                   # always a fresh copy, whatever ``copy`` asks
        return a if dtype is None else a.astype(dtype)

    def tolist(self):
        return self.numpy().tolist()

    def item(self):
        """The value of a one-element tensor as a Python number."""
        n = self.numel()
        if n != 1:
            raise ValueError(f"a Tensor with {n} elements cannot be converted to Scalar; "
                             f"index it first or use .tolist()")
        return self.numpy().item()

    def __bool__(self) -> bool:
        n = self.numel()
        if n != 1:
            raise RuntimeError(f"Boolean value of Tensor with {n} elements is ambiguous; use "
                               f".any() or .all() reductions, or index one element")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.category != 1 or self.numel() != 1:
            raise TypeError("only one-element integer tensors can be converted to an index")
        return int(self.item())

    def __repr__(self) -> str:
        m = self._impl.meta
        extra = ""
        if str(m.device) != "cpu":
            extra += f", device='{m.device}'"
        extra += f", dtype={m.dtype}"
        ag = self._impl.ag
        if ag is not None and ag.grad_fn is not None:
            extra += f", grad_fn=<{ag.grad_fn.name}>"
        elif ag is not None and ag.requires_grad:
            extra += ", requires_grad=True"
        if not self._impl.blob.backend.has_data:
            return f"tensor(<no data>, shape={self.shape}{extra})"
        try:
            a = self.numpy()
        except Exception as e:  # noqa: BLE001 - show the failure rather than raise in repr
            return f"tensor(<failed: {type(e).__name__}: {e}>{extra})"
        body = np.array2string(a, separator=", ", prefix="tensor(",
                               formatter=None if a.dtype.kind != "b" else {"bool": str})
        return f"tensor({body}{extra})"

    __str__ = __repr__

    def __dlpack__(self, stream=None, **kwargs):
        """Exports the storage (waiting for pending writes first); cpu tensors only."""
        if self.device.type != "cpu":
            raise DeviceError(f"__dlpack__: only cpu tensors can be exported, got {self.device}")
        return self._read(_Export(self._impl.blob), "dlpack").__dlpack__(**kwargs)

    def __dlpack_device__(self):
        if self.device.type != "cpu":
            raise DeviceError(f"__dlpack_device__: only cpu tensors can be exported, got {self.device}")
        return (1, 0)

    def __hash__(self) -> int:
        return id(self)

    # -- conversion ---------------------------------------------------------------------
    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def half(self):
        return self.to(dtype="float16")

    def int(self):
        return self.to(dtype="int32")

    def long(self):
        return self.to(dtype="int64")

    def bool(self):
        return self.to(dtype="bool")

    def type(self, dtype):
        return self.to(dtype=dtype)

    def detach(self) -> "Tensor":
        """A tensor sharing this one's storage, outside autograd: writing it in place
        changes this tensor too (as in PyTorch), and a gradient rule that saved this tensor
        then refuses to run on the changed values."""
        impl = self._impl
        if impl.meta is None or impl.meta.shape is None:
            self._meta
        return wrap(detached(impl))

    # -- views --------------------------------------------------------------------------
    def view(self, *shape) -> "Tensor":
        self._meta
        return viewed(self, _views().view(self._impl, shape_args(shape)), "reshape", None)

    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        self._meta
        out = _views().transpose(self._impl, dim0, dim1)
        order = list(range(len(out.meta.shape)))
        if order:
            a, b = dim0 % len(order), dim1 % len(order)
            order[a], order[b] = order[b], order[a]
        return viewed(self, out, "permute", tuple(order))

    def permute(self, *dims) -> "Tensor":
        self._meta
        dims = shape_args(dims)
        out = _views().permute(self._impl, dims)
        return viewed(self, out, "permute", tuple(d % len(dims) for d in dims))

    @property
    def T(self) -> "Tensor":
        nd = self.ndim
        return self.permute(*reversed(range(nd)))

    @property
    def mT(self) -> "Tensor":
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> "Tensor":
        self._meta
        return viewed(self, _views().unsqueeze(self._impl, dim), "reshape", None)

    def squeeze(self, dim=None) -> "Tensor":
        self._meta
        return viewed(self, _views().squeeze(self._impl, dim), "reshape", None)

    def expand(self, *sizes) -> "Tensor":
        self._meta
        return viewed(self, _views().expand(self._impl, shape_args(sizes)), "expand", None)

    def expand_as(self, other) -> "Tensor":
        return self.expand(*other.shape)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def is_floating_point(self):
        return self.dtype.is_floating_point

    # The methods that compute (ops, reading values, indexing, conversions) and the
    # operators are bound by actorflow.methods, the face layer: tensor/ imports nothing
    # above itself.
    _resolve = None                 # eager.interpreter.resolve, bound there too


def shape_args(args) -> tuple:
    """A shape given as ints or as one sequence: ``view(2, 3)`` or ``view((2, 3))``."""
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
        return tuple(args[0])
    for a in args:
        if not isinstance(a, (int, np.integer)):
            raise ShapeError(f"expected a shape of ints, got {args!r}")
    return tuple(args)


def _views():
    from . import views
    return views
