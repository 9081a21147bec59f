"""Grad rules of convolution and pooling (``ops/conv.py``), as in ``rules.py``: conv2d's
input gradient is conv_transpose2d and its weight gradient the conv2d_weight op, and the
other way round for conv_transpose2d; unfold and fold are each other's gradient; each pool
has a backward op (max_pool2d's reads the indices it saved)."""

from __future__ import annotations

from .. import functional as F
from ..eager.interpreter import apply
from ..ops import get as op_def
from ..tensor.tensor import wrap
from .rules import rule

_CONV, _CONV_T, _CONV_W = op_def("conv2d"), op_def("conv_transpose2d"), op_def("conv2d_weight")
_UNFOLD, _FOLD = op_def("unfold"), op_def("fold")
_MAX_BACK = op_def("max_pool2d_backward")
_AVG_BACK = op_def("avg_pool2d_backward")
_ADAPTIVE_BACK = op_def("adaptive_avg_pool2d_backward")


def _like(g, x):
    return g if g.dtype is x.dtype else F.cast(g, x.dtype)


def _conv(a) -> dict:
    return {
        "stride": a["stride"],
        "padding": a["padding"],
        "dilation": a["dilation"],
        "groups": a["groups"],
    }


def _weight_grad(inp, grad, a, kernel):
    return wrap(apply(_CONV_W, [inp._impl, grad._impl], dict(_conv(a), kernel=kernel))[0])


@rule("conv2d", saves="x")
def _conv2d(ctx, g):
    x, w = ctx.x(0), ctx.x(1)
    g = _like(g, x)
    a = ctx.attrs
    gx = gw = None
    if ctx.needs[0]:
        attrs = dict(_conv(a), output_size=tuple(x.shape[2:]))
        gx = wrap(apply(_CONV_T, [g._impl, w._impl], attrs)[0])
    if ctx.needs[1]:
        gw = _weight_grad(x, g, a, tuple(w.shape[2:]))
    return gx, gw


@rule("conv_transpose2d", saves="x")
def _conv_transpose2d(ctx, g):
    x, w = ctx.x(0), ctx.x(1)
    g = _like(g, x)
    a = ctx.attrs
    gx = None
    if ctx.needs[0]:
        gx = wrap(apply(_CONV, [g._impl, w._impl], _conv(a))[0])
        h, wd = x.shape[2:]
        if tuple(gx.shape[2:]) != (h, wd):  # output_padding past the stride: the rows
            gx = gx[:, :, :h, :wd]  # it added convolve to more than the input
    gw = _weight_grad(g, x, a, tuple(w.shape[2:])) if ctx.needs[1] else None
    return gx, gw


def _blocks(a) -> dict:
    return {
        "kernel": a["kernel"],
        "stride": a["stride"],
        "padding": a["padding"],
        "dilation": a["dilation"],
    }


@rule("unfold")
def _unfold(ctx, g):
    attrs = dict(_blocks(ctx.attrs), output_size=tuple(ctx.shape(0)[2:]))
    return (wrap(apply(_FOLD, [g._impl], attrs)[0]),)


@rule("fold")
def _fold(ctx, g):
    return (wrap(apply(_UNFOLD, [g._impl], _blocks(ctx.attrs))[0]),)


@rule("max_pool2d", saves="y")
def _max_pool2d(ctx, g, _g_indices=None):
    x_hw = tuple(ctx.shape(0)[2:])
    return (wrap(apply(_MAX_BACK, [g._impl, ctx.y(1)._impl], {"input_hw": x_hw})[0]),)


@rule("avg_pool2d")
def _avg_pool2d(ctx, g):
    attrs = dict(ctx.attrs, input_hw=tuple(ctx.shape(0)[2:]))
    return (wrap(apply(_AVG_BACK, [g._impl], attrs)[0]),)


@rule("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(ctx, g):
    return (wrap(apply(_ADAPTIVE_BACK, [g._impl], {"input_hw": tuple(ctx.shape(0)[2:])})[0]),)
