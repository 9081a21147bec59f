"""nn.Graph: a training (or inference) step traced once, then run as a program of op
kernels with its parameters and optimizer state as state held across pieces.

``build(*args)`` is traced through the lazy interpreter on placeholders of the first
call's shapes: the forward ops, ``loss.backward()`` (autograd records on the placeholders,
its rules are recorded too) and, for each optimizer given to ``add_optimizer``, its update
(``update``, the one formula eager ``step()`` runs in place, traced out of place, so the
numbers are the same). The result is one Program (``tracing.stateful_program``) whose state
arrays are the parameters' own storage and the optimizer's state tensors
(``graph_state``): after a step the module and the optimizer hold the updated values, as
after an eager step.

``step(*args)`` (or calling the graph) runs one iteration on the caller's thread;
``run(iterable, buffers=2, memory=...)`` runs many as one ActorGraph (``stateful_graph``):
an actor per op of the step and one per state written back, the op actors reading the
register of a source actor that reads the iterable or, for a DataLoader, of the loader's
own actors (its sampler and its loading stage on its workers: ``actors_into``), so batch
i+1 loads while batch i computes; ``fused=True`` makes the step one op actor instead.

On a CUDA device (parameters on ``cuda:0``) ``step()`` issues the compiled step as one
instruction on the device's compute stream (``tracing.device.DeviceProgram``) and returns
its outputs as tensors there at once (reading one is the wait); a static step is captured
as a CUDA graph once and replayed (``cuda_graph=False`` launches its kernels one by one).
``run(...)`` there keeps the batches in device registers: cuda tensors are stored as they
are (a device source), host batches (arrays, cpu tensors, a host DataLoader's) are copied
over by a copy actor on the device's copy stream (``to_device``, double-buffered: batch
i+1's copy overlaps step i), a ``DataLoader(device="cuda:0")``'s own copy is read as it is.
With ``fused=True`` the step's op actor issues the compiled step there (``DeviceSteps``,
captured and replayed as ``step()`` is); with an actor per op each op's actor launches its
kernel there and each state's writer copies its new value over on the device. An act ends
when its device work completed (no host wait). The outputs are copied to the host
(``to_host``): the run yields host arrays, as on the cpu.

A compiled step holds what ``build`` read when traced, so it is kept only as long as that
still holds (``_Traced``, checked before every step and run): the Graph's attributes, its
modules' tree (children, parameters and buffers by identity, their other attributes, hooks),
the optimizers' parameter groups, the globals and closure variables ``build`` reads, and the
class attributes and globals the model's code reaches from the modules' ``forward`` and from
``build`` (``code_reads.py``: ``self.scale`` set on the class, a constant or a function it uses,
what a base's ``forward``, a child's method, a helper method of the Graph, a function of the
script it calls or one held as an attribute reads; not another module's globals read as its
attributes, a plain config class's attributes, a name given to ``getattr``, a class
attribute set later where there was none, nor what a dict, list or config object a module
holds holds, changed in place: it is compared by identity); a change compiles the step anew
(a name the loop sets every step compiles every step: the third compile such a name causes
warns, naming it). Checking costs a few comparisons per step: the modules count their
changes (``module.structure_version``) and are walked again only when that count moved; the
class attributes and globals are looked up each step. Per compiled step, its key also holds
the input layout, the train/eval modes, the optimizers' options (``graph_key``) and which
parameters require grad. The options a scheduler changes per step (``Optimizer.scheduled``:
``lr``, SGD's momentum, Adam's betas) are state the step reads (``graph_rates``: a float64
tensor each, written from the group before every step and run), so a schedule compiles
nothing anew. A scheduler given to ``add_optimizer(opt, lr_sch=...)`` is stepped by the
graph after every step: after each ``step()``, and inside a ``run()`` per piece, where the
rates are inputs of the piece instead (``_Schedules``: the run's source side takes step k's
rates as it makes piece k, a float64 scalar per scheduled option per group, then steps the
scheduler; a loader's batches get theirs in a stage after its loading actor), so a per-batch
schedule (OneCycleLR, warm-up then cosine) trains within one run as an eager loop does. A
tensor ``build`` captures from outside (not a parameter or buffer) is read live at every
step.

Random ops in ``build`` (dropout in training mode, ``scaled_dot_product_attention``'s
``dropout_p``, ``af.rand``/``af.randn``) draw new values every step: each is recorded as a
counter-based draw (numpy's Philox, ``rand_step``) keyed by the graph's seed (``_seed``,
taken when the graph is made from a child of ``af.manual_seed``'s generator) and its place
among the step's random ops, its counter the graph's step count (``_count``, an int64 state
every such step reads and adds one to, written back in piece order like the parameters).
So the k-th step draws the same values as ``step()``, as a piece of ``run()`` (whose op
actors may act on piece k+1 before piece k is done), fused or not, and on a CUDA device.
The values are not eager mode's (an eager op draws from ``af.manual_seed``'s generator
itself), as PyTorch's compiled graphs draw otherwise than its eager ops. In eval mode
dropout is the identity: nothing random is traced and the count stays.
"""

from __future__ import annotations

import copy
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..autograd import enable_grad, no_grad
from ..code_reads import PLAIN, ModelReads, attribute_names, class_value, global_names
from ..creation import from_numpy, spawned_seed
from ..dtype import bfloat16
from ..errors import ActorError, DeviceError, DTypeError, KernelError, PlanError, TraceError
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.graph.checks import check_timeout
from ..runtime.plan.spec import PieceSpec, Spec, flatten, unflatten
from ..runtime_api import lend_arrays, peek_array, written_outside
from ..sbp import Placement
from ..tensor.tensor import Tensor, wrap
from ..tracing import stateful_graph, stateful_program
from ..tracing.recording import standing_in
from .module import Module, changed, structure_version

if TYPE_CHECKING:
    from typing import Protocol

    from ..runtime.observe.stats import RunStats
    from .pipeline_graph import PipelineStep

    # what the Graph reads of an optimizer and a scheduler (``af.optim``'s, a layer beside:
    # not imported here)
    class _OptimizerLike(Protocol):
        param_groups: list[dict[str, Any]]

        def graph_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]: ...

    class _SchedulerLike(Protocol):
        optimizer: Any
        last_epoch: int

        def step(self) -> None: ...
        def get_last_lr(self) -> list[float]: ...
        def state_dict(self) -> dict[str, Any]: ...
        def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


# what a learning-rate scheduler has (``optim.lr_scheduler.LRScheduler``, a layer beside)
_SCHEDULER = ("optimizer", "step", "get_last_lr", "last_epoch", "state_dict", "load_state_dict")
# the Graph's own bookkeeping: setting these is not a change to what build reads
_INTERNAL = frozenset(
    {
        "_optimizers",
        "_replay",
        "_lr_sch",
        "_compiled",
        "_traced",
        "_recompiled_by",
        "_graph",
        "cuda_graph",
        "_seed",
        "_count",
        "_pipeline",
    }
)


def _no_bfloat16(graph, what: str, leaves) -> None:
    """Refuses a bfloat16 tensor (or Spec) among a step's inputs or outputs: they are numpy
    arrays, and numpy has no bfloat16."""
    for i, x in enumerate(leaves):
        if getattr(x, "dtype", None) is bfloat16:
            raise DTypeError(
                f"{type(graph).__name__}: build's {what} {i} is bfloat16, which a "
                f"step's inputs and outputs cannot be (numpy has no bfloat16); "
                f"feed float32 and cast inside build (x.bfloat16()), and return "
                f"float32 (y.float())"
            )


class Graph:
    """Subclass it: assign modules (and a loss) as attributes in ``__init__`` after
    ``super().__init__()``, ``add_optimizer(opt)`` to train, and define ``build``.

    ``cuda_graph``: on a CUDA device, capture a static step as a CUDA graph and replay it
    (the default); False launches its kernels one by one every step. It may be set on the
    graph at any time (``self.cuda_graph = False``) without compiling the step again. On a
    GPU (the CuPy driver) a step with an op in the reference form (its numpy kernel over
    the device arrays: a strided view, an op the kernel generator does not cover) is not
    captured, since those calls may allocate memory during a capture: it is launched one
    by one every step, as with False.

    ``stages=[m0, ..., m_n-1]`` (modules; the model is ``m_n-1(...m0(x))``) makes the graph
    a pipeline instead (``pipeline_graph.py``): each batch is cut along dim 0 into
    ``micro_batches`` micro-batches (as ``np.array_split``) that flow through the stages,
    forward and backward, as pieces of an ActorGraph, stage i holding at most
    ``stage_buffers[i]`` micro-batches for its backward (default ``n - i``: 1F1B). Its
    ``build(self, out, *rest)`` gets the last stage's output for one micro-batch and the
    rest of the item (the targets) cut the same way, and returns that micro-batch's loss
    without calling backward (the graph does, scaled by 1/micro_batches, so the
    gradients are those of the mean of the micro-batch losses: with a mean loss and equal
    micro-batches, those of the whole batch). Each optimizer steps once per batch, after
    its last backward; ``step(x, *rest)`` returns the batch's loss (the mean of its
    micro-batch losses), ``run(batches)`` yields it per batch. ``graph.pipelined`` holds
    the last batch's order of acts and each stage's peak of micro-batches and saved
    bytes held. ``stage_ranks="processes"`` (or ``"ray"``) makes each stage global on a
    one-rank placement of its own (``af.placement("cpu", ranks=[i])``) on ranks of that
    kind, so each stage computes in a worker process (a Ray actor) of its own;
    ``graph.pipelined.close()`` brings the stages back and ends the workers. ``loss=`` (a
    module without parameters or a function of ``(out, *rest)``) gives the micro-batch's
    loss in place of ``build``; with it and every stage on process ranks, the workers run
    each batch among themselves (``pipeline_links.py``)."""

    def __init__(
        self,
        cuda_graph: bool = True,
        *,
        stages: list | None = None,
        micro_batches: int = 1,
        stage_buffers: list | None = None,
        stage_ranks: str | None = None,
        loss: Any = None,
    ) -> None:
        self._pipeline = None  # stages=: what step() and run() hand the batches to
        if stages is not None:
            from .pipeline_graph import PipelineStep

            self._pipeline = PipelineStep(
                self, stages, micro_batches, stage_buffers, stage_ranks, loss
            )
        elif (
            micro_batches != 1
            or stage_buffers is not None
            or stage_ranks is not None
            or loss is not None
        ):
            raise ValueError(
                f"{type(self).__name__}(micro_batches={micro_batches!r}, "
                f"stage_buffers={stage_buffers!r}, stage_ranks={stage_ranks!r}"
                f"{', loss=...' if loss is not None else ''}): "
                f"these cut a pipeline's batches; give "
                f"stages=[...] (the model's modules in order) with them"
            )
        self.cuda_graph = cuda_graph  # on a CUDA device: a static step is one replay
        self._optimizers: list = []
        self._lr_sch: list = []  # the schedulers the graph steps after each step
        self._compiled: dict = {}  # (kind, layout, settings) -> what was compiled
        self._traced = None  # _Traced: what the compiled steps were traced with
        self._graph: ActorGraph | None = None  # the last run()'s ActorGraph
        # the seed of the step's random ops (their key: it and their place in the step),
        # from a child of af.manual_seed's generator (creation.spawned_seed): every compiled
        # form of the step draws the same values, and the n-th graph made after
        # manual_seed(s) the same whatever eager ops (inits, a loader's seed) drew meanwhile
        self._seed = spawned_seed()
        self._count = None  # the steps run, as the random ops read it
        self._replay: Any = None  # over global tensors: its step programs (parallel/programs.py)

    @property
    def pipelined(self) -> PipelineStep | None:
        """A pipeline graph's ``PipelineStep`` (``stages=``: its last batch's order of acts,
        each stage's peak of micro-batches and saved bytes held, its ActorGraph), else
        None."""
        return self._pipeline

    def __setattr__(self, name: str, value) -> None:
        old = self.__dict__.get(name)
        object.__setattr__(self, name, value)
        if self._watched(name, value, old):
            changed()  # build may read it: checked at the next step

    def __delattr__(self, name: str) -> None:
        old = self.__dict__.get(name)
        object.__delattr__(self, name)
        if self._watched(name, None, old):
            changed()

    def _watched(self, name: str, value, old) -> bool:
        """Whether setting ``name`` changes what ``_Traced`` compares: a module, or an
        attribute the class's methods read (a counter the training loop keeps on the Graph
        is not, and costs no walk of the modules at the next step)."""
        return name not in _INTERNAL and (
            isinstance(value, Module) or isinstance(old, Module) or name in _attrs_read(type(self))
        )

    def add_optimizer(
        self, optimizer: _OptimizerLike, *, lr_sch: _SchedulerLike | None = None
    ) -> None:
        """Trains with ``optimizer``: each step runs its update on the parameters of its
        groups.

        Args:
            optimizer: an actorflow optimizer.
            lr_sch: a scheduler of ``optimizer`` (``af.optim.lr_scheduler``) the graph
                steps once after every step, as an eager loop calls ``sched.step()`` after
                ``opt.step()``: after each ``step()``, and inside a ``run()`` per piece
                (piece k trains with the rates of step k: a per-batch schedule such as
                OneCycleLR, or warm-up then cosine, within one run).

        Raises:
            TypeError: ``optimizer`` is not an optimizer, or ``lr_sch`` not a scheduler.
            ValueError: ``lr_sch`` schedules another optimizer."""
        if not (hasattr(optimizer, "param_groups") and hasattr(optimizer, "graph_state")):
            raise TypeError(
                f"add_optimizer: expected an actorflow optimizer, got {type(optimizer).__name__}"
            )
        if lr_sch is not None:
            if not all(hasattr(lr_sch, k) for k in _SCHEDULER):
                raise TypeError(
                    f"add_optimizer: lr_sch must be a learning-rate scheduler "
                    f"(an af.optim.lr_scheduler.LRScheduler), got "
                    f"{type(lr_sch).__name__}; give one made for this optimizer, "
                    f"e.g. af.optim.lr_scheduler.OneCycleLR(optimizer, ...)"
                )
            if lr_sch.optimizer is not optimizer:
                raise ValueError(
                    f"add_optimizer: lr_sch ({type(lr_sch).__name__}) schedules "
                    f"another optimizer ({type(lr_sch.optimizer).__name__} at "
                    f"{id(lr_sch.optimizer):#x}), not this "
                    f"{type(optimizer).__name__} ({id(optimizer):#x}); give the "
                    f"scheduler made for this optimizer"
                )
            self._lr_sch.append(lr_sch)
        self._optimizers.append(optimizer)
        self._compiled.clear()
        self._traced = None

    def build(self, *args: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} has no build(); define "
            f"build(self, ...) with what one step computes"
        )

    # -- what the graph holds --------------------------------------------------------------
    def _modules(self) -> list:
        return [v for v in vars(self).values() if isinstance(v, Module)]

    def _params(self) -> list:
        """Every parameter of the graph's modules and optimizers, then every buffer: what a
        step reads as state (live storage, never a constant copied when traced)."""
        seen, out = set(), []
        mods = self._modules()
        groups = [p for o in self._optimizers for g in o.param_groups for p in g["params"]]
        for p in (
            [p for m in mods for p in m.parameters()]
            + groups
            + [b for m in mods for b in m.buffers()]
        ):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _step_fn(self, inputs: list, rated: bool = False):
        """What one step records: ``fn(piece, states=[...]) -> (output, new states)``, the
        state tensors (parameters and buffers, the step count, then each optimizer's
        per-parameter state), the optimizer rows ``(optimizer, group, param, {name: state
        tensor})``, what each state is, in words (for error messages), and the step
        count's index among them (what random ops read: ``_step_count``). ``inputs``: the
        step's input specs (the count is on the first one's device when no parameter is).
        ``rated``: a piece is ``(item, rates)``, the rates its step reads in place of the
        ``graph_rates`` state (a float64 scalar per scheduled option per group, in
        ``_rate_values``' order: a run's per-batch schedule, ``_Schedules``)."""
        _no_bfloat16(self, "input", inputs)
        params = self._params()
        opt_rows = []  # per group its rates (param None), then its params
        for o in self._optimizers:
            for g in o.param_groups:
                opt_rows.append((o, g, None, o.graph_rates(g)))
                for p in g["params"]:
                    opt_rows.append((o, g, p, o.graph_state(p, g)))
        where = params[0].device if params else (inputs[0].device if inputs else "cpu")
        state = (
            list(params)
            + [self._step_count(where)]
            + [t for *_, st in opt_rows for t in st.values()]
        )
        build = self.build
        pos = {id(p): i for i, p in enumerate(params)}

        def fn(piece, states):
            if rated:
                piece, given = piece
                given = iter(given)
            with standing_in(params, states[: len(params)]):
                with enable_grad():  # one piece: build's arguments, or its one argument
                    out = build(*piece) if isinstance(piece, (tuple, list)) else build(piece)
                _no_bfloat16(self, "output", flatten(out)[0])
                new = [None] * len(states)
                at = len(params) + 1
                with no_grad():
                    for o, g, p, st in opt_rows:
                        names = list(st)
                        mine = dict(zip(names, states[at : at + len(names)], strict=True))
                        if p is None:  # the group's rates: read, never written
                            rates = mine if not rated else {n: next(given) for n in names}
                        elif p.grad is not None:
                            new_p, new_st = o.update(p, p.grad, g, mine, rates=rates)
                            new[pos[id(p)]] = new_p
                            for k, name in enumerate(names):
                                new[at + k] = new_st.get(name)
                        at += len(names)
                for i, t in enumerate(new):  # a state build wrote in place (a buffer)
                    if t is None:
                        new[i] = states[i]
                return out, new

        return fn, state, opt_rows, self._state_names(params, opt_rows), len(params)

    def _step_count(self, device):
        """The steps this graph ran that drew random values, an int64 scalar on the step's
        ``device``: state a compiled step with random ops reads (they draw from
        ``rand_step``'s counter-based generator at this count) and adds one to, in piece
        order, so ``step()``, ``run()`` and ``run(fused=True)`` draw the same values for
        the same step. Made once, moved with the step."""
        from ..creation import zeros
        from ..dtype import int64

        if self._count is None:
            self._count = zeros((), dtype=int64, device=device)
        elif self._count.device != device:
            self._count = self._count.to(device)
        return self._count

    def _state_names(self, params: list, opt_rows: list) -> list:
        """Per state, what it is: ``parameter 'model.0.weight'``, ``buffer ...``, ``Adam
        state 'exp_avg' of parameter ...``."""
        names: dict = {}
        for k, v in vars(self).items():
            if isinstance(v, Module):
                for n, p in v.named_parameters(k):
                    names.setdefault(id(p), f"parameter {n!r}")
                for n, b in v.named_buffers(k):
                    names.setdefault(id(b), f"buffer {n!r}")
        out = [names.get(id(p), "a parameter of an optimizer") for p in params]
        out.append(f"the step count of {type(self).__name__}'s random ops")
        for o, g, p, st in opt_rows:
            for name in st:
                if p is None:
                    at = next(i for i, x in enumerate(o.param_groups) if x is g)
                    out.append(f"{type(o).__name__} group {at}'s {name!r}")
                else:
                    out.append(
                        f"{type(o).__name__} state {name!r} of {names.get(id(p), 'a parameter')}"
                    )
        return out

    # -- what a compiled step holds ----------------------------------------------------------
    def _check(self) -> tuple:
        """Before a step or a run: drops every compiled step when what ``build`` read has
        changed since it was traced (``_Traced``); returns the settings a compiled step is
        kept by besides its input layout: each module's train/eval mode, each optimizer
        group's hyperparameters (a new ``lr`` compiles anew) and which parameters require
        grad. A few comparisons when nothing changed: the modules are walked again only
        when ``structure_version`` moved. The rates a schedule changes (``lr``...) are not
        among them: the step reads them as state (``graph_rates``)."""
        t = self._traced
        groups = [g for o in self._optimizers for g in o.param_groups]
        if t is None or t.version != structure_version[0] or t.moved(groups):
            t = self._take_again()
        hyper = tuple(o.graph_key(g) for o in self._optimizers for g in o.param_groups)
        return t.modes, hyper, tuple(p.requires_grad for p in t.params)

    def _take_again(self):
        t = _Traced(self)
        old = self._traced
        warn = None
        if old is None or t.ident != old.ident:
            if old is not None and self._compiled:
                warn = self._note_changed(old)
            self._compiled.clear()  # traced with what is no longer there
        self._traced = t
        if warn is not None:
            warnings.warn(warn, RuntimeWarning, stacklevel=_user_frame())
        return t

    def _note_changed(self, old: _Traced) -> str | None:
        """Counts the compiles a changed global or class attribute caused; at the third one
        a name causes, what to warn (once per name): a compiled step holds the value its
        code read, so a name the loop sets every step (a ``step`` counter a helper reads,
        behind a flag too) makes every step compile anew."""
        counts = self.__dict__.setdefault("_recompiled_by", {})
        changed = [k for ns, k, v in old.names if not _same(_lookup(ns, k), v)]
        changed += [
            f"{c.__name__}.{k}" for c, k, v in old.classes if not _same(class_value(c, k), v)
        ]
        said = None
        for k in changed:
            counts[k] = counts.get(k, 0) + 1
            if counts[k] == 3 and said is None:
                said = (
                    f"{type(self).__name__}: its step was compiled anew 3 times because "
                    f"'{k}' changed, which code the model may run reads (build, a module's "
                    f"forward, or a function or method they call, even behind a flag); a "
                    f"compiled step holds the value it read, so each change compiles it "
                    f"again: pass the value as an input or a tensor (read live), or keep it "
                    f"out of the model's code"
                )
        return said

    def _keep(self, key, entry):
        """Keeps what was just compiled under ``key``. What build read is taken again after
        it ran (a build that sets attributes must not make every step compile anew)."""
        self._take_again()
        self._compiled[key] = entry
        return entry

    def _traced_error(self, e: TraceError) -> TraceError:
        return TraceError(f"{type(self).__name__}.build: {e}")

    def _compile(self, in_specs: tuple, settings: tuple, rated: bool = False):
        """The step as one Program (``step()``), per input layout (``rated``: a piece with
        its rates, ``_step_fn``'s)."""
        key = ("step", tuple((ps.structure, tuple(ps.specs)) for ps in in_specs), settings, rated)
        got = self._compiled.get(key)
        if got is None:
            fn, state, opt_rows, names, count = self._step_fn(
                [s for ps in in_specs for s in ps.specs], rated
            )
            specs = [Spec(t.shape, t.dtype, t.device) for t in state]
            try:
                program = stateful_program(
                    lambda *a, states: fn(a[0], states),
                    list(in_specs),
                    specs,
                    names,
                    count,
                    self._seed,
                )
            except TraceError as e:
                raise self._traced_error(e) from e
            got = self._keep(key, _Compiled(state, opt_rows, program=program))
        return got

    def _compile_graph(self, spec, buffers, memory, settings, loader=None, rated=0):
        """The step as an ActorGraph with an actor per op (``run()``), per input layout: fed
        by ``run(feed=...)``, or reading the register of a loader's actors (``loader``: one
        with ``actors_into``; the graph is kept for any loader of the same ``actors_key``,
        bound to ``loader`` for the run). ``rated``: the number of rates each piece carries
        (a per-batch schedule: pieces ``(item, rates)``, a loader's batches given theirs by
        ``_with_rates``)."""
        key = (
            "graph",
            spec.structure,
            tuple(spec.specs),
            buffers,
            repr(memory),
            settings,
            loader.actors_key if loader is not None else None,
            rated,
        )
        got = self._compiled.get(key)
        if got is None:
            device = _device_of(self._traced.params, [])
            full = _rated_spec(spec, rated, device)
            traced = full if device is None else _placed(full, device)
            fn, state, opt_rows, names, count = self._step_fn(list(traced.specs), bool(rated))
            specs = [Spec(t.shape, t.dtype, t.device) for t in state]
            added: list = []
            port: list = [None]

            def source(g):
                if device is not None:
                    node, reads = self._device_input(g, spec, device, loader, rated, port)
                    added.append(reads)
                    return node
                added.append(loader.actors_into(g, spec))
                return self._with_rates(g, added[0].node, spec, rated, port)

            try:
                g, shared, captured = stateful_graph(
                    fn,
                    traced,
                    specs,
                    type(self).__name__,
                    dict(memory=memory, buffers=buffers),
                    names,
                    None if loader is None and device is None else source,
                    count,
                    self._seed,
                )
            except TraceError as e:
                raise self._traced_error(e) from e
            got = self._keep(
                key,
                _Compiled(
                    state,
                    opt_rows,
                    graph=g,
                    shared=shared,
                    captured=captured,
                    reads=added[0] if added else None,
                    port=port,
                ),
            )
        return got

    def _fused_graph(self, spec, buffers, memory, settings, loader=None, rated=0):
        """The step as one op actor running the program ``step()`` runs, fed as
        ``_compile_graph``'s graph is (``run(feed=...)``, or a loader's actors; ``rated``
        as there). On a CUDA device every register the step reads or writes is there
        (``_on_device_graph``)."""
        key = (
            "fused",
            spec.structure,
            tuple(spec.specs),
            buffers,
            repr(memory),
            settings,
            loader.actors_key if loader is not None else None,
            rated,
        )
        got = self._compiled.get(key)
        if got is None:
            device = _device_of(self._traced.params, [])
            if device is not None:
                return self._on_device_graph(
                    key, device, spec, buffers, memory, settings, loader, rated
                )
            full = _rated_spec(spec, rated, None)
            step = self._compile((full,), settings, bool(rated))
            g = ActorGraph(memory=memory, buffers=buffers)
            reads, port = None, [None]
            if loader is None:
                inp = g.input(
                    out=unflatten(full.structure, list(full.specs)),
                    name=f"inputs of {type(self).__name__}",
                )
            else:
                reads = loader.actors_into(g, spec)
                inp = self._with_rates(g, reads.node, spec, rated, port)
            g.sink(g.op_program(step.program, inp, name="step"))
            got = self._compiled[key] = _Compiled(
                step.state,
                step.opt_rows,
                program=step.program,
                graph=g,
                captured=step.captured,
                reads=reads,
                port=port,
            )
        return got

    def _on_device_graph(self, key, device, spec, buffers, memory, settings, loader, rated=0):
        """``_fused_graph`` on a CUDA device: the batches in device registers (cuda tensors
        fed as they are, a DataLoader's on the device; host batches copied there by a copy
        actor on the copy stream, ``to_device``), the step's op actor issuing the step on
        the compute stream (``DeviceSteps``) into its device register, and a copy of that to
        the host (``to_host``) for what the run yields: host arrays, as on the cpu."""
        from ..tracing.device import DeviceSteps

        on = _placed(_rated_spec(spec, rated, device), device)
        step = self._compile((on,), settings, bool(rated))
        program = DeviceSteps(self._device_program(step, device), on)
        g = ActorGraph(memory=memory, buffers=buffers)
        port: list = [None]
        inp, reads = self._device_input(g, spec, device, loader, rated, port)
        out = g.op_program(program, inp, name="step")
        if program.out_spec.specs:
            out = g.copy(out, "cpu", name="to_host")
        g.sink(out)
        got = self._compiled[key] = _Compiled(
            step.state,
            step.opt_rows,
            program=program,
            graph=g,
            captured=step.captured,
            reads=reads,
            port=port,
        )
        return got

    def _device_input(self, g, spec, device, loader, rated=0, port=None):
        """Adds to ``g`` the actors whose device register holds a batch of layout ``spec``
        for a step on ``device``: a loader's (``loader.actors_into``) or a fed input (its
        register on the device when ``spec`` is: cuda batches stored as they are), then,
        for batches on the host, a copy actor to the device (``to_device``, on its copy
        stream). With ``rated`` a piece carries its rates (``_with_rates``: a loader's
        batches get theirs on the host, before the copy). Returns ``(actor, the loader's
        actors or None)``."""
        reads = None
        if loader is not None:
            reads = loader.actors_into(g, spec, to_device=not rated)
            inp = self._with_rates(g, reads.node, spec, rated, port)
        else:
            full = _rated_spec(spec, rated, device)
            inp = g.input(
                out=unflatten(full.structure, list(full.specs)),
                name=f"inputs of {type(self).__name__}",
            )
        if getattr(inp, "device", None) is None:  # host batches: copied over
            inp = g.copy(inp, device, name="to_device")
        return inp, reads

    @staticmethod
    def _with_rates(g, node, spec, rated: int, port: list):
        """``node`` (a loader's batches, of layout ``spec``) as it is, or with ``rated``
        rates: then a stage after it giving each batch its step's rates, ``(batch, rates)``
        (``port[0]``: the run's ``_Schedules``, taken in piece order on the source side)."""
        if not rated:
            return node
        full = _rated_spec(spec, rated, None)
        return g.actor(
            lambda batch: (batch, port[0]()),
            node,
            name="lr_sch",
            inline=True,
            out=unflatten(full.structure, list(full.specs)),
        )

    def _arrays(self, state, opt_rows, captured) -> list:
        """The state's arrays, once every eager write to them is done, then the captured
        tensors' (read live)."""
        self._fresh_state(state, opt_rows)
        return lend_arrays(state) + [peek_array(t, stand_in=True) for t in captured]

    @staticmethod
    def _fresh_state(state, opt_rows) -> None:
        """Takes the optimizers' part of ``state`` anew from them (``graph_state``: their
        own tensors, which eager steps may have replaced)."""
        at = len(state) - sum(len(st) for *_, st in opt_rows)
        with no_grad():
            for o, g, p, st in opt_rows:
                mine = o.graph_rates(g) if p is None else o.graph_state(p, g)
                for name in st:
                    state[at] = mine[name]
                    at += 1

    def _rates_now(self, optimizers=None) -> list:
        """The values of the rates a step reads as state (``Optimizer.scheduled``), now (of
        ``optimizers``' groups; default all)."""
        return [
            [g[k] for k in o.scheduled]
            for o in (self._optimizers if optimizers is None else optimizers)
            for g in o.param_groups
        ]

    def _rate_values(self) -> list:
        """``_rates_now`` flat, as floats (a tuple option's items one by one): the order of
        the rates a piece carries (``_step_fn(rated=True)``)."""
        return [
            float(x)
            for row in self._rates_now()
            for v in row
            for x in (v if isinstance(v, tuple) else (v,))
        ]

    def _step_schedules(self) -> None:
        """After a step: the schedulers given to ``add_optimizer`` step once."""
        for s in self._lr_sch:
            s.step()

    def _schedules_now(self) -> tuple:
        """What ``_schedules_back`` sets back: the schedulers' state and every group's
        scheduled options (``lr``...)."""
        saved = [copy.deepcopy(s.state_dict()) for s in self._lr_sch]
        groups = [
            (g, {k: g[k] for k in o.scheduled}) for o in self._optimizers for g in o.param_groups
        ]
        return saved, groups

    def _schedules_back(self, undo: tuple) -> None:
        """The schedulers and groups as ``_schedules_now`` found them."""
        saved, groups = undo
        for s, st in zip(self._lr_sch, saved, strict=True):
            s.load_state_dict(copy.deepcopy(st))
        for g, values in groups:
            g.update(values)

    def _done(self, state) -> None:
        written_outside(state)  # (saved tensors see it, as an in-place write)

    # -- running ---------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        return self.step(*args)

    def step(self, *args: Any) -> Any:
        """One iteration on ``args`` (tensors or arrays): returns what ``build`` returns,
        with parameters and optimizer state updated. On a CUDA device it returns at once
        with tensors on the device, and a failed op raises where they are read (see the
        module doc).

        Raises:
            KernelError: an op of the step failed (it names the op and holds the kernel's
                error); nothing was written back, so the parameters, buffers and optimizer
                state keep their values and the next step runs as usual.
            TraceError: ``build`` does what a step cannot record (when compiled)."""
        if self._pipeline is not None:  # (stages=: pipeline_graph.py)
            return self._pipeline.step(args)
        settings = self._check()
        placement = self._traced.placement  # type: ignore[attr-defined]  # set by _check()
        if placement is not None:
            return self._global_step(placement, args)
        leaves, structure = flatten(args)
        _no_bfloat16(self, "input", leaves)
        device = _device_of(self._traced.params, leaves)  # type: ignore[attr-defined]  # set by _check()
        if device is not None:
            return self._step_on(device, leaves, structure, settings)
        arrays = [peek_array(a) if isinstance(a, Tensor) else a for a in leaves]
        spec = PieceSpec.of(unflatten(structure, arrays), "nn.Graph.step")
        step = self._compile((spec,), settings)
        program, state, opt_rows = step.program, step.state, step.opt_rows
        program.state_arrays = self._arrays(state, opt_rows, program.captured)
        if not program.bound:  # its workspace, kept for the next steps
            program.tmp = [_empty(s) for s in program.tmp_specs]
            program.bound = True
        outs = [_empty(s) for s in program.out_spec.specs]
        try:
            program.run(outs, [spec_arrays(arrays, spec)])
        except KernelError as e:
            raise self._step_error(e, len(program.steps)) from e.original
        self._done(state)
        self._step_schedules()
        return unflatten(program.out_spec.structure, [from_numpy(o) for o in outs])

    # -- over global tensors ---------------------------------------------------------------
    def _placement(self) -> Placement | None:
        """The placement of the graph's global parameters, or None for a local graph: found
        with what the step was traced with (``_Traced``, taken again when a module changed:
        ``Module.to_global`` counts as a change), so a step pays no walk of its modules.

        Raises:
            DeviceError: some parameters are global and others local, or on two
                placements."""
        self._check()
        return self._traced.placement  # type: ignore[attr-defined]  # set by _check()

    def _global_step(self, placement: Placement, args: tuple) -> Any:
        """``step()`` of a graph whose parameters are global tensors: ``build`` runs on the
        placement's ranks as eager global calls (each op on every rank's part; the
        gradients of broadcast parameters come back all-reduced), then each optimizer's
        ``step()`` (the update ``step()`` traces, run in place) and its scheduler. Inputs
        that are local (tensors or arrays) are split along their first dim over the ranks,
        data parallelism's layout (a 0-dim one is broadcast); global inputs are used as
        they are. The outputs are global tensors."""
        from ..parallel import programs

        leaves, structure = flatten(args)
        batch = [_as_global(x, placement) for x in leaves]
        made: list = [None]  # (the eager step's output structure)

        def run() -> list:
            params = [p for p in self._params() if p.requires_grad]
            for p in params:
                p.grad = None
            with enable_grad():
                out = self.build(*unflatten(structure, batch))
            with no_grad():
                for opt in self._optimizers:
                    opt.step()
            for p in params:
                p.grad = None
            outs, made[0] = flatten(out)
            return outs

        replay = self._replay
        if replay is None:
            replay = self._replay = programs.StepReplay()
        found = programs.step_inputs(self, structure, batch)
        if found is None:
            outs = run()
            structure_out = made[0]
        else:
            ranks, key, inputs, state = found
            outs = replay.step(ranks, key, inputs, state, run)
            if made[0] is not None:  # (an eager step: its outputs' structure, kept)
                replay.structure = made[0]
            structure_out = replay.structure
        self._step_schedules()
        return unflatten(structure_out, outs)

    def _global_run(self, placement, iterable, fused, trace, timeout, progress) -> Iterator:
        """``run()`` of a global graph: ``_global_step`` per item, the items read as they
        come (a DataLoader loads ahead in its own actors)."""
        name = type(self).__name__
        for what, given in (("fused=True", fused), ("trace=", trace), ("timeout=", timeout)):
            if given:
                raise PlanError(
                    f"{name}.run({what}): a graph over global tensors runs each step as "
                    f"eager calls on the ranks, without actors per op, so {what} does not "
                    f"apply; leave it out"
                )
        items: Any = iterable
        if callable(items) and not hasattr(items, "__iter__"):
            items = items()
        bar = None
        if progress:
            from ..runtime.observe.progress import open_bar

            total = len(items) if hasattr(items, "__len__") else None
            bar = open_bar(progress, total, "steps")
        try:
            for item in items:  # (build's arguments, as a local run gives them: a tuple
                #                  or list item's items, else the item itself)
                args = tuple(item) if isinstance(item, (tuple, list)) else (item,)
                out = self._global_step(placement, args)
                if bar is not None:
                    bar.update(1)
                yield out
        finally:
            if bar is not None:
                bar.close()

    def _step_on(self, device, leaves, structure, settings):
        """``step()`` on a device with its own memory (cuda): the inputs as contiguous
        tensors there, the step one instruction on its compute stream (``DeviceProgram``),
        captured as a CUDA graph and replayed while ``cuda_graph`` is on; returns the
        outputs as tensors on the device at once (reading one waits for the step)."""
        leaves = [_on_device(x, device) for x in leaves]
        spec = PieceSpec.of(unflatten(structure, leaves), "nn.Graph.step", device)
        step = self._compile((spec,), settings)
        run = self._device_program(step, device)
        self._fresh_state(step.state, step.opt_rows)
        outs = run.submit(
            [t._impl for t in leaves],
            [t._impl for t in step.state],
            [t._impl for t in step.captured],
            bool(self.cuda_graph),
        )
        self._done(step.state)
        self._step_schedules()
        return unflatten(step.program.out_spec.structure, [wrap(o) for o in outs])

    def _device_program(self, step, device):
        """The ``DeviceProgram`` running the compiled ``step`` on ``device`` (made once)."""
        run = step.device
        if run is None:
            from ..tracing.device import DeviceProgram

            for t in step.state:
                if t._impl.base is not None:
                    raise TypeError(
                        f"{type(self).__name__}.step() on {device}: a state "
                        f"tensor of shape {tuple(t.shape)} is a view of another; "
                        f"a compiled step on a CUDA device writes whole tensors "
                        f"(make it a tensor of its own with .clone())"
                    )
            run = step.device = DeviceProgram(step.program, device, f"{type(self).__name__}.step")
        return run

    def _step_error(self, e: KernelError, ops: int) -> KernelError:
        """``step()``'s error for the failed op ``e``: the KernelError eager mode raises
        for it, saying that the step wrote nothing back."""
        at = f"op {e.step + 1} of the {ops} of " if e.step is not None else ""
        err = KernelError(
            e.op,
            e.device,
            e.original,
            True,
            f"{at}{type(self).__name__}.step(); nothing was written back: the "
            f"parameters, buffers and optimizer state keep their values, and "
            f"the next step runs as usual",
        )
        err.kernel_traceback, err.step = e.kernel_traceback, e.step
        return err

    def run(
        self,
        iterable: Iterable[Any] | Callable[[], Iterable[Any]],
        buffers: int = 2,
        memory: dict[str, int | str | None] | None = None,
        fused: bool = False,
        trace: str | Path | None = None,
        progress: bool | dict[str, Any] = False,
        timeout: float | None = None,
        engine: str | None = None,
    ) -> Iterator[Any]:
        """Runs ``build`` on every item of ``iterable`` (a DataLoader, a list, a function
        returning an iterable...) as an ActorGraph: an actor per op of the step, and one
        per state written back, fed by a source actor reading the iterable, so the next
        items load (and the first layers of the next piece run) while a piece trains; the
        parameters are updated in piece order. Yields what ``build`` returns per item.
        Items of another layout (a loader's last, smaller batch) start a run of their own
        (compiled once per layout). A DataLoader's own actors (``actors_into``: its
        sampler, its loading stage on its workers) take the source's place, in the same
        graph: a batch is collated into the register the op actors read, never made a
        tensor, and its layout comes from the loader's first sample (``layout()``); the
        compiled step serves every loader of the same kind (``actors_key``). The loader's
        ``memory`` budget is not the run's: give ``memory`` here.

        ``buffers``, ``memory``: as ``ActorGraph``'s (registers per output, budgets per
        device). ``fused=True`` runs the whole step as one op actor instead (the program
        ``step()`` runs): no overlap between the ops of consecutive pieces, but one act per
        piece instead of one per op, which wins where ops are small and Python's cost per
        act dominates. ``trace``: a path for the run's timeline (Chrome trace JSON, as
        ``ActorGraph.run``); a run per further layout writes ``name.1.json``, ...).
        ``progress``: a progress bar of the steps (tqdm; True or tqdm's arguments), with
        the bottleneck; its total is ``len(iterable)`` when it has one. ``timeout``:
        seconds the loader may take for one item (and, with ``fused=True``, the step for
        one piece) before the run fails with ActorError (the op actors of a run that is not
        fused act on the run's loop, where an act cannot be timed out). With a ``timeout``
        and a DataLoader of ``workers > 1`` (replicas cannot be timed yet), the DataLoader
        is read as an iterable of its collated batches instead.
        ``engine``: as ``ActorGraph.run``'s; only ``"local"`` (or None) runs a training
        step: its state lives in this process, so ``"ray"`` is refused with a PlanError
        before anything starts.

        The step is the one compiled for what ``build`` read when the run starts: a change
        to the modules, the optimizers or their hyperparameters while the run goes on
        stops it with TraceError (change them between runs). A scheduler given to
        ``add_optimizer(opt, lr_sch=...)`` is the exception: the run steps it once per
        piece as it makes the piece, piece k carrying the rates of step k, so the run
        trains as an eager loop stepping it per batch and leaves it (and the groups) as
        that loop does; a run stopped early sets it back to the pieces it wrote back. An
        op that fails stops the run with ActorError naming the first op of the step that
        fails on that piece (the one ``step()`` names) and holding its KernelError.

        On a CUDA device (the parameters on ``cuda:0``) the batches are held in registers
        there (``memory={"cuda:0": ...}`` budgets them, with the step's workspace): items
        of cuda tensors as they are, host items (and a host DataLoader's batches) copied
        over by a copy actor while the step before runs; the run still yields host arrays
        (each output copied back on the device's copy stream). A kernel fault stops the run
        with ActorError holding its KernelError; the steps before it were applied, its own
        and later ones were not, and the next run goes on from there.

        A pipeline graph (``stages=``) runs each item as a batch of micro-batches through
        its stages' actors (``pipeline_graph.py``), yields each batch's loss and takes
        ``trace`` (batch k's timeline at ``name.k.json``) and ``memory``; the other
        arguments are for a traced step and are refused with PlanError."""
        name = type(self).__name__
        if self._pipeline is not None:  # (stages=: pipeline_graph.py)
            _pipeline_options(name, buffers, fused, progress, timeout, engine)
            yield from self._pipeline.run(iterable, trace=trace, memory=memory)
            return
        _local_engine(engine, name)
        if timeout is not None:
            check_timeout(timeout, False, f"inputs of {name}")
        placement = self._placement()
        if placement is not None:
            yield from self._global_run(placement, iterable, fused, trace, timeout, progress)
            return
        items: Any = iterable  # (read by what it has: a DataLoader's actors, a len...)
        if callable(items) and not hasattr(items, "__iter__"):
            items = items()
        if progress:
            progress = dict(progress) if isinstance(progress, dict) else {}
            progress.setdefault("desc", "steps")
            if "total" not in progress and hasattr(items, "__len__"):
                try:
                    progress["total"] = len(items)
                except TypeError:  # (a DataLoader over an iterable dataset)
                    pass
        runs = done = 0
        if hasattr(items, "actors_into"):  # a DataLoader
            if timeout is not None and items.workers > 1:
                items = items.iter_arrays()  # read as an iterable, by a source
            else:  # its actors join the step's graph
                layout = items.layout()
                rest: list = []
                if layout is not None:
                    for out in self._run_layout(
                        layout,
                        None,
                        buffers,
                        memory,
                        fused,
                        trace,
                        progress,
                        timeout,
                        items,
                        rest,
                    ):
                        done += 1
                        yield out
                    runs += 1
                    items = rest  # (its last, smaller batch: a run of its own)
                else:
                    items = items.iter_arrays()  # (no whole batch)
        it = iter(items)
        item = next(it, _NONE)
        if item is not _NONE:
            self._check()
        device = (
            _device_of(self._traced.params, [])  # type: ignore[attr-defined]  # set by _check()
            if item is not _NONE
            else None
        )
        while item is not _NONE:  # a run per layout: a register has one size
            spec = _layout(item, device)
            key = (spec.structure, tuple(spec.specs))
            later: list = []

            def same_layout(first=item, key=key, later=later):
                yield first
                for x in it:
                    s = _layout(x, device)
                    if (s.structure, tuple(s.specs)) != key:
                        later.append(x)  # (the last, smaller batch of a loader...)
                        return
                    yield x

            path = trace
            if trace is not None and runs:
                p = Path(trace)
                path = p.with_name(f"{p.stem}.{runs}{p.suffix}")
            shown = dict(progress, initial=done) if progress else False  # (one bar's
            for out in self._run_layout(
                spec, same_layout(), buffers, memory, fused, path, shown, timeout
            ):  # count on)
                done += 1
                yield out
            runs += 1
            item = later[0] if later else _NONE

    def _run_layout(
        self,
        spec,
        feed,
        buffers,
        memory,
        fused,
        trace=None,
        progress=False,
        timeout=None,
        loader=None,
        rest=None,
    ):
        """One run of the items of one layout (``feed``), as ``run()`` says: compiled for
        what build reads now, stopped by a change to it, an op's failure named as
        ``step()`` names it. The state is handed back to the optimizers at the end.
        ``loader`` (``feed`` None): a pass of it, its actors in the step's graph; what the
        run leaves out (its last, smaller batch) is added to ``rest``."""
        settings = self._check()
        free = [o for o in self._optimizers if all(s.optimizer is not o for s in self._lr_sch)]
        rates = self._rates_now(free)  # (read once, when the run starts; a scheduler
        #                                given to add_optimizer changes its own)
        device = _device_of(self._traced.params, [])
        sched = _Schedules(self) if self._lr_sch else None
        rated = sched.count if sched is not None else 0
        c = (self._fused_graph if fused else self._compile_graph)(
            spec, buffers, memory, settings, loader, rated
        )
        if c.graph.running:  # (before anything of the running one changes)
            raise RuntimeError(
                f"{type(self).__name__}.run(): a run of this step on this input layout is "
                f"still going (an earlier run() not iterated to its end or closed); one "
                f"step's runs take turns: finish or close() the other first"
            )
        if device is not None:  # (the state's and captured tensors)
            self._fresh_state(c.state, c.opt_rows)
            if fused:
                c.program.attach(c.state, c.captured, bool(self.cuda_graph))
            else:
                c.shared[:] = list(c.state) + list(c.captured)
        elif fused:
            c.program.state_arrays = self._arrays(c.state, c.opt_rows, c.captured)
        else:
            c.shared[:] = self._arrays(c.state, c.opt_rows, c.captured)
        g, reads, state = c.graph, c.reads, c.state
        if reads is not None:
            reads.bind(loader)  # (the run's loader: its pass, its last batch)
        c.port[0] = sched  # (a loader's batches: their rates' stage reads it)
        on = device if rated and any(s.device == device for s in spec.specs) else None
        timed = [a for a in g.actors if getattr(a, "fed", False) or a.name == "step"] + (
            list(reads.actors) if reads is not None else []
        )
        for a in timed:  # the loader, and the fused step on a thread
            a.timeout = timeout  # when timed (else inline as planned)
            if a.name == "step":
                a.inline = a.inline_given = False if timeout is not None else None
        self._graph = g
        nothing = g.yields_nothing
        waiting: dict = {}  # piece -> its item, until its output is out
        count = [0]

        def fed():
            for x in feed:
                if sched is not None:  # (the piece and the rates of its step)
                    x = (x, sched(on))
                waiting[count[0]] = x
                count[0] += 1
                yield x
                if sched is not None and sched.error is not None:
                    return  # (the pieces made train; then its error)

        run = g.run(feed=fed() if feed is not None else None, trace=trace, progress=progress)
        n = 0
        try:
            for out in run:
                waiting.pop(n, None)
                n += 1
                yield None if nothing else out
                if (
                    self._check() != settings
                    or not self._compiled
                    or self._rates_now(free) != rates
                ):
                    raise TraceError(
                        f"{type(self).__name__}.run(): the modules (their parameters, "
                        f"buffers, children, attributes or modes), the optimizers or their "
                        f"hyperparameters changed while the run was going (after piece "
                        f"{n - 1}); the run computes the step compiled when it started, "
                        f"with the learning rates of then, so it was stopped rather than "
                        f"train on what is no longer there. Change them between runs (once "
                        f"the loop over run() has ended: a scheduler stepped per epoch), "
                        f"give the scheduler to add_optimizer(opt, lr_sch=...) to step it per "
                        f"batch inside a run, or call step() per batch"
                    )
            if reads is not None:
                rest.extend(reads.rest())
            if sched is not None:  # (its scheduler failed after the last piece)
                sched.raise_pending()
        except ActorError as e:
            run.close()
            g.join()
            if sched is not None and sched.error is not None and e.original is sched.error:
                raise sched.error from e  # (the scheduler's own error, as eager's)
            item = waiting.get(e.piece) if reads is None else _reload(reads, e.piece, sched)
            err = self._run_error(e, g, fused, spec, item)
            if err is e:
                raise
            raise err from err.original
        finally:
            run.close()
            g.join()
            self._done(state)
            c.port[0] = None
            if sched is not None:  # (the pieces made ahead of a stopped run)
                sched.settle(_trained(g, n))
            if reads is not None:
                reads.loader = None  # (the compiled step keeps no dataset alive)

    def _run_error(self, e: ActorError, g, fused: bool, spec, item) -> ActorError:
        """``run()``'s error for an op that failed: the actor of the first op of the step
        that fails on that piece (the op ``step()`` names; ops of a run that is not fused
        act in data order, so another may have failed first), with its KernelError."""
        first = e.original
        if not isinstance(first, KernelError):
            return e
        actor, tb = e.actor, e.actor_traceback
        replay = g.replay
        if not fused and replay is not None and item is not None:
            leaves, _ = flatten(item)
            arrays = [peek_array(a) if isinstance(a, Tensor) else a for a in leaves]
            try:
                replay(spec_arrays(arrays, spec))
            except KernelError as k:
                if k.actor != actor:
                    actor, first, tb = k.actor, k, k.kernel_traceback
            except Exception:  # noqa: BLE001 - the replay only names the op; the run's
                pass  # own error stands
        if first is e.original:
            return e
        return ActorError(actor, e.piece, first, tb)

    def stats(self) -> RunStats:
        """The last ``run()``'s statistics (see ActorGraph.stats).

        Raises:
            RuntimeError: the graph has not run yet."""
        if self._graph is None:
            raise RuntimeError(f"{type(self).__name__}.stats(): the graph has not run yet")
        return self._graph.stats()

    def __repr__(self) -> str:
        mods = [
            f"({k}): {v!r}".replace("\n", "\n  ")
            for k, v in vars(self).items()
            if isinstance(v, Module)
        ]
        return f"{type(self).__name__}(\n  " + "\n  ".join(mods) + "\n)"


class _Compiled:
    """A compiled step, one of three kinds: ``program`` (``step()``), ``graph`` with an
    actor per op and its ``shared`` state arrays (``run()``), or ``graph`` running
    ``program`` as one op actor (``run(fused=True)``). Each holds the state tensors and
    optimizer rows it was traced with, the tensors ``build`` captures (read live), and
    for a graph fed by a DataLoader its actors (``reads``, bound to the run's loader);
    ``port``: a run's ``_Schedules`` while it goes (``port[0]``), for the stage giving a
    loader's batches their rates."""

    __slots__ = (
        "state",
        "opt_rows",
        "program",
        "graph",
        "shared",
        "captured",
        "reads",
        "device",
        "port",
    )

    def __init__(
        self,
        state,
        opt_rows,
        program=None,
        graph=None,
        shared=None,
        captured=(),
        reads=None,
        port=None,
    ):
        self.state, self.opt_rows = state, opt_rows
        self.program, self.graph, self.shared = program, graph, shared
        self.captured = program.captured if program is not None and not captured else captured
        self.reads = reads
        self.port = port if port is not None else [None]
        self.device = None  # step() on a CUDA device: its DeviceProgram


class _Traced:
    """What the compiled steps of a Graph were traced with, and the check that it still
    holds (``Graph._check``).

    ``version``: ``structure_version`` when taken. ``ident``: the Graph's attributes (its
    modules, and the attributes its class's methods read by name: a counter the training
    loop keeps on the Graph is no reason to compile again), its modules' tree (each module,
    its parameters, buffers and children by name, its hooks and other attributes), the
    optimizers and their parameter groups, the globals and closure variables ``build``
    reads, and the globals and class attributes the model's code reaches (``code_reads.py``:
    ``ModelReads``), as ids (objects: ``keep`` holds them, so no id is reused while this
    lives) and values (numbers, strings). ``group_ids``: the ids of the optimizers'
    parameters in group order; ``names``: ``(namespace, name, object)`` per global or
    closure variable ``build`` reads and per global the model's code reaches; ``classes``:
    ``(class, name, value)`` per class attribute it reaches; ``params``: the parameters and
    buffers, in state order; ``modes``: each module's train/eval mode; ``placement``: the
    global parameters' placement (None for a local graph)."""

    __slots__ = (
        "version",
        "ident",
        "keep",
        "group_ids",
        "names",
        "classes",
        "params",
        "modes",
        "placement",
    )

    def __init__(self, graph: Graph):
        self.version = structure_version[0]
        keep: list = []
        ident: list = []
        read = _attrs_read(type(graph))
        for k, v in vars(graph).items():
            if k not in _INTERNAL and (k in read or isinstance(v, Module)):
                ident.append((k, _ident(v, keep)))
        mods, seen = [], set()
        for v in graph._modules():
            for m in v.modules():
                if id(m) not in seen:
                    seen.add(id(m))
                    mods.append(m)
        for m in mods:
            keep.append(m)
            entry = [id(m), type(m)]
            for d in (m._parameters, m._buffers, m._modules):
                entry.append(tuple((k, _ident(t, keep)) for k, t in d.items()))
            entry.append(tuple(_ident(h, keep) for h in m._forward_hooks))
            entry.append(tuple(_ident(h, keep) for h in m._forward_pre_hooks))
            entry += [(k, _ident(v, keep)) for k, v in vars(m).items() if k not in _OWN]
            ident.append(tuple(entry))
        groups = [g for o in graph._optimizers for g in o.param_groups]
        self.group_ids = tuple(id(p) for g in groups for p in g["params"])
        keep += [p for g in groups for p in g["params"]]
        ident.append(tuple(_ident(o, keep) for o in graph._optimizers))
        ident.append((tuple(len(g["params"]) for g in groups), self.group_ids))
        self.names = _names_read(graph.build)
        model = ModelReads(mods, graph)
        self.classes = model.class_state()
        for _, ns, k, v in model.module_globals():
            if not any(ns is n and k == q for n, q, _ in self.names):
                self.names.append((ns, k, v))
        ident.append(tuple((k, _ident(v, keep)) for _, k, v in self.names))
        ident.append(tuple((_ident(c, keep), k, _ident(v, keep)) for c, k, v in self.classes))
        self.ident = tuple(ident)
        self.keep = keep
        self.params = graph._params()
        self.modes = tuple(m.training for m in mods)
        self.placement = _placement_of(type(graph).__name__, self.params)

    def moved(self, groups: list) -> bool:
        """Did an optimizer's parameters, a name ``build`` reads, or a class attribute or
        global the model's code reads change since?"""
        if tuple(id(p) for g in groups for p in g["params"]) != self.group_ids:
            return True
        for ns, k, v in self.names:
            if not _same(_lookup(ns, k), v):
                return True
        for c, k, v in self.classes:
            if not _same(class_value(c, k), v):
                return True
        return False


_OWN = frozenset(
    {"training", "_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks"}
)  # a module's own: in _Traced one by one


def _user_frame() -> int:
    """The ``stacklevel`` of the first caller outside actorflow (for a warning raised from
    inside it, whichever entry point was called)."""
    f: Any = sys._getframe(1)
    level = 1
    while f is not None and str(f.f_globals.get("__name__", "")).startswith("actorflow."):
        f = f.f_back
        level += 1
    return level


def _same(now, then) -> bool:
    """Whether a name holds what it held: the same object, or a number or string of the
    same type and ``repr`` (a NaN is itself, -0.0 is not 0.0)."""
    return now is then or (
        type(now) is type(then) and isinstance(then, PLAIN) and repr(now) == repr(then)
    )


def _ident(v, keep: list):
    """``v`` in a ``_Traced``: numbers and strings by value, anything else by identity."""
    if isinstance(v, PLAIN) or (type(v) is tuple and all(isinstance(x, PLAIN) for x in v)):
        return (type(v), repr(v))
    keep.append(v)
    return id(v)


def _lookup(ns, name):
    """What ``name`` holds now in ``ns`` (a globals dict, or a closure cell)."""
    if isinstance(ns, dict):
        return ns.get(name, _NONE)
    try:
        return ns.cell_contents
    except ValueError:  # (an emptied cell)
        return _NONE


# Graph subclass -> the attribute names it reads
_ATTRS: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()


def _attrs_read(cls) -> frozenset:
    """The attribute names the methods of ``cls`` (a Graph subclass, and its bases below
    Graph) load, and ``build`` (an instance may hold its own)."""
    names = _ATTRS.get(cls)
    if names is None:
        found = {"build"}
        for c in cls.__mro__:
            if c is Graph or c is object:
                continue
            for f in vars(c).values():
                f = getattr(f, "__func__", f)
                code = getattr(f, "__code__", None)
                if code is not None:
                    found.update(attribute_names(code))
        names = _ATTRS[cls] = frozenset(found)
    return names


def _names_read(fn) -> list:
    """``(namespace, name, object)`` for each global and closure variable ``fn`` reads
    (its own code: not the functions it calls)."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    glb = fn.__globals__
    out = [(glb, n, glb[n]) for n in global_names(code) if n in glb]
    for n, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
        v = _lookup(cell, n)
        if v is not _NONE:
            out.append((cell, n, v))
    return out


def _pipeline_options(name: str, buffers, fused, progress, timeout, engine) -> None:
    """Refuses what ``run()`` takes for a traced step but a pipeline graph does not."""
    for what, given in (
        ("buffers=", buffers != 2),
        ("fused=True", fused),
        ("progress=", progress),
        ("timeout=", timeout is not None),
        ("engine=", engine not in (None, "local")),
    ):
        if given:
            raise PlanError(
                f"{name}.run({what}): a pipeline graph (stages=...) runs its stages as "
                f"actors of its own, with stage_buffers= registers per stage, in this "
                f"process; {what} is for a traced step: leave it out"
            )


def _local_engine(engine, name: str) -> None:
    """``run(engine=...)``: a training step runs with the local engine only."""
    if engine is None or engine == "local":
        return
    if isinstance(engine, str) and engine != "ray":
        raise ValueError(
            f"{name}.run(engine={engine!r}): the engines are 'local' and 'ray'; "
            f"nn.Graph runs with 'local' (the default)"
        )
    what = repr(engine) if isinstance(engine, str) else type(engine).__name__
    raise PlanError(
        f"{name}.run(engine={what}): a training step reads and writes its "
        f"parameters and optimizer state across pieces, state held in this "
        f"process's memory, which Ray runs do not take yet (they run stateless "
        f"stages and op actors in other processes); run it with engine='local' "
        f"(the default), where every op of the step is an actor of this process"
    )


_NONE = object()


def _reload(reads, piece: int, sched=None):
    """Batch ``piece`` of a loader's run, loaded again to name the op that fails on it
    (None when it cannot be); with ``sched`` (a per-batch schedule) with rates (the
    groups' now: which op fails does not depend on them)."""
    try:
        batch = reads.batch(piece)
    except Exception:  # noqa: BLE001 - only names the op; the run's own error stands
        return None
    return batch if sched is None else (batch, sched.now())


def _trained(g, yielded: int) -> int:
    """How many pieces a run that stopped wrote back: its step actor's acts (fused), else
    the fewest of its state writers' (``yielded``, the pieces it gave out, when there are
    none)."""
    acts = [
        a["acts"]
        for name, a in g.stats().actors.items()
        if name == "step" or name.startswith("set state")
    ]
    return min(acts) if acts else yielded


class _Schedules:
    """A run's per-batch schedule (``add_optimizer(lr_sch=...)``), on its source side: as
    piece k is made (fed, or a loader's batch k given its rates) it takes the rates the
    groups hold (``Graph._rate_values``: step k's) and steps the schedulers once, as an
    eager loop steps them after each optimizer step. A schedule depends on the step count
    only, so running ahead of the training is exact; ``settle`` sets a stopped run's
    schedulers back to the pieces it trained. A scheduler that raises as it steps after
    piece k (OneCycleLR past ``total_steps``) fails as in an eager loop: piece k is made
    and trained, and the run raises the error at its end (fed items: no more are made) or
    as the next piece is made (a loader's batches: then the pieces a run that is not
    fused trains are those before the failure, ``settle``'s)."""

    def __init__(self, graph: Graph):
        self.graph, self.made = graph, 0
        self.error: Exception | None = None  # a schedule's step failed: raised next call
        self.count = len(graph._rate_values())
        self.undo = graph._schedules_now()

    def now(self) -> tuple:
        """The rates the groups hold now, as float64 scalars."""
        import numpy as np

        return tuple(np.full((), v, np.float64) for v in self.graph._rate_values())

    def __call__(self, device=None) -> tuple:
        """The next piece's rates (float64 scalars; tensors on ``device`` when given: a
        piece of cuda tensors), then the schedulers stepped."""
        self.raise_pending()
        out = self.now()
        if device is not None:
            out = tuple(from_numpy(a).to(str(device)) for a in out)
        try:
            self.graph._step_schedules()
        except Exception as e:  # noqa: BLE001 - raised after this piece, as eager does
            self.error = e
        self.made += 1
        return out

    def raise_pending(self) -> None:
        """Raises the error a scheduler raised as it stepped after the last piece made."""
        if self.error is not None:
            raise self.error

    def settle(self, done: int) -> None:
        """After a run that trained ``done`` of the ``made`` pieces (stopped early, or
        failed): the schedulers and groups as after ``done`` steps from the run's start."""
        if done == self.made:
            return
        self.error = None  # (stepped again up to the pieces trained)
        self.graph._schedules_back(self.undo)
        self.made = 0
        for _ in range(done):
            self.graph._step_schedules()
            self.made += 1


def _rated_spec(spec, rated: int, device):
    """``spec`` (an item's layout) with ``rated`` float64 scalars after it, the layout of a
    piece ``(item, rates)`` (a per-batch schedule's); the scalars on ``device`` when the
    item's arrays are there (cuda tensors fed as they are). ``spec`` when ``rated`` is 0."""
    if not rated:
        return spec
    on = device if device is not None and any(s.device == device for s in spec.specs) else "cpu"
    return PieceSpec(
        (tuple, (spec.structure, (tuple, (0,) * rated))),
        list(spec.specs) + [Spec((), "float64", on)] * rated,
    )


def _placement_of(name: str, params: list) -> Placement | None:
    """The placement of ``params`` where they are global, None where they are local (see
    ``Graph._placement``)."""
    found = None
    local = None
    for p in params:
        d = p._impl.meta.device
        if d.placed:
            if found is not None and d.placement is not found:
                raise DeviceError(
                    f"{name}: its parameters are on two placements, "
                    f"{found!r} and {d.placement!r}; make them one with "
                    f"module.to_global(placement)"
                )
            found = d.placement
        else:
            local = d
    if found is not None and local is not None:
        raise DeviceError(
            f"{name}: some parameters are global (on {found!r}) and some "
            f"local (on {local}); make every module global with "
            f"module.to_global(placement)"
        )
    return found


def _as_global(x, placement):
    """A step's input for a graph on ``placement``: a global tensor as it is, a local one
    (or an array) split along dim 0 over the ranks (broadcast when it has no dims)."""
    from ..sbp import broadcast, split

    if not isinstance(x, Tensor):
        if not isinstance(x, np.ndarray) and not np.isscalar(x):
            return x
        x = from_numpy(np.ascontiguousarray(x))
    if x._impl.meta.device.placed:
        return x
    return x.to_global(placement, split(0) if x.ndim else broadcast)


def _device_of(params, leaves):
    """The device with its own memory (cuda) a step runs on: its parameters', else its
    first tensor input's; None for a step on the host (cpu, null)."""
    for t in params[:1] or [x for x in leaves if isinstance(x, Tensor)][:1]:
        b = t._impl.blob.backend
        if not b.host_memory:
            return t._impl.meta.device
    return None


def _placed(spec, device):
    """``spec``'s layout on ``device``."""
    return PieceSpec(spec.structure, [Spec(s.shape, s.dtype, device) for s in spec.specs])


def _layout(item, device):
    """A fed item's layout: on ``device`` (the step's CUDA device, or None) when its tensors
    are there (they are stored in device registers as they are; host items are copied
    over by the run's copy actor)."""
    if device is not None:
        leaves, _ = flatten(item)
        if any(isinstance(x, Tensor) and x._impl.meta.device == device for x in leaves):
            return PieceSpec.of(item, "nn.Graph.run", device)
    return PieceSpec.of(item, "nn.Graph.run")


def _on_device(x, device):
    """A step's input as a contiguous tensor of its own on ``device``."""
    if not isinstance(x, Tensor):
        from ..runtime.plan.spec import as_array

        return from_numpy(as_array(x, "nn.Graph.step")).to(str(device))
    if x._impl.meta.device != device:
        return x.to(str(device))
    return x.clone() if x._impl.base is not None else x


def _empty(spec):
    import numpy as np

    return np.empty(spec.shape, spec.dtype.np)


def spec_arrays(arrays, spec):
    """The arrays of a piece, contiguous and in their spec's dtype (as a register holds)."""
    import numpy as np

    return [
        np.ascontiguousarray(a, dtype=s.dtype.np) for a, s in zip(arrays, spec.specs, strict=True)
    ]


__all__ = ["Graph"]
