"""Ops that make tensors: empty, full, arange, rand, randn (no tensor inputs), and the
counter-based forms of rand and randn a compiled step records (``rand_step``, ``randn_step``).
Eager random ops carry a seed drawn when they are called, so results follow ``manual_seed``.

``rand_step`` / ``randn_step`` read one tensor, the step's count (an int64 scalar that
``nn.Graph`` keeps as state and adds one to per step), and draw from numpy's Philox, a
counter-based generator: keyed by ``key`` (the graph's seed and the op's place among the
step's random ops), its counter starting at the step's count. So step k draws the same
values whenever it runs (``step()``, a piece of ``run()`` whose op actors act out of piece
order, one fused actor, the CUDA emulator), and a different step draws new ones."""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
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
        gen = np.random.default_rng(attrs["seed"])  # (a seed, or a Generator)
        if o.dtype in (np.float32, np.float64):
            if normal:
                gen.standard_normal(dtype=o.dtype, out=o)
            else:
                gen.random(dtype=o.dtype, out=o)
        else:
            o[...] = gen.standard_normal(o.shape) if normal else gen.random(o.shape)

    return kernel


def _k_random_step(normal):
    base = _k_random(normal)

    def kernel(outs, ins, attrs):
        seed, index = attrs["key"]
        bits = np.random.Philox(
            key=np.array([seed, index], dtype=np.uint64),
            counter=np.array([0, 0, 0, int(ins[0])], dtype=np.uint64),
        )
        base(outs, ins, {"seed": np.random.Generator(bits)})

    return kernel


def _step_infer(metas, attrs):
    m = metas[0]
    if m.shape != () or m.dtype.name != "int64":
        raise DTypeError(
            f"rand_step/randn_step: the step's count must be an int64 scalar, "
            f"got shape {tuple(m.shape)} and dtype {m.dtype.name}"
        )
    return [(attrs["shape"], attrs["dtype"])]


_ATTRS = ("shape", "dtype", "device")
register(OpDef("empty", (), _shape_infer, {"cpu": _k_empty}, attrs=_ATTRS))
register(OpDef("full", (), _shape_infer, {"cpu": _k_full}, attrs=_ATTRS + ("value",)))
# (host_only: numpy's generators write into numpy arrays only; so a CUDA device draws the
# same values as cpu, bit for bit)
register(
    OpDef(
        "arange",
        (),
        _shape_infer,
        {"cpu": _k_arange},
        attrs=_ATTRS + ("start", "step"),
        host_only=True,
    )
)
register(
    OpDef(
        "rand",
        (),
        _shape_infer,
        {"cpu": _k_random(False)},
        attrs=_ATTRS + ("seed",),
        host_only=True,
    )
)
register(
    OpDef(
        "randn",
        (),
        _shape_infer,
        {"cpu": _k_random(True)},
        attrs=_ATTRS + ("seed",),
        host_only=True,
    )
)
register(
    OpDef(
        "rand_step",
        ("count",),
        _step_infer,
        {"cpu": _k_random_step(False)},
        attrs=_ATTRS + ("key",),
        host_only=True,
    )
)
register(
    OpDef(
        "randn_step",
        ("count",),
        _step_infer,
        {"cpu": _k_random_step(True)},
        attrs=_ATTRS + ("key",),
        host_only=True,
    )
)
