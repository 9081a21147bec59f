"""Ops that build new tensors from several: cat and stack. A cat's ``dtype`` attr, when
given, is its result's dtype (the functor's, which counts inputs it skipped)."""

from __future__ import annotations

import numpy as np

from ..dtype import promote_types
from ..errors import ShapeError
from .registry import OpDef, register


def promote_all(metas):
    """The common dtype of tensors joined (PyTorch's promotion, dims or not)."""
    dtype = metas[0].dtype
    for m in metas[1:]:
        dtype = promote_types(dtype, m.dtype)
    return dtype


def _cat_infer(metas, attrs):
    dim = attrs["dim"]
    first = metas[0].shape
    total = 0
    for i, m in enumerate(metas):
        s = m.shape
        if len(s) != len(first):
            raise ShapeError(
                f"cat: tensors must have the same number of dimensions: got "
                f"{len(first)} and {len(s)} (shapes {first} and {s}, tensor {i})"
            )
        for d, (x, y) in enumerate(zip(first, s, strict=True)):
            if d != dim and x != y:
                raise ShapeError(
                    f"cat: sizes of tensors must match except in dimension {dim}; "
                    f"expected size {x} but got size {y} for tensor {i} in "
                    f"dimension {d} (shapes {first} and {s})"
                )
        total += s[dim]
    dtype = attrs.get("dtype")  # (given: skipped inputs count too)
    if dtype is None:
        dtype = promote_all(metas)
    return [(first[:dim] + (total,) + first[dim + 1 :], dtype)]


def _k_cat(outs, ins, attrs):
    np.concatenate(ins, axis=attrs["dim"], out=outs[0], casting="unsafe")


def _stack_infer(metas, attrs):
    first = metas[0].shape
    for i, m in enumerate(metas):
        if m.shape != first:
            raise ShapeError(
                f"stack: expects each tensor to be equal size, but got {first} at "
                f"entry 0 and {m.shape} at entry {i}"
            )
    dim = attrs["dim"]
    return [(first[:dim] + (len(metas),) + first[dim:], promote_all(metas))]


def _k_stack(outs, ins, attrs):
    np.stack(ins, axis=attrs["dim"], out=outs[0], casting="unsafe")


register(OpDef("cat", ("tensors*",), _cat_infer, {"cpu": _k_cat}, attrs=("dim", "dtype")))
register(OpDef("stack", ("tensors*",), _stack_infer, {"cpu": _k_stack}, attrs=("dim",)))
