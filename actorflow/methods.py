"""The Tensor's methods that compute, and its operators, bound in one table.

``tensor/`` sits below the op, VM and eager layers and imports nothing above itself; this
face module attaches to ``Tensor`` what needs them: the op methods (``t.add(u)``,
``t.sum(dim)``...), the operators (``a * b`` is functional's prebuilt operator function
itself: one Python call fewer on the commonest op call), reading values (``numpy``,
``numpy_async``, ``item``, ``tolist``, ``repr``, ``float(t)``..., DLPack export), indexing,
conversions (``to``, ``cpu``, ``float``..., ``clone``, ``reshape``...). Importing
``actorflow`` imports it. ``actorflow/tensor/tensor.pyi`` declares all of it for editors and
type checkers: ``python tools/tensor_stub.py`` writes it from this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import autograd, indexing, parallel
from . import functional as F
from .dtype import DType, as_dtype, bfloat16, bfloat16_values
from .eager.interpreter import read, read_async, resolve
from .errors import DeviceError
from .functional.common import check_memory_format
from .ops.common import normalize_dim
from .tensor import views
from .tensor.tensor import Tensor, shape_args, viewed

if TYPE_CHECKING:
    from .device import _DeviceLike
    from .dtype import _DTypeLike
    from .functional.common import _Operand

# -- reading values --------------------------------------------------------------------------


def _read(self, fn, name):
    impl = self._impl
    if not impl.blob.backend.has_data:
        raise DeviceError(
            f"{name}(): the {impl.meta.device} device has no data; null "
            f"tensors have only shapes, dtypes and bytes"
        )
    self._wait_shape()
    return read(impl, fn, name)


def numpy(self, *, force: bool = False) -> np.ndarray:
    """A numpy copy of the values, taken after every write issued before this call.
    Blocks the calling thread; inside a coroutine prefer ``await t.numpy_async()``.
    ``force`` is PyTorch's (a copy even where it would share memory): this is always one.
    A bfloat16 tensor's values come as float32 (exactly: numpy has no bfloat16)."""
    a = _read(self, self._impl.blob.backend.allocator.copy_out, "numpy")
    return bfloat16_values(a) if self._impl.meta.dtype is bfloat16 else a


async def numpy_async(self) -> np.ndarray:
    """Like ``numpy()``, awaiting the result without blocking the running event loop."""
    impl = self._impl
    if not impl.blob.backend.has_data:
        raise DeviceError(f"numpy_async(): the {impl.meta.device} device has no data")
    a = await read_async(impl, impl.blob.backend.allocator.copy_out, "numpy")
    return bfloat16_values(a) if impl.meta.dtype is bfloat16 else a


def _array(self, dtype=None, copy=None):
    a = self.numpy()  # always a fresh copy, whatever ``copy`` asks
    return a if dtype is None else a.astype(dtype)


def tolist(self) -> Any:
    return self.numpy().tolist()


def item(self) -> bool | int | float:
    """The value of a one-element tensor as a Python number."""
    n = self.numel()
    if n != 1:
        raise ValueError(
            f"a Tensor with {n} elements cannot be converted to Scalar; "
            f"index it first or use .tolist()"
        )
    return self.numpy().item()


def _bool(self) -> bool:
    n = self.numel()
    if n != 1:
        raise RuntimeError(
            f"Boolean value of Tensor with {n} elements is ambiguous; use "
            f".any() or .all() reductions, or index one element"
        )
    return bool(self.item())


def _float(self) -> float:
    return float(self.item())


def _int(self) -> int:
    return int(self.item())


def _index(self) -> int:
    if self.dtype.category != 1 or self.numel() != 1:
        raise TypeError("only one-element integer tensors can be converted to an index")
    return int(self.item())


def _repr(self) -> str:
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
    body = np.array2string(
        a,
        separator=", ",
        prefix="tensor(",
        formatter=None if a.dtype.kind != "b" else {"bool": str},
    )
    return f"tensor({body}{extra})"


class _Export:
    """Access callback for DLPack: the storage itself, never to be reused by the cache."""

    __slots__ = ("blob",)

    def __init__(self, blob):
        self.blob = blob

    def __call__(self, array):
        self.blob.owned = False
        return array


def _dlpack(self, stream=None, **kwargs):
    """Exports the storage (waiting for pending writes first): a cpu tensor's numpy array,
    or a cuda tensor's device memory (kDLCUDA) where its driver is a GPU's (a view is
    exported as a contiguous copy)."""
    dev = self.device
    if dev.type == "cuda":
        t = self if self._impl.base is None else self.contiguous()
        blob = t._impl.blob
        backend = blob.backend
        backend.dlpack_device("__dlpack__")  # refused on the emulator, before any read
        array = _read(t, lambda a: backend.export(_Export(blob)(a)), "dlpack")
        return array.__dlpack__(stream=stream, **kwargs)
    if dev.type != "cpu":
        raise DeviceError(f"__dlpack__: only cpu and cuda tensors can be exported, got {dev}")
    return _read(self, _Export(self._impl.blob), "dlpack").__dlpack__(**kwargs)


def _dlpack_device(self):
    dev = self.device
    if dev.type == "cuda":
        return self._impl.blob.backend.dlpack_device()
    if dev.type != "cpu":
        raise DeviceError(
            f"__dlpack_device__: only cpu and cuda tensors can be exported, got {dev}"
        )
    return (1, 0)


# -- indexing and conversions ----------------------------------------------------------------


def _iter(self):
    for i in range(len(self)):
        yield self[i]


def _getitem(self, key) -> Tensor:
    self._wait_shape()
    return indexing.getitem(self, key)


def _setitem(self, key, value) -> None:
    self._wait_shape()
    indexing.setitem(self, key, value)


_DTYPE_NAMES = {
    "bool",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float",
    "double",
    "half",
    "int",
    "long",
}


def to(
    self,
    *args,
    device: _DeviceLike | None = None,
    dtype: _DTypeLike | None = None,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: Any = None,
    tensor: Tensor | None = None,
) -> Tensor:
    """``t.to("null")``, ``t.to(af.float64)``, ``t.to("cpu", af.int32)``, ``t.to(other)``
    (its dtype and device): PyTorch's forms. Positional booleans after these are
    ``non_blocking`` then ``copy``. ``copy=True`` returns a new tensor even when nothing
    changes; ``non_blocking`` changes nothing (every copy is queued in order)."""
    flags = []
    for a in args:
        if type(a) is bool:
            flags.append(a)
        elif isinstance(a, DType) or (isinstance(a, str) and a in _DTYPE_NAMES):
            dtype = a
        elif isinstance(a, Tensor):
            tensor = a
        else:
            device = a
    if len(flags) > 2:
        raise TypeError(
            f"to(): too many positional booleans {flags}; they are non_blocking and copy"
        )
    if len(flags) == 2:
        copy = flags[1]
    if tensor is not None:
        dtype, device = tensor.dtype, tensor.device
    check_memory_format("to", memory_format)
    out = self
    if dtype is not None and as_dtype(dtype) is not self.dtype:
        out = F.cast(out, dtype)
    if device is not None:
        out = F.to_device(out, device)
    if copy and out is self:
        out = F.clone(self)
    return out


def cpu(self) -> Tensor:
    return self.to("cpu")


def _converter(name: str, dtype: str):
    """``t.float()``, ``t.long()``...: ``t.to(dtype=dtype)``."""

    def convert(self) -> Tensor:
        return self.to(dtype=dtype)

    convert.__name__ = name
    convert.__qualname__ = "Tensor." + name
    return convert


def _type(self, dtype: _DTypeLike) -> Tensor:
    return self.to(dtype=dtype)


def contiguous(self, memory_format: Any = None) -> Tensor:
    """``self`` when row-major already, else a contiguous copy (``memory_format`` as in
    ``clone``)."""
    check_memory_format("contiguous", memory_format)
    return self if self.is_contiguous() else F.clone(self)


def reshape(self, *sizes, shape: Sequence[int] | None = None) -> Tensor:
    """``t.reshape(2, 3)``, ``t.reshape((2, 3))`` or ``t.reshape(shape=(2, 3))``: a view
    when ``self`` is contiguous, else a copy."""
    if shape is not None:
        if sizes:
            raise TypeError(f"reshape(): got the shape {sizes} and shape={shape}; pass one")
        sizes = (shape,)
    shape = shape_args(sizes)
    if self.is_contiguous():
        return viewed(self, views.view(self._impl, shape, "reshape"), "reshape", None)
    c = F.clone(self)
    return viewed(c, views.view(c._impl, shape, "reshape"), "reshape", None)


def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dims ``start_dim`` to ``end_dim`` (both included; negative ones count from the end)
    as one, as PyTorch's: a view where the tensor is contiguous, else a copy; a 0-d tensor
    gives shape (1,).

    Raises:
        IndexError: a dim out of range. ValueError: ``start_dim`` after ``end_dim``."""
    shape = self.shape
    s = normalize_dim("flatten", start_dim, len(shape))
    e = normalize_dim("flatten", end_dim, len(shape))
    if not shape:
        return self.reshape(1)
    if s > e:
        raise ValueError(
            f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
            f"for a tensor of shape {tuple(shape)}; give start_dim <= end_dim"
        )
    n = 1
    for d in shape[s : e + 1]:
        n *= d
    return self.reshape(tuple(shape[:s]) + (n,) + tuple(shape[e + 1 :]))


# -- op methods whose argument order or defaults differ from their functions ----------------


def _relu_(self) -> Tensor:
    return F.relu(self, inplace=True)


def _where(self, condition: Tensor, other: _Operand) -> Tensor:
    return F.where(condition, self, other)


def _rmatmul(self, other) -> Tensor:
    return F.matmul(other, self)


def _pos(self) -> Tensor:
    return self


def _deepcopy(self, memo: dict) -> Tensor:
    """``copy.deepcopy``: a copy of a leaf's values (and of its gradient) with its
    requires_grad, as PyTorch's; a computed tensor is refused, as there."""
    if not self.is_leaf:
        raise RuntimeError(
            "deepcopy: only tensors made by the user (leaves) can be deep "
            "copied, not one computed with autograd; detach() it first"
        )
    c = F.clone(self.detach())
    if self.requires_grad:
        c.requires_grad_(True)
    if self.grad is not None:
        c.grad = F.clone(self.grad)
    memo[id(self)] = c
    return c


# Tensor method -> what it is. A functional function whose first parameter is the tensor
# is bound as it is (no forwarding call).
METHODS = {
    "_resolve": staticmethod(resolve),
    "_read": _read,
    "numpy": numpy,
    "numpy_async": numpy_async,
    "__array__": _array,
    "tolist": tolist,
    "item": item,
    "__bool__": _bool,
    "__float__": _float,
    "__int__": _int,
    "__index__": _index,
    "__repr__": _repr,
    "__str__": _repr,
    "__dlpack__": _dlpack,
    "__dlpack_device__": _dlpack_device,
    "__getitem__": _getitem,
    "__setitem__": _setitem,
    "__iter__": _iter,
    "to": to,
    "to_global": parallel.to_global,
    "to_local": parallel.to_local,
    "cpu": cpu,
    "type": _type,
    **{
        name: _converter(name, dtype)
        for name, dtype in (
            ("float", "float32"),
            ("double", "float64"),
            ("half", "float16"),
            ("bfloat16", "bfloat16"),
            ("int", "int32"),
            ("long", "int64"),
            ("bool", "bool"),
        )
    },
    "clone": F.clone,
    "contiguous": contiguous,
    "reshape": reshape,
    "flatten": flatten,
    "__pow__": F.pow,
    "__matmul__": F.matmul,
    "__rmatmul__": _rmatmul,
    "__pos__": _pos,
    "__neg__": F.neg,
    "__abs__": F.abs,
    "__invert__": F.bitwise_not,
    "__iadd__": F.add_,
    "__isub__": F.sub_,
    "__imul__": F.mul_,
    "__itruediv__": F.div_,
    "__ifloordiv__": F.floor_divide_,
    "__imod__": F.remainder_,
    "add": F.add,
    "sub": F.sub,
    "mul": F.mul,
    "div": F.div,
    "pow": F.pow,
    "matmul": F.matmul,
    "maximum": F.maximum,
    "minimum": F.minimum,
    "eq": F.eq,
    "ne": F.ne,
    "lt": F.lt,
    "le": F.le,
    "gt": F.gt,
    "ge": F.ge,
    "add_": F.add_,
    "sub_": F.sub_,
    "mul_": F.mul_,
    "div_": F.div_,
    "floor_divide": F.floor_divide,
    "remainder": F.remainder,
    "floor_divide_": F.floor_divide_,
    "remainder_": F.remainder_,
    "zero_": F.zero_,
    "fill_": F.fill_,
    "copy_": F.copy_,
    "neg": F.neg,
    "abs": F.abs,
    "exp": F.exp,
    "log": F.log,
    "sqrt": F.sqrt,
    "tanh": F.tanh,
    "sin": F.sin,
    "cos": F.cos,
    "rsqrt": F.rsqrt,
    "erf": F.erf,
    "relu": F.relu,
    "relu_": _relu_,
    "clamp": F.clamp,
    "clamp_": F.clamp_,
    "clip": F.clip,
    "clip_": F.clip_,
    "sigmoid": F.sigmoid,
    "gelu": F.gelu,
    "logical_not": F.logical_not,
    "sum": F.sum,
    "mean": F.mean,
    "var": F.var,
    "std": F.std,
    "max": F.max,
    "min": F.min,
    "amax": F.amax,
    "amin": F.amin,
    "argmax": F.argmax,
    "argmin": F.argmin,
    "softmax": F.softmax,
    "log_softmax": F.log_softmax,
    "nonzero": F.nonzero,
    "where": _where,
    "__deepcopy__": _deepcopy,
    "gather": F.gather,
    "scatter_add": F.scatter_add,
    "scatter_add_": F.scatter_add_,
    "cumsum": F.cumsum,
    "sort": F.sort,
    "argsort": F.argsort,
    "topk": F.topk,
    "masked_fill": F.masked_fill,
    "triu": F.triu,
    "tril": F.tril,
}

# (op, operator, reflected operator): functional's prebuilt operator functions
OPERATORS = (
    ("add", "__add__", "__radd__"),
    ("sub", "__sub__", "__rsub__"),
    ("mul", "__mul__", "__rmul__"),
    ("div", "__truediv__", "__rtruediv__"),
    ("pow", None, "__rpow__"),
    ("floor_divide", "__floordiv__", "__rfloordiv__"),
    ("remainder", "__mod__", "__rmod__"),
    ("bitwise_and", "__and__", "__rand__"),
    ("bitwise_or", "__or__", "__ror__"),
    ("bitwise_xor", "__xor__", "__rxor__"),
    ("eq", "__eq__", None),
    ("ne", "__ne__", None),
    ("lt", "__lt__", None),
    ("le", "__le__", None),
    ("gt", "__gt__", None),
    ("ge", "__ge__", None),
)


def bind() -> None:
    """Attaches METHODS, autograd's and OPERATORS to Tensor (once, when actorflow is
    imported)."""
    for name, fn in list(METHODS.items()) + list(autograd.METHODS.items()):
        setattr(Tensor, name, fn)
    for op, method, reflected in OPERATORS:
        if method:
            setattr(Tensor, method, F.prebuilt_operator(op, method))
        if reflected:
            setattr(Tensor, reflected, F.prebuilt_operator(op, reflected, reflected=True))


bind()
