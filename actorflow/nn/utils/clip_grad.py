"""Gradient clipping with PyTorch's formulas: ``clip_grad_norm_`` (the gradients scaled so
that their total norm is at most ``max_norm``) and ``clip_grad_value_`` (each element
clamped).

Eagerly the gradients are written in place, as PyTorch's are. Inside ``nn.Graph.build``
(after ``loss.backward()``, before the optimizers' update that the step traces) the
gradients are recorded tensors, which a traced step cannot write in place: each
parameter's ``grad`` is set to the clipped tensor instead, which the update then reads, so
clipping is part of the compiled step and gives the eager numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ... import functional as F
from ...autograd import no_grad
from ...creation import tensor
from ...errors import TraceError
from ...tensor.tensor import Tensor


def _with_grads(name: str, parameters) -> list:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(
                f"{name}: parameters must be tensors (model.parameters()), got {type(p).__name__}"
            )
    return [p for p in params if p.grad is not None]


def _traced(g) -> bool:
    """Is ``g`` a gradient recorded by ``nn.Graph``'s trace (no data, no in-place write)?"""
    return g._impl.blob.traced


def _set(p, new, write_in_place) -> None:
    """``p.grad`` becomes ``new(grad)``: in place eagerly, a new recorded tensor traced."""
    g = p.grad
    if _traced(g):
        p.grad = new(g)
    else:
        write_in_place(g)


def _norm(g, p: float):
    """PyTorch's ``vector_norm(g, p)``: of every element, as a 0-d tensor of g's dtype."""
    if p == math.inf:
        return F.amax(F.abs(g))
    if p == -math.inf:
        return F.amin(F.abs(g))
    if p == 0:
        return F.sum(F.ne(g, 0), dtype=g.dtype)
    if p == 1:
        return F.sum(F.abs(g))
    if p == 2:
        return F.sqrt(F.sum(F.mul(g, g)))
    return F.pow(F.sum(F.pow(F.abs(g), p)), 1.0 / p)


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scales the gradients of ``parameters`` (those that have one) by ``min(1, max_norm /
    (total + 1e-6))``, where ``total`` is the ``norm_type`` norm of all of them together
    (the norm of their norms; ``inf`` the largest magnitude), as PyTorch's.

    Args:
        parameters: a tensor or an iterable of tensors.
        max_norm: the largest total norm kept.
        norm_type: the norm's order: a float, ``inf`` or ``"inf"``.
        error_if_nonfinite: raise when the total norm is nan or inf (reads its value, so
            eager mode only).
        foreach: PyTorch's choice of kernels, accepted and ignored (one path here).

    Returns:
        The total norm, a 0-d tensor (of the gradients' dtype; 0.0 when none has one).

    Raises:
        RuntimeError: the total norm is not finite and ``error_if_nonfinite``.
        TraceError: ``error_if_nonfinite`` inside ``nn.Graph.build``."""
    norm_type = float(norm_type)
    max_norm = float(max_norm)
    with no_grad():
        params = _with_grads("clip_grad_norm_", parameters)
        if not params:
            return tensor(0.0)
        grads = [p.grad for p in params]
        norms = [_norm(g, norm_type) for g in grads]
        total = _norm(F.stack(norms), norm_type)  # (also of one: order 0 counts it 1)
        if error_if_nonfinite:
            if any(_traced(g) for g in grads):
                raise TraceError(
                    "clip_grad_norm_(error_if_nonfinite=True) reads the total "
                    "norm's value, which a traced nn.Graph step does not have; "
                    "pass error_if_nonfinite=False inside build (and check the "
                    "norm the step returns)"
                )
            value = total.item()
            if math.isnan(value) or math.isinf(value):
                raise RuntimeError(
                    f"clip_grad_norm_: the total norm of order {norm_type} of "
                    f"the gradients is {value}, so it cannot be clipped; pass "
                    f"error_if_nonfinite=False to scale them by it anyway"
                )
        coef = F.clamp(F.div(max_norm, F.add(total, 1e-6)), max=1.0)
        for p in params:
            _set(p, lambda g: F.mul(g, coef), lambda g: F.mul_(g, coef))
    return total


def clip_grad_value_(
    parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None
) -> None:
    """Clamps every gradient element of ``parameters`` into ``[-clip_value, clip_value]``,
    as PyTorch's (``foreach`` accepted and ignored)."""
    clip_value = float(clip_value)
    with no_grad():
        for p in _with_grads("clip_grad_value_", parameters):
            _set(
                p,
                lambda g: F.clamp(g, -clip_value, clip_value),
                lambda g: F.clamp_(g, -clip_value, clip_value),
            )
