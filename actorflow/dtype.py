"""DType: the element types actorflow supports, and PyTorch-style type promotion.

Promotion follows PyTorch: categories bool < integer < floating; a tensor with dimensions
outranks a zero-dim tensor, which outranks a Python scalar, unless the lower-ranked operand
is of a higher category (``int32_tensor + 1.5`` is float32, ``float16_tensor + 1.5`` stays
float16). Python floats become the default float dtype, float32.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .errors import DTypeError

BOOL, INT, FLOAT = 0, 1, 2


class DType:
    """An element type. Singletons: compare with ``is`` or ``==``."""

    __slots__ = ("name", "np", "itemsize", "category")

    def __init__(self, name: str, np_dtype: npt.DTypeLike, category: int) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.category = category

    @property
    def is_floating_point(self) -> bool:
        return self.category == FLOAT

    def __repr__(self) -> str:
        return f"actorflow.{self.name}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (as_dtype, (self.name,))


bool_ = DType("bool", np.bool_, BOOL)
int32 = DType("int32", np.int32, INT)
int64 = DType("int64", np.int64, INT)
float16 = DType("float16", np.float16, FLOAT)
float32 = DType("float32", np.float32, FLOAT)
float64 = DType("float64", np.float64, FLOAT)
bfloat16 = DType("bfloat16", np.uint16, FLOAT)  # stored as uint16 bits: see above

# a dtype as functions take it: a DType or its name ('float32'); ``as_dtype`` also takes a
# numpy dtype or a Python type
_DTypeLike: TypeAlias = DType | str
# a Python scalar, as ops take it beside tensors
_Number: TypeAlias = bool | int | float

ALL = (bool_, int32, int64, float16, float32, float64)  # numpy's own: computed as they are
STORAGE_ONLY = (bfloat16,)  # computed in float32
_BY_NAME = {d.name: d for d in ALL + STORAGE_ONLY}
_BY_NAME.update(
    {
        "float": float32,
        "double": float64,
        "half": float16,
        "int": int32,
        "long": int64,
        "bool_": bool_,
    }
)
_BY_NP = {d.np: d for d in ALL}
_BY_PY: dict[object, DType] = {bool: bool_, int: int64, float: float32}

default_float = float32


def as_dtype(value: DType | npt.DTypeLike) -> DType:
    """Returns the DType for a DType, a name ('float32'), a numpy dtype or a Python type.

    Raises DTypeError naming the supported dtypes for anything else.
    """
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        d = _BY_NAME.get(value)
        if d is not None:
            return d
    elif value in _BY_PY:
        return _BY_PY[value]
    else:
        try:
            d = _BY_NP.get(np.dtype(value))
        except TypeError:
            d = None
        if d is not None:
            return d
    raise DTypeError(
        f"unsupported dtype {value!r}; actorflow supports "
        f"{', '.join(x.name for x in ALL + STORAGE_ONLY)}"
    )


def from_numpy_dtype(np_dtype: np.dtype, op: str = "from_numpy") -> DType:
    d = _BY_NP.get(np_dtype)
    if d is None:
        raise DTypeError(
            f"{op}: numpy dtype {np_dtype} is not supported; convert the array with "
            f".astype(...) to one of {', '.join(x.name for x in ALL)}"
        )
    return d


def promote_types(a: DType, b: DType) -> DType:
    """The smallest dtype both a and b convert to safely, by PyTorch's table."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.itemsize == b.itemsize and a.category == FLOAT:
        return float32  # bfloat16 and float16: neither holds the other
    return a if a.itemsize >= b.itemsize else b


def scalar_dtype(value: object) -> DType:
    """The dtype a Python scalar takes on its own: bool, int64 or the default float."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return default_float
    raise DTypeError(
        f"expected a tensor or a Python bool, int or float, got {type(value).__name__}"
    )


def combine_categories(higher: DType | None, lower: DType | None) -> DType | None:
    # PyTorch's combine_categories: a lower-ranked group only matters when its category is higher.
    if higher is None:
        return lower
    if lower is None or higher.category == FLOAT:
        return higher
    if higher is bool_ or lower.category == FLOAT:
        return promote_types(higher, lower)
    return higher


def result_type(*operands: Any) -> DType:
    """The dtype of an elementwise op over tensors (or TensorMetas) and Python scalars
    (see the module docstring)."""
    dim = zero = scalar = None
    for x in operands:
        impl = getattr(x, "_impl", None)
        meta = impl.meta if impl is not None else (x if hasattr(x, "strides") else None)
        if meta is not None:
            if meta.shape:
                dim = meta.dtype if dim is None else promote_types(dim, meta.dtype)
            else:
                zero = meta.dtype if zero is None else promote_types(zero, meta.dtype)
        else:
            d = scalar_dtype(x)
            scalar = d if scalar is None else promote_types(scalar, d)
    out = combine_categories(dim, combine_categories(zero, scalar))
    if out is None:
        raise DTypeError("result_type needs at least one operand")
    return out


# -- bfloat16 storage --------------------------------------------------------------------

_U32 = np.dtype(np.uint32)


def bfloat16_bits(values: npt.ArrayLike) -> np.ndarray:
    """The bfloat16 bits (uint16) nearest to ``values`` (read as float32 first), ties to
    even, as PyTorch's conversion: NaN becomes 0x7FC0, values past the largest bfloat16
    round to infinity."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = np.ascontiguousarray(values, dtype=np.float32)
        bits = f.view(_U32)
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    out = rounded.astype(np.uint16)
    nan = f != f
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bfloat16_values(bits: npt.ArrayLike) -> np.ndarray:
    """The float32 values of bfloat16 ``bits`` (uint16), exactly."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    np.left_shift(wide, 16, out=wide)  # (in place: a 0-d array stays an array)
    return wide.view(np.float32)
