"""Joining, casting, moving and copying functors: cat, stack, cast, to_device, clone,
nonzero, is_floating_point."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, overload

from ..backends import get_backend
from ..device import _DeviceLike
from ..device import device as as_device
from ..dtype import FLOAT, _DTypeLike, as_dtype
from ..eager.interpreter import apply, apply1
from ..errors import ShapeError
from ..ops.common import normalize_dim
from ..ops.shape import promote_all
from ..tensor import views
from ..tensor.tensor import Tensor, wrap
from .common import (
    CAST,
    COPY,
    NO_ATTRS,
    check_memory_format,
    dim_alias,
    no_data,
    op_def,
    readable_on,
    refuse_out,
    resolved,
    tensor_arg,
)

# -- joining, casting, copying ---------------------------------------------------------

_CAT, _STACK = op_def("cat"), op_def("stack")


def _tensor_list(name, tensors):
    if isinstance(tensors, Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{name}(): expected a sequence of tensors, got {type(tensors).__name__}")
    ts = [tensor_arg(name, t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    if not ts:
        raise ValueError(f"{name}(): expected a non-empty sequence of tensors")
    return ts


def cat(
    tensors: Iterable[Tensor], dim: int = 0, *, out: None = None, axis: int | None = None
) -> Tensor:
    """Joins tensors along an existing dim. Example: ``af.cat([x, y], dim=1)``.

    As in PyTorch, 1-dim empty tensors (shape ``(0,)``, any dtype) are skipped when the
    others have other shapes (their dtypes still count in the result's); ``axis`` is
    ``dim``'s numpy name; ``out=`` is refused."""
    if out is not None:
        refuse_out("cat", out)
    dim = dim_alias("cat", dim, axis, 0)
    ts = _tensor_list("cat", tensors)
    for t in ts:
        shape = resolved(t._impl).shape
        if len(shape) < 2 and (not shape or not shape[0]):  # (0,) or ()
            return _cat_skipping(ts, dim)
    d = normalize_dim("cat", dim, len(ts[0]._impl.meta.shape))
    return wrap(apply(_CAT, [t._impl for t in ts], {"dim": d})[0])


def _cat_skipping(ts, dim):
    """cat with 1-dim empty inputs (skipped; their dtypes still count in the result's), or
    with 0-dim inputs (refused, naming the first)."""
    metas = [t._impl.meta for t in ts]
    shapes = [m.shape for m in metas]
    keep = [i for i, s in enumerate(shapes) if s != (0,)]
    attrs = {}
    if not keep:  # all empty: joined along their dim
        keep, dim = list(range(len(ts))), 0
    elif len(keep) < len(ts):
        attrs["dtype"] = promote_all(metas)
    for i in keep:
        if not shapes[i]:
            raise ShapeError(
                f"cat: zero-dimensional tensor (at position {i}) cannot be "
                f"concatenated; use stack, or unsqueeze first"
            )
    attrs["dim"] = normalize_dim("cat", dim, len(shapes[keep[0]]))
    return wrap(apply(_CAT, [ts[i]._impl for i in keep], attrs)[0])


def stack(
    tensors: Iterable[Tensor], dim: int = 0, *, out: None = None, axis: int | None = None
) -> Tensor:
    """Joins equal-shaped tensors along a new dim (``axis``: ``dim``'s numpy name;
    ``out=`` is refused)."""
    if out is not None:
        refuse_out("stack", out)
    dim = dim_alias("stack", dim, axis, 0)
    ts = _tensor_list("stack", tensors)
    d = normalize_dim("stack", dim, len(ts[0].shape) + 1)
    return wrap(apply(_STACK, [t._impl for t in ts], {"dim": d})[0])


def cast(input: Tensor, dtype: _DTypeLike) -> Tensor:
    """A copy of ``input`` converted to ``dtype``."""
    impl = tensor_arg("cast", input)._impl
    dt = as_dtype(dtype)
    return wrap(apply1(CAST, impl, None, {"dtype": dt}, dt))  # (the dtype: the attrs' key)


def to_device(input: Tensor, device: _DeviceLike) -> Tensor:
    """A copy of ``input`` on ``device`` (or ``input`` itself when it is there already)."""
    x = tensor_arg("to", input)
    impl = x._impl
    dev = as_device(device)
    if dev is x.device:
        return input
    if dev.placed or x.device.placed:  # to or from a global tensor's layout
        return wrap(apply(COPY, [impl], NO_ATTRS, device=dev)[0])
    dst = get_backend(dev)
    if not impl.blob.backend.has_data and dst.has_data:
        raise no_data("to", x.device)
    moved = readable_on("to", impl, dev)
    if moved is not impl:
        return wrap(moved)  # across the host boundary (cuda)
    return wrap(apply(COPY, [impl], NO_ATTRS, device=dev)[0])


def to_where(input: Tensor, other: Tensor) -> Tensor:
    """``input`` where ``other`` is (``input`` itself when it is there already): on its
    device; for a global ``other``, laid out as it on its placement and held by the same
    ranks (a 0-d ``input`` broadcast, having no dim to split; a global ``input`` on another
    placement or other ranks brought here whole first; made on ``other``'s kind of ranks,
    whatever this thread's is). What an optimizer's state tensor is made to be for its
    parameter."""
    from ..parallel.ranks import ranks_here
    from ..sbp import broadcast, layout

    x = tensor_arg("to", input)
    if is_where(x, other):
        return input
    whole = to_device(x, "cpu") if x.is_global else x
    if not other.is_global:
        return to_device(whole, other.device)
    ranks: Any = other._impl.blob.ranks  # type: ignore[attr-defined]  # (a GlobalBlob's)
    with ranks_here(ranks.kind):  # (made there: ranks_of(placement) under that kind)
        if whole.ndim == 0:
            return to_device(whole, layout(other.placement, (broadcast,)))
        return to_device(whole, other.device)


def is_where(input: Tensor, other: Tensor) -> bool:
    """Whether ``input`` is where ``to_where`` puts it for ``other``."""
    if not other.is_global:
        return not input.is_global and input.device == other.device
    if not input.is_global or input.placement != other.placement:
        return False
    if getattr(input._impl.blob, "ranks", 0) is not getattr(other._impl.blob, "ranks", None):
        return False
    return input.ndim == 0 or input.device == other.device


def clone(input: Tensor, *, memory_format: Any = None) -> Tensor:
    """A contiguous copy with its own storage (``memory_format``: None, or PyTorch's
    preserve_format or contiguous_format, which ask the same here)."""
    if memory_format is not None:
        check_memory_format("clone", memory_format)
    impl = tensor_arg("clone", input)._impl
    return wrap(apply(COPY, [impl], NO_ATTRS)[0])


_NONZERO = op_def("nonzero")


@overload
def nonzero(input: Tensor, *, out: None = None, as_tuple: Literal[False] = False) -> Tensor: ...
@overload
def nonzero(input: Tensor, *, out: None = None, as_tuple: Literal[True]) -> tuple[Tensor, ...]: ...
@overload
def nonzero(
    input: Tensor, *, out: None = None, as_tuple: bool = False
) -> Tensor | tuple[Tensor, ...]: ...


def nonzero(
    input: Tensor, *, out: None = None, as_tuple: bool = False
) -> Tensor | tuple[Tensor, ...]:
    """Indices of the non-zero elements, shape (n, ndim), int64. Its shape is known only
    after compute: reading it (or using it in an op) waits for the kernel.

    ``as_tuple=True``: a tuple of ndim 1-dim index tensors, one per dim (one for a 0-dim
    input), as in PyTorch; making them waits for the kernel. ``out=`` is refused."""
    if out is not None:
        refuse_out("nonzero", out)
    impl = tensor_arg("nonzero", input)._impl
    if not as_tuple:
        return wrap(apply(_NONZERO, [impl], NO_ATTRS)[0])
    if not resolved(impl).shape:  # a 0-dim input counts as 1-dim
        impl = views.view(impl, (1,))
    idx = apply(_NONZERO, [impl], NO_ATTRS)[0]
    resolved(idx)
    return tuple(
        wrap(views.basic_index(idx, (slice(None), k))) for k in range(len(resolved(impl).shape))
    )


def is_floating_point(input: Tensor) -> bool:
    return tensor_arg("is_floating_point", input).dtype.category == FLOAT


__all__ = [
    n
    for n in dir()
    if not n.startswith("_")
    and n
    not in (
        "annotations",
        "Any",
        "Iterable",
        "Literal",
        "overload",
        "namedtuple",
        "np",
        "ops",
        "apply",
        "resolve",
        "Tensor",
        "wrap",
        "FLOAT",
        "DeviceError",
        "DTypeError",
        "ShapeError",
        "normalize_dim",
        "normalize_dims",
        "MinMax",
        "get_backend",
        "as_device",
        "as_dtype",
        "promote_all",
        "views",
        "dim_alias",
        "refuse_out",
        "resolved",
        "check_memory_format",
        "readable_on",
    )
]
