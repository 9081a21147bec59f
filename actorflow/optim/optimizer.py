"""Optimizer: parameter groups, per-parameter state, ``zero_grad``; updates run in place
under no_grad, as ordinary ops queued on the VM (``step`` never waits for values)."""

from __future__ import annotations

from ..autograd import no_grad, zero_grad
from ..tensor.tensor import Tensor


class Optimizer:
    """``params``: an iterable of tensors, or of dicts ``{"params": [...], **options}``
    (groups with their own options); ``defaults``: every option and its default."""

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.state: dict = {}
        self.param_groups: list = []
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of tensors "
                            f"(model.parameters()), got a single Tensor; wrap it in a list")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: expected tensors, got "
                                f"{type(p).__name__}")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter appears in two groups")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown options {sorted(unknown)}")
        group["params"] = params
        self._check(group)
        self.param_groups.append(group)

    def _check(self, group: dict) -> None:
        if group["lr"] < 0:
            raise ValueError(f"{type(self).__name__}: invalid learning rate {group['lr']}")

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grad([p for g in self.param_groups for p in g["params"]], set_to_none)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            from ..autograd import enable_grad
            with enable_grad():
                loss = closure()
        with no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        self._update(p, p.grad, g, self.state.setdefault(p, {}))
        return loss

    def _update(self, p, grad, group: dict, state: dict) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k != "params":
                    lines.append(f"    {k}: {g[k]}")
        return "\n".join(lines) + "\n)"
