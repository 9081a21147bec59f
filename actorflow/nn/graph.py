"""nn.Graph: a training (or inference) step traced once, then run as a program of op
kernels with its parameters and optimizer state as state held across pieces.

``build(*args)`` is traced through the lazy interpreter on placeholders of the first
call's shapes: the forward ops, ``loss.backward()`` (autograd records on the placeholders,
its rules are recorded too) and, for each optimizer given to ``add_optimizer``, its update
in graph form (``graph_update``: the eager formulas out of place, so the numbers are the
same). The result is one Program (``tracing.stateful_program``) whose state arrays are the
parameters' own storage and the optimizer state's: after a step the module holds the
updated values, as after an eager step.

``step(*args)`` (or calling the graph) runs one iteration on the caller's thread;
``run(iterable, buffers=2, memory=...)`` runs many as an ActorGraph, the loader a source
actor and the step an op actor, so batch i+1 loads while batch i computes.
"""

from __future__ import annotations

from ..autograd import enable_grad, no_grad
from ..autograd.graph import Meta
from ..creation import tensor
from ..errors import TraceError
from ..runtime.graph import ActorGraph
from ..runtime.spec import PieceSpec, Spec, flatten, unflatten
from ..runtime_api import synchronize
from ..tensor.tensor import Tensor
from ..tracing import stateful_program
from .module import Module


class Graph:
    """Subclass it: assign modules (and a loss) as attributes in ``__init__`` after
    ``super().__init__()``, ``add_optimizer(opt)`` to train, and define ``build``."""

    def __init__(self):
        self._optimizers: list = []
        self._compiled: dict = {}           # input PieceSpecs -> (program, state, opt rows)

    def add_optimizer(self, optimizer) -> None:
        if not (hasattr(optimizer, "param_groups") and hasattr(optimizer, "graph_update")):
            raise TypeError(f"add_optimizer: expected an actorflow optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizers.append(optimizer)
        self._compiled.clear()

    def build(self, *args):
        raise NotImplementedError(f"{type(self).__name__} has no build(); define "
                                  f"build(self, ...) with what one step computes")

    # -- what the graph holds --------------------------------------------------------------
    def _params(self) -> list:
        seen, out = set(), []
        mods = [v for v in vars(self).values() if isinstance(v, Module)]
        groups = [p for o in self._optimizers for g in o.param_groups for p in g["params"]]
        for p in [p for m in mods for p in m.parameters()] + groups:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _compile(self, in_specs: tuple):
        key = tuple((ps.structure, tuple(ps.specs)) for ps in in_specs)
        got = self._compiled.get(key)
        if got is not None:
            return got
        params = self._params()
        trained = {id(p) for o in self._optimizers for g in o.param_groups for p in g["params"]}
        opt_rows = []                       # (optimizer, group, param, {name: state tensor})
        for o in self._optimizers:
            for g in o.param_groups:
                for p in g["params"]:
                    opt_rows.append((o, g, p, o.graph_state(p, g)))
        state = list(params) + [t for *_, st in opt_rows for t in st.values()]
        state_specs = [Spec(t.shape, t.dtype, t.device) for t in state]
        build = self.build
        pos = {id(p): i for i, p in enumerate(params)}

        def fn(*args, states):
            real = [p._impl for p in params]
            try:
                for p, ph in zip(params, states):
                    if id(p) in trained or p.requires_grad:
                        ph._impl.ag = Meta()            # a leaf that requires grad
                    p._impl = ph._impl
                piece = args[0]             # one piece: build's arguments, or its one
                with enable_grad():
                    out = build(*piece) if isinstance(piece, (tuple, list)) else build(piece)
                new = [None] * len(states)
                at = len(params)
                with no_grad():
                    for o, g, p, st in opt_rows:
                        names = list(st)
                        mine = dict(zip(names, states[at:at + len(names)]))
                        grad = p.grad
                        if grad is not None:
                            new_p, new_st = o.graph_update(p, grad, g, mine)
                            new[pos[id(p)]] = new_p
                            for k, name in enumerate(names):
                                new[at + k] = new_st.get(name)
                        at += len(names)
                return out, new
            finally:
                for p, impl in zip(params, real):
                    p._impl = impl
        try:
            program = stateful_program(fn, list(in_specs), state_specs)
        except TraceError as e:
            raise TraceError(f"{type(self).__name__}.build: {e}") from e
        got = (program, state, opt_rows)
        self._compiled[key] = got
        return got

    def _attach(self, program, state) -> None:
        synchronize()                       # every eager write to the state is done
        program.state_arrays = [t._impl.array() for t in state]

    def _done(self, state, opt_rows) -> None:
        for t in state:
            t._impl.blob.version += 1       # written outside the VM: saved tensors see it
        for o, g, p, st in opt_rows:
            o.graph_done(p, g, st)

    # -- running ---------------------------------------------------------------------------
    def __call__(self, *args):
        return self.step(*args)

    def step(self, *args):
        """One iteration on ``args`` (tensors or arrays): returns what ``build`` returns,
        with parameters and optimizer state updated."""
        leaves, structure = flatten(args)
        arrays = [a.numpy() if isinstance(a, Tensor) else a for a in leaves]
        spec = PieceSpec.of(unflatten(structure, arrays), "nn.Graph.step")
        program, state, opt_rows = self._compile((spec,))
        self._attach(program, state)
        outs = [_empty(s) for s in program.out_spec.specs]
        program.run(outs, [spec_arrays(arrays, spec)])
        self._done(state, opt_rows)
        return unflatten(program.out_spec.structure, [tensor(o) for o in outs])

    def run(self, iterable, buffers: int = 2, memory=None, name: str = "loader"):
        """Runs ``build`` on every item of ``iterable`` (a DataLoader, a list, a function
        returning an iterable...) as an ActorGraph: the loader is a source actor, the
        step an op actor; yields what ``build`` returns per item (numpy arrays)."""
        g = ActorGraph(memory=memory, buffers=buffers)
        src = g.source(iterable, name=name)
        compiled = []

        def build(specs):
            program, state, opt_rows = self._compile(tuple(specs))
            self._attach(program, state)
            compiled.append((state, opt_rows))
            return program

        def traced(*_):
            raise AssertionError("the step is built by nn.Graph")
        traced.__name__ = type(self).__name__
        step = g.op(traced, src, name="step")
        step.build = build
        g.sink(step)
        self._graph = g
        try:
            yield from g.run()
        finally:
            g.join()
            for state, opt_rows in compiled[-1:]:
                self._done(state, opt_rows)

    def stats(self):
        """The last ``run()``'s statistics (see ActorGraph.stats)."""
        return self._graph.stats()

    def __repr__(self) -> str:
        mods = [f"({k}): {v!r}".replace("\n", "\n  ") for k, v in vars(self).items()
                if isinstance(v, Module)]
        return f"{type(self).__name__}(\n  " + "\n  ".join(mods) + "\n)"


def _empty(spec):
    import numpy as np
    return np.empty(spec.shape, spec.dtype.np)


def spec_arrays(arrays, spec):
    """The arrays of a piece, contiguous and in their spec's dtype (as a register holds)."""
    import numpy as np
    return [np.ascontiguousarray(a, dtype=s.dtype.np) for a, s in zip(arrays, spec.specs)]


__all__ = ["Graph"]
