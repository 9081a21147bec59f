"""Ops with no tensor inputs that make tensors: empty, full, arange, rand, randn.
Random ops carry a seed drawn when they are called, so results follow ``manual_seed``."""

from __future__ import annotations

import numpy as np

from .registry import OpDef, register


def _shape_infer(metas, attrs):
    return [(attrs["shape"], attrs["dtype"])]


def _k_empty(outs, ins, attrs):
    pass


def _k_full(outs, ins, attrs):
    outs[0].fill(attrs["value"])


def _k_arange(outs, ins, attrs):
    o = outs[0]
    n = o.shape[0]
    start, step = attrs["start"], attrs["step"]
    if o.dtype.kind in "iu":
        o[...] = np.arange(n, dtype=np.int64) * step + start
    else:
        np.add(np.arange(n, dtype=np.float64) * step, start, out=o, casting="unsafe")


def _k_random(normal):
    def kernel(outs, ins, attrs):
        o = outs[0]
        gen = np.random.default_rng(attrs["seed"])
        if o.dtype in (np.float32, np.float64):
            if normal:
                gen.standard_normal(dtype=o.dtype, out=o)
            else:
                gen.random(dtype=o.dtype, out=o)
        else:
            o[...] = gen.standard_normal(o.shape) if normal else gen.random(o.shape)
    return kernel


_ATTRS = ("shape", "dtype", "device")
register(OpDef("empty", (), _shape_infer, {"cpu": _k_empty}, attrs=_ATTRS))
register(OpDef("full", (), _shape_infer, {"cpu": _k_full}, attrs=_ATTRS + ("value",)))
register(OpDef("arange", (), _shape_infer, {"cpu": _k_arange}, attrs=_ATTRS + ("start", "step")))
register(OpDef("rand", (), _shape_infer, {"cpu": _k_random(False)}, attrs=_ATTRS + ("seed",)))
register(OpDef("randn", (), _shape_infer, {"cpu": _k_random(True)}, attrs=_ATTRS + ("seed",)))
