"""RMSprop (momentum, centered, weight decay) with PyTorch's update formula, step for step:
``rmsprop_update`` is the one place it is written, for eager and graph mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import functional as F
from ..creation import zeros_like
from ..tensor.tensor import Tensor
from .optimizer import OUT_OF_PLACE, Optimizer, Writes, next_count

if TYPE_CHECKING:
    from .optimizer import ParamsT


def rmsprop_update(
    p, g, state: dict, group: dict, writes: Writes = OUT_OF_PLACE, values: dict | None = None
):
    """One RMSprop step of ``p`` with gradient ``g``: ``(p', state')`` (the averages and
    the momentum buffer; the count is the caller's).

    ``state``: ``square_avg``, with ``centered`` also ``grad_avg``, with ``momentum > 0``
    also ``momentum_buffer``. ``group``: the options (they decide the ops); ``values``: the
    options as the step reads them (``Optimizer.rates``), ``group`` if None. ``writes``:
    where results go."""
    v = group if values is None else values
    if group["maximize"]:
        g = F.neg(g)
    if group["weight_decay"]:
        g = F.add(g, F.mul(p, group["weight_decay"]))
    alpha = group["alpha"]
    sq = writes.add(writes.mul(state["square_avg"], alpha), F.mul(F.mul(g, g), 1.0 - alpha))
    new = {"square_avg": sq}
    if group["centered"]:
        ga = F.sub(g, state["grad_avg"])  # (lerp towards g by 1 - alpha)
        ga = new["grad_avg"] = writes.add(state["grad_avg"], F.mul(ga, 1.0 - alpha))
        avg = F.sqrt(F.sub(sq, F.mul(ga, ga)))
    else:
        avg = F.sqrt(sq)
    avg = F.add(avg, group["eps"])
    mom = v["momentum"]
    if isinstance(mom, Tensor) and "momentum_buffer" in state:
        on = F.gt(mom, 0.0)  # (scheduled through 0: PyTorch skips the
        step = F.div(g, avg)  # buffer at a step with momentum 0)
        buf = state["momentum_buffer"]
        buf = new["momentum_buffer"] = F.where(on, F.add(F.mul(buf, mom), step), buf)
        return F.sub(p, F.mul(F.where(on, buf, step), v["lr"])), new
    if group["momentum"] > 0:
        buf = writes.add(writes.mul(state["momentum_buffer"], v["momentum"]), F.div(g, avg))
        new["momentum_buffer"] = buf
        return writes.sub(p, F.mul(buf, v["lr"])), new
    return writes.sub(p, F.mul(F.div(g, avg), v["lr"])), new


class RMSprop(Optimizer):
    """RMSprop as PyTorch's: ``alpha`` the smoothing of the squared gradients, ``centered``
    normalizes by their variance, ``momentum`` a buffer of the scaled steps."""

    counts = ("step",)
    scheduled = ("lr", "momentum")  # (OneCycleLR cycles the momentum)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        maximize: bool = False,
    ) -> None:
        for name, val in (
            ("lr", lr),
            ("alpha", alpha),
            ("eps", eps),
            ("weight_decay", weight_decay),
            ("momentum", momentum),
        ):
            if val < 0:
                raise ValueError(f"RMSprop: invalid {name} {val} (it must be >= 0)")
        super().__init__(
            params,
            dict(
                lr=lr,
                alpha=alpha,
                eps=eps,
                weight_decay=weight_decay,
                momentum=momentum,
                centered=centered,
                maximize=maximize,
            ),
        )

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
        p, new = rmsprop_update(p, grad, state, group, writes, self.rates(group, rates))
        new["step"] = n
        return p, new

    def graph_key(self, group: dict[str, Any]) -> str:
        return super().graph_key(group) + repr(self._buffered(group))

    def _buffered(self, group) -> bool:
        """Whether ``group``'s step keeps a momentum buffer: its momentum is above 0, or a
        step made one (a momentum scheduled through 0 keeps it, as PyTorch does)."""
        return group["momentum"] > 0 or self._holds(group, "momentum_buffer")

    def _fill(self, p, group, state) -> None:
        state.setdefault("step", 0)
        for k, wanted in (
            ("square_avg", True),
            ("momentum_buffer", self._buffered(group)),
            ("grad_avg", group["centered"]),
        ):
            if wanted and k not in state:
                state[k] = zeros_like(p)
