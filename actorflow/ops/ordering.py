"""Scans and orderings along one dim: cumsum (forward, or from the end: ``reverse``, its
gradient), sort (stable: equal values keep their order, descending too, as PyTorch's
``stable=True``; NaN sorts above every number) and topk (the first k of that sort)."""

from __future__ import annotations

import numpy as np

from ..dtype import BOOL, INT, int64
from ..errors import ShapeError
from .registry import OpDef, register


def _cumsum_infer(metas, attrs):
    m = metas[0]
    dtype = attrs["dtype"] or (int64 if m.dtype.category in (BOOL, INT) else m.dtype)
    return [(m.shape, dtype)]


def _k_cumsum(outs, ins, attrs):
    x, o = ins[0], outs[0]
    if x.ndim == 0:
        o[...] = x
        return
    dim = attrs["dim"]
    acc = np.float32 if o.dtype == np.float16 else o.dtype  # half sums in float32, as PyTorch
    if attrs["reverse"]:
        flip = (slice(None),) * dim + (slice(None, None, -1),)
        o[flip] = np.cumsum(x[flip], axis=dim, dtype=acc)
    elif acc is o.dtype:
        np.cumsum(x, axis=dim, dtype=acc, out=o)
    else:
        o[...] = np.cumsum(x, axis=dim, dtype=acc)


register(
    OpDef("cumsum", ("x",), _cumsum_infer, {"cpu": _k_cumsum}, attrs=("dim", "reverse", "dtype"))
)


def sort_order(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """The indices that sort ``x`` along ``dim``, stably: equal values keep their order
    (descending: the reversed stable sort of the reversed array, so ties still come first
    to first)."""
    if not descending:
        return np.argsort(x, axis=dim, kind="stable")
    flip = (slice(None),) * dim + (slice(None, None, -1),)
    order = np.argsort(x[flip], axis=dim, kind="stable")[flip]
    return (x.shape[dim] - 1) - order


def _sort_infer(metas, attrs):
    m = metas[0]
    return [(m.shape, m.dtype), (m.shape, int64)]


def _k_sort(outs, ins, attrs):
    x = ins[0]
    if x.ndim == 0:
        outs[0][...] = x
        outs[1][...] = 0
        return
    dim = attrs["dim"]
    order = sort_order(x, dim, attrs["descending"])
    k = attrs.get("k")
    if k is not None:
        order = order[(slice(None),) * dim + (slice(0, k),)]
    outs[0][...] = np.take_along_axis(x, order, axis=dim)
    outs[1][...] = order


def _topk_infer(metas, attrs):
    m = metas[0]
    dim, k = attrs["dim"], attrs["k"]
    size = m.shape[dim] if m.shape else 1
    if not 0 <= k <= size:
        raise ShapeError(
            f"topk: k ({k}) is out of range for dim {dim} of size {size} (input "
            f"shape {m.shape}); pass k in [0, {size}]"
        )
    shape = m.shape[:dim] + (k,) + m.shape[dim + 1 :] if m.shape else ()
    return [(shape, m.dtype), (shape, int64)]


register(
    OpDef(
        "sort",
        ("x",),
        _sort_infer,
        {"cpu": _k_sort},
        outputs=("values", "indices"),
        attrs=("dim", "descending"),
    )
)
# topk: the first k of the stable sort (largest: descending); ``sorted=False`` is allowed
# any order by PyTorch, and gets this one
register(
    OpDef(
        "topk",
        ("x",),
        _topk_infer,
        {"cpu": _k_sort},
        outputs=("values", "indices"),
        attrs=("dim", "descending", "k"),
    )
)
