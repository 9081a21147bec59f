"""Optimizer: parameter groups, per-parameter state, ``zero_grad``, and the one update per
optimizer that both modes run.

Each optimizer's formula is one function of ``(param, grad, state, group)`` returning
``(param', state')``, given how results are written: ``IN_PLACE`` (eager ``step()``: into
the parameter and its state tensors, as ordinary ops queued on the VM under no_grad, so
``step`` never waits for values) or ``OUT_OF_PLACE`` (an ``nn.Graph`` step, which traces
it). Both run the same ops on the same values, so the two modes agree bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import functional as F
from ..autograd import no_grad, zero_grad
from ..creation import tensor
from ..errors import add_note
from ..tensor.tensor import Tensor

if TYPE_CHECKING:
    from typing import TypeAlias

    # what an optimizer takes: tensors, or groups of them with their own options
    ParamsT: TypeAlias = Iterable[Tensor] | Iterable[dict[str, Any]]


def _replace(a, value: float):
    """A tensor like ``a`` holding ``value`` everywhere, computed from ``a`` (traceable)."""
    return F.add(F.mul(a, 0.0), value)


def _max_into(a, b):
    return F.copy_(a, F.maximum(a, b))


def next_count(n, writes):
    """This step's count from the state's count ``n``: an int in eager mode (``IN_PLACE``;
    a graph step may have left a tensor), a float64 0-d tensor in a graph step."""
    if writes is IN_PLACE:
        return (int(n.item()) if isinstance(n, Tensor) else n) + 1
    return F.add(n, 1.0)


class Writes:
    """How an update's results are written: the ops that produce a new parameter or state
    value from the old one (``mul(a, x)``, ``add(a, x)``, ``sub(a, x)``, ``maximum(a, x)``,
    ``fill(a, value)``), either into ``a`` itself or as new tensors. The kernels are the
    same either way (``mul_`` runs ``mul``'s, into its input)."""

    __slots__ = ("name", "mul", "add", "sub", "maximum", "fill")

    def __init__(self, name, mul, add, sub, maximum, fill):
        self.name, self.mul, self.add, self.sub = name, mul, add, sub
        self.maximum, self.fill = maximum, fill

    def __repr__(self) -> str:
        return self.name


IN_PLACE = Writes("IN_PLACE", F.mul_, F.add_, F.sub_, _max_into, F.fill_)
OUT_OF_PLACE = Writes("OUT_OF_PLACE", F.mul, F.add, F.sub, F.maximum, _replace)


class Optimizer:
    """``params``: an iterable of tensors, or of dicts ``{"params": [...], **options}``
    (groups with their own options); ``defaults``: every option and its default."""

    caches: tuple = ()  # attributes that are caches (made again by an optimizer's copy
    #                     elsewhere: a pipeline stage's worker is not sent them)
    _waits: tuple = ()  # the steps of this optimizer still running elsewhere (pipelines'
    #                     stages' workers: a weak method each), waited for by _settle

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.state: dict = {}
        self._rates: dict = {}  # id(group) -> (group, graph_rates' tensors, values in
        #                         them, their device)
        self.param_groups: list = []
        if isinstance(params, Tensor):
            raise TypeError(
                f"{type(self).__name__}: params must be an iterable of tensors "
                f"(model.parameters()), got a single Tensor; wrap it in a list"
            )
        groups: list[Any] = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: expected tensors, got {type(p).__name__}")
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

    def steps_by_update(self) -> bool:
        """Whether ``step()`` is ``Optimizer.step`` (each parameter's ``update`` in turn),
        which another process can run with a copy of the optimizer; False for a class
        with a step of its own."""
        return type(self).step is Optimizer.step

    def _settle(self, mine: Any = None) -> None:
        """Waits for the steps of this optimizer still running elsewhere (pipelines whose
        stages' workers step it after a batch: each one's), raising the first one's error
        once all are waited for, before this process reads or writes the state (``step``,
        ``state_dict``, ``load_state_dict``, another pipeline's batch). ``mine``: the wait
        of the pipeline asking (a bound method), left pending: it checks its own step at
        its next batch."""
        waits = self._waits
        pending = [w() for w in waits]
        self._waits = tuple(
            w for w, f in zip(waits, pending, strict=True) if f is not None and f == mine
        )
        first = None
        for k, settle in enumerate(pending):
            if settle is None or settle == mine:
                continue
            try:
                settle()
            except Exception as e:  # noqa: BLE001 - raised below, once all are waited for
                if first is None:
                    first = e
                else:
                    add_note(first, f"another pipeline's step failed too: {e!r}")
            except BaseException as stop:  # (Ctrl-C: the steps not waited for yet are kept)
                rest = zip(waits[k + 1 :], pending[k + 1 :], strict=True)
                self._waits += tuple(w for w, f in rest if f is not None and f != mine)
                if first is not None:
                    add_note(stop, f"another pipeline's step had failed: {first!r}")
                raise
        if first is not None:
            raise first

    def _waiting(self, settle: Any, pending: bool) -> None:
        """Notes (``pending``) or forgets the wait ``settle`` (a pipeline's bound method:
        kept weakly) for this optimizer's step running elsewhere."""
        kept = tuple(w for w in self._waits if (f := w()) is not None and f != settle)
        self._waits = kept + (weakref.WeakMethod(settle),) if pending else kept

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient, in place (``update`` with
        ``IN_PLACE``); ``closure`` recomputes the loss first and its value is returned."""
        self._settle()
        loss = None
        if closure is not None:
            from ..autograd import enable_grad

            with enable_grad():
                loss = closure()
        with no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        st = self._state(p, g)
                        st.update(self.update(p, p.grad, g, st, IN_PLACE)[1])
        return loss

    def update(
        self,
        p: Tensor,
        grad: Tensor,
        group: dict[str, Any],
        state: dict[str, Any],
        writes: Writes = OUT_OF_PLACE,
        rates: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        """The optimizer's formula for one parameter: ``(p', state')`` from ``p``, its
        gradient, its state (as ``_state`` makes it) and its group's options, written as
        ``writes`` says (``IN_PLACE``: ``p'`` is ``p`` and the state tensors are written in
        place). ``nn.Graph`` traces it ``OUT_OF_PLACE``, with ``rates``: the stand-ins of
        ``graph_rates``' tensors, read in place of the ``scheduled`` options' values (the
        group's own values still decide which ops run)."""
        raise NotImplementedError

    def _state(self, p, group: dict) -> dict:
        """``p``'s state, every entry the update reads made now if missing (``_fill``), and
        each of its tensors where ``p`` is (``F.to_where``): a state made before its
        parameter moved (Adagrad's, made with the optimizer, before ``model.to_global(...)``
        or a pipeline's ``stage_ranks=`` moved the model) follows it."""
        st = self.state.get(p)
        if st is None:
            st = self.state[p] = {}
        self._fill(p, group, st)
        for name, v in st.items():
            if isinstance(v, Tensor) and not F.is_where(v, p):
                st[name] = F.to_where(v, p)
        return st

    def _fill(self, p, group: dict, state: dict) -> None:
        """Adds what ``state`` lacks of what ``update`` reads under ``group``'s options."""

    def _holds(self, group: dict, name: str) -> bool:
        """Whether the state of a parameter of ``group`` holds ``name``."""
        return any(self.state.get(p, {}).get(name) is not None for p in group["params"])

    # -- graph mode ------------------------------------------------------------------------
    counts: tuple = ()  # state entries that count steps: ints in eager mode
    flags: tuple = ()  # state entries that are float64 scalars in both modes
    scheduled: tuple = ("lr",)  # options a scheduler changes per step: read as state

    def graph_key(self, group: dict[str, Any]) -> str:
        """The options of ``group`` a compiled step is kept by (they decide its ops): all but
        the ``scheduled`` ones, which the step reads as state (``graph_rates``), so a
        schedule changes them without compiling the step anew."""
        return repr(
            [kv for kv in group.items() if kv[0] != "params" and kv[0] not in self.scheduled]
        )

    def graph_rates(self, group: dict[str, Any]) -> dict[str, Tensor]:
        """``group``'s ``scheduled`` options as the float64 0-d tensors an ``nn.Graph`` step
        reads them from (a tuple option, ``betas``, one tensor per item: ``betas.0``...),
        written from the group's values now. Called when the step compiles and before
        every step and run, so each step reads the values the group holds then. The
        tensors are the group's own, made on its parameters' device and written in place;
        made anew there when the parameters moved (``Module.to``)."""
        got = self._rates.get(id(group))
        device = group["params"][0].device if group["params"] else None
        if got is None or got[0] is not group or got[3] != device:
            made: dict[str, Tensor] = {}
            values: dict[str, float] = {}
            got = self._rates[id(group)] = (group, made, values, device)
            for name, v in _flat_rates(group, self.scheduled):
                made[name] = tensor(float(v), dtype="float64", device=device)
                values[name] = float(v)
        _, tensors, written, _ = got
        with no_grad():
            for name, v in _flat_rates(group, self.scheduled):
                if written[name] != v:
                    F.fill_(tensors[name], float(v))
                    written[name] = float(v)
        return dict(tensors)

    def flat_rates(self, group: dict[str, Any]) -> list[tuple[str, Any]]:
        """``(name, value)`` per scheduled option of ``group`` (a tuple's items as
        ``name.i``): the names ``rates`` reads from ``traced``."""
        return list(_flat_rates(group, self.scheduled))

    def rates(self, group: dict[str, Any], traced: dict[str, Any] | None) -> dict[str, Any]:
        """The options an update reads: ``group`` itself (eager), or with ``traced`` (a
        graph step's stand-ins for ``graph_rates``' tensors) in place of the ``scheduled``
        values."""
        if traced is None:
            return group
        out = dict(group)
        for name in self.scheduled:
            v = group[name]
            out[name] = (
                tuple(traced[f"{name}.{i}"] for i in range(len(v)))
                if isinstance(v, tuple)
                else traced[name]
            )
        return out

    def graph_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """``p``'s state as the tensors an ``nn.Graph`` step reads and then writes in
        place: the optimizer's own state tensors (made now if missing), with each count
        (``counts``) turned into a float64 tensor kept in the state, which ``update``
        then reads in either mode. Called when the step compiles and before every step
        and run, so the graph always works on the state eager steps left."""
        st = self._state(p, group)
        for k in self.counts:
            if not isinstance(st[k], Tensor):
                st[k] = tensor(float(st[k]), dtype="float64", device=p.device)
        return dict(st)

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: ``{"state": {param index: {name: value}}, "param_groups":
        [{options..., "params": [param indices]}]}`` (indices in group order)."""
        self._settle()
        index: dict = {}
        groups = []
        for g in self.param_groups:
            ids = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: self._saved(st) for p, st in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def _saved(self, st: dict) -> dict:
        """A parameter's state as ``state_dict`` gives it: the counts as ints (a graph step
        keeps them as tensors)."""
        return {
            k: int(v.item()) if k in self.counts and isinstance(v, Tensor) else v
            for k, v in st.items()
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes what ``state_dict()`` gave (or ``af.load`` read back) for an optimizer over
        parameters of the same shapes, in the same groups: options and state are copied,
        each state tensor onto its parameter's device (a global parameter's: laid out as
        the parameter, a 0-d one broadcast on its placement), whichever device it was
        saved from."""
        self._settle()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"])
            for a, b in zip(groups, self.param_groups, strict=True)
        ):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the saved groups hold "
                f"{[len(g['params']) for g in groups]} parameters, this optimizer's "
                f"{[len(g['params']) for g in self.param_groups]}"
            )
        by_index = {}
        for saved, mine in zip(groups, self.param_groups, strict=True):
            for i, p in zip(saved["params"], mine["params"], strict=True):
                by_index[int(i)] = p
            for k, v in saved.items():
                if k != "params":
                    mine[k] = tuple(v) if isinstance(v, list) else v
        self.state = {}
        for i, st in state_dict["state"].items():
            p = by_index[int(i)]
            mine = {}
            for k, v in st.items():
                if k in self.counts:  # (PyTorch saves them as tensors)
                    v = int(v.item() if isinstance(v, Tensor) else v)
                elif k in self.flags:
                    v = tensor(float(v.item() if isinstance(v, Tensor) else v), dtype="float64")
                    v = F.to_where(v, p)
                elif isinstance(v, Tensor):
                    if tuple(v.shape) != tuple(p.shape) and v.ndim:
                        raise ValueError(
                            f"{type(self).__name__}.load_state_dict: state "
                            f"{k!r} of parameter {i} has shape {tuple(v.shape)}, "
                            f"the parameter {tuple(p.shape)}"
                        )
                    v = F.to_where(v.to(p.dtype), p).clone()
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


def _flat_rates(group: dict, names: tuple):
    """``(name, value)`` per scheduled option of ``group``, a tuple's items as ``name.i``."""
    for name in names:
        v = group[name]
        if isinstance(v, tuple):
            for i, x in enumerate(v):
                yield f"{name}.{i}", x
        else:
            yield name, v
