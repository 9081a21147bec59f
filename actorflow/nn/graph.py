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

from pathlib import Path

from ..autograd import enable_grad, no_grad
from ..autograd.graph import Meta
from ..creation import from_numpy
from ..errors import TraceError
from ..runtime.graph import ActorGraph
from ..runtime.spec import PieceSpec, Spec, flatten, unflatten
from ..runtime_api import synchronize
from ..tensor.tensor import Tensor
from ..tracing import stateful_graph, stateful_program
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
    def _modules(self) -> list:
        return [v for v in vars(self).values() if isinstance(v, Module)]

    def _params(self) -> list:
        """Every parameter of the graph's modules and optimizers, then every buffer: what a
        step reads as state (live storage, never a constant copied when traced)."""
        seen, out = set(), []
        mods = self._modules()
        groups = [p for o in self._optimizers for g in o.param_groups for p in g["params"]]
        for p in [p for m in mods for p in m.parameters()] + groups + \
                [b for m in mods for b in m.buffers()]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _step_fn(self):
        """What one step records: ``fn(piece, states=[...]) -> (output, new states)``, the
        state tensors (parameters, then each optimizer's per-parameter state) and the
        optimizer rows ``(optimizer, group, param, {name: state tensor})``."""
        params = self._params()
        opt_rows = []
        for o in self._optimizers:
            for g in o.param_groups:
                for p in g["params"]:
                    opt_rows.append((o, g, p, o.graph_state(p, g)))
        state = list(params) + [t for *_, st in opt_rows for t in st.values()]
        build = self.build
        pos = {id(p): i for i, p in enumerate(params)}

        def fn(piece, states):
            real = [p._impl for p in params]
            try:
                for p, ph in zip(params, states):
                    if p.requires_grad:
                        ph._impl.ag = Meta()            # a leaf that requires grad
                    p._impl = ph._impl
                with enable_grad():     # one piece: build's arguments, or its one argument
                    out = build(*piece) if isinstance(piece, (tuple, list)) else build(piece)
                new = [None] * len(states)
                at = len(params)
                with no_grad():
                    for o, g, p, st in opt_rows:
                        names = list(st)
                        mine = dict(zip(names, states[at:at + len(names)]))
                        if p.grad is not None:
                            new_p, new_st = o.graph_update(p, p.grad, g, mine)
                            new[pos[id(p)]] = new_p
                            for k, name in enumerate(names):
                                new[at + k] = new_st.get(name)
                        at += len(names)
                return out, new
            finally:
                for p, impl in zip(params, real):
                    p._impl = impl
        return fn, state, opt_rows

    def _settings(self) -> tuple:
        """What a compiled step bakes in besides the input layout: each module's train/eval
        mode, each optimizer group's hyperparameters (a new ``lr`` compiles anew) and which
        parameters require grad."""
        modes = tuple(m.training for v in self._modules() for m in v.modules())
        hyper = tuple(tuple(sorted((k, repr(v)) for k, v in g.items() if k != "params"))
                      for o in self._optimizers for g in o.param_groups)
        frozen = tuple(p.requires_grad for p in self._params())
        return modes, hyper, frozen

    def _compile(self, in_specs: tuple):
        """The step as one Program (``step()``), per input layout."""
        key = (tuple((ps.structure, tuple(ps.specs)) for ps in in_specs), self._settings())
        got = self._compiled.get(key)
        if got is None:
            fn, state, opt_rows = self._step_fn()
            specs = [Spec(t.shape, t.dtype, t.device) for t in state]
            try:
                program = stateful_program(lambda *a, states: fn(a[0], states), list(in_specs),
                                           specs)
            except TraceError as e:
                raise TraceError(f"{type(self).__name__}.build: {e}") from e
            got = self._compiled[key] = (program, state, opt_rows)
        return got

    def _compile_graph(self, spec, buffers, memory):
        """The step as an ActorGraph with an actor per op (``run()``), per input layout."""
        key = ("graph", spec.structure, tuple(spec.specs), buffers, repr(memory),
               self._settings())
        got = self._compiled.get(key)
        if got is None:
            fn, state, opt_rows = self._step_fn()
            specs = [Spec(t.shape, t.dtype, t.device) for t in state]
            try:
                g, shared = stateful_graph(fn, spec, specs, type(self).__name__,
                                           dict(memory=memory, buffers=buffers))
            except TraceError as e:
                raise TraceError(f"{type(self).__name__}.build: {e}") from e
            got = self._compiled[key] = (g, shared, state, opt_rows)
        return got

    def _fused_graph(self, spec, buffers, memory):
        """The step as one op actor running the program ``step()`` runs."""
        key = ("fused", spec.structure, tuple(spec.specs), buffers, repr(memory),
               self._settings())
        got = self._compiled.get(key)
        if got is None:
            program, state, opt_rows = self._compile((spec,))
            g = ActorGraph(memory=memory, buffers=buffers)
            inp = g.input(out=unflatten(spec.structure, list(spec.specs)),
                          name=f"inputs of {type(self).__name__}")

            def traced(*_):
                raise AssertionError("the step is built by nn.Graph")
            traced.__name__ = "step"
            a = g.op(traced, inp, name="step")
            a.build = lambda specs: program
            g.sink(a)
            got = self._compiled[key] = (g, program, state, opt_rows)
        return got

    def _arrays(self, state, opt_rows) -> list:
        """The state's arrays, once the optimizers' eager state is in the graph's tensors
        and every eager write to them is done."""
        with no_grad():
            for o, g, p, st in opt_rows:
                o.graph_sync(p, g, st)
        synchronize()
        return [t._impl.array() for t in state]

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
        arrays = [_values(a) if isinstance(a, Tensor) else a for a in leaves]
        spec = PieceSpec.of(unflatten(structure, arrays), "nn.Graph.step")
        program, state, opt_rows = self._compile((spec,))
        program.state_arrays = self._arrays(state, opt_rows)
        if not program.bound:               # its workspace, kept for the next steps
            program.tmp = [_empty(s) for s in program.tmp_specs]
            program.bound = True
        outs = [_empty(s) for s in program.out_spec.specs]
        program.run(outs, [spec_arrays(arrays, spec)])
        self._done(state, opt_rows)
        return unflatten(program.out_spec.structure, [from_numpy(o) for o in outs])

    def run(self, iterable, buffers: int = 2, memory=None, fused: bool = False,
            trace=None, progress=False):
        """Runs ``build`` on every item of ``iterable`` (a DataLoader, a list, a function
        returning an iterable...) as an ActorGraph: an actor per op of the step, and one
        per state written back, fed by a source actor reading the iterable, so the next
        items load (and the first layers of the next piece run) while a piece trains; the
        parameters are updated in piece order. Yields what ``build`` returns per item.
        Items of another layout (a loader's last, smaller batch) start a run of their own
        (compiled once per layout).

        ``fused=True`` runs the whole step as one op actor instead (the program ``step()``
        runs): no overlap between the ops of consecutive pieces, but one act per piece
        instead of one per op, which wins where ops are small and Python's cost per act
        dominates. ``trace``: a path for the run's timeline (Chrome trace JSON, as
        ``ActorGraph.run``); a run per further layout writes ``name.1.json``, ...).
        ``progress``: a progress bar of the steps (tqdm; True or tqdm's arguments), with
        the bottleneck; its total is ``len(iterable)`` when it has one."""
        if callable(iterable) and not hasattr(iterable, "__iter__"):
            iterable = iterable()
        if progress:
            progress = dict(progress) if isinstance(progress, dict) else {}
            progress.setdefault("desc", "steps")
            if "total" not in progress and hasattr(iterable, "__len__"):
                progress["total"] = len(iterable)
        it = iter(iterable)
        item = next(it, _NONE)
        runs = done = 0
        while item is not _NONE:            # a run per layout: a register has one size
            spec = PieceSpec.of(item, "nn.Graph.run")
            key = (spec.structure, tuple(spec.specs))
            later: list = []

            def same_layout(first=item, key=key, later=later):
                yield first
                for x in it:
                    s = PieceSpec.of(x, "nn.Graph.run")
                    if (s.structure, tuple(s.specs)) != key:
                        later.append(x)     # (the last, smaller batch of a loader...)
                        return
                    yield x
            path = trace
            if trace is not None and runs:
                p = Path(trace)
                path = p.with_name(f"{p.stem}.{runs}{p.suffix}")
            shown = dict(progress, initial=done) if progress else False   # (one bar's
            for out in self._run_layout(spec, same_layout(), buffers, memory, fused, path,
                                        shown):                            # count on)
                done += 1
                yield out
            runs += 1
            item = later[0] if later else _NONE

    def _run_layout(self, spec, feed, buffers, memory, fused, trace=None, progress=False):
        if fused:
            g, program, state, opt_rows = self._fused_graph(spec, buffers, memory)
            program.state_arrays = self._arrays(state, opt_rows)
        else:
            g, shared, state, opt_rows = self._compile_graph(spec, buffers, memory)
            shared[:] = self._arrays(state, opt_rows)
        self._graph = g
        nothing = getattr(g, "yields_nothing", False)
        try:
            for out in g.run(feed=feed, trace=trace, progress=progress):
                yield None if nothing else out
        finally:
            g.join()
            self._done(state, opt_rows)

    def stats(self):
        """The last ``run()``'s statistics (see ActorGraph.stats)."""
        return self._graph.stats()

    def __repr__(self) -> str:
        mods = [f"({k}): {v!r}".replace("\n", "\n  ") for k, v in vars(self).items()
                if isinstance(v, Module)]
        return f"{type(self).__name__}(\n  " + "\n  ".join(mods) + "\n)"


_NONE = object()


def _values(t: Tensor):
    """A tensor's values for the step to read: its own array when nothing is still being
    written into it (no copy, no wait), else a copy taken after the writes."""
    impl = t._impl
    blob = impl.blob
    if blob.backend.has_data and blob.allocated and blob.error is None and blob.idle() \
            and impl.meta.shape is not None:
        return impl.array()
    return t.numpy()


def _empty(spec):
    import numpy as np
    return np.empty(spec.shape, spec.dtype.np)


def spec_arrays(arrays, spec):
    """The arrays of a piece, contiguous and in their spec's dtype (as a register holds)."""
    import numpy as np
    return [np.ascontiguousarray(a, dtype=s.dtype.np) for a, s in zip(arrays, spec.specs)]


__all__ = ["Graph"]
