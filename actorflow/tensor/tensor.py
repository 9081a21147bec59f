"""Tensor: the user-facing object, a thin bridge over a TensorImpl.

Ops return at once: the work is queued on the VM. Reading values (``numpy()``, ``item()``,
``tolist()``, ``repr``) waits for the writes before it; ``await t.numpy_async()`` waits
without blocking a running event loop.
"""

from __future__ import annotations

import numpy as np

from ..errors import DeviceError, ShapeError
from .meta import is_contiguous, numel


def wrap(impl) -> "Tensor":
    t = Tensor.__new__(Tensor)
    t._impl = impl
    t.requires_grad = False
    t.grad = None
    return t


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

    __slots__ = ("_impl", "requires_grad", "grad", "__weakref__")
    __array_priority__ = 1000          # numpy defers binary operators to Tensor

    def __init__(self, *args, **kwargs):
        raise TypeError("make tensors with actorflow.tensor(data), actorflow.zeros(...), "
                        "actorflow.from_numpy(array), ...")

    # -- metadata -----------------------------------------------------------------------
    @property
    def _meta(self):
        impl = self._impl
        if impl.meta.shape is None:
            from ..eager.interpreter import resolve
            resolve(impl)
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

    @property
    def is_leaf(self) -> bool:
        return True

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(f"only tensors of floating point dtype can require gradients, "
                               f"got {self.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def __len__(self) -> int:
        shape = self._meta.shape
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    # -- reading values -----------------------------------------------------------------
    def _read(self, fn, name):
        from ..eager.interpreter import _VM, access
        impl = self._impl
        if not impl.blob.backend.has_data:
            raise DeviceError(f"{name}(): the {impl.meta.device} device has no data; null "
                              f"tensors have only shapes, dtypes and bytes")
        self._meta
        instr = access(impl, fn, write=False, name=name)
        if not instr.done:
            _VM.wait(instr)
        return _result(instr, impl.blob)

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values, taken after every write issued before this call.
        Blocks the calling thread; inside a coroutine prefer ``await t.numpy_async()``."""
        return self._read(self._impl.blob.backend.allocator.copy_out, "numpy")

    async def numpy_async(self) -> np.ndarray:
        """Like ``numpy()``, awaiting the result without blocking the running event loop."""
        from ..eager.interpreter import _VM, access
        impl = self._impl
        if not impl.blob.backend.has_data:
            raise DeviceError(f"numpy_async(): the {impl.meta.device} device has no data")
        if impl.meta.shape is None:
            w = impl.blob.last_write
            if w is not None:
                await _VM.wait_async(w)
            self._meta
        instr = access(impl, impl.blob.backend.allocator.copy_out, write=False, name="numpy")
        await _VM.wait_async(instr)
        return _result(instr, impl.blob)

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
        if self.requires_grad:
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
    def to(self, *args, dtype=None, device=None) -> "Tensor":
        """``t.to("null")``, ``t.to(af.float64)``, ``t.to("cpu", af.int32)``."""
        from ..dtype import DType, as_dtype
        for a in args:
            if isinstance(a, DType) or (isinstance(a, str) and a in _DTYPE_NAMES):
                dtype = a
            elif isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            else:
                device = a
        out = self
        if dtype is not None and as_dtype(dtype) is not self.dtype:
            out = F.cast(out, dtype)
        if device is not None:
            out = F.to_device(out, device)
        return out

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

    def clone(self) -> "Tensor":
        return F.clone(self)

    def detach(self) -> "Tensor":
        """A tensor sharing this one's storage, outside autograd."""
        impl = self._impl
        m = impl.meta
        if m.shape is None:
            self._meta
            m = impl.meta
        return wrap(impl.view(m.shape, m.strides, m.offset))

    def contiguous(self) -> "Tensor":
        return self if self.is_contiguous() else F.clone(self)

    # -- views --------------------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        shape = _shape_args(shape)
        if self.is_contiguous():
            return wrap(_views().view(self._impl, shape, "reshape"))
        return wrap(_views().view(F.clone(self)._impl, shape, "reshape"))

    def view(self, *shape) -> "Tensor":
        self._meta
        return wrap(_views().view(self._impl, _shape_args(shape)))

    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        self._meta
        return wrap(_views().transpose(self._impl, dim0, dim1))

    def permute(self, *dims) -> "Tensor":
        self._meta
        return wrap(_views().permute(self._impl, _shape_args(dims)))

    @property
    def T(self) -> "Tensor":
        nd = self.ndim
        return self.permute(*reversed(range(nd)))

    @property
    def mT(self) -> "Tensor":
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> "Tensor":
        self._meta
        return wrap(_views().unsqueeze(self._impl, dim))

    def squeeze(self, dim=None) -> "Tensor":
        self._meta
        return wrap(_views().squeeze(self._impl, dim))

    def expand(self, *sizes) -> "Tensor":
        self._meta
        return wrap(_views().expand(self._impl, _shape_args(sizes)))

    def expand_as(self, other) -> "Tensor":
        return self.expand(*other.shape)

    def __getitem__(self, key):
        self._meta
        return _indexing().getitem(self, key)

    def __setitem__(self, key, value) -> None:
        self._meta
        _indexing().setitem(self, key, value)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # -- math (see actorflow.functional) ------------------------------------------------
    # The binary operators (+, -, *, /, comparisons...) are bound after the class: see
    # _OPERATORS at the end of this module.
    def __pow__(self, other): return F.pow(self, other)
    def __matmul__(self, other): return F.matmul(self, other)
    def __rmatmul__(self, other): return F.matmul(other, self)
    def __pos__(self): return self
    def __neg__(self): return F.neg(self)
    def __abs__(self): return F.abs(self)
    def __invert__(self): return F.bitwise_not(self)
    def __iadd__(self, other): return F.add_(self, other)
    def __isub__(self, other): return F.sub_(self, other)
    def __imul__(self, other): return F.mul_(self, other)
    def __itruediv__(self, other): return F.div_(self, other)
    def __ifloordiv__(self, other): return F.floor_divide_(self, other)
    def __imod__(self, other): return F.remainder_(self, other)

    def add(self, other): return F.add(self, other)
    def sub(self, other): return F.sub(self, other)
    def mul(self, other): return F.mul(self, other)
    def div(self, other): return F.div(self, other)
    def pow(self, other): return F.pow(self, other)
    def matmul(self, other): return F.matmul(self, other)
    def maximum(self, other): return F.maximum(self, other)
    def minimum(self, other): return F.minimum(self, other)
    def eq(self, other): return F.eq(self, other)
    def ne(self, other): return F.ne(self, other)
    def lt(self, other): return F.lt(self, other)
    def le(self, other): return F.le(self, other)
    def gt(self, other): return F.gt(self, other)
    def ge(self, other): return F.ge(self, other)
    def add_(self, other): return F.add_(self, other)
    def sub_(self, other): return F.sub_(self, other)
    def mul_(self, other): return F.mul_(self, other)
    def div_(self, other): return F.div_(self, other)
    def floor_divide(self, other): return F.floor_divide(self, other)
    def remainder(self, other): return F.remainder(self, other)
    def floor_divide_(self, other): return F.floor_divide_(self, other)
    def remainder_(self, other): return F.remainder_(self, other)
    def zero_(self): return F.zero_(self)
    def fill_(self, value): return F.fill_(self, value)
    def copy_(self, src): return F.copy_(self, src)
    def neg(self): return F.neg(self)
    def abs(self): return F.abs(self)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def sqrt(self): return F.sqrt(self)
    def tanh(self): return F.tanh(self)
    def relu(self): return F.relu(self)
    def clamp(self, min=None, max=None): return F.clamp(self, min, max)  # noqa: A002
    def relu_(self): return F.relu(self, inplace=True)
    def sigmoid(self): return F.sigmoid(self)
    def gelu(self, approximate="none"): return F.gelu(self, approximate)
    def logical_not(self): return F.logical_not(self)
    def sum(self, dim=None, keepdim=False, *, dtype=None): return F.sum(self, dim, keepdim, dtype=dtype)
    def mean(self, dim=None, keepdim=False, *, dtype=None): return F.mean(self, dim, keepdim, dtype=dtype)
    def max(self, dim=None, keepdim=False): return F.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return F.min(self, dim, keepdim)
    def amax(self, dim=None, keepdim=False): return F.amax(self, dim, keepdim)
    def amin(self, dim=None, keepdim=False): return F.amin(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return F.argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return F.argmin(self, dim, keepdim)
    def softmax(self, dim): return F.softmax(self, dim)
    def log_softmax(self, dim): return F.log_softmax(self, dim)
    def nonzero(self): return F.nonzero(self)
    def where(self, condition, other): return F.where(condition, self, other)
    def is_floating_point(self): return self.dtype.is_floating_point


_DTYPE_NAMES = {"bool", "int32", "int64", "float16", "float32", "float64", "float", "double",
                "half", "int", "long"}


def _shape_args(args) -> tuple:
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
        return tuple(args[0])
    for a in args:
        if not isinstance(a, (int, np.integer)):
            raise ShapeError(f"expected a shape of ints, got {args!r}")
    return tuple(args)


def _result(instr, blob):
    err = instr.error
    if err is not None:
        raise err.to_raise()
    err = blob.error
    if err is not None and err.intact and not err._reported:
        raise err.to_raise()       # a failed write left it as it was: said once, here
    return instr.result


def _views():
    from . import views
    return views


def _indexing():
    from .. import indexing
    return indexing


from .. import functional as F  # noqa: E402  (the bridge: Tensor methods call functional)

# (op, method, reflected method). These operators are functional's prebuilt operator
# functions themselves rather than methods that forward to them: one Python call fewer on
# every ``a * b``, the commonest op call there is.
_OPERATORS = (
    ("add", "__add__", "__radd__"), ("sub", "__sub__", "__rsub__"),
    ("mul", "__mul__", "__rmul__"), ("div", "__truediv__", "__rtruediv__"),
    ("pow", None, "__rpow__"), ("floor_divide", "__floordiv__", "__rfloordiv__"),
    ("remainder", "__mod__", "__rmod__"), ("bitwise_and", "__and__", "__rand__"),
    ("bitwise_or", "__or__", "__ror__"), ("bitwise_xor", "__xor__", "__rxor__"),
    ("eq", "__eq__", None), ("ne", "__ne__", None), ("lt", "__lt__", None),
    ("le", "__le__", None), ("gt", "__gt__", None), ("ge", "__ge__", None),
)
for _op, _method, _reflected in _OPERATORS:
    if _method:
        setattr(Tensor, _method, F._operator(_op, _method))
    if _reflected:
        setattr(Tensor, _reflected, F._operator(_op, _reflected, reflected=True))
del _op, _method, _reflected
