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

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """PyTorch's layout: ``{"state": {param index: {name: value}}, "param_groups":
        [{options..., "params": [param indices]}]}`` (indices in group order)."""
        index: dict = {}
        groups = []
        for g in self.param_groups:
            ids = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(st) for p, st in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes what ``state_dict()`` gave (or ``af.load`` read back) for an optimizer over
        parameters of the same shapes, in the same groups: options and state are copied."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved groups hold "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer's "
                             f"{[len(g['params']) for g in self.param_groups]}")
        by_index = {}
        for saved, mine in zip(groups, self.param_groups):
            for i, p in zip(saved["params"], mine["params"]):
                by_index[int(i)] = p
            for k, v in saved.items():
                if k != "params":
                    mine[k] = tuple(v) if isinstance(v, list) else v
        self.state = {}
        for i, st in state_dict["state"].items():
            p = by_index[int(i)]
            mine = {}
            for k, v in st.items():
                if isinstance(v, Tensor):
                    if tuple(v.shape) != tuple(p.shape) and v.ndim:
                        raise ValueError(f"{type(self).__name__}.load_state_dict: state "
                                         f"{k!r} of parameter {i} has shape {tuple(v.shape)}, "
                                         f"the parameter {tuple(p.shape)}")
                    v = v.to(p.dtype).clone()
                mine[k] = v
            self.state[p] = mine

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k != "params":
                    lines.append(f"    {k}: {g[k]}")
        return "\n".join(lines) + "\n)"
