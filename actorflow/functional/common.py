"""What every functor shares: op lookup and argument checks with clear messages."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from .. import ops
from ..backends import get_backend
from ..dtype import _Number
from ..eager.interpreter import resolve, transfer
from ..errors import DeviceError
from ..tensor.tensor import Tensor

NO_ATTRS: dict = {}

# What the functions take, as Tensor's stub (tensor/tensor.pyi) spells it: an operand of an
# elementwise op (a tensor, a Python or numpy scalar, or an array made a tensor), the dims
# of a reduction
_Operand: TypeAlias = Tensor | _Number | np.ndarray | np.generic
_Dims: TypeAlias = int | tuple[int, ...] | list[int]
NUMBER = (bool, int, float)


def op_def(name):
    """The OpDef called ``name``."""
    return ops.get(name)


def number(op: str, value: Any, arg: str = "other") -> _Number:
    """A Python scalar from a bool/int/float or a numpy scalar; TypeError otherwise."""
    if type(value) in NUMBER:
        return value
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    raise TypeError(
        f"{op}(): argument '{arg}' must be a Tensor or a number, not {type(value).__name__}"
    )


def tensor_arg(op: str, value: Any, arg: str = "input") -> Tensor:
    if isinstance(value, Tensor):
        return value
    raise TypeError(f"{op}(): argument '{arg}' must be a Tensor, not {type(value).__name__}")


def refuse_out(op: str, out):
    """TypeError for ``out=``, which the functions take (PyTorch's signatures) and refuse:
    actorflow ops return new tensors."""
    raise TypeError(
        f"{op}(): out= is not supported (got {type(out).__name__}); actorflow ops "
        f"return a new tensor: assign the result, or write it into an existing "
        f"tensor with out.copy_({op}(...))"
    )


def dim_alias(op: str, dim, axis, default=None):
    """``dim``, or ``axis`` (the numpy name PyTorch also takes) when given instead."""
    if axis is None:
        return dim
    if dim is not default:
        raise TypeError(f"{op}(): got dim={dim!r} and its alias axis={axis!r}; pass one")
    return axis


def keepdim_alias(op: str, keepdim, keepdims):
    """``keepdim``, or ``keepdims`` (the numpy name PyTorch also takes) when given."""
    if keepdims is None:
        return keepdim
    if keepdim:
        raise TypeError(f"{op}(): got keepdim and its alias keepdims; pass one")
    return keepdims


_LAYOUTS_KEPT = {
    "torch.preserve_format",
    "torch.contiguous_format",
    "contiguous_format",
    "preserve_format",
}


def check_memory_format(op: str, value) -> None:
    """Checks a ``memory_format=``: actorflow's results are row-major (contiguous), which
    is what None, PyTorch's preserve_format and contiguous_format ask of a new tensor;
    another (channels_last...) is refused, naming it."""
    if value is None or str(value) in _LAYOUTS_KEPT:
        return
    raise ValueError(
        f"{op}(): memory_format={value} is not supported; actorflow tensors are "
        f"row-major (contiguous): leave memory_format out"
    )


def broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (a mask to the tensor it masks)."""
    if len(shape) > len(target):
        return False
    return all(
        s in (1, t) for s, t in zip(tuple(shape)[::-1], tuple(target)[::-1], strict=False)
    )  # trailing dims


def tensor_like(value, like: Tensor) -> Tensor:
    from ..creation import tensor

    return tensor(value, device=like.device)


def resolved(impl):
    """The impl's meta, waiting for compute when its shape is known only after it."""
    if impl.meta.shape is None:
        resolve(impl)
    return impl.meta


def no_data(op, device):
    return DeviceError(
        f"{op}: the {device} device has no data to read; null tensors have only "
        f"shapes, dtypes and bytes (use cpu for values)"
    )


def readable_on(name: str, impl, device):
    """``impl`` where an op on ``device`` can read it as it is (the same device, host memory
    on both sides as cpu and null, or a side without data), else its copy on ``device`` made
    by the transfer across the host boundary, as ``.to(device)`` makes it: what ``to``, and a
    copy into a tensor of ``device`` (``copy_``, ``x[...] = v``), read from another device.
    ``name``: the op, for errors.

    Raises:
        DeviceError: both devices have their own memory (cuda:0 and cuda:1): the message
            names the op, the devices and the way through the host."""
    if impl.meta.device is device or device.placed or impl.meta.device.placed:
        return impl  # (to or from a global tensor: the global interpreter converts)
    src, dst = impl.blob.backend, get_backend(device)
    if not (src.has_data and dst.has_data) or (src.host_memory and dst.host_memory):
        return impl
    return transfer(impl, device, name)


COPY = op_def("copy")
CAST = op_def("cast")
