"""Adam with PyTorch's update formula, step for step: ``adam_update`` (with
``bias_corrections``) is the one place it is written, for eager and graph mode, Adam and
AdamW."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import functional as F
from ..creation import from_numpy, zeros_like
from ..sbp import broadcast, layout
from .optimizer import IN_PLACE, OUT_OF_PLACE, Optimizer, Writes, next_count

if TYPE_CHECKING:
    from ..tensor.tensor import Tensor
    from .optimizer import ParamsT


def bias_corrections(t, group: dict) -> tuple:
    """Adam's scalars at step ``t`` (a float64 0-d tensor counting this step): the step
    size ``lr / (1 - beta1 ** t)`` and ``sqrt(1 - beta2 ** t)``, float64 0-d tensors."""
    b1, b2 = group["betas"]
    return F.div(group["lr"], F.sub(1.0, F.pow(b1, t))), F.sqrt(F.sub(1.0, F.pow(b2, t)))


def adam_update(
    p,
    g,
    state: dict,
    group: dict,
    corrections: tuple,
    decoupled: bool,
    writes: Writes = OUT_OF_PLACE,
    values: dict | None = None,
):
    """One Adam step of ``p`` with gradient ``g``: ``(p', state')`` (the moments; the
    count is the caller's). ``state``: ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq``
    with ``amsgrad``); ``corrections``: ``bias_corrections`` at this step; ``decoupled``:
    weight decay as ``p *= 1 - lr * weight_decay`` (AdamW) instead of ``g += weight_decay
    * p`` (Adam's L2); ``writes``: where results go; ``values``: the options as the step
    reads them (``Optimizer.rates``), ``group`` if None."""
    step_size, c2 = corrections
    v = group if values is None else values
    lr, (b1, b2), eps, wd = v["lr"], v["betas"], group["eps"], group["weight_decay"]
    # the scalars first (0-d tensors in a graph step), so that the elementwise ops over the
    # parameter that follow come one after another: a CUDA step launches them as one chain
    r1, r2 = 1.0 - b1, 1.0 - b2
    decay = 1.0 - lr * wd if wd and decoupled else None
    if group["maximize"]:
        g = F.neg(g)
    if wd:
        if decoupled:
            p = writes.mul(p, decay)
        else:
            g = F.add(g, F.mul(p, wd))
    m = writes.add(writes.mul(state["exp_avg"], b1), F.mul(g, r1))
    v = writes.add(writes.mul(state["exp_avg_sq"], b2), F.mul(F.mul(g, g), r2))
    new = {"exp_avg": m, "exp_avg_sq": v}
    if group["amsgrad"]:
        v = new["max_exp_avg_sq"] = writes.maximum(state["max_exp_avg_sq"], v)
    denom = F.add(F.div(F.sqrt(v), c2), eps)
    return writes.sub(p, F.mul(F.div(m, denom), step_size)), new


class Adam(Optimizer):
    """Adam; ``weight_decay`` adds ``wd * p`` to the gradient (L2), as PyTorch's Adam."""

    decoupled = False
    counts = ("step",)
    caches = ("_corrections",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: invalid eps {eps}")
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=tuple(betas),
                eps=eps,
                weight_decay=weight_decay,
                amsgrad=amsgrad,
                maximize=maximize,
            ),
        )
        self._corrections: dict = {}  # eager: (count, lr, betas) -> bias_corrections

    scheduled = ("lr", "betas")  # (OneCycleLR cycles beta1)

    def update(
        self,
        p: Tensor,
        grad: Tensor,
        group: dict[str, Any],
        state: dict[str, Any],
        writes: Writes = OUT_OF_PLACE,
        rates: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        n = next_count(state["step"], writes)
        if writes is IN_PLACE:  # eager: the count an int
            key = (n, group["lr"], group["betas"], p.device)
            corrections = self._corrections.get(key)
            if corrections is None:  # once per count, options and device, not per parameter
                if len(self._corrections) > 8:
                    self._corrections.clear()
                t = from_numpy(np.array(float(n)))  # float64, 0-d
                if p.is_global:  # (on p's ranks, whole on each: a 0-d tensor has no split)
                    t = t.to(layout(p.placement, (broadcast,)))
                elif p.device.type != "cpu":
                    t = t.to(p.device)  # (where p's ops run)
                corrections = self._corrections[key] = bias_corrections(t, group)
        else:  # traced: the count a float64 tensor, state of the step
            corrections = bias_corrections(n, self.rates(group, rates))
        p, new = adam_update(
            p, grad, state, group, corrections, self.decoupled, writes, self.rates(group, rates)
        )
        new["step"] = n
        return p, new

    def _fill(self, p, group, state) -> None:
        if "step" not in state:
            state["step"] = 0
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[: 3 if group["amsgrad"] else 2]:
            if k not in state:
                state[k] = zeros_like(p)
