"""Indexing ops beyond views: integer-array gather, boolean-mask select and nonzero (their
output shape is known only after compute: dynamic), index_put for ``x[key] = value``, and
class_index, the class-index targets of the losses checked and made safe to gather with.

A key is a tuple of ints, slices, None, Ellipsis, numpy integer arrays and ``Slot(i)``
placeholders for the i-th index tensor input; kernels put the tensors' arrays in the slots.
An index tensor's values are known only when the kernel runs, so kernels check them there:
``x[idx]`` takes -n to n-1 (negative counts from the end, as in PyTorch), while a gather
given ``bounds`` (an embedding's rows) and class targets take only 0 to n-1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..dtype import bool_, int64
from ..errors import DTypeError, IndexOutOfBoundsError, ShapeError
from .common import add_at, host, is_array
from .registry import OpDef, register


class Slot(NamedTuple):
    """Stands in a key for the index tensor at ``ins[first + index]``."""

    index: int


class Bounds(NamedTuple):
    """An ``index`` op's attr, for a gather by one index tensor (the key ``ROWS``): its
    values must be in [0, size), none counting from the end. The kernel's error reads
    ``f"{what} {value} is out of bounds: valid values are in [0, {size}){fix}"``."""

    size: int
    what: str  # the op and the index, e.g. "embedding: index"
    fix: str  # e.g. " (num_embeddings...)": what the size is, how to get in range


ROWS = (Slot(0),)  # the key of a gather by one index tensor (``indexing.take``)


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


_UNSIGNED = {
    np.dtype(t): np.dtype(t).newbyteorder("=").str.replace("i", "u")
    for t in (np.int8, np.int16, np.int32, np.int64)
}


def _nonnegative(arr: np.ndarray) -> np.ndarray:
    """A signed integer array read as unsigned (no copy): a negative value becomes one
    larger than any index, so one ``max`` bounds both sides."""
    u = _UNSIGNED.get(arr.dtype)
    return arr if u is None else arr.view(u)


def _out_of_range(bad: np.ndarray, total: int, size: int, what: str, fix: str):
    """The IndexOutOfBoundsError for ``bad``, the values out of [0, size) among ``total``."""
    more = f" ({bad.size} of {total} values are)" if bad.size > 1 else ""
    return IndexOutOfBoundsError(
        f"{what} {bad.flat[0]} is out of bounds{more}: valid values are in [0, {size}){fix}"
    )


def check_bounds(bounds: Bounds, arr: np.ndarray) -> None:
    """Raises IndexOutOfBoundsError unless every value of the integer array ``arr`` is in
    [0, bounds.size). One pass over ``arr`` when it is."""
    n = bounds.size
    if arr.size and _nonnegative(arr).max() >= n:
        raise _out_of_range(arr[(arr < 0) | (arr >= n)], arr.size, n, bounds.what, bounds.fix)


def _k_index(outs, ins, attrs):
    x = ins[0]
    bounds = attrs.get("bounds")
    if bounds is not None:
        check_bounds(bounds, ins[1])
    key = fill_key(attrs["key"], ins[1:])
    if (
        not isinstance(x, np.ndarray) and bounds is None and any(is_array(k) for k in key)
    ):  # (a device's indexing does not raise on
        check_key("getitem", x.shape, key)  # an index out of bounds: checked first)
    try:
        picked = x[key]
    except IndexError:
        check_key("getitem", x.shape, key)  # raises IndexOutOfBoundsError, naming it
        raise
    outs[0][...] = picked


def _k_masked(outs, ins, attrs):
    x = ins[0]
    key = fill_key(attrs["key"], ins[1:])
    try:
        picked = x[key]
    except IndexError:
        check_key("getitem", x.shape, key)  # a mask of the wrong size, an index out
        raise  # of bounds
    return [np.ascontiguousarray(picked)]


def _k_nonzero(outs, ins, attrs):
    return [np.ascontiguousarray(np.argwhere(ins[0]).astype(np.int64, copy=False))]


def _index_put_infer(metas, attrs):
    # metas: [target, value?, index tensors...]; the target is written in place
    target = metas[0]
    nvalue = attrs["has_value"]
    shape = index_shape("setitem", target.shape, attrs["key"], metas[1 + nvalue :])
    if nvalue and not attrs["masked"]:  # a mask selects a data-dependent count
        v = metas[1].shape
        try:
            np.broadcast_shapes(v, shape)
        except ValueError:
            raise ShapeError(
                f"setitem: cannot assign a value of shape {v} to a selection of shape {shape}"
            ) from None
    return [(target.shape, target.dtype)]


def check_key(op: str, shape: tuple, key: tuple) -> None:
    """Raises IndexOutOfBoundsError if ``key`` cannot index an array of ``shape`` (an index
    out of bounds, a mask of the wrong size). It indexes a zero-stride stand-in, so it reads
    the index arrays only: a kernel calls it before it writes anything."""
    dummy = np.broadcast_to(np.empty((), np.uint8), shape)
    key = tuple(host(k) if is_array(k) else k for k in key)  # (a device's: read here)
    try:
        dummy[key]
    except IndexError as e:
        raise IndexOutOfBoundsError(
            f"{op}: {e} (a tensor of shape {shape}); valid indices of a dimension of size n "
            f"are -n to n-1"
        ) from None


def _k_index_put(outs, ins, attrs):
    # ins: [target, value?, index tensors...]; outs[0] is the target's view, written
    nvalue = attrs["has_value"]
    value = ins[1] if nvalue else attrs["scalar"]
    template = attrs["key"]
    key = fill_key(template, ins[1 + nvalue :])
    o = outs[0]
    for k in template:
        if type(k) is Slot:  # index tensors' values: known only now (the rest of the
            check_key("setitem", o.shape, key)  # key was checked when the op was issued)
            break
    o[key] = value


# Row scatters with this many indices or more sum equal rows after a sort: np.add.at walks
# the indices one row at a time (an embedding's gradient, 2048 rows of 128 float32: 2.4 ms
# add.at, 0.4 ms sorted).
ROWS_BY_SORT = 256


def _rows_key(key, o, value) -> bool:
    """Whether ``o[key] += value`` adds whole rows of ``o`` (contiguous) picked by one
    integer array (``key`` is that array alone), many enough to sort."""
    if len(key) != 1 or o.ndim < 2 or value.dtype != o.dtype or not o.flags.c_contiguous:
        return False
    k = key[0]
    return (
        isinstance(k, np.ndarray)
        and k.dtype.kind in "iu"
        and k.size >= ROWS_BY_SORT
        and value.shape == k.shape + o.shape[1:]
    )


def _add_rows(o, idx, value):
    """``np.add.at(o, idx, value)`` for rows: the rows sorted by index (stable), each run
    of one index summed in order, added once."""
    idx = idx.ravel()
    if idx.min() < 0:
        idx = np.where(idx < 0, idx + o.shape[0], idx)
    rows = value.reshape(idx.size, -1)
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
    sums = np.add.reduceat(rows[order], starts, axis=0)
    o.reshape(o.shape[0], -1)[sorted_idx[starts]] += sums


def _k_index_add(outs, ins, attrs):
    # ins: [x, value, index tensors...]: out = x, then out[key] += value with repeated
    # indices summed (the backward of a gather or a basic index: autograd's rules run it,
    # with the gather's bounds)
    bounds = attrs.get("bounds")
    if bounds is not None:
        check_bounds(bounds, ins[2])
    key = fill_key(attrs["key"], ins[2:])
    o = outs[0]
    check_key("index_add", o.shape, key)
    o[...] = ins[0]
    if _rows_key(key, o, ins[1]):
        _add_rows(o, key[0], ins[1])
    elif any(is_array(k) and k.dtype != np.bool_ for k in key):
        add_at(o, key, ins[1])
    else:
        o[key] += ins[1]  # basic keys and masks select each element once


def _class_index_infer(metas, attrs):
    t = metas[0]
    return [(t.shape, int64), (t.shape, attrs["dtype"])]


def _k_class_index(outs, ins, attrs):
    # ins: [target]; outs: [index: target with ignored entries at 0, keep: 1 or 0]
    t = ins[0]
    index, keep_out = outs
    keep = np.not_equal(t, attrs["ignore_index"])
    classes = attrs["classes"]
    wrong = np.greater_equal(_nonnegative(t), classes)
    wrong &= keep
    if wrong.any():
        bad = t[wrong]
        ignore = attrs["ignore_index"]
        raise _out_of_range(
            bad,
            t.size,
            classes,
            f"{attrs['loss']}: Target",
            f" (the input's {classes} classes; negative targets do not count "
            f"from the end) or ignore_index ({ignore}), whose targets are "
            f"skipped; if {bad.flat[0]} marks targets to skip, pass "
            f"ignore_index={bad.flat[0]}",
        )
    np.multiply(t, keep, out=index)  # an ignored target picks class 0, weighted 0
    np.copyto(keep_out, keep)


register(
    OpDef("index", ("x", "indices*"), _index_infer, {"cpu": _k_index}, attrs=("key", "bounds"))
)
register(
    OpDef(
        "class_index",
        ("target",),
        _class_index_infer,
        {"cpu": _k_class_index},
        outputs=("index", "keep"),
        attrs=("classes", "ignore_index", "dtype", "loss"),
    )
)
register(
    OpDef(
        "index_add",
        ("x", "value", "indices*"),
        lambda metas, attrs: [(metas[0].shape, metas[0].dtype)],
        {"cpu": _k_index_add},
        attrs=("key", "bounds"),
    )
)
register(
    OpDef(
        "masked_index",
        ("x", "indices*"),
        lambda metas, attrs: [(None, metas[0].dtype)],
        {"cpu": _k_masked},
        attrs=("key",),
        dynamic=True,
    )
)
register(
    OpDef(
        "nonzero", ("x",), lambda metas, attrs: [(None, int64)], {"cpu": _k_nonzero}, dynamic=True
    )
)
register(
    OpDef(
        "index_put",
        ("x", "value?", "indices*"),
        _index_put_infer,
        {"cpu": _k_index_put},
        attrs=("key", "masked", "has_value", "scalar"),
    )
)


# -- gather and scatter_add along one dim ---------------------------------------------------
# torch.gather / torch.scatter_add: ``index`` has the input's number of dims; out[i][j] =
# x[index[i][j]][j] (dim 0). Its values must be in [0, n) of ``dim``'s size n (none count from
# the end, as in PyTorch); the kernels check them before they write anything.


def along_shape(op: str, x, dim: int, index, src=None) -> None:
    """Checks the shapes of a gather (``src`` None) or a scatter along ``dim``: the same
    number of dims, and ``index`` no larger than ``x`` (than ``src`` too, for a scatter) in
    every dim but ``dim`` (in every dim, for ``src``)."""
    if index.dtype is not int64:
        raise DTypeError(
            f"{op}(): index must be an int64 tensor, got {index.dtype}; convert "
            f"it with index.long()"
        )
    xs, ix = x.shape, index.shape
    if len(ix) != len(xs) and not (len(ix) <= 1 and len(xs) <= 1):
        raise ShapeError(
            f"{op}(): index has {len(ix)} dims but the input has {len(xs)} "
            f"(index shape {ix}, input shape {xs}); they must have the same "
            f"number of dims"
        )
    for d, (i, s) in enumerate(zip(ix, xs, strict=False)):  # (0-dim against 1-dim: none)
        if d != dim and i > s:
            raise ShapeError(
                f"{op}(): index shape {ix} is larger than the input's {xs} in "
                f"dim {d} ({i} > {s}); only dim {dim} may be larger"
            )
    if src is not None:
        ss = src.shape
        if len(ss) != len(ix) or any(i > s for i, s in zip(ix, ss, strict=True)):
            raise ShapeError(
                f"{op}(): index shape {ix} must be no larger than src's {ss} in "
                f"every dim (and have as many dims)"
            )


def _along(op: str, dim: int, size: int) -> Bounds:
    return Bounds(
        size,
        f"{op}: index",
        f" (the size of dim {dim}); negative indices do not count from the end here",
    )


def _gather_infer(metas, attrs):
    x, index = metas
    along_shape("gather", x, attrs["dim"], index)
    return [(index.shape, x.dtype)]


def _along_key(index: np.ndarray, dim: int) -> tuple:
    """The key that picks ``x[..., index, ...]`` along ``dim`` with the other dims' own
    positions: one broadcast index array per dim (no copies: aranges of one dim each, made
    where ``index`` lives: numpy's, or the device's by ``like=``)."""
    nd = index.ndim
    return tuple(
        index
        if d == dim
        else np.arange(s, like=index).reshape((1,) * d + (s,) + (1,) * (nd - d - 1))
        for d, s in enumerate(index.shape)
    )


def _k_gather(outs, ins, attrs):
    x, index = ins
    dim = attrs["dim"]
    check_bounds(_along("gather", dim, x.shape[dim] if x.ndim else 1), index)
    if x.ndim == 0:
        outs[0][...] = x
        return
    outs[0][...] = x[_along_key(index, dim)]


def _scatter_add_infer(metas, attrs):
    x, index, src = metas
    along_shape("scatter_add", x, attrs["dim"], index, src)
    if src.dtype is not x.dtype:
        raise DTypeError(
            f"scatter_add(): src is {src.dtype} but the input is {x.dtype}; "
            f"cast src with .to({x.dtype})"
        )
    return [(x.shape, x.dtype)]


def _k_scatter_add(outs, ins, attrs):
    x, index, src = ins
    dim = attrs["dim"]
    check_bounds(_along("scatter_add", dim, x.shape[dim] if x.ndim else 1), index)
    o = outs[0]
    o[...] = x
    if x.ndim == 0:
        if index.size:
            o += src
        return
    picked = src[tuple(slice(0, s) for s in index.shape)]
    add_at(o, _along_key(index, dim), picked)


register(OpDef("gather", ("x", "index"), _gather_infer, {"cpu": _k_gather}, attrs=("dim",)))
register(
    OpDef(
        "scatter_add",
        ("x", "index", "src"),
        _scatter_add_infer,
        {"cpu": _k_scatter_add},
        attrs=("dim",),
    )
)
