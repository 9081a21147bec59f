"""SGD (momentum, dampening, weight decay, Nesterov), Adam and AdamW, with PyTorch's update
formulas, step for step."""

from __future__ import annotations

import math

from .. import functional as F
from .optimizer import Optimizer


class SGD(Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _update(self, p, g, group, state):
        if group["maximize"]:
            g = F.neg(g)
        wd, mom = group["weight_decay"], group["momentum"]
        if wd:
            g = F.add(g, F.mul(p, wd))
        if mom:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = F.clone(g)
            else:
                F.mul_(buf, mom)
                F.add_(buf, F.mul(g, 1.0 - group["dampening"]))
            g = F.add(g, F.mul(buf, mom)) if group["nesterov"] else buf
        F.sub_(p, F.mul(g, group["lr"]))


class Adam(Optimizer):
    """Adam; ``weight_decay`` adds ``wd * p`` to the gradient (L2), as PyTorch's Adam."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False):
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: invalid eps {eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _update(self, p, g, group, state):
        if group["maximize"]:
            g = F.neg(g)
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if wd:
            if self.decoupled:
                F.mul_(p, 1.0 - lr * wd)
            else:
                g = F.add(g, F.mul(p, wd))
        if not state:
            state["step"] = 0
            state["exp_avg"] = F.mul(p, 0.0)
            state["exp_avg_sq"] = F.mul(p, 0.0)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = F.mul(p, 0.0)
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        F.mul_(m, b1)
        F.add_(m, F.mul(g, 1.0 - b1))
        F.mul_(v, b2)
        F.add_(v, F.mul(F.mul(g, g), 1.0 - b2))
        if group["amsgrad"]:
            vmax = state["max_exp_avg_sq"]
            F.copy_(vmax, F.maximum(vmax, v))
            v = vmax
        c1 = 1.0 - b1 ** t
        c2 = math.sqrt(1.0 - b2 ** t)
        denom = F.add(F.div(F.sqrt(v), c2), eps)
        F.sub_(p, F.mul(F.div(m, denom), lr / c1))


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the step."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
