"""Neural-network ops: softmax and log_softmax along a dim (numerically stable), and the
backward of gelu (autograd's rule for gelu runs it)."""

from __future__ import annotations

import numpy as np

from ..dtype import FLOAT
from ..errors import DTypeError
from .elementwise import _erf
from .registry import OpDef, register


def _softmax_infer(op):
    def infer(metas, attrs):
        m = metas[0]
        if m.dtype.category != FLOAT:
            raise DTypeError(f"{op}: needs a floating point tensor, got {m.dtype}; "
                             f"convert with .float() first")
        return [(m.shape, m.dtype)]
    return infer


def _shifted(x, dim):
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    if x.ndim == 0 or x.size == 0:
        return x - x
    return x - np.max(x, axis=dim, keepdims=True)


def _k_softmax(outs, ins, attrs):
    dim = attrs["dim"]
    e = np.exp(_shifted(ins[0], dim))
    np.divide(e, np.sum(e, axis=dim, keepdims=True) if e.ndim else e, out=outs[0],
              casting="unsafe")


def _k_log_softmax(outs, ins, attrs):
    dim = attrs["dim"]
    z = _shifted(ins[0], dim)
    with np.errstate(divide="ignore"):           # an empty dim sums to 0: log gives -inf
        lse = np.log(np.sum(np.exp(z), axis=dim, keepdims=True)) if z.ndim else np.log(np.exp(z))
    np.subtract(z, lse, out=outs[0], casting="unsafe")


register(OpDef("softmax", ("x",), _softmax_infer("softmax"), {"cpu": _k_softmax}, attrs=("dim",)))
register(OpDef("log_softmax", ("x",), _softmax_infer("log_softmax"), {"cpu": _k_log_softmax},
               attrs=("dim",)))


def _gelu_backward_infer(metas, attrs):
    g, x = metas
    if g.shape != x.shape or g.dtype is not x.dtype:
        raise DTypeError(f"gelu_backward: the gradient ({g.dtype}{list(g.shape)}) and the "
                         f"input ({x.dtype}{list(x.shape)}) must match")
    return [(x.shape, x.dtype)]


def _k_gelu_backward(outs, ins, attrs):
    g, x = ins
    if x.dtype == np.float16:
        x, g = x.astype(np.float32), g.astype(np.float32)
    if attrs["approximate"] == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        k = x.dtype.type(0.044715)
        t = np.tanh(c * (x + k * x ** 3))
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x)
    else:
        cdf = 0.5 * (1.0 + _erf(x / np.sqrt(2.0).astype(x.dtype)))
        pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi).astype(x.dtype)
        d = cdf + x * pdf
    np.multiply(g, d, out=outs[0], casting="unsafe")


register(OpDef("gelu_backward", ("grad", "x"), _gelu_backward_infer,
               {"cpu": _k_gelu_backward}, attrs=("approximate",)))
