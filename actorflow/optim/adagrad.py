"""Adagrad (learning-rate decay, weight decay) with PyTorch's update formula, step for
step: ``adagrad_update`` is the one place it is written, for eager and graph mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import functional as F
from ..creation import full_like
from .optimizer import OUT_OF_PLACE, Optimizer, Writes, next_count

if TYPE_CHECKING:
    from ..tensor.tensor import Tensor
    from .optimizer import ParamsT


def adagrad_update(
    p, g, state: dict, group: dict, n, writes: Writes = OUT_OF_PLACE, values: dict | None = None
):
    """One Adagrad step of ``p`` with gradient ``g`` at step ``n`` (counting this one: an
    int in eager mode, a float64 0-d tensor in a graph step): ``(p', state')``.

    ``state``: ``sum``, the squared gradients so far. The step size is PyTorch's ``lr / (1
    + (n - 1) * lr_decay)``, the same float64 operations on either kind of ``n``.
    ``group``: the options (they decide the ops); ``values``: the options as the step reads
    them (``Optimizer.rates``), ``group`` if None. ``writes``: where results go."""
    v = group if values is None else values
    if group["maximize"]:
        g = F.neg(g)
    if group["weight_decay"]:
        g = F.add(g, F.mul(p, group["weight_decay"]))
    clr = v["lr"]
    if group["lr_decay"]:
        clr = clr / (1 + (n - 1) * group["lr_decay"])
    s = writes.add(state["sum"], F.mul(g, g))
    std = F.add(F.sqrt(s), group["eps"])
    return writes.sub(p, F.mul(F.div(g, std), clr)), {"sum": s}


class Adagrad(Optimizer):
    """Adagrad as PyTorch's: each element's step divided by the root of its squared
    gradients' sum (``initial_accumulator_value`` to start), the rate decayed by
    ``lr_decay`` per step. Its state is made with the optimizer, as PyTorch's."""

    counts = ("step",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        maximize: bool = False,
    ) -> None:
        for name, val in (
            ("lr", lr),
            ("lr_decay", lr_decay),
            ("weight_decay", weight_decay),
            ("initial_accumulator_value", initial_accumulator_value),
            ("eps", eps),
        ):
            if val < 0:
                raise ValueError(f"Adagrad: invalid {name} {val} (it must be >= 0)")
        super().__init__(
            params,
            dict(
                lr=lr,
                lr_decay=lr_decay,
                weight_decay=weight_decay,
                initial_accumulator_value=initial_accumulator_value,
                eps=eps,
                maximize=maximize,
            ),
        )
        for group in self.param_groups:
            for p in group["params"]:
                self._state(p, group)

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
        p, new = adagrad_update(p, grad, state, group, n, writes, self.rates(group, rates))
        new["step"] = n
        return p, new

    def _fill(self, p, group, state) -> None:
        state.setdefault("step", 0)
        if "sum" not in state:
            # (the constructor's value, not the group's: PyTorch's state starts so)
            state["sum"] = full_like(p, self.defaults["initial_accumulator_value"])
