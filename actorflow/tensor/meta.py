"""TensorMeta: shape, dtype, device, strides and offset (in elements) of a tensor."""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ..device import Device
from ..dtype import DType


class TensorMeta(NamedTuple):
    """Immutable metadata of a tensor; a view shares its base's blob with other strides."""

    shape: tuple
    dtype: DType
    device: Device
    strides: tuple
    offset: int = 0

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous(self.shape, self.strides)


_STRIDES: dict = {}


def contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides in elements for ``shape`` (cached)."""
    s = _STRIDES.get(shape)
    if s is None:
        acc, out = 1, []
        for n in reversed(shape):
            out.append(acc)
            acc *= max(n, 1)
        s = tuple(reversed(out))
        if len(_STRIDES) < 4096:
            _STRIDES[shape] = s
    return s


def as_shape(value, what: str) -> tuple:
    """``value`` (an int or an iterable of ints) as a shape tuple; TypeError or ShapeError
    naming ``what`` otherwise."""
    from ..errors import ShapeError

    if isinstance(value, numbers.Integral):
        value = (value,)
    try:
        shape = tuple(value)
    except TypeError:
        raise TypeError(f"{what}: size must be ints or a tuple of ints, got {value!r}") from None
    if not all(isinstance(s, numbers.Integral) for s in shape):
        raise TypeError(f"{what}: size must be whole numbers (ints), got {value!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{what}: negative dimension in size {shape}")
    return shape


def numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def is_contiguous(shape: tuple, strides: tuple) -> bool:
    """True when the strides are row-major for the shape (size-1 dims may have any stride)."""
    acc = 1
    for n, st in zip(reversed(shape), reversed(strides), strict=True):
        if n == 0:
            return True
        if n != 1 and st != acc:
            return False
        acc *= n
    return True


def contiguous_meta(shape: tuple, dtype: DType, device: Device) -> TensorMeta:
    """The row-major TensorMeta of ``shape`` and ``dtype`` on ``device``. Metas are immutable
    values, so tensors share them: each device keeps the ones made (a few thousand at most),
    and the eager interpreter looks there first (``device.metas.get((shape, dtype))``)."""
    key = (shape, dtype)
    m = device.metas.get(key)
    if m is None:
        m = TensorMeta(shape, dtype, device, contiguous_strides(shape), 0)
        if len(device.metas) < 4096:
            device.metas[key] = m
    return m


def strided(base, meta: TensorMeta):
    """The numpy view ``meta`` describes (its shape, and strides and offset in elements)
    over the contiguous array ``base``: how a view tensor, a traced program's operand and a
    picked output read their storage. ``base`` itself when ``meta`` or ``base`` is None; a
    fresh empty array when ``meta`` has no elements (nothing to address in ``base``)."""
    if meta is None or base is None:
        return base
    if 0 in meta.shape:
        return np.empty(meta.shape, base.dtype)
    size = base.itemsize
    return np.ndarray(
        meta.shape, base.dtype, base, meta.offset * size, tuple(s * size for s in meta.strides)
    )
