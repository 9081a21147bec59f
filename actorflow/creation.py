"""Making tensors: from data (an empty op allocates, an access-by-callback instruction
copies the data in), zero-copy from numpy or DLPack, and factories (zeros, rand, ...)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ops
from .backends import get_backend
from .device import _DeviceLike
from .device import device as as_device
from .dtype import (
    _DTypeLike,
    _Number,
    as_dtype,
    bfloat16,
    bfloat16_bits,
    default_float,
    from_numpy_dtype,
    int64,
    scalar_dtype,
)
from .eager.interpreter import access, apply
from .errors import DeviceError, DTypeError
from .sbp import Placement, as_sbp, layout
from .tensor.impl import TensorImpl
from .tensor.meta import as_shape
from .tensor.tensor import Tensor, wrap

_EMPTY, _FULL, _ARANGE = ops.get("empty"), ops.get("full"), ops.get("arange")
_COPY = ops.get("copy")
_RAND, _RANDN = ops.get("rand"), ops.get("randn")
_SEEDS = [np.random.default_rng()]


def manual_seed(seed: int) -> None:
    """Seeds the generator that random ops draw from, so their results repeat."""
    _SEEDS[0] = np.random.default_rng(int(seed))


def _next_seed() -> int:
    return int(_SEEDS[0].integers(0, 2**63 - 1))


def spawned_seed() -> int:
    """A seed for a random stream of its own (``nn.Graph``'s random ops): from the next
    child of ``manual_seed``'s generator (``Generator.spawn``), so the n-th one asked for
    after ``manual_seed(s)`` is always the same, and the values eager random ops draw do
    not change."""
    return int(_SEEDS[0].spawn(1)[0].integers(0, 2**63 - 1))


def _finish(impl, requires_grad: bool) -> Tensor:
    t = wrap(impl)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _size(op: str, size) -> tuple:
    if len(size) == 1 and not isinstance(size[0], numbers.Integral):
        size = size[0]
    return as_shape(size, f"{op}()")


def _infer_data_dtype(data, arr) -> object:
    if not isinstance(data, (np.ndarray, np.generic)):  # Python numbers and lists of them
        if arr.dtype.kind == "f":
            return default_float  # Python floats become float32, as in PyTorch
        if arr.dtype.kind in "iu":
            return int64
    return from_numpy_dtype(arr.dtype, "tensor")


def tensor(
    data: Any,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, scalars, numpy arrays or a
    tensor). Python floats become float32 and ints int64 unless ``dtype`` says otherwise.

    Example: ``af.tensor([[1., -1.], [1., -1.]])``
    """
    if placement is not None or sbp is not None:
        lay = _placed("tensor", device, placement, sbp)
        local = tensor(data, dtype=dtype)
        return _finish(apply(_COPY, [local._impl], {}, device=lay)[0], requires_grad)
    if isinstance(data, Tensor):
        if dtype is None:
            dtype = data.dtype  # (a bfloat16 tensor's numpy() is float32)
        data = data.numpy()
    try:
        arr = np.array(data, copy=True) if isinstance(data, np.ndarray) else np.asarray(data)
    except (ValueError, TypeError) as e:
        raise TypeError(
            f"tensor(): could not read data of type {type(data).__name__}: {e}"
        ) from None
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(
            f"tensor(): data must be numbers (nested lists of bool, int or float), "
            f"got elements of type {arr.dtype}"
        )
    dt = as_dtype(dtype) if dtype is not None else _infer_data_dtype(data, arr)
    dev = as_device(device if device is not None else "cpu")
    impl = apply(_EMPTY, [], {"shape": arr.shape, "dtype": dt, "device": dev}, device=dev)[0]
    backend = get_backend(dev)
    if dt is bfloat16:
        arr = bfloat16_bits(arr)  # the storage: bits rounded from float32
    if backend.has_data:
        copy_in = backend.allocator.copy_in
        access(impl, lambda dst: copy_in(dst, arr), write=True, name="copy_in")
    return _finish(impl, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A cpu tensor sharing memory with a C-contiguous numpy array (others are copied).
    Do not write the array while actorflow work on the tensor may be pending."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy(): expected a numpy.ndarray, got {type(array).__name__}")
    dt = from_numpy_dtype(array.dtype)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    impl = TensorImpl.new(array.shape, dt, as_device("cpu"))
    blob = impl.blob
    blob.backend.allocator.adopt(array.nbytes, "from_numpy")
    blob.array, blob.owned, blob.allocated = array, False, True
    return wrap(impl)


def from_dlpack(obj: Any) -> Tensor:
    """A tensor sharing memory with any object that implements ``__dlpack__``: a host
    array's (a cpu tensor), or a CUDA array's (a CuPy or torch CUDA tensor: a tensor on
    ``cuda:N``, its device, where CUDA runs on a GPU; C-contiguous only). Do not write the
    producer's memory while actorflow work on the tensor may be pending.

    Raises:
        DeviceError: a CUDA array where CUDA devices run on the emulator (whose memory is
            not a GPU's: copy to the host first), or not C-contiguous."""
    if isinstance(obj, Tensor):
        return obj
    kind = getattr(obj, "__dlpack_device__", None)
    if kind is not None:
        dev_type, index = kind()
        if dev_type == 2:  # kDLCUDA
            dev = as_device(f"cuda:{index}")
            array = get_backend(dev).adopt(obj)
            impl = TensorImpl.new(array.shape, from_numpy_dtype(array.dtype), dev)
            blob = impl.blob
            blob.backend.allocator.adopt(array.darray.nbytes, "from_dlpack")
            blob.array, blob.owned, blob.allocated = array, False, True
            return wrap(impl)
    return from_numpy(np.from_dlpack(obj))


def _placed(name: str, device, placement, sbp):
    """``device``, or the layout ``placement=`` and ``sbp=`` ask for (a global tensor)."""
    if placement is None and sbp is None:
        return device
    if device is not None:
        raise DeviceError(
            f"{name}(): give device= for a local tensor or placement= and sbp= for a global "
            f"one, not both"
        )
    if placement is None or sbp is None:
        raise DeviceError(
            f"{name}(): a global tensor needs both placement= and sbp= (e.g. "
            f"placement=af.placement('cpu', ranks=2), sbp=af.sbp.broadcast)"
        )
    if not isinstance(placement, Placement):
        raise DeviceError(f"{name}(): placement must be an af.placement(...), got {placement!r}")
    return layout(placement, as_sbp(sbp, name))


def _factory(op, shape, dtype, device, extra=None):
    dev = as_device(device if device is not None else "cpu")
    attrs = {"shape": shape, "dtype": dtype, "device": dev}
    if extra:
        attrs.update(extra)
    return apply(op, [], attrs, device=dev)[0]


def empty(
    *size: int | Sequence[int],
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """An uninitialized tensor. Example: ``af.empty(2, 3)``."""
    device = _placed("empty", device, placement, sbp)
    shape = _size("empty", size)
    return _finish(_factory(_EMPTY, shape, as_dtype(dtype or default_float), device), requires_grad)


def full(
    size: int | Sequence[int],
    fill_value: _Number,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """A tensor filled with ``fill_value``; its dtype follows the value unless given."""
    device = _placed("full", device, placement, sbp)
    shape = _size("full", (size,) if isinstance(size, (int, numbers.Integral)) else tuple(size))
    if isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    dt = as_dtype(dtype) if dtype is not None else scalar_dtype(fill_value)
    return _finish(_factory(_FULL, shape, dt, device, {"value": fill_value}), requires_grad)


def zeros(
    *size: int | Sequence[int],
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """A tensor of zeros. Example: ``af.zeros(2, 3)`` or ``af.zeros((2, 3))``."""
    device = _placed("zeros", device, placement, sbp)
    return full(_size("zeros", size), 0, as_dtype(dtype or default_float), device, requires_grad)


def ones(
    *size: int | Sequence[int],
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """A tensor of ones."""
    device = _placed("ones", device, placement, sbp)
    return full(_size("ones", size), 1, as_dtype(dtype or default_float), device, requires_grad)


def arange(
    start: int | float,
    end: int | float | None = None,
    step: int | float = 1,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """Values from ``start`` (default 0) up to ``end`` (excluded) by ``step``; int64 when all
    are ints, else float32. Example: ``af.arange(5)``."""
    device = _placed("arange", device, placement, sbp)
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    n = int(np.ceil((end - start) / step))
    if n < 0:
        raise ValueError(
            f"arange(): upper bound and step sign are inconsistent "
            f"(start={start}, end={end}, step={step})"
        )
    ints = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    dt = as_dtype(dtype) if dtype is not None else (int64 if ints else default_float)
    impl = _factory(_ARANGE, (n,), dt, device, {"start": start, "step": step})
    return _finish(impl, requires_grad)


def _random(op, name, size, dtype, device, requires_grad):
    dt = as_dtype(dtype or default_float)
    if not dt.is_floating_point:
        raise DTypeError(f"{name}(): needs a floating point dtype, got {dt}")
    impl = _factory(op, _size(name, size), dt, device, {"seed": _next_seed()})
    return _finish(impl, requires_grad)


def rand(
    *size: int | Sequence[int],
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """Uniform random values in [0, 1). Follows ``manual_seed``."""
    device = _placed("rand", device, placement, sbp)
    return _random(_RAND, "rand", size, dtype, device, requires_grad)


def randn(
    *size: int | Sequence[int],
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
    placement: Placement | None = None,
    sbp: Any = None,
) -> Tensor:
    """Standard normal random values. Follows ``manual_seed``."""
    device = _placed("randn", device, placement, sbp)
    return _random(_RANDN, "randn", size, dtype, device, requires_grad)


def _like(fn, t, dtype, device, **kw):
    return fn(t.shape, dtype=dtype or t.dtype, device=device or t.device, **kw)


def zeros_like(
    input: Tensor,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(zeros, input, dtype, device, requires_grad=requires_grad)


def ones_like(
    input: Tensor,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(ones, input, dtype, device, requires_grad=requires_grad)


def empty_like(
    input: Tensor,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(empty, input, dtype, device, requires_grad=requires_grad)


def full_like(
    input: Tensor,
    fill_value: _Number,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return full(
        input.shape, fill_value, dtype or input.dtype, device or input.device, requires_grad
    )


def rand_like(
    input: Tensor,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(rand, input, dtype, device, requires_grad=requires_grad)


def randn_like(
    input: Tensor,
    dtype: _DTypeLike | None = None,
    device: _DeviceLike | None = None,
    requires_grad: bool = False,
) -> Tensor:
    return _like(randn, input, dtype, device, requires_grad=requires_grad)
