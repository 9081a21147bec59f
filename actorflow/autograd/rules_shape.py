"""Grad rules of the ops that change shapes: reductions, softmax-like, batch norm, matmul,
joining, gathers, and the views (reshape, permute, expand, basic indexing), as in ``rules.py``."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..creation import zeros
from ..eager.interpreter import apply
from ..ops import get as op_def
from ..tensor import views
from ..tensor.tensor import wrap
from .rules import expand_to, reshape, rule, sum_to

VIEW_RULES: dict = {}


def _kept(g, in_shape, dims, keepdim):
    """A reduction's gradient with the reduced dims back (size 1) when they were dropped."""
    if keepdim:
        return g
    nd = len(in_shape)
    dims = range(nd) if dims is None else dims
    shape = tuple(1 if i in dims else s for i, s in enumerate(in_shape))
    return reshape(g, shape)


def _count(in_shape, dims) -> int:
    dims = range(len(in_shape)) if dims is None else dims
    n = 1
    for d in dims:
        n *= in_shape[d]
    return n


@rule("sum")
def _sum(ctx, g):
    a, shape = ctx.attrs, ctx.shape(0)
    return (expand_to(_kept(g, shape, a["dims"], a["keepdim"]), shape),)


@rule("mean")
def _mean(ctx, g):
    a, shape = ctx.attrs, ctx.shape(0)
    g = F.div(_kept(g, shape, a["dims"], a["keepdim"]), float(max(1, _count(shape, a["dims"]))))
    return (expand_to(g, shape),)


@rule("amax", "amin", saves="xy")
def _amax(ctx, g):
    a, shape = ctx.attrs, ctx.shape(0)
    x = ctx.x(0)
    y = _kept(ctx.y(0), shape, a["dims"], a["keepdim"])
    hit = F.cast(F.eq(x, y), g.dtype)  # ties share the gradient evenly
    n = F.sum(hit, dim=a["dims"], keepdim=True) if a["dims"] is not None else F.sum(hit)
    g = _kept(g, shape, a["dims"], a["keepdim"])
    return (F.mul(hit, F.div(g, n)),)


@rule("max_dim", "min_dim", saves="y")
def _max_dim(ctx, g, _g_indices=None):
    a, shape = ctx.attrs, ctx.shape(0)
    d = a["dim"]
    idx = _kept(ctx.y(1), shape, (d,), a["keepdim"])
    g = _kept(g, shape, (d,), a["keepdim"])
    pos = F.cast(F.eq(_arange_along(shape, d, idx.device), idx), g.dtype)
    return (F.mul(pos, g),)


def _arange_along(shape, d, device):
    from ..creation import arange

    r = arange(shape[d], device=device)
    return reshape(r, tuple(shape[d] if i == d else 1 for i in range(len(shape))))


_SOFTMAX_BACKWARD = op_def("softmax_backward")


@rule("softmax", saves="y")
def _softmax(ctx, g):  # (g - sum(g * y)) * y, one op
    y = ctx.y(0)
    if g.dtype is not y.dtype:
        g = F.cast(g, y.dtype)
    return (wrap(apply(_SOFTMAX_BACKWARD, [g._impl, y._impl], {"dim": ctx.attrs["dim"]})[0]),)


@rule("log_softmax", saves="y")
def _log_softmax(ctx, g):
    y, d = ctx.y(0), ctx.attrs["dim"]
    return (F.sub(g, F.mul(F.exp(y), F.sum(g, dim=d, keepdim=True))),)


_BATCH_NORM_BACKWARD = op_def("batch_norm_backward")


@rule("batch_norm", saves="xy")
def _batch_norm(ctx, g, _g_mean=None, _g_var=None):
    """PyTorch's closed form, one op (``batch_norm_backward``). The statistics the op also
    returns (mean, biased var) get no gradient, as PyTorch's saved statistics: the caller
    reads them only to update running ones, under no_grad."""
    x = ctx.x(0)
    has_w, has_b = ctx.attrs["affine"]
    ins = [g._impl, x._impl, ctx.y(1)._impl, ctx.y(2)._impl]
    if has_w:
        ins.append(ctx.x(1)._impl)
    gx, gw, gb = (wrap(t) for t in apply(_BATCH_NORM_BACKWARD, ins, {"eps": ctx.attrs["eps"]}))
    out = [gx if ctx.needs[0] else None]
    if has_w:
        out.append(gw if ctx.needs[len(out)] else None)
    if has_b:
        out.append(gb if ctx.needs[len(out)] else None)
    return tuple(out)


_LAYER_NORM_BACKWARD = op_def("layer_norm_backward")


@rule("layer_norm", saves="xy")
def _layer_norm(ctx, g, _g_mean=None, _g_rstd=None):
    """One op (``layer_norm_backward``) from the row statistics the forward returned; those
    get no gradient (they are read by the backward only)."""
    x = ctx.x(0)
    has_w, has_b = ctx.attrs["affine"]
    if g.dtype is not x.dtype:
        g = F.cast(g, x.dtype)
    ins = [g._impl, x._impl, ctx.y(1)._impl, ctx.y(2)._impl]
    if has_w:
        ins.append(ctx.x(1)._impl)
    gx, gw, gb = (wrap(t) for t in apply(_LAYER_NORM_BACKWARD, ins, {"dims": ctx.attrs["dims"]}))
    out = [gx if ctx.needs[0] else None]
    if has_w:
        out.append(gw if ctx.needs[len(out)] else None)
    if has_b:
        out.append(gb if ctx.needs[len(out)] else None)
    return tuple(out)


def _mT(t):
    return wrap(views.transpose(t._impl, -2, -1))


@rule("matmul", saves="x")
def _matmul(ctx, g):
    a, b = ctx.x(0), ctx.x(1)
    sa, sb = ctx.shape(0), ctx.shape(1)
    if len(sa) == 1 and len(sb) == 1:  # a dot product
        return (F.mul(g, b) if ctx.needs[0] else None, F.mul(g, a) if ctx.needs[1] else None)
    a2 = reshape(a, (1,) + sa) if len(sa) == 1 else a
    b2 = reshape(b, sb + (1,)) if len(sb) == 1 else b
    gshape = list(g.shape)
    if len(sa) == 1:
        gshape.insert(len(gshape) - (0 if len(sb) == 1 else 1), 1)
    if len(sb) == 1:
        gshape.append(1)
    g2 = reshape(g, tuple(gshape))
    ga = gb = None
    if ctx.needs[0]:
        ga = reshape(sum_to(F.matmul(g2, _mT(b2)), a2.shape), sa)
    if ctx.needs[1]:
        if len(sb) == 2 and len(gshape) == 2 and _transposed(b):
            # b is a transposed view (Linear's weight.T): give its gradient the same layout,
            # so the view's backward hands the weight a contiguous gradient (no copy)
            gb = _mT(F.matmul(_mT(g2), a2))
        else:
            gb = reshape(sum_to(F.matmul(_mT(a2), g2), b2.shape), sb)
    return ga, gb


def _transposed(t) -> bool:
    m = t._impl.meta
    return len(m.shape) == 2 and m.strides == (1, m.shape[0]) and m.shape[0] > 1


@rule("cat")
def _cat(ctx, g):
    d = ctx.attrs["dim"]
    out, start = [], 0
    for k in range(len(ctx.needs)):
        n = ctx.shape(k)[d]
        key = (slice(None),) * d + (slice(start, start + n),)
        out.append(wrap(views.basic_index(g._impl, key)) if ctx.needs[k] else None)
        start += n
    return tuple(out)


@rule("stack")
def _stack(ctx, g):
    d = ctx.attrs["dim"]
    return tuple(
        wrap(views.basic_index(g._impl, (slice(None),) * d + (k,))) if ctx.needs[k] else None
        for k in range(len(ctx.needs))
    )


_INDEX_ADD = op_def("index_add")


@rule("index", "masked_index", saves="x")
def _index(ctx, g):
    """A gather's gradient: zeros of the input's shape, the gradient added at the gathered
    positions (repeated ones summed). A gather's ``bounds`` hold here too: the gradient
    does not read the failed gather's output, so it checks the indices itself rather than
    add at a wrapped position."""
    x = ctx.x(0)
    z = zeros(ctx.shape(0), dtype=x.dtype, device=x.device)
    if g.dtype is not x.dtype:
        g = F.cast(g, x.dtype)
    idx = [ctx.x(k)._impl for k in range(1, len(ctx.needs))]
    attrs = {"key": ctx.attrs["key"], "bounds": ctx.attrs.get("bounds")}
    gx = wrap(apply(_INDEX_ADD, [z._impl, g._impl] + idx, attrs)[0])
    return (gx,) + (None,) * len(idx)


_PUT = op_def("index_put")


@rule("index_put", saves="x", unread_written=True)
def _index_put(ctx, g):
    """``x[key] = value`` (written in place into x): x's gradient is g with the written
    positions zeroed, value's the gradient at those positions, summed to its shape."""
    a = ctx.attrs
    nv = a["has_value"]
    idx = [ctx.x(k)._impl for k in range(1 + nv, len(ctx.needs))]
    out = [None] * len(ctx.needs)
    if ctx.needs[0]:
        gx = F.clone(g)
        apply(
            _PUT,
            [gx._impl] + idx,
            {"key": a["key"], "masked": a["masked"], "has_value": 0, "scalar": 0},
            outs=[gx._impl],
        )
        out[0] = gx
    if nv and ctx.needs[1]:
        op = op_def("masked_index" if a["masked"] else "index")
        picked = wrap(apply(op, [g._impl] + idx, {"key": a["key"]})[0])
        out[1] = sum_to(picked, ctx.shape(1))
    return tuple(out)


# -- views ---------------------------------------------------------------------------------


def _view_reshape(ctx, g):
    return (reshape(g, ctx.shape(0)),)


def _view_permute(ctx, g):
    order = ctx.attrs["key"]  # view dim i is input dim order[i]
    inverse = tuple(int(i) for i in np.argsort(order))
    return (wrap(views.permute(g._impl, inverse)),)


def _view_expand(ctx, g):
    return (sum_to(g, ctx.shape(0)),)


def _view_index(ctx, g):
    base = ctx.node.ins[0]
    z = zeros(base.shape, dtype=base.dtype, device=base.device)
    if g.dtype is not base.dtype:
        g = F.cast(g, base.dtype)
    return (wrap(apply(_INDEX_ADD, [z._impl, g._impl], {"key": tuple(ctx.attrs["key"])})[0]),)


class _ViewRule:
    __slots__ = ("fn", "saves_inputs", "saves_outputs", "unread_written")

    def __init__(self, fn):
        self.fn = fn
        self.saves_inputs = self.saves_outputs = self.unread_written = False


VIEW_RULES.update(
    reshape=_ViewRule(_view_reshape),
    permute=_ViewRule(_view_permute),
    expand=_ViewRule(_view_expand),
    index=_ViewRule(_view_index),
)


# -- gathers and scatters along a dim, cumsum, sort/topk, pad --------------------------------

_GATHER, _SCATTER_ADD, _CUMSUM = op_def("gather"), op_def("scatter_add"), op_def("cumsum")
_PAD, _PAD_BACKWARD = op_def("pad"), op_def("pad_backward")


def _scatter_into_zeros(shape, dtype, device, dim, index, g):
    """zeros(shape) with ``g`` added at ``index`` along ``dim`` (the scatter_add that is a
    gather's gradient; its kernel checks the index's bounds, as the gather's did)."""
    z = zeros(shape, dtype=dtype, device=device)
    if g.dtype is not dtype:
        g = F.cast(g, dtype)
    return wrap(apply(_SCATTER_ADD, [z._impl, index._impl, g._impl], {"dim": dim})[0])


@rule("gather", saves="x")
def _gather(ctx, g):
    x = ctx.x(0)
    return (
        _scatter_into_zeros(ctx.shape(0), x.dtype, x.device, ctx.attrs["dim"], ctx.x(1), g),
        None,
    )


@rule("scatter_add", saves="x", unread_written=True)
def _scatter_add(ctx, g):
    """The input's gradient is g; src's is g gathered at the index, zero where src reaches
    past the index's shape."""
    gsrc = None
    if ctx.needs[2]:
        index = ctx.x(1)
        gsrc = wrap(apply(_GATHER, [g._impl, index._impl], {"dim": ctx.attrs["dim"]})[0])
        src_shape = ctx.shape(2)
        if gsrc.shape != src_shape:
            pads = tuple((0, s - n) for s, n in zip(src_shape, gsrc.shape, strict=True))
            gsrc = wrap(
                apply(_PAD, [gsrc._impl], {"pads": pads, "mode": "constant", "value": 0.0})[0]
            )
    return (g if ctx.needs[0] else None), None, gsrc


@rule("cumsum")
def _cumsum(ctx, g):
    a = ctx.attrs
    if len(ctx.shape(0)) == 0:
        return (g,)
    return (
        wrap(
            apply(
                _CUMSUM, [g._impl], {"dim": a["dim"], "reverse": not a["reverse"], "dtype": None}
            )[0]
        ),
    )


@rule("sort", "topk", saves="y")
def _sort(ctx, g, _g_indices=None):
    """The values' gradient scattered back through the indices."""
    if len(ctx.shape(0)) == 0:
        return (g,)
    return (_scatter_into_zeros(ctx.shape(0), g.dtype, g.device, ctx.attrs["dim"], ctx.y(1), g),)


@rule("pad")
def _pad(ctx, g):
    """Constant padding's gradient is the pad by the negated amounts (the padding cut off,
    zeros where the input was cropped); the other modes' sums g back through their maps."""
    a = ctx.attrs
    if a["mode"] == "constant":
        neg = tuple((-b, -e) for b, e in a["pads"])
        return (wrap(apply(_PAD, [g._impl], {"pads": neg, "mode": "constant", "value": 0.0})[0]),)
    return (
        wrap(
            apply(
                _PAD_BACKWARD,
                [g._impl],
                {"pads": a["pads"], "mode": a["mode"], "shape": tuple(ctx.shape(0))},
            )[0]
        ),
    )
