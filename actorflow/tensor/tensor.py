"""Tensor: the user-facing object, a thin bridge over a TensorImpl.

What is defined here needs nothing above ``tensor/``: metadata and views. What computes or
reads values (ops, operators, ``numpy()``, ``item()``, ``repr``, conversions, indexing) is
bound onto the class by ``actorflow.methods``, the face layer, from its one table; the stub
``tensor.pyi`` declares both halves, so editors and type checkers see every method. Ops
return at once: the work is queued on the VM; reading values waits for the writes before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import DeviceError, ShapeError
from .impl import detached
from .meta import is_contiguous, numel

if TYPE_CHECKING:
    from ..sbp import SBP, Placement


def wrap(impl) -> Tensor:
    t = Tensor.__new__(Tensor)
    t._impl = impl
    return t


GRAD_VIEW: list = [None]  # autograd's recorder of views, set when it is armed


def viewed(t: Tensor, impl, kind: str, arg) -> Tensor:
    """``impl`` (a view of ``t``) as a Tensor; when ``t`` is in autograd, the view gets its
    backward node (``kind``: "reshape", "permute", "expand" or "index"; ``arg`` its key)."""
    out = wrap(impl)
    if t._impl.ag is not None:  # (set only by autograd, so it is armed)
        GRAD_VIEW[0](t, out, kind, arg)
    return out


class Tensor:
    """An n-dimensional array on a device. Make one with ``af.tensor``, ``af.zeros``..."""

    __slots__ = ("_impl", "__weakref__")
    __array_priority__ = 1000  # numpy defers binary operators to Tensor

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError(
            "make tensors with actorflow.tensor(data), actorflow.zeros(...), "
            "actorflow.from_numpy(array), ..."
        )

    # -- metadata -----------------------------------------------------------------------
    @property
    def _meta(self):
        impl = self._impl
        if impl.meta.shape is None:
            self._resolve(impl)  # a value-dependent shape: wait for it
        return impl.meta

    def _wait_shape(self) -> None:
        """Waits for a value-dependent shape (an op's output whose shape is known only once
        it ran); returns at once for any other tensor."""
        impl = self._impl
        if impl.meta.shape is None:
            self._resolve(impl)

    @property
    def shape(self) -> tuple:
        return self._meta.shape

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
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
    def is_global(self) -> bool:
        """Whether this is a global tensor (laid out over a placement's ranks)."""
        return self._impl.meta.device.placed

    @property
    def is_local(self) -> bool:
        return not self._impl.meta.device.placed

    @property
    def placement(self) -> Placement:
        """A global tensor's placement (``af.placement``)."""
        d = self._impl.meta.device
        if not d.placed:
            raise DeviceError(
                f"a local tensor (on {d}) has no placement; make it global with "
                f".to_global(placement, sbp)"
            )
        return d.placement

    @property
    def sbp(self) -> tuple[SBP, ...]:
        """A global tensor's layout over its placement: one ``af.sbp`` per placement axis."""
        d = self._impl.meta.device
        if not d.placed:
            raise DeviceError(
                f"a local tensor (on {d}) has no sbp; make it global with "
                f".to_global(placement, sbp)"
            )
        return d.sbp

    @property
    def ndim(self) -> int:
        return len(self._meta.shape)

    def dim(self) -> int:
        return len(self._meta.shape)

    def numel(self) -> int:
        return numel(self._meta.shape)

    def stride(self, dim: int | None = None) -> tuple[int, ...] | int:
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

    def __hash__(self) -> int:
        return id(self)

    def detach(self) -> Tensor:
        """A tensor sharing this one's storage, outside autograd: writing it in place
        changes this tensor too (as in PyTorch), and a gradient rule that saved this tensor
        then refuses to run on the changed values."""
        impl = self._impl
        if impl.meta.shape is None:
            self._wait_shape()
        return wrap(detached(impl))

    # -- views --------------------------------------------------------------------------
    def view(self, *shape) -> Tensor:
        self._wait_shape()
        return viewed(self, _views().view(self._impl, shape_args(shape)), "reshape", None)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        self._wait_shape()
        out = _views().transpose(self._impl, dim0, dim1)
        order = list(range(len(out.meta.shape)))
        if order:
            a, b = dim0 % len(order), dim1 % len(order)
            order[a], order[b] = order[b], order[a]
        return viewed(self, out, "permute", tuple(order))

    def permute(self, *dims) -> Tensor:
        self._wait_shape()
        dims = shape_args(dims)
        out = _views().permute(self._impl, dims)
        return viewed(self, out, "permute", tuple(d % len(dims) for d in dims))

    @property
    def T(self) -> Tensor:
        nd = self.ndim
        return self.permute(*reversed(range(nd)))

    @property
    def mT(self) -> Tensor:
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> Tensor:
        self._wait_shape()
        return viewed(self, _views().unsqueeze(self._impl, dim), "reshape", None)

    def squeeze(self, dim: int | None = None) -> Tensor:
        self._wait_shape()
        return viewed(self, _views().squeeze(self._impl, dim), "reshape", None)

    def expand(self, *sizes) -> Tensor:
        self._wait_shape()
        return viewed(self, _views().expand(self._impl, shape_args(sizes)), "expand", None)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(*other.shape)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    # The methods that compute or read values (ops, operators, numpy, item, repr,
    # indexing, conversions) are bound by actorflow.methods, the face layer: tensor/
    # imports nothing above itself, and no method here calls one bound there
    # (tests/test_tensor_stub.py checks it). The one call upward is this seam, declared
    # here and bound there: eager.interpreter.resolve, waiting for a value-dependent shape.
    _resolve = None


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
