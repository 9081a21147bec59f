"""SGD (momentum, dampening, weight decay, Nesterov), Adam and AdamW, with PyTorch's update
formulas, step for step."""

from __future__ import annotations

import math

from .. import functional as F
from ..creation import tensor, zeros_like
from .optimizer import Optimizer


def _scaled(t, factor: float):
    """``t * factor``, or ``t`` itself for a factor of 1 (the same numbers, one op less)."""
    return t if factor == 1.0 else F.mul(t, factor)


class SGD(Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    @staticmethod
    def _direction(p, g, group):
        """The gradient as the update uses it: negated to maximize, plus weight decay."""
        if group["maximize"]:
            g = F.neg(g)
        if group["weight_decay"]:
            g = F.add(g, F.mul(p, group["weight_decay"]))
        return g

    def _update(self, p, g, group, state):
        g = self._direction(p, g, group)
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = F.clone(g)
            else:
                F.mul_(buf, mom)
                F.add_(buf, _scaled(g, 1.0 - group["dampening"]))
            g = F.add(g, F.mul(buf, mom)) if group["nesterov"] else buf
        F.sub_(p, F.mul(g, group["lr"]))

    # graph mode (nn.Graph): the same update, out of place, on state held across pieces
    def graph_state(self, p, group) -> dict:
        if not group["momentum"]:
            return {}
        buf = self.state.get(p, {}).get("momentum_buffer")
        st = {"momentum_buffer": F.clone(buf) if buf is not None else zeros_like(p)}
        if group["dampening"]:      # the first step takes g undamped: it must know which
            st["started"] = tensor(1.0 if buf is not None else 0.0, dtype="float64")
        return st

    def graph_update(self, p, g, group, st):
        g = self._direction(p, g, group)
        mom = group["momentum"]
        new = {}
        if mom:
            buf = st["momentum_buffer"]
            later = F.add(F.mul(buf, mom), _scaled(g, 1.0 - group["dampening"]))
            if "started" in st:     # (without dampening, mom * 0 + g is g itself: no pick)
                later = F.where(F.gt(st["started"], 0.5), later, g)
                new["started"] = F.add(F.mul(st["started"], 0.0), 1.0)
            new["momentum_buffer"] = buf = later
            g = F.add(g, F.mul(buf, mom)) if group["nesterov"] else buf
        return F.sub(p, F.mul(g, group["lr"])), new

    def graph_sync(self, p, group, st) -> None:
        """Before a graph run: the eager state (it may have stepped since) into ``st``."""
        if not group["momentum"]:
            return
        buf = self.state.get(p, {}).get("momentum_buffer")
        if buf is st["momentum_buffer"]:
            return                      # the graph's own buffer (since graph_done): as is
        if buf is not None:
            F.copy_(st["momentum_buffer"], buf)
        else:
            F.zero_(st["momentum_buffer"])
        if "started" in st:
            F.fill_(st["started"], 0.0 if buf is None else 1.0)

    def graph_done(self, p, group, st) -> None:
        if group["momentum"]:
            self.state.setdefault(p, {})["momentum_buffer"] = st["momentum_buffer"]


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
        self._graph_steps: dict = {}    # id(a graph's step tensor) -> the count it holds

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

    # graph mode (nn.Graph): the same update, out of place; the step count is state too
    _MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def graph_state(self, p, group) -> dict:
        st = self.state.get(p, {})
        out = {"step": tensor(float(st.get("step", 0)), dtype="float64")}
        for k in self._MOMENTS[:3 if group["amsgrad"] else 2]:
            out[k] = F.clone(st[k]) if k in st else zeros_like(p)
        return out

    def graph_update(self, p, g, group, st):
        if group["maximize"]:
            g = F.neg(g)
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if wd:
            if self.decoupled:
                p = F.mul(p, 1.0 - lr * wd)
            else:
                g = F.add(g, F.mul(p, wd))
        t = F.add(st["step"], 1.0)
        m = F.add(F.mul(st["exp_avg"], b1), F.mul(g, 1.0 - b1))
        v = F.add(F.mul(st["exp_avg_sq"], b2), F.mul(F.mul(g, g), 1.0 - b2))
        new = {"step": t, "exp_avg": m, "exp_avg_sq": v}
        if group["amsgrad"]:
            v = new["max_exp_avg_sq"] = F.maximum(st["max_exp_avg_sq"], v)
        c1 = F.sub(1.0, F.pow(b1, t))                       # float64, as the eager floats
        c2 = F.sqrt(F.sub(1.0, F.pow(b2, t)))
        denom = F.add(F.div(F.sqrt(v), c2), eps)
        return F.sub(p, F.mul(F.div(m, denom), F.div(lr, c1))), new

    def graph_sync(self, p, group, st) -> None:
        """Before a graph run: the eager state (it may have stepped since) into ``st``."""
        eager = self.state.get(p, {})
        n = eager.get("step", 0)
        if self._graph_steps.get(id(st["step"])) != n:     # (each compiled graph has its
            F.fill_(st["step"], float(n))                   # own state: keyed by it)
        for k in self._MOMENTS:
            if k in st:
                e = eager.get(k)
                if e is None:
                    F.zero_(st[k])
                elif e is not st[k]:
                    F.copy_(st[k], e)

    def graph_done(self, p, group, st) -> None:
        mine = self.state.setdefault(p, {})
        for k, v in st.items():
            mine[k] = int(v.item()) if k == "step" else v
        self._graph_steps[id(st["step"])] = mine["step"]


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the step."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
