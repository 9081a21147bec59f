"""Indexing ops beyond views: integer-array gather, boolean-mask select and nonzero (their
output shape is known only after compute: dynamic), and index_put for ``x[key] = value``.

A key is a tuple of ints, slices, None, Ellipsis, numpy integer arrays and ``Slot(i)``
placeholders for the i-th index tensor input; kernels put the tensors' arrays in the slots.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..dtype import bool_, int64
from ..errors import IndexOutOfBoundsError, ShapeError
from .registry import OpDef, register


class Slot(NamedTuple):
    """Stands in a key for the index tensor at ``ins[first + index]``."""
    index: int


def fill_key(key: tuple, arrays: list) -> tuple:
    return tuple(arrays[k.index] if type(k) is Slot else k for k in key)


def _dummy_key(key: tuple, metas: list) -> tuple:
    out = []
    for k in key:
        if type(k) is Slot:
            m = metas[k.index]
            out.append(np.zeros(m.shape, np.bool_ if m.dtype is bool_ else np.intp))
        else:
            out.append(k)
    return tuple(out)


def index_shape(op: str, shape: tuple, key: tuple, metas: list) -> tuple:
    """The shape of ``x[key]`` computed on a zero-stride stand-in for x (no data read)."""
    dummy = np.broadcast_to(np.empty((), np.uint8), shape)
    try:
        return dummy[_dummy_key(key, metas)].shape
    except IndexError as e:
        raise IndexError(f"{op}: cannot index a tensor of shape {shape}: {e}") from None


def _index_infer(metas, attrs):
    return [(index_shape("index", metas[0].shape, attrs["key"], metas[1:]), metas[0].dtype)]


def _k_index(outs, ins, attrs):
    x = ins[0]
    outs[0][...] = x[fill_key(attrs["key"], ins[1:])]


def _k_masked(outs, ins, attrs):
    x = ins[0]
    return [np.ascontiguousarray(x[fill_key(attrs["key"], ins[1:])])]


def _k_nonzero(outs, ins, attrs):
    return [np.ascontiguousarray(np.argwhere(ins[0]).astype(np.int64, copy=False))]


def _index_put_infer(metas, attrs):
    # metas: [target, value?, index tensors...]; the target is written in place
    target = metas[0]
    nvalue = attrs["has_value"]
    shape = index_shape("setitem", target.shape, attrs["key"], metas[1 + nvalue:])
    if nvalue and not attrs["masked"]:     # a mask selects a data-dependent count
        v = metas[1].shape
        try:
            np.broadcast_shapes(v, shape)
        except ValueError:
            raise ShapeError(f"setitem: cannot assign a value of shape {v} to a selection of "
                             f"shape {shape}") from None
    return [(target.shape, target.dtype)]


def check_key(op: str, shape: tuple, key: tuple) -> None:
    """Raises IndexOutOfBoundsError if ``key`` cannot index an array of ``shape`` (an index
    out of bounds, a mask of the wrong size). It indexes a zero-stride stand-in, so it reads
    the index arrays only: a kernel calls it before it writes anything."""
    dummy = np.broadcast_to(np.empty((), np.uint8), shape)
    try:
        dummy[key]
    except IndexError as e:
        raise IndexOutOfBoundsError(
            f"{op}: {e} (a tensor of shape {shape}); valid indices of a dimension of size n "
            f"are -n to n-1") from None


def _k_index_put(outs, ins, attrs):
    # ins: [target, value?, index tensors...]; outs[0] is the target's view, written
    nvalue = attrs["has_value"]
    value = ins[1] if nvalue else attrs["scalar"]
    template = attrs["key"]
    key = fill_key(template, ins[1 + nvalue:])
    o = outs[0]
    for k in template:
        if type(k) is Slot:          # index tensors' values: known only now (the rest of the
            check_key("setitem", o.shape, key)    # key was checked when the op was issued)
            break
    o[key] = value


def _k_index_add(outs, ins, attrs):
    # ins: [x, value, index tensors...]: out = x, then out[key] += value with repeated
    # indices summed (the backward of a gather or a basic index: autograd's rules run it)
    key = fill_key(attrs["key"], ins[2:])
    o = outs[0]
    check_key("index_add", o.shape, key)
    o[...] = ins[0]
    if any(isinstance(k, np.ndarray) and k.dtype != np.bool_ for k in key):
        np.add.at(o, key, ins[1])
    else:
        o[key] += ins[1]             # basic keys and masks select each element once


register(OpDef("index", ("x", "indices*"), _index_infer, {"cpu": _k_index}, attrs=("key",)))
register(OpDef("index_add", ("x", "value", "indices*"),
               lambda metas, attrs: [(metas[0].shape, metas[0].dtype)], {"cpu": _k_index_add},
               attrs=("key",)))
register(OpDef("masked_index", ("x", "indices*"),
               lambda metas, attrs: [(None, metas[0].dtype)], {"cpu": _k_masked},
               attrs=("key",), dynamic=True))
register(OpDef("nonzero", ("x",), lambda metas, attrs: [(None, int64)], {"cpu": _k_nonzero},
               dynamic=True))
register(OpDef("index_put", ("x", "value?", "indices*"), _index_put_infer,
               {"cpu": _k_index_put}, attrs=("key", "masked", "has_value", "scalar")))
