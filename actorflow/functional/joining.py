"""Joining, casting, moving and copying functors: cat, stack, cast, to_device, clone,
nonzero, is_floating_point."""

from __future__ import annotations

from ..backends import get_backend
from ..device import device as as_device
from ..dtype import FLOAT, as_dtype
from ..eager.interpreter import apply
from ..errors import ShapeError
from ..ops.common import normalize_dim
from ..tensor.tensor import Tensor, wrap
from .common import CAST, COPY, NO_ATTRS, no_data, op_def, tensor_arg


# -- joining, casting, copying ---------------------------------------------------------

_CAT, _STACK = op_def("cat"), op_def("stack")


def _tensor_list(name, tensors):
    if isinstance(tensors, Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{name}(): expected a sequence of tensors, got {type(tensors).__name__}")
    ts = [tensor_arg(name, t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    if not ts:
        raise ValueError(f"{name}(): expected a non-empty sequence of tensors")
    return ts


def cat(tensors, dim: int = 0):
    """Joins tensors along an existing dim. Example: ``af.cat([x, y], dim=1)``."""
    ts = _tensor_list("cat", tensors)
    d = normalize_dim("cat", dim, len(ts[0].shape))     # Tensor.shape resolves
    if not ts[0].shape:
        raise ShapeError("cat: zero-dimensional tensor (at position 0) cannot be concatenated; "
                         "use stack, or unsqueeze first")
    return wrap(apply(_CAT, [t._impl for t in ts], {"dim": d})[0])


def stack(tensors, dim: int = 0):
    """Joins equal-shaped tensors along a new dim."""
    ts = _tensor_list("stack", tensors)
    d = normalize_dim("stack", dim, len(ts[0].shape) + 1)
    return wrap(apply(_STACK, [t._impl for t in ts], {"dim": d})[0])


def cast(input, dtype):
    """A copy of ``input`` converted to ``dtype``."""
    impl = tensor_arg("cast", input)._impl
    dt = as_dtype(dtype)
    return wrap(apply(CAST, [impl], {"dtype": dt})[0])


def to_device(input, device):
    """A copy of ``input`` on ``device`` (or ``input`` itself when it is there already)."""
    impl = tensor_arg("to", input)._impl
    dev = as_device(device)
    if dev is impl.meta.device:
        return input
    if not impl.blob.backend.has_data and get_backend(dev).has_data:
        raise no_data("to", impl.meta.device)
    return wrap(apply(COPY, [impl], NO_ATTRS, device=dev)[0])


def clone(input):
    """A contiguous copy with its own storage."""
    impl = tensor_arg("clone", input)._impl
    return wrap(apply(COPY, [impl], NO_ATTRS)[0])


_NONZERO = op_def("nonzero")


def nonzero(input):
    """Indices of the non-zero elements, shape (n, ndim), int64. Its shape is known only
    after compute: reading it (or using it in an op) waits for the kernel."""
    impl = tensor_arg("nonzero", input)._impl
    return wrap(apply(_NONZERO, [impl], NO_ATTRS)[0])


def is_floating_point(input) -> bool:
    return tensor_arg("is_floating_point", input).dtype.category == FLOAT


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "annotations", "namedtuple", "np", "ops", "apply", "resolve", "Tensor", "wrap", "FLOAT",
    "DeviceError", "DTypeError", "ShapeError", "normalize_dim", "normalize_dims", "MinMax",
    "get_backend", "as_device", "as_dtype")]
