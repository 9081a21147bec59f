"""``x[key]`` and ``x[key] = value``: basic keys (ints, slices, None, ...) make views;
integer arrays and tensors gather with the ``index`` op; boolean masks select with
``masked_index``, whose output shape is known only after compute. An index tensor may hold
-n to n-1 there (negative counts from the end, as in PyTorch); ``take`` and
``class_targets`` are the gathers whose indices must be 0 to n-1 (an embedding's rows, a
loss's classes), checked by the kernel when the values exist."""

from __future__ import annotations

import numbers

import numpy as np

from . import ops
from .dtype import bool_
from .eager.interpreter import apply
from .ops.index import ROWS, Bounds, Slot
from .tensor import views
from .tensor.tensor import Tensor, viewed, wrap

_INDEX, _MASKED, _PUT = ops.get("index"), ops.get("masked_index"), ops.get("index_put")
_CLASS_INDEX = ops.get("class_index")
_INTP_MAX = np.iinfo(np.intp).max


def _is_basic(k) -> bool:
    return (
        k is None
        or k is Ellipsis
        or isinstance(k, slice)
        or (isinstance(k, numbers.Integral) and not isinstance(k, (bool, np.bool_)))
    )


def _split_key(key):
    """-> (template key with Slots, index tensor impls, has a boolean mask)."""
    items = key if isinstance(key, tuple) else (key,)
    template, impls, masked = [], [], False
    for k in items:
        if isinstance(k, Tensor):
            dtype = k.dtype
            if dtype.is_floating_point:
                raise IndexError(
                    f"tensors used as indices must be long, int or bool, got a "
                    f"tensor of {dtype} (shape {k.shape}); convert it with "
                    f".long()"
                )
            template.append(Slot(len(impls)))
            impls.append(k._impl)
            masked |= dtype is bool_
        elif isinstance(k, (list, np.ndarray)) or isinstance(k, (bool, np.bool_)):
            arr = np.asarray(k)
            if arr.dtype.kind not in "biu":
                raise IndexError(
                    f"tensors used as indices must be long, int or bool, got "
                    f"an array of {arr.dtype}"
                )
            if arr.dtype.kind == "u" and arr.size and arr.max() > _INTP_MAX:
                raise IndexError(
                    f"index {arr.max()} is out of bounds: it does not fit an "
                    f"int64 (an array of {arr.dtype})"
                )
            masked |= arr.dtype.kind == "b"
            template.append(arr if arr.dtype.kind == "b" else arr.astype(np.intp))
        elif _is_basic(k):
            template.append(k)
        else:
            raise IndexError(
                f"only integers, slices, None, Ellipsis, lists, arrays and tensors "
                f"are valid indices, got {type(k).__name__}"
            )
    return tuple(template), impls, masked


def getitem(t: Tensor, key):
    items = key if isinstance(key, tuple) else (key,)
    impl = t._impl
    if all(_is_basic(k) for k in items):
        return viewed(t, views.basic_index(impl, items), "index", items)
    template, impls, masked = _split_key(key)
    op = _MASKED if masked else _INDEX
    return wrap(apply(op, [impl] + impls, {"key": template})[0])


def setitem(t: Tensor, key, value) -> None:
    from .functional import copy_, fill_
    from .functional.common import number as _number
    from .functional.common import readable_on

    items = key if isinstance(key, tuple) else (key,)
    if not isinstance(value, Tensor) and isinstance(value, (list, np.ndarray)):
        from .creation import tensor

        value = tensor(value, dtype=t.dtype, device=t.device)
    if all(_is_basic(k) for k in items):
        target = wrap(views.basic_index(t._impl, items))
        if isinstance(value, Tensor):
            copy_(target, value)
        else:
            fill_(target, _number("setitem", value, "value"))
        return
    template, impls, masked = _split_key(key)
    target = t._impl
    attrs = {"key": template, "masked": masked}
    if isinstance(value, Tensor):
        ins = [target, readable_on("setitem", value._impl, target.meta.device)] + impls
        attrs.update(has_value=1, scalar=None)
    else:
        ins = [target] + impls
        attrs.update(has_value=0, scalar=_number("setitem", value, "value"))
    apply(_PUT, ins, attrs, device=target.meta.device, outs=[target])


def take(t: Tensor, index: Tensor, bounds: Bounds) -> Tensor:
    """``t[index]`` for an integer tensor ``index`` (checked by the caller) whose values
    must be in [0, bounds.size): indices naming rows, which PyTorch does not count from
    the end. Raises (as a KernelError at the next sync point, the values being known only
    when the kernel runs) IndexOutOfBoundsError with ``bounds``' words otherwise."""
    return wrap(apply(_INDEX, [t._impl, index._impl], {"key": ROWS, "bounds": bounds})[0])


def class_targets(target: Tensor, classes: int, ignore_index: int, dtype, loss: str):
    """A loss's class-index ``target`` made safe to gather with: ``(index, keep)``, index the
    target with entries equal to ``ignore_index`` at class 0 (int64), keep 1 where a target
    counts and 0 where it is ignored (in ``dtype``). Every other target must be in
    [0, classes); else (as a KernelError at the next sync point) IndexOutOfBoundsError
    naming ``loss``, the target, the range and ignore_index, poisoning both outputs, so
    everything computed from them reports that one error."""
    attrs = {"classes": classes, "ignore_index": ignore_index, "dtype": dtype, "loss": loss}
    index, keep = apply(_CLASS_INDEX, [target._impl], attrs)
    return wrap(index), wrap(keep)
