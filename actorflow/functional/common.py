"""What every functor shares: op lookup and argument checks with clear messages."""

from __future__ import annotations

import numpy as np

from .. import ops
from ..eager.interpreter import resolve
from ..errors import DeviceError
from ..tensor.tensor import Tensor

NO_ATTRS: dict = {}
NUMBER = (bool, int, float)


def op_def(name):
    """The OpDef called ``name``."""
    return ops.get(name)


def number(op: str, value, arg: str = "other"):
    """A Python scalar from a bool/int/float or a numpy scalar; TypeError otherwise."""
    if type(value) in NUMBER:
        return value
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    raise TypeError(f"{op}(): argument '{arg}' must be a Tensor or a number, "
                    f"not {type(value).__name__}")


def tensor_arg(op: str, value, arg: str = "input") -> Tensor:
    if isinstance(value, Tensor):
        return value
    raise TypeError(f"{op}(): argument '{arg}' must be a Tensor, not {type(value).__name__}")


def tensor_like(value, like: Tensor) -> Tensor:
    from ..creation import tensor
    return tensor(value, device=like.device)


def resolved(impl):
    """The impl's meta, waiting for compute when its shape is known only after it."""
    if impl.meta.shape is None:
        resolve(impl)
    return impl.meta


def no_data(op, device):
    return DeviceError(f"{op}: the {device} device has no data to read; null tensors have only "
                       f"shapes, dtypes and bytes (use cpu for values)")


COPY = op_def("copy")
CAST = op_def("cast")
