"""SGD (momentum, dampening, weight decay, Nesterov) with PyTorch's update formula, step for
step: ``sgd_update`` is the one place it is written, for eager and graph mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import functional as F
from ..creation import tensor, zeros_like
from ..tensor.tensor import Tensor
from .optimizer import OUT_OF_PLACE, Optimizer, Writes

if TYPE_CHECKING:
    from .optimizer import ParamsT


def sgd_update(
    p, g, state: dict, group: dict, writes: Writes = OUT_OF_PLACE, values: dict | None = None
):
    """One SGD step of ``p`` with gradient ``g``: ``(p', state')``.

    ``state``: ``momentum_buffer`` (zeros before the first step) when ``momentum``, and
    with ``dampening`` also ``started`` (a float64 0 or 1: the first step takes the
    gradient undamped, as PyTorch's buffer starts as a copy of it: ``0 * momentum + 1 * g``
    is that copy exactly). ``group``: the options (they decide the ops); ``values``: the
    options as the step reads them (``Optimizer.rates``: the scheduled ones tensors in a
    graph step), ``group`` if None. ``writes``: where results go."""
    v = group if values is None else values
    if group["maximize"]:
        g = F.neg(g)
    if group["weight_decay"]:
        g = F.add(g, F.mul(p, group["weight_decay"]))
    new: dict[str, Any] = {}
    mom = v["momentum"]
    if isinstance(mom, Tensor) and "momentum_buffer" in state:
        return _sgd_scheduled(p, g, state, group, v, new)
    if group["momentum"]:
        damped = g
        if group["dampening"]:
            started = state["started"]
            damped = F.mul(g, F.sub(1.0, F.mul(started, group["dampening"])))
            new["started"] = writes.fill(started, 1.0)
        buf = writes.add(writes.mul(state["momentum_buffer"], mom), damped)
        new["momentum_buffer"] = buf
        g = F.add(g, F.mul(buf, mom)) if group["nesterov"] else buf
    return writes.sub(p, F.mul(g, v["lr"])), new


def _sgd_scheduled(p, g, state: dict, group: dict, v: dict, new: dict):
    """``sgd_update`` in a graph step whose momentum is read as a tensor (it may be
    scheduled through 0): PyTorch skips the buffer at a step with momentum 0, so each
    result is selected on ``momentum != 0``: the buffer (and ``started``) kept and the
    plain gradient taken when it is 0."""
    mom = v["momentum"]
    on = F.ne(mom, 0.0)
    damped = g
    if group["dampening"]:
        started = state["started"]
        damped = F.mul(g, F.sub(1.0, F.mul(started, group["dampening"])))
        new["started"] = F.where(on, OUT_OF_PLACE.fill(started, 1.0), started)
    buf = state["momentum_buffer"]
    buf = new["momentum_buffer"] = F.where(on, F.add(F.mul(buf, mom), damped), buf)
    g = F.where(on, F.add(g, F.mul(buf, mom)) if group["nesterov"] else buf, g)
    return F.sub(p, F.mul(g, v["lr"])), new


class SGD(Optimizer):
    flags = ("started",)
    scheduled = ("lr", "momentum")  # (OneCycleLR cycles the momentum)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                dampening=dampening,
                weight_decay=weight_decay,
                nesterov=nesterov,
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
        return sgd_update(p, grad, state, group, writes, self.rates(group, rates))

    def graph_key(self, group: dict[str, Any]) -> str:
        return super().graph_key(group) + repr(self._buffered(group))

    def _buffered(self, group) -> bool:
        """Whether ``group``'s step keeps a momentum buffer: its momentum is not 0, or a
        step made one (a momentum scheduled through 0 keeps it, as PyTorch does)."""
        return bool(group["momentum"]) or self._holds(group, "momentum_buffer")

    def _fill(self, p, group, state) -> None:
        if not self._buffered(group):
            return
        fresh = state.get("momentum_buffer") is None
        if fresh:
            state["momentum_buffer"] = zeros_like(p)
        if group["dampening"] and "started" not in state:  # (a buffer from before: a
            v = 0.0 if fresh else 1.0  # step made it)
            state["started"] = F.to_where(tensor(v, dtype="float64"), p)  # (a 0-d flag where
            #                                    p is: broadcast on a global p's placement)
