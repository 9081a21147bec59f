"""Batched matmul with numpy's rules: 1-D operands are promoted and the added dim removed,
batch dims broadcast."""

from __future__ import annotations

import numpy as np

from ..dtype import bool_, promote_types
from ..errors import DTypeError, ShapeError
from .common import broadcast_shapes
from .registry import OpDef, register


def matmul_shape(a: tuple, b: tuple) -> tuple:
    if not a or not b:
        raise ShapeError(
            f"matmul: both arguments need at least 1 dimension, got shapes {a} "
            f"and {b}; use mul (*) for scalars"
        )
    ka = a[-1]
    kb = b[0] if len(b) == 1 else b[-2]
    if ka != kb:
        raise ShapeError(
            f"matmul: shapes {a} and {b} cannot be multiplied ({ka} != {kb}); "
            f"the last dim of the first must equal the "
            f"{'only' if len(b) == 1 else 'second-to-last'} dim of the second"
        )
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return b[:-2] + b[-1:]
    if len(b) == 1:
        return a[:-1]
    batch = broadcast_shapes("matmul", a[:-2], b[:-2])
    return batch + (a[-2], b[-1])


def _matmul_infer(metas, attrs):
    a, b = metas
    dtype = promote_types(a.dtype, b.dtype)
    if dtype is bool_:
        raise DTypeError("matmul: bool tensors are not supported; convert with .int() or .float()")
    return [(matmul_shape(a.shape, b.shape), dtype)]


def _k_matmul(outs, ins, attrs):
    a, b = ins
    o = outs[0]
    if a.dtype != o.dtype:
        a = a.astype(o.dtype)
    if b.dtype != o.dtype:
        b = b.astype(o.dtype)
    np.matmul(a, b, out=o)


register(OpDef("matmul", ("a", "b"), _matmul_infer, {"cpu": _k_matmul}))
