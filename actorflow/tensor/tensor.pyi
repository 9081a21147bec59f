# The Tensor as editors and type checkers see it: the methods tensor.py defines and those
# actorflow.methods binds from its table (METHODS, autograd.METHODS, OPERATORS).
# Written by tools/tensor_stub.py from the class itself: do not edit by hand; change the
# functions (or the generator's types) and run `python tools/tensor_stub.py`.
# tests/test_tensor_stub.py fails when this file is out of date.
import builtins
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias, overload

import numpy as np

from ..device import Device
from ..dtype import DType
from ..sbp import SBP, Placement
from .impl import TensorImpl
from .meta import TensorMeta

_Number: TypeAlias = bool | int | float
_Operand: TypeAlias = Tensor | _Number | np.ndarray | np.generic
_DTypeLike: TypeAlias = DType | str
_DeviceLike: TypeAlias = Device | str
_Dims: TypeAlias = int | tuple[int, ...] | list[int]
_Shape: TypeAlias = int | Sequence[int]

class _MinMax(NamedTuple):
    values: Tensor
    indices: Tensor

GRAD_VIEW: list[Any]

def wrap(impl: TensorImpl) -> Tensor: ...

def viewed(t: Tensor, impl: TensorImpl, kind: str, arg: Any) -> Tensor:
    """``impl`` (a view of ``t``) as a Tensor; when ``t`` is in autograd, the view gets its
    backward node (``kind``: "reshape", "permute", "expand" or "index"; ``arg`` its key).
    """

def shape_args(args: tuple[Any, ...]) -> tuple[builtins.int, ...]:
    """A shape given as ints or as one sequence: ``view(2, 3)`` or ``view((2, 3))``."""

class Tensor:
    """An n-dimensional array on a device. Make one with ``af.tensor``, ``af.zeros``..."""

    # -- defined in tensor.py
    __array_priority__: builtins.int
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    @property
    def _meta(self) -> TensorMeta: ...
    def _wait_shape(self) -> None:
        """Waits for a value-dependent shape (an op's output whose shape is known only once
        it ran); returns at once for any other tensor.
        """
    @property
    def shape(self) -> tuple[builtins.int, ...]: ...
    @overload
    def size(self, dim: None = None) -> tuple[builtins.int, ...]: ...
    @overload
    def size(self, dim: builtins.int) -> builtins.int: ...
    @property
    def dtype(self) -> DType: ...
    @property
    def device(self) -> Device: ...
    @property
    def is_global(self) -> builtins.bool:
        """Whether this is a global tensor (laid out over a placement's ranks)."""
    @property
    def is_local(self) -> builtins.bool: ...
    @property
    def placement(self) -> Placement:
        """A global tensor's placement (``af.placement``)."""
    @property
    def sbp(self) -> tuple[SBP, ...]:
        """A global tensor's layout over its placement: one ``af.sbp`` per placement axis."""
    @property
    def ndim(self) -> builtins.int: ...
    def dim(self) -> builtins.int: ...
    def numel(self) -> builtins.int: ...
    @overload
    def stride(self, dim: None = None) -> tuple[builtins.int, ...]: ...
    @overload
    def stride(self, dim: builtins.int) -> builtins.int: ...
    def is_contiguous(self) -> builtins.bool: ...
    def __len__(self) -> builtins.int: ...
    def __hash__(self) -> builtins.int: ...
    def detach(self) -> Tensor:
        """A tensor sharing this one's storage, outside autograd: writing it in place
        changes this tensor too (as in PyTorch), and a gradient rule that saved this tensor
        then refuses to run on the changed values.
        """
    def view(self, *shape: _Shape) -> Tensor: ...
    def transpose(self, dim0: builtins.int, dim1: builtins.int) -> Tensor: ...
    def permute(self, *dims: _Shape) -> Tensor: ...
    @property
    def T(self) -> Tensor: ...
    @property
    def mT(self) -> Tensor: ...
    def unsqueeze(self, dim: builtins.int) -> Tensor: ...
    def squeeze(self, dim: builtins.int | None = None) -> Tensor: ...
    def expand(self, *sizes: _Shape) -> Tensor: ...
    def expand_as(self, other: Tensor) -> Tensor: ...
    def is_floating_point(self) -> builtins.bool: ...
    _impl: TensorImpl

    # -- bound by actorflow.methods from METHODS
    @staticmethod
    def _resolve(impl: TensorImpl) -> None:
        """Waits for the writer of a tensor whose shape is known only after compute."""
    def _read(self, fn: Any, name: str) -> Any: ...
    def numpy(self, *, force: builtins.bool = False) -> np.ndarray:
        """A numpy copy of the values, taken after every write issued before this call.
        Blocks the calling thread; inside a coroutine prefer ``await t.numpy_async()``.
        ``force`` is PyTorch's (a copy even where it would share memory): this is always one.
        A bfloat16 tensor's values come as float32 (exactly: numpy has no bfloat16).
        """
    async def numpy_async(self) -> np.ndarray:
        """Like ``numpy()``, awaiting the result without blocking the running event loop."""
    def __array__(self, dtype: Any = None, copy: builtins.bool | None = None) -> np.ndarray: ...
    def tolist(self) -> Any: ...
    def item(self) -> _Number:
        """The value of a one-element tensor as a Python number."""
    def __bool__(self) -> builtins.bool: ...
    def __float__(self) -> builtins.float: ...
    def __int__(self) -> builtins.int: ...
    def __index__(self) -> builtins.int: ...
    def __repr__(self) -> str: ...
    def __str__(self) -> str: ...
    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """Exports the storage (waiting for pending writes first): a cpu tensor's numpy array,
        or a cuda tensor's device memory (kDLCUDA) where its driver is a GPU's (a view is
        exported as a contiguous copy).
        """
    def __dlpack_device__(self) -> tuple[builtins.int, builtins.int]: ...
    def __getitem__(self, key: Any) -> Tensor: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __iter__(self) -> Iterator[Tensor]: ...
    def to(
        self, *args: Any, device: _DeviceLike | None = None, dtype: _DTypeLike | None = None,
        non_blocking: builtins.bool = False, copy: builtins.bool = False,
        memory_format: Any = None, tensor: Tensor | None = None,
    ) -> Tensor:
        """``t.to("null")``, ``t.to(af.float64)``, ``t.to("cpu", af.int32)``, ``t.to(other)``
        (its dtype and device): PyTorch's forms. Positional booleans after these are
        ``non_blocking`` then ``copy``. ``copy=True`` returns a new tensor even when nothing
        changes; ``non_blocking`` changes nothing (every copy is queued in order).
        """
    def to_global(self, placement: Placement | None = None, sbp: Any = None) -> Tensor:
        """``x`` as a global tensor on ``placement`` laid out by ``sbp`` (each left out: x's
        own, for a global ``x``). A local ``x`` is the whole value: each rank gets its part of
        it; a global one is converted (boxed). Differentiable. Always a new tensor.

        Example: ``w.to_global(af.placement("cpu", ranks=2), af.sbp.broadcast)``
        """
    def to_local(self, rank: builtins.int | None = None) -> Tensor:
        """A global tensor's whole value as a local tensor (partial sums added, splits joined);
        with ``rank``, a copy of that rank's part alone (an index into the placement's ranks),
        which autograd does not follow. A local ``x`` is returned as it is.
        """
    def cpu(self) -> Tensor: ...
    def type(self, dtype: _DTypeLike) -> Tensor: ...
    def float(self) -> Tensor: ...
    def double(self) -> Tensor: ...
    def half(self) -> Tensor: ...
    def bfloat16(self) -> Tensor: ...
    def int(self) -> Tensor: ...
    def long(self) -> Tensor: ...
    def bool(self) -> Tensor: ...
    def clone(self, *, memory_format: Any = None) -> Tensor:
        """A contiguous copy with its own storage (``memory_format``: None, or PyTorch's
        preserve_format or contiguous_format, which ask the same here).
        """
    def contiguous(self, memory_format: Any = None) -> Tensor:
        """``self`` when row-major already, else a contiguous copy (``memory_format`` as in
        ``clone``).
        """
    def reshape(self, *sizes: _Shape, shape: Sequence[builtins.int] | None = None) -> Tensor:
        """``t.reshape(2, 3)``, ``t.reshape((2, 3))`` or ``t.reshape(shape=(2, 3))``: a view
        when ``self`` is contiguous, else a copy.
        """
    def flatten(self, start_dim: builtins.int = 0, end_dim: builtins.int = -1) -> Tensor:
        """Dims ``start_dim`` to ``end_dim`` (both included; negative ones count from the end)
        as one, as PyTorch's: a view where the tensor is contiguous, else a copy; a 0-d tensor
        gives shape (1,).

        Raises:
            IndexError: a dim out of range. ValueError: ``start_dim`` after ``end_dim``.
        """
    def __pow__(self, exponent: _Operand, *, out: None = None) -> Tensor:
        """``input ** exponent`` elementwise with broadcasting; either may be a Python number.
        Integers to negative integer powers are refused, as in PyTorch.
        """
    def __matmul__(self, other: Tensor, *, out: None = None) -> Tensor:
        """Matrix product with batching and broadcasting of leading dims (numpy's rules)."""
    def __rmatmul__(self, other: _Operand) -> Tensor: ...
    def __pos__(self) -> Tensor: ...
    def __neg__(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise neg of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.neg(af.tensor([1., -1.]))``
        """
    def __abs__(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise abs of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.abs(af.tensor([1., -1.]))``
        """
    def __invert__(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise bitwise_not of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.bitwise_not(af.tensor([1., -1.]))``
        """
    def __iadd__(self, other: _Operand, *, alpha: _Number = 1) -> Tensor:
        """``input += alpha * other`` in place (see ``add``)."""
    def __isub__(self, other: _Operand, *, alpha: _Number = 1) -> Tensor:
        """``input -= alpha * other`` in place (see ``sub``)."""
    def __imul__(self, other: _Operand) -> Tensor: ...
    def __itruediv__(self, other: _Operand, *, rounding_mode: str | None = None) -> Tensor:
        """``input /= other`` in place; ``rounding_mode`` as in ``div``."""
    def __ifloordiv__(self, other: _Operand) -> Tensor: ...
    def __imod__(self, other: _Operand) -> Tensor: ...
    def add(self, other: _Operand, *, alpha: _Number = 1, out: None = None) -> Tensor:
        """``input + alpha * other`` elementwise with broadcasting; either of ``input`` and
        ``other`` may be a Python number. ``alpha`` follows PyTorch: a float only for a floating
        point result, a bool only for a bool one; another ``alpha`` than 1 costs one more op.

        Example: ``af.add(x, y, alpha=0.5)``
        """
    def sub(self, other: _Operand, *, alpha: _Number = 1, out: None = None) -> Tensor:
        """``input - alpha * other`` elementwise (see ``add``); a bool operand is refused, as in
        PyTorch.
        """
    def mul(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise mul with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.mul(af.ones(2, 3), af.ones(3))``
        """
    def div(
        self, other: _Operand, *, rounding_mode: str | None = None, out: None = None,
    ) -> Tensor:
        """``input / other`` elementwise with broadcasting: true division (a floating point
        result), or rounded toward zero (``rounding_mode="trunc"``) or down (``"floor"``, as
        ``floor_divide``), which keep integer dtypes, as in PyTorch.
        """
    def pow(self, exponent: _Operand, *, out: None = None) -> Tensor:
        """``input ** exponent`` elementwise with broadcasting; either may be a Python number.
        Integers to negative integer powers are refused, as in PyTorch.
        """
    def matmul(self, other: Tensor, *, out: None = None) -> Tensor:
        """Matrix product with batching and broadcasting of leading dims (numpy's rules)."""
    def maximum(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise maximum with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.maximum(af.ones(2, 3), af.ones(3))``
        """
    def minimum(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise minimum with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.minimum(af.ones(2, 3), af.ones(3))``
        """
    def eq(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise eq with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.eq(af.ones(2, 3), af.ones(3))``
        """
    def ne(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise ne with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.ne(af.ones(2, 3), af.ones(3))``
        """
    def lt(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise lt with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.lt(af.ones(2, 3), af.ones(3))``
        """
    def le(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise le with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.le(af.ones(2, 3), af.ones(3))``
        """
    def gt(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise gt with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.gt(af.ones(2, 3), af.ones(3))``
        """
    def ge(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise ge with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.ge(af.ones(2, 3), af.ones(3))``
        """
    def add_(self, other: _Operand, *, alpha: _Number = 1) -> Tensor:
        """``input += alpha * other`` in place (see ``add``)."""
    def sub_(self, other: _Operand, *, alpha: _Number = 1) -> Tensor:
        """``input -= alpha * other`` in place (see ``sub``)."""
    def mul_(self, other: _Operand) -> Tensor: ...
    def div_(self, other: _Operand, *, rounding_mode: str | None = None) -> Tensor:
        """``input /= other`` in place; ``rounding_mode`` as in ``div``."""
    def floor_divide(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise floor_divide with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.floor_divide(af.ones(2, 3), af.ones(3))``
        """
    def remainder(self, other: _Operand, *, out: None = None) -> Tensor:
        """Elementwise remainder with broadcasting; either argument may be a Python number (``out=`` is refused).

        Example: ``af.remainder(af.ones(2, 3), af.ones(3))``
        """
    def floor_divide_(self, other: _Operand) -> Tensor: ...
    def remainder_(self, other: _Operand) -> Tensor: ...
    def zero_(self) -> Tensor: ...
    def fill_(self, value: _Number) -> Tensor:
        """Writes ``value`` to every element of ``input`` (a view writes through)."""
    def copy_(self, other: Tensor, non_blocking: builtins.bool = False) -> Tensor:
        """Copies ``other`` (broadcast to ``input``'s shape, any dtype, any device: from
        across the host boundary, cuda to cpu or cpu to cuda, through the transfer ``.to()``
        makes, ``readable_on``) into ``input``. ``non_blocking`` is accepted for PyTorch's
        signature: every copy is queued and ordered like any other op.

        Raises:
            DeviceError: ``other`` is on a device without data (null) and ``input`` is not, or
                both are on devices with their own memory (the message says how to go
                through the host).
        """
    def neg(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise neg of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.neg(af.tensor([1., -1.]))``
        """
    def abs(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise abs of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.abs(af.tensor([1., -1.]))``
        """
    def exp(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise exp of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.exp(af.tensor([1., -1.]))``
        """
    def log(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise log of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.log(af.tensor([1., -1.]))``
        """
    def sqrt(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise sqrt of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.sqrt(af.tensor([1., -1.]))``
        """
    def tanh(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise tanh of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.tanh(af.tensor([1., -1.]))``
        """
    def sin(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise sin of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.sin(af.tensor([1., -1.]))``
        """
    def cos(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise cos of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.cos(af.tensor([1., -1.]))``
        """
    def rsqrt(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise rsqrt of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.rsqrt(af.tensor([1., -1.]))``
        """
    def erf(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise erf of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.erf(af.tensor([1., -1.]))``
        """
    def relu(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise relu of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.relu(af.tensor([1., -1.]))``
        """
    def relu_(self) -> Tensor: ...
    def clamp(
        self, min: _Operand | None = None, max: _Operand | None = None, *, out: None = None,
    ) -> Tensor:
        """Limits every element to [min, max] (either bound may be None, not both). A bound may
        be a number or a tensor that broadcasts with ``input``; where min > max, the result is
        max, as in PyTorch. ``out=`` is refused.

        Example: ``af.clamp(x, min=0.0)``, ``af.clamp(x, min=lo, max=hi)``
        """
    def clamp_(self, min: _Operand | None = None, max: _Operand | None = None) -> Tensor:
        """``clamp`` written into ``input`` (the bounds must not change its shape or dtype)."""
    def clip(
        self, min: _Operand | None = None, max: _Operand | None = None, *, out: None = None,
    ) -> Tensor:
        """Limits every element to [min, max] (either bound may be None, not both). A bound may
        be a number or a tensor that broadcasts with ``input``; where min > max, the result is
        max, as in PyTorch. ``out=`` is refused.

        Example: ``af.clamp(x, min=0.0)``, ``af.clamp(x, min=lo, max=hi)``
        """
    def clip_(self, min: _Operand | None = None, max: _Operand | None = None) -> Tensor:
        """``clamp`` written into ``input`` (the bounds must not change its shape or dtype)."""
    def sigmoid(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise sigmoid of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.sigmoid(af.tensor([1., -1.]))``
        """
    def gelu(self, approximate: str = 'none') -> Tensor:
        """GELU: x * Phi(x) with the exact erf ('none') or the tanh approximation ('tanh')."""
    def logical_not(self, inplace: builtins.bool = False, *, out: None = None) -> Tensor:
        """Elementwise logical_not of a tensor; ``inplace=True`` writes the input (``out=`` is refused).

        Example: ``af.logical_not(af.tensor([1., -1.]))``
        """
    def sum(
        self, dim: _Dims | None = None, keepdim: builtins.bool = False, *,
        dtype: _DTypeLike | None = None, out: None = None, axis: _Dims | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Sum over ``dim`` (an int, a tuple, or None for all). Ints and bools sum to int64."""
    def mean(
        self, dim: _Dims | None = None, keepdim: builtins.bool = False, *,
        dtype: _DTypeLike | None = None, out: None = None, axis: _Dims | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Mean over ``dim``; the input (or ``dtype``) must be floating point."""
    def var(
        self, dim: _Dims | builtins.bool | None = None, unbiased: builtins.bool = True,
        keepdim: builtins.bool = False, *, correction: builtins.float | None = None,
        out: None = None, axis: _Dims | None = None, keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Variance over ``dim`` (an int, a tuple, or None for all) with ``correction``
        (N - correction divides; default 1, Bessel's) or PyTorch's older ``unbiased``
        (``var(x, True)``, ``var(x, dim, False)``). N - correction <= 0 gives inf (nan for
        0 / 0), as PyTorch.
        """
    def std(
        self, dim: _Dims | builtins.bool | None = None, unbiased: builtins.bool = True,
        keepdim: builtins.bool = False, *, correction: builtins.float | None = None,
        out: None = None, axis: _Dims | None = None, keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Standard deviation: sqrt of ``var`` with the same arguments."""
    @overload
    def max(
        self, dim: None = None, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor: ...
    @overload
    def max(
        self, dim: builtins.int, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> _MinMax: ...
    @overload
    def max(
        self, dim: Tensor, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor: ...
    @overload
    def min(
        self, dim: None = None, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor: ...
    @overload
    def min(
        self, dim: builtins.int, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> _MinMax: ...
    @overload
    def min(
        self, dim: Tensor, keepdim: builtins.bool = False, *, out: None = None,
        other: Tensor | None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor: ...
    def amax(
        self, dim: _Dims | None = None, keepdim: builtins.bool = False, *, out: None = None,
        axis: _Dims | None = None, keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Largest elements over ``dim`` (an int, a tuple, or None for all)."""
    def amin(
        self, dim: _Dims | None = None, keepdim: builtins.bool = False, *, out: None = None,
        axis: _Dims | None = None, keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Smallest elements over ``dim`` (an int, a tuple, or None for all)."""
    def argmax(
        self, dim: builtins.int | None = None, keepdim: builtins.bool = False, *,
        out: None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Index of the largest element (of the flattened tensor when ``dim`` is None)."""
    def argmin(
        self, dim: builtins.int | None = None, keepdim: builtins.bool = False, *,
        out: None = None, axis: builtins.int | None = None,
        keepdims: builtins.bool | None = None,
    ) -> Tensor:
        """Index of the smallest element (of the flattened tensor when ``dim`` is None)."""
    def softmax(
        self, dim: builtins.int | None = None, dtype: _DTypeLike | None = None, *,
        out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """exp(x) / sum(exp(x)) along ``dim``, computed stably (in ``dtype`` when given: the
        input is cast to it first). Example: ``af.softmax(x, dim=1)``.
        """
    def log_softmax(
        self, dim: builtins.int | None = None, dtype: _DTypeLike | None = None, *,
        out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """log(softmax(x)) along ``dim``, computed stably (in ``dtype`` when given)."""
    @overload
    def nonzero(self, *, out: None = None, as_tuple: Literal[False] = False) -> Tensor: ...
    @overload
    def nonzero(self, *, out: None = None, as_tuple: Literal[True]) -> tuple[Tensor, ...]: ...
    def where(self, condition: Tensor, other: _Operand) -> Tensor: ...
    def __deepcopy__(self, memo: dict) -> Tensor:
        """``copy.deepcopy``: a copy of a leaf's values (and of its gradient) with its
        requires_grad, as PyTorch's; a computed tensor is refused, as there.
        """
    def gather(
        self, dim: builtins.int | None = None, index: Tensor | None = None, *,
        sparse_grad: builtins.bool = False, out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """``out[i][j] = input[index[i][j]][j]`` (dim 0; likewise along any dim): ``index`` has
        the input's number of dims, is int64 and no larger than the input in the other dims; its
        values must be in [0, input.shape[dim]). ``sparse_grad`` is taken and ignored (the
        gradient is dense).
        """
    def scatter_add(
        self, dim: builtins.int | None = None, index: Tensor | None = None,
        src: Tensor | None = None, *, out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """A copy of ``input`` with ``src[i][j]`` added at ``[index[i][j]][j]`` (dim 0; likewise
        along any dim), repeated indices summed. ``index``: int64, the input's number of dims, no
        larger than ``src`` in any dim nor than the input in the dims but ``dim``; its values in
        [0, input.shape[dim]).
        """
    def scatter_add_(
        self, dim: builtins.int | None = None, index: Tensor | None = None,
        src: Tensor | None = None, *, axis: builtins.int | None = None,
    ) -> Tensor:
        """``scatter_add`` written into ``input``."""
    def cumsum(
        self, dim: builtins.int | None = None, *, dtype: _DTypeLike | None = None,
        out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """The cumulative sum along ``dim``; bools and ints sum to int64 unless ``dtype`` says
        otherwise (the input is then summed in it, as in PyTorch).
        """
    def sort(
        self, dim: builtins.int = -1, descending: builtins.bool = False, *,
        stable: builtins.bool = False, out: None = None, axis: builtins.int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(values, indices)`` of ``input`` sorted along ``dim``. The sort is always stable
        (equal values keep their order, descending too; ``stable`` is taken for PyTorch's
        signature); NaN sorts above every number, as in PyTorch.
        """
    def argsort(
        self, dim: builtins.int = -1, descending: builtins.bool = False, *,
        stable: builtins.bool = False, out: None = None, axis: builtins.int | None = None,
    ) -> Tensor:
        """The indices of ``sort(input, dim, descending)`` (stable, as there)."""
    def topk(
        self, k: builtins.int, dim: builtins.int = -1, largest: builtins.bool = True,
        sorted: builtins.bool = True, *, out: None = None, axis: builtins.int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
        along ``dim``, sorted; among equal values the first ones come first (``sorted=False``
        gives the same order, one PyTorch allows).

        Raises:
            ShapeError: k outside [0, size of dim].
        """
    def masked_fill(self, mask: Tensor, value: _Number | Tensor) -> Tensor:
        """``value`` where the bool ``mask`` is True, ``input`` elsewhere (the mask broadcasts
        to the input's shape); ``value`` is a number or a 0-d tensor, as in PyTorch.

        Raises: DTypeError for a mask that is not bool; ShapeError for a mask that does not
        broadcast to the input, or a value tensor that is not 0-d.
        """
    def triu(self, diagonal: builtins.int = 0, *, out: None = None) -> Tensor:
        """The upper triangle of the last two dims (a batch of matrices
        before them): the entries on and above ``diagonal`` (0: the main diagonal, > 0 above,
        < 0 below) kept, the rest zero.

        Raises: ShapeError for a tensor of fewer than 2 dims.
        """
    def tril(self, diagonal: builtins.int = 0, *, out: None = None) -> Tensor:
        """The lower triangle of the last two dims: the entries on and
        below ``diagonal`` kept, the rest zero.

        Raises: ShapeError for a tensor of fewer than 2 dims.
        """

    # -- bound by actorflow.methods from autograd.METHODS
    def requires_grad_(self, requires_grad: builtins.bool = True) -> Tensor:
        """Marks a leaf tensor as needing ``.grad`` after ``backward()`` (floating point only)."""
    @property
    def requires_grad(self) -> builtins.bool: ...
    @requires_grad.setter
    def requires_grad(self, value: builtins.bool) -> None: ...
    @property
    def grad(self) -> Tensor | None: ...
    @grad.setter
    def grad(self, value: Tensor | None) -> None: ...
    @property
    def grad_fn(self) -> Any: ...
    @property
    def is_leaf(self) -> builtins.bool: ...
    def retain_grad(self) -> None:
        """Keeps this non-leaf tensor's gradient in ``.grad`` after ``backward()``."""
    def backward(
        self, gradient: Tensor | None = None, retain_graph: builtins.bool = False,
        create_graph: builtins.bool = False,
    ) -> None:
        """Computes the gradient of this tensor with respect to the leaves that require grad
        and adds it to their ``.grad``. ``gradient``: d(something)/d(this tensor), needed
        unless it has one element.
        """
    def detach_(self) -> Tensor:
        """Takes this tensor out of autograd in place."""

    # -- bound by actorflow.methods from OPERATORS
    def __add__(self, other: _Operand) -> Tensor: ...
    def __radd__(self, other: _Operand) -> Tensor: ...
    def __sub__(self, other: _Operand) -> Tensor: ...
    def __rsub__(self, other: _Operand) -> Tensor: ...
    def __mul__(self, other: _Operand) -> Tensor: ...
    def __rmul__(self, other: _Operand) -> Tensor: ...
    def __truediv__(self, other: _Operand) -> Tensor: ...
    def __rtruediv__(self, other: _Operand) -> Tensor: ...
    def __rpow__(self, other: _Operand) -> Tensor: ...
    def __floordiv__(self, other: _Operand) -> Tensor: ...
    def __rfloordiv__(self, other: _Operand) -> Tensor: ...
    def __mod__(self, other: _Operand) -> Tensor: ...
    def __rmod__(self, other: _Operand) -> Tensor: ...
    def __and__(self, other: _Operand) -> Tensor: ...
    def __rand__(self, other: _Operand) -> Tensor: ...
    def __or__(self, other: _Operand) -> Tensor: ...
    def __ror__(self, other: _Operand) -> Tensor: ...
    def __xor__(self, other: _Operand) -> Tensor: ...
    def __rxor__(self, other: _Operand) -> Tensor: ...
    def __eq__(self, other: _Operand) -> Tensor: ...  # type: ignore[override]
    def __ne__(self, other: _Operand) -> Tensor: ...  # type: ignore[override]
    def __lt__(self, other: _Operand) -> Tensor: ...
    def __le__(self, other: _Operand) -> Tensor: ...
    def __gt__(self, other: _Operand) -> Tensor: ...
    def __ge__(self, other: _Operand) -> Tensor: ...
