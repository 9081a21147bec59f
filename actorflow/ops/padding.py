"""pad: a tensor with elements added (or, for negative pads, removed) at the ends of its
dims. ``pads`` holds one ``(before, after)`` per dim of the input; ``mode`` "constant"
fills with ``value``, "reflect", "replicate" and "circular" take the input's own elements
through an index map per padded dim (``pad_map``). ``pad_backward`` is their gradient:
the gradient summed back through the same maps (constant padding's gradient is a pad by
the negated amounts)."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .common import add_at
from .registry import OpDef, register


def padded_shape(op: str, shape: tuple, pads: tuple) -> tuple:
    out = []
    for d, (n, (b, a)) in enumerate(zip(shape, pads, strict=True)):
        m = n + b + a
        if m < 0:
            raise ShapeError(
                f"{op}: padding ({b}, {a}) of dim {d} (size {n}) leaves "
                f"{m} elements; the result's sizes must be >= 0"
            )
        out.append(m)
    return tuple(out)


def pad_map(mode: str, n: int, before: int, after: int) -> np.ndarray:
    """The input position each output position of a dim of size ``n`` reads, for a
    non-constant ``mode``."""
    if mode == "circular":  # the cropped part, wrapped around (as PyTorch)
        lo = max(-before, 0)
        m = n - lo - max(-after, 0)
        j = np.arange(-max(before, 0), m + max(after, 0))
        return lo + j % m if m > 0 else lo + j
    j = np.arange(-before, n + after)
    if mode == "replicate":
        return np.clip(j, 0, n - 1)
    period = 2 * (n - 1)  # reflect: ... 2 1 | 0 1 2 ... n-1 | n-2 ...
    m = np.abs(j) % period if period else np.zeros_like(j)
    return np.where(m >= n, period - m, m)


def _pad_infer(metas, attrs):
    m = metas[0]
    return [(padded_shape("pad", m.shape, attrs["pads"]), m.dtype)]


def _k_pad(outs, ins, attrs):
    x, o = ins[0], outs[0]
    mode = attrs["mode"]
    if mode == "constant":
        src, dst = [], []
        for n, (b, a) in zip(x.shape, attrs["pads"], strict=True):
            lo, hi = max(0, -b), n - max(0, -a)
            src.append(slice(lo, max(lo, hi)))
            dst.append(slice(max(0, b), max(0, b) + max(0, hi - lo)))
        o.fill(attrs["value"])
        o[tuple(dst)] = x[tuple(src)]
        return
    y = x
    for d, (b, a) in enumerate(attrs["pads"]):
        if b or a:
            y = np.take(y, pad_map(mode, x.shape[d], b, a), axis=d)
    o[...] = y


def _pad_backward_infer(metas, attrs):
    return [(attrs["shape"], metas[0].dtype)]


def _k_pad_backward(outs, ins, attrs):
    y, shape = ins[0], attrs["shape"]
    for d in reversed(range(len(shape))):
        b, a = attrs["pads"][d]
        if b or a:
            z = np.zeros_like(y, shape=y.shape[:d] + (shape[d],) + y.shape[d + 1 :])
            add_at(z, (slice(None),) * d + (pad_map(attrs["mode"], shape[d], b, a),), y)
            y = z
    outs[0][...] = y


register(OpDef("pad", ("x",), _pad_infer, {"cpu": _k_pad}, attrs=("pads", "mode", "value")))
register(
    OpDef(
        "pad_backward",
        ("grad",),
        _pad_backward_infer,
        {"cpu": _k_pad_backward},
        attrs=("pads", "mode", "shape"),
    )
)
