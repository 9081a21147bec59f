"""Grad rules of the elementwise ops: one per op name, beside its op's family.

A rule is ``fn(ctx, *out_grads) -> one gradient per input`` (None where an input gets
none); it runs under no_grad with actorflow's own functions, so its work is queued on the
VM (or recorded by a tracer) like any other op. ``ctx.x(k)`` / ``ctx.y(k)`` are the saved
inputs / outputs (``saves=`` says which a rule reads), ``ctx.shape(k)`` an input's shape,
``ctx.attrs`` the call's attrs, ``ctx.needs[k]`` whether input k wants a gradient.
Gradients of broadcast inputs are summed back to their shapes here (``sum_to``); the engine
casts a gradient to its input's dtype and device.
"""

from __future__ import annotations

import math

from .. import functional as F
from ..eager.interpreter import apply
from ..ops import get as op_def
from ..tensor import views
from ..tensor.tensor import wrap

RULES: dict = {}


class Rule:
    __slots__ = ("fn", "saves_inputs", "saves_outputs", "unread_written")

    def __init__(self, fn, saves: str, unread_written: bool = False):
        self.fn = fn
        self.saves_inputs = "x" in saves
        self.saves_outputs = "y" in saves
        self.unread_written = unread_written  # never reads an input the op overwrites


def rule(*names, saves: str = "", unread_written: bool = False):
    """Registers ``fn`` as the grad rule of the ops ``names``; ``saves``: "x" (it reads the
    inputs), "y" (the outputs), "xy", or "" (shapes only). An in-place call's input that the
    op overwrites is saved as a copy made before the write, unless ``unread_written``."""

    def register(fn):
        for n in names:
            RULES[n] = Rule(fn, saves, unread_written)
        return fn

    return register


# -- helpers -------------------------------------------------------------------------------


def reshape(t, shape):
    shape = tuple(shape)
    if t.shape == shape:
        return t
    if not t.is_contiguous():
        t = F.clone(t)
    return wrap(views.view(t._impl, shape))


def sum_to(g, shape):
    """``g`` summed over the dims broadcasting added or stretched to reach ``shape``."""
    shape = tuple(shape)
    gs = g.shape
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    dims = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(shape) if s == 1 and gs[i + lead] != 1
    )
    if dims:
        g = F.sum(g, dim=dims, keepdim=True)
    return reshape(g, shape)


def expand_to(g, shape):
    """``g`` broadcast to ``shape`` (a view: no copy)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    return wrap(views.expand(g._impl, shape))


def _float(mask, like):
    return F.cast(mask, like.dtype)


# -- binary --------------------------------------------------------------------------------


@rule("add")
def _add(ctx, g):
    return sum_to(g, ctx.shape(0)), sum_to(g, ctx.shape(1))


@rule("sub")
def _sub(ctx, g):
    return sum_to(g, ctx.shape(0)), (sum_to(F.neg(g), ctx.shape(1)) if ctx.needs[1] else None)


@rule("mul", saves="x")
def _mul(ctx, g):
    a, b = ctx.x(0), ctx.x(1)
    return (
        sum_to(F.mul(g, b), ctx.shape(0)) if ctx.needs[0] else None,
        sum_to(F.mul(g, a), ctx.shape(1)) if ctx.needs[1] else None,
    )


@rule("div", saves="x")
def _div(ctx, g):
    a, b = ctx.x(0), ctx.x(1)
    ga = sum_to(F.div(g, b), ctx.shape(0)) if ctx.needs[0] else None
    gb = sum_to(F.neg(F.div(F.mul(g, a), F.mul(b, b))), ctx.shape(1)) if ctx.needs[1] else None
    return ga, gb


@rule("pow", saves="xy")
def _pow(ctx, g):
    a, b, y = ctx.x(0), ctx.x(1), ctx.y(0)
    ga = gb = None
    if ctx.needs[0]:  # (an exponent of 0 contributes nothing, as
        zero_b = F.eq(b, 0)  # in PyTorch, even at a base of 0: 1 stands in)
        d = F.mul(g, F.mul(b, F.pow(F.where(zero_b, 1.0, a), F.sub(b, 1))))
        ga = sum_to(d, ctx.shape(0))
    if ctx.needs[1]:  # (a base of 0 gives 0, not 0 * -inf)
        zero_a = F.eq(a, 0)
        d = F.mul(g, F.mul(y, F.log(F.where(zero_a, 1.0, a))))
        gb = sum_to(d, ctx.shape(1))
    return ga, gb


def _pick(ctx, g, first: bool):
    """maximum/minimum: the gradient goes to the input that was picked; ties split it."""
    a, b = ctx.x(0), ctx.x(1)
    win = F.gt(a, b) if first else F.lt(a, b)
    tie = F.mul(_float(F.eq(a, b), g), 0.5)
    wa = F.add(_float(win, g), tie)
    ga = sum_to(F.mul(g, wa), ctx.shape(0)) if ctx.needs[0] else None
    gb = sum_to(F.mul(g, F.sub(1.0, wa)), ctx.shape(1)) if ctx.needs[1] else None
    return ga, gb


@rule("maximum", saves="x")
def _maximum(ctx, g):
    return _pick(ctx, g, True)


@rule("minimum", saves="x")
def _minimum(ctx, g):
    return _pick(ctx, g, False)


@rule("remainder", saves="x")
def _remainder(ctx, g):  # a - floor(a / b) * b, away from its jumps
    a, b = ctx.x(0), ctx.x(1)
    ga = sum_to(g, ctx.shape(0)) if ctx.needs[0] else None
    gb = sum_to(F.neg(F.mul(g, F.floor_divide(a, b))), ctx.shape(1)) if ctx.needs[1] else None
    return ga, gb


# -- with a scalar (x op s, and the reflected s op x) --------------------------------------


@rule("add_scalar", "radd_scalar", "sub_scalar", "remainder_scalar")
def _add_s(ctx, g):
    return (g,)


@rule("rsub_scalar")
def _rsub_s(ctx, g):
    return (F.neg(g),)


@rule("mul_scalar", "rmul_scalar")
def _mul_s(ctx, g):
    return (F.mul(g, ctx.attrs["scalar"]),)


@rule("div_scalar")
def _div_s(ctx, g):
    return (F.div(g, ctx.attrs["scalar"]),)


@rule("rremainder_scalar", saves="x")
def _rremainder_s(ctx, g):  # s - floor(s / x) * x
    return (F.neg(F.mul(g, F.floor_divide(ctx.attrs["scalar"], ctx.x(0)))),)


@rule("rdiv_scalar", saves="x")
def _rdiv_s(ctx, g):  # d(s / x) = -s / x^2
    x = ctx.x(0)
    return (F.mul(F.div(g, F.mul(x, x)), -ctx.attrs["scalar"]),)


@rule("pow_scalar", saves="x")
def _pow_s(ctx, g):  # d(x^s) = s x^(s-1)
    s = ctx.attrs["scalar"]
    if s == 0:
        return (F.mul(g, 0.0),)
    return (F.mul(g, F.mul(F.pow(ctx.x(0), s - 1), s)),)


@rule("rpow_scalar", saves="y")
def _rpow_s(ctx, g):  # d(s^x) = s^x log s (0 for s = 0, as PyTorch)
    s = ctx.attrs["scalar"]
    log_s = math.log(s) if s > 0 else (0.0 if s == 0 else math.nan)
    return (F.mul(F.mul(g, ctx.y(0)), log_s),)


@rule(
    "floor_divide",
    "floor_divide_scalar",
    "rfloor_divide_scalar",
    "trunc_divide",
    "trunc_divide_scalar",
    "rtrunc_divide_scalar",
)
def _floor_divide(ctx, g):  # piecewise constant: zero almost everywhere
    return tuple(F.mul(g, 0.0) if ctx.needs[k] else None for k in range(len(ctx.needs)))


@rule("maximum_scalar", "minimum_scalar", "rmaximum_scalar", "rminimum_scalar", saves="x")
def _pick_s(ctx, g):
    x, s = ctx.x(0), ctx.attrs["scalar"]
    win = F.gt(x, s) if ctx.name.endswith("maximum_scalar") else F.lt(x, s)
    w = F.add(_float(win, g), F.mul(_float(F.eq(x, s), g), 0.5))
    return (F.mul(g, w),)


# -- unary ---------------------------------------------------------------------------------


@rule("neg")
def _neg(ctx, g):
    return (F.neg(g),)


@rule("abs", saves="x")
def _abs(ctx, g):
    x = ctx.x(0)
    sign = F.sub(_float(F.gt(x, 0), g), _float(F.lt(x, 0), g))
    return (F.mul(g, sign),)


@rule("exp", saves="y")
def _exp(ctx, g):
    return (F.mul(g, ctx.y(0)),)


@rule("log", saves="x")
def _log(ctx, g):
    return (F.div(g, ctx.x(0)),)


@rule("sqrt", saves="y")
def _sqrt(ctx, g):
    return (F.div(g, F.mul(ctx.y(0), 2.0)),)


@rule("tanh", saves="y")
def _tanh(ctx, g):
    y = ctx.y(0)
    return (F.mul(g, F.sub(1.0, F.mul(y, y))),)


@rule("sin", saves="x")
def _sin(ctx, g):
    return (F.mul(g, F.cos(ctx.x(0))),)


@rule("cos", saves="x")
def _cos(ctx, g):
    return (F.neg(F.mul(g, F.sin(ctx.x(0)))),)


@rule("rsqrt", saves="y")
def _rsqrt(ctx, g):  # d(x^-1/2) = -1/2 x^-3/2 = -1/2 y^3
    y = ctx.y(0)
    return (F.mul(F.mul(g, F.mul(F.mul(y, y), y)), -0.5),)


@rule("erf", saves="x")
def _erf(ctx, g):  # 2/sqrt(pi) exp(-x^2)
    x = ctx.x(0)
    return (F.mul(g, F.mul(F.exp(F.neg(F.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


@rule("sigmoid", saves="y")
def _sigmoid(ctx, g):
    y = ctx.y(0)
    return (F.mul(g, F.mul(y, F.sub(1.0, y))),)


@rule("relu", saves="y")
def _relu(ctx, g):
    return (F.where(F.gt(ctx.y(0), 0), g, 0.0),)


_GELU_BACKWARD, _SILU_BACKWARD = op_def("gelu_backward"), op_def("silu_backward")


def _by_backward_op(op, ctx, g, attrs):
    """An activation's gradient by its backward op (gradient, input), one kernel."""
    x = ctx.x(0)
    if g.dtype is not x.dtype:
        g = F.cast(g, x.dtype)
    return (wrap(apply(op, [g._impl, x._impl], attrs)[0]),)


@rule("gelu", saves="x")
def _gelu(ctx, g):
    return _by_backward_op(
        _GELU_BACKWARD, ctx, g, {"approximate": ctx.attrs.get("approximate", "none")}
    )


@rule("silu", saves="x")
def _silu(ctx, g):
    return _by_backward_op(_SILU_BACKWARD, ctx, g, {})


@rule("clamp", saves="x")
def _clamp(ctx, g):  # to x where min <= x <= max, as PyTorch
    x, lo, hi = ctx.x(0), ctx.attrs.get("min"), ctx.attrs.get("max")
    keep = None
    if lo is not None:
        keep = F.ge(x, lo)
    if hi is not None:
        le = F.le(x, hi)
        keep = le if keep is None else F.logical_and(keep, le)
    return (F.where(keep, g, 0.0),)


@rule("clamp_tensor", saves="x")
def _clamp_tensor(ctx, g):
    """PyTorch's split: x gets the gradient where min <= x <= max, min where x < min (and
    min < max), max where x > max or max < min (max wins then); each summed to its shape."""
    x, bounds = ctx.x(0), ctx.attrs["bounds"]
    if bounds == "both":
        lo, hi = ctx.x(1), ctx.x(2)
        picks = (
            F.logical_and(F.ge(x, lo), F.le(x, hi)),
            F.logical_and(F.lt(x, lo), F.lt(lo, hi)) if ctx.needs[1] else None,
            F.logical_or(F.gt(x, hi), F.lt(hi, lo)) if ctx.needs[2] else None,
        )
    elif bounds == "min":
        lo = ctx.x(1)
        picks = (F.ge(x, lo), F.lt(x, lo))
    else:
        hi = ctx.x(1)
        picks = (F.le(x, hi), F.gt(x, hi))
    return tuple(
        sum_to(F.where(p, g, 0.0), ctx.shape(k)) if ctx.needs[k] and p is not None else None
        for k, p in enumerate(picks)
    )


@rule("cast")
def _cast(ctx, g):
    return (g,)  # (the engine casts it back to the input's dtype)


@rule("copy")
def _copy(ctx, g):  # clone, to(device), copy_ (the source's part)
    return (sum_to(g, ctx.shape(0)),)


@rule("where", saves="x")
def _where(ctx, g):
    cond = ctx.x(0)
    out = [None]
    for k in range(1, len(ctx.needs)):
        if not ctx.needs[k]:
            out.append(None)
            continue
        # the tensor inputs after the condition are x then y (either may be a number)
        is_x = k == 1 and "x" not in ctx.attrs
        picked = F.where(cond, g, 0.0) if is_x else F.where(cond, 0.0, g)
        out.append(sum_to(picked, ctx.shape(k)))
    return tuple(out)


@rule("triu", "tril")
def _triangle(ctx, g):  # the kept triangle's gradient, zeros elsewhere
    tri = F.triu if ctx.name == "triu" else F.tril
    return (tri(g, ctx.attrs["diagonal"]),)
