"""Pipeline parallelism for ``nn.Graph(stages=[...], micro_batches=M)``: a model cut into
stages, each batch cut into micro-batches that flow through the stages as the pieces of
one ActorGraph, forward and backward, the activations a stage keeps for its backward
bounded by registers.

The model is ``m_{n-1}(...m_0(x))``. Per stage ``i`` the graph has a forward actor
``stage{i}.forward`` and a backward actor ``stage{i}.backward`` (the last stage one actor,
``stage{n-1}.forward_backward``, which also computes ``build``'s loss and starts the
backward), on threads of their own:

- ``stage{i}.forward`` reads its input activation (stage 0: the micro-batch from the
  source; stage i: stage i-1's output register), runs ``m_i`` eagerly with autograd on a
  tensor made from it (requiring grad for i > 0), writes the output activation into one of
  its ``k_i`` output registers and keeps the micro-batch's autograd graph (what its
  backward needs) in the stage's FIFO.
- That register is read by stage i+1's forward and by ``stage{i}.backward``, and is free
  again only once both have read it: so the stage holds at most ``k_i`` micro-batches
  (its FIFO never grows past ``k_i``), and its forward waits for a free register, i.e.
  for a backward. ``k_i = n - i`` by default (``stage_buffers=`` overrides): 1F1B's count
  of micro-batches in flight on stage i.
- ``stage{i}.backward`` reads the gradient of the stage's output from stage i+1's
  backward, runs the micro-batch's backward (the oldest of the FIFO: they come in piece
  order), which adds the parameters' gradients to ``.grad`` and gives the gradient of the
  stage's input, and writes that for stage i-1's backward.
- A stage's forward and backward share its modules, so they take turns: both need the
  stage's one token (``resources={"stage{i}": 1}``).

Nothing in the graph says "1F1B": with ``k_i = n - i`` the registers let a stage run
``n - i`` forwards (warm-up); from then on each forward needs the register a backward
frees, so no two forwards follow each other, and the stage runs one backward and one
forward in turn (a backward first, then the forward whose register it freed, when that
forward's input is there by then: two backwards in a row where it is not) until its
forwards are done, then drains the backwards. Where a forward takes 1 and a backward 2
units of time (the tests' simulated times) the order is exactly 1F1B's on every stage.
With ``k_i = M`` nothing holds the forwards back: a stage whose forwards come faster than
its gradients runs GPipe's order, all forwards then all backwards (at M times the
activations).

What a stage holds for its backward is its FIFO of autograd graphs, at most ``k_i``, and
its ``k_i`` output registers (the activations it sent on). Every register is declared
before the run (each stage's output layout found by running the stages on one row of the
first micro-batch in eval mode without autograd, once per input layout: nothing of the
modules changes and nothing random is drawn), so no piece is sized by an act outside the
count. A register has one size: uneven micro-batches are padded to the largest along
dim 0 and carry their row count. Each stage computes on its parameters' device (the
registers are on the host: a stage on a CUDA device copies its input and gradient over
and its output back, on every act), on a stream of its own there, so two stages' kernels
run at the same time (one stream runs its ops in order); a backward act ends once its
gradients are written, so each act's time in a trace is its own.

Each micro-batch's backward is scaled by 1/M, so each parameter's ``.grad`` ends the batch
holding the gradient of the mean of the M micro-batch losses. When ``build``'s loss is a
mean over the micro-batch's rows and the micro-batches are of equal size, that is the
gradient of the loss of the whole batch, and the step equals one eager step on the whole
batch (within float rounding: the sums are in another order). Uneven micro-batches (a
batch of N rows in M parts, as ``np.array_split``) weigh each micro-batch's mean equally.

A batch is one run of the graph (one graph per input layout, made once): after its last
micro-batch's backward (the run's end), each optimizer given to ``add_optimizer`` steps
once, in the order given, then the schedulers (where the stages' workers run the batch,
``loss=``, each worker steps the optimizers over its stage's parameters: sent once every
report is read, waited for at the next batch, ``close()`` or the optimizer's next use
here, which raise its error: ``pipeline_links.stage_steps``; a stage's step there runs
the batch's last weights part of that stage first, so that part's error is the step's,
raised as the step's, the batch's loss already returned and another stage perhaps
stepped). The gradients of the
stages' parameters and of every parameter the optimizers hold (a head ``build`` applies is
in no stage) are None before a batch and again after it (its step done, or its run
stopped), so each step sees that batch's gradients only; the next batch's forwards see the
new parameters (the pipeline is flushed between batches, as synchronous 1F1B and GPipe are).
A stage that raises stops the run with ActorError naming the actor
(``stage{i}.forward``...) and the piece, which is the micro-batch's index within its
batch; the gradients of that batch are dropped and no optimizer steps, so the parameters
keep their values, and the buffers the batch wrote are set back to their values before it
(a kernel's error had poisoned what later ops wrote in place, batch norm's running
statistics, and earlier micro-batches had moved them): a local stage's buffers that the
batch before wrote (every buffer in a graph's first batch) are copied before each batch,
and one the forward replaced by a new tensor is put back (one a failed batch wrote first,
not copied, keeps that write: a warning names it, and it is copied from then on); a
stage in a worker copies a
buffer as its compiled act first writes it, and lets the copies go when the batch ends
well. Batch norm in a stage normalizes
each micro-batch by its own statistics (as GPipe's does), and random ops (dropout) draw
from the eager generator in the order the stages' threads reach them, which differs from
run to run.

Threads share one interpreter lock: the stages overlap where their kernels leave it
(numpy's BLAS calls do), not in the Python around them.

Stages on ranks: a stage whose parameters and buffers are global, broadcast on a single-rank
placement of its own (``stage_i.to_global(af.placement("cpu", ranks=[i]))`` under
``af.parallel.use_ranks("processes")`` or ``("ray")``; ``nn.Graph(stages=...,
stage_ranks="processes")`` or ``"ray"`` does that for every stage, a stage without
parameters too, its worker given this machine's cores over the stage count). On inline ranks
(this process) such a stage runs its ops as global calls, as any global module does: the
reference. On held ranks (a worker process each, or a Ray actor) it computes in that worker
(``pipeline_ranks.py``; the registers' layouts are found there too): the stage's module is
pickled before each batch with each parameter and buffer standing for the part the global
tensor names (a tensor it reaches twice is one tensor there) and sent where those bytes
differ from what the worker holds, and each act is one command there, run as the stage's
compiled program (``stage_programs.py``: the module's forward and its backward traced per
micro-batch layout, as ``nn.Graph`` compiles a step): a forward puts the micro-batch's
input rows on the worker, runs the forward program there (keeping what the backward reads)
and reads the output back into its register; a backward puts the output's gradient, runs
that micro-batch's backward program there (gradients accumulated in the worker over the
batch) and reads the input's gradient back. The stages' threads here only
put, ask and wait (the pipe's wait leaves the interpreter lock), so the stages compute at
the same time in their processes. The last stage's output is read back and ``build`` runs
here (autograd over a copy of it: a head module of this process trains too), its gradient
the worker's backward's input. After the batch's last backward, each parameter's accumulated
gradient becomes the ``.grad`` of the global parameter here (a global tensor over the
worker's part, nothing copied; added to the gradient ``build`` gave it, where ``build`` used
the parameter too), and the optimizers step them as any global parameters (their ops sent to
the worker). Each activation and gradient goes through this process, through the channel
kept between it and each worker (a copy each way; with ``loss=`` the workers pass them to
each other: ``pipeline_links.py``). A stage's ``forward`` runs as Python only when traced
(twice per micro-batch layout, train/eval mode and frozen parameters: the batch's first
micro-batch's form and the later ones'; once where no parameter gets a gradient), as
``build`` does in
``nn.Graph``: what it changes of its module's attributes then stays in the worker's copy,
until a change here sends a new copy; what changes
here (attributes, in place too, eval and train modes, frozen parameters, replaced layers,
loaded values, and the class attributes and globals of their module that the stage's
``forward`` reaches, where they hold numbers, strings or tuples of them:
``pipeline_ranks._shared``) reaches the worker at the next batch (a class attribute or
global holding anything else is the worker's own). A stage's module must pickle (no lambdas
or local functions in it), and a Ray actor loads its classes by their module's name (not
from a script run as ``__main__``). A stage's random ops in its worker draw as a compiled
step's (counter-based, ``rand_step``), keyed by the stage's index, at a count made of a seed
this process's generator gives each stage per batch and the micro-batch's place
(``af.manual_seed`` repeats them; the stages and the micro-batches draw apart). An error of
an act's kernels is the act's (the stage's ``ActorError``); a worker's error is the stage's
``ActorError``, and a worker that dies the stage's ``ActorError`` whose original names the
placement and the rank; after a failed batch the workers let go of what they held for it. A
batch runs with this thread's kind of ranks set to the stages' (``ranks_here``: not the
process's, so another thread's calls are not moved), so what the optimizers make on a
stage's placement is made on its worker. The saved bytes a stage on held ranks reports are
its worker's (the last stage's without ``build``'s, which runs here).
``graph.pipelined.close()`` brings the stages ``stage_ranks=`` made global back to this
process (with the optimizers' state) and ends the workers it started once nothing lives on
them any more (another pipeline's stages, a tensor made there by hand); stages made global
by hand keep their workers until ``af.parallel.ranks_of(placement).close()``
(``graph.pipelined.ranks``). Global stages laid out otherwise (several ranks, a split, two
stages on one placement) are refused.

``loss=`` (``_check_loss``: a module without parameters or a function of ``(out, *rest)``,
in place of ``build``): a micro-batch's loss is ``loss(out, *rest)``, wherever the last
stage's act computes it. Where every stage is on process ranks (and no ``memory=`` budget
or ``sim_time`` asks for the actor graph here), a batch does not run as an ActorGraph of
this process: the loss goes to the last stage's worker with its module, and the workers run
the batch among themselves (``pipeline_links.py``: one command each, activations and
gradients passed worker to worker under the same registers' rule); ``acts``,
``peak_held``, ``peak_saved_bytes`` and the trace come from the workers' reports, and
``actor_graph`` is None."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..autograd import enable_grad, no_grad
from ..backends import get_backend
from ..creation import from_numpy
from ..device import device as as_device
from ..dtype import as_dtype
from ..eager.interpreter import use_stream
from ..errors import ActorError
from ..parallel.interpreter import make as _global_of
from ..parallel.interpreter import parts_of
from ..parallel.ranks import HeldRanks, ProcessRanks, Ranks, ranks_here
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.plan.spec import Spec, flatten, unflatten
from ..runtime_api import peek_array, settled
from ..sbp import Placement, broadcast
from ..tensor.tensor import Tensor, wrap
from .module import Module, structure_version
from .pipeline_links import (
    BACKWARD,
    CREDIT,
    FORWARD,
    WAIT,
    WEIGHTS,
    Links,
    StepsSent,
    counted,
    forget_fresh,
    run_batch,
    send_steps,
    stage_error,
    stage_steps,
    stepped,
)
from .pipeline_ranks import RankStage, eval_mode, saved_bytes
from .stage_programs import checked, checked_loss

INDEX = Spec((), "int64")  # a micro-batch's rows and index, carried with its arrays
LOSS = Spec((), "float64")  # a micro-batch's loss, carried by the backward to the sink


class PipelineStep:
    """What ``nn.Graph(stages=...)`` runs its steps with (``graph.pipelined``).

    Attributes, about the last ``step()`` or ``run()``:
        acts: ``[(stage, "F" or "B", micro-batch)]`` of the last batch, in the order the
            acts started (the last stage's one act: its "F" then its "B"); where the
            workers run the batch (``loss=`` on process ranks), a stage's weights acts
            too, as ``(stage, "W", micro-batch)`` (not the batch's last where the workers
            step the optimizers: the step runs that one).
        peak_held: per stage, the most micro-batches whose autograd graph it held at once.
        peak_saved_bytes: per stage, the most bytes of saved activations it held at once:
            the blobs the held autograd graphs keep for backward (the stage's input
            included, its parameters and buffers not).
        peak_weights_held, peak_weights_bytes: where the workers run the batch, per stage,
            the most weights parts it held waiting at once (at most ``WEIGHT_SLOTS``: the
            registers of its weights actor, ``pipeline_links``) and the most bytes they
            held (what each reads of its act: the plan's ``weights_bytes``); 0 elsewhere
            (a weights part runs in its backward act there). Each is its own maximum: a
            stage's activations never held more than ``peak_saved_bytes`` plus
            ``peak_weights_bytes`` at once.
        sim_time: None, or ``(forward_s, backward_s)``: simulated seconds added to each
            forward and each backward act (ActorGraph's ``time=``; for experiments and
            tests: under ``af.testing.seeded`` they run on the virtual clock).
        actor_graph: the ActorGraph of the last run (``stats()``; None where the
            workers ran the batch among themselves: ``loss=`` on process ranks)."""

    def __init__(
        self,
        graph: Any,  # (the nn.Graph it runs for: graph.py imports this module)
        stages: Sequence[Module],
        micro_batches: int,
        stage_buffers: Sequence[int] | None,
        stage_ranks: str | None = None,
        loss: Any = None,
    ) -> None:
        name = type(graph).__name__
        if isinstance(stages, Module) or not isinstance(stages, Sequence) or not stages:
            raise TypeError(
                f"{name}(stages=...): give a non-empty list of modules, the model cut in "
                f"order (the model is m_n-1(...m_0(x))), got {type(stages).__name__}"
            )
        for i, m in enumerate(stages):
            if not isinstance(m, Module):
                raise TypeError(
                    f"{name}(stages=...): stage {i} is a {type(m).__name__}, not an "
                    f"nn.Module; give each stage as a module (an nn.Sequential of its "
                    f"layers)"
                )
        if (
            not isinstance(micro_batches, int)
            or isinstance(micro_batches, bool)
            or micro_batches < 1
        ):
            raise ValueError(
                f"{name}(micro_batches={micro_batches!r}): give a whole number of "
                f"micro-batches >= 1"
            )
        owner: dict = {}
        for i, m in enumerate(stages):
            for p in m.parameters():
                j = owner.setdefault(id(p), i)
                if j != i:
                    raise ValueError(
                        f"{name}(stages=...): a parameter of shape {tuple(p.shape)} is in "
                        f"stage {j} and in stage {i}; a pipeline's stages share no "
                        f"parameter (their backwards run at the same time, each adding to "
                        f"its own parameters' gradients): give each stage its own modules"
                    )
        if stage_ranks not in (None, "processes", "ray"):
            raise ValueError(
                f"{name}(stage_ranks={stage_ranks!r}): give 'processes' (each stage made "
                f"global on a one-rank placement of its own: a worker process) or 'ray' (a "
                f"Ray actor), or leave it out (the stages as they are)"
            )
        _check_loss(graph, loss)
        n = len(stages)
        # per stage, a RankStage where its ranks are held elsewhere (process or Ray
        # ranks): its acts computed there, one command each (pipeline_ranks.py)
        self._workers: list[RankStage | None] = [None] * len(stages)
        self._kind: str | None = None  # the stages' kind of ranks in a batch
        default = [n - i for i in range(n)]
        if stage_buffers is None:
            buffers = default
        else:
            buffers = list(stage_buffers)
            if len(buffers) != n or not all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in buffers
            ):
                raise ValueError(
                    f"{name}(stage_buffers={stage_buffers!r}): give one whole number >= 1 "
                    f"per stage ({n} stages): the micro-batches each stage may hold for "
                    f"its backward (1F1B's, the default: {default})"
                )
        self._placed: list = []  # (stage_ranks=: each stage's ranks, what close() undoes)
        if stage_ranks is not None:
            self._placed = _to_ranks(stages, stage_ranks, name)
            for r in self._placed:
                users = _STAGE_USERS.get(r)
                if users is not None:  # (started by stage_ranks=)
                    users.add(self)
        self._ranks: list[Ranks | None] = _stage_ranks(stages, name, self._placed)
        self.graph = graph
        self.loss = loss  # a micro-batch's loss, loss(out, *rest), where build is not given
        self._links = Links()  # (where the workers run a batch among themselves)
        self._batches = 0  # batches begun (a stopped one's messages are told apart by it)
        self._steps: tuple | None = None  # the optimizers' step the workers were sent last
        self._box: list = []  # its asks (ranks, token): let go of if this is collected first
        weakref.finalize(self, _forget_asks, self._box)
        self._written: set | None = None  # the local stages' buffers the last batch wrote
        self.stages = list(stages)
        self.micro_batches = micro_batches
        self.buffers = buffers
        self.sim_time: tuple[float, float] | None = None
        self.acts: list[tuple[int, str, int]] = []
        self.peak_held = [0] * n
        self.peak_saved_bytes = [0] * n
        self.peak_weights_held = [0] * n
        self.peak_weights_bytes = [0] * n
        self.actor_graph: ActorGraph | None = None
        self._lock = threading.Lock()
        self._fifos: list[deque] = [deque() for _ in range(n)]
        self._held_bytes = [0] * n
        self._params: list[set] = [set() for _ in range(n)]  # blob ids not counted as saved
        self._rest: Any = None  # the structure of a batch's other leaves (targets)
        self._key: tuple | None = None  # what actor_graph was made for
        self._grads: list[list] = [[] for _ in range(n)]  # per stage: what gets a .grad
        self._streams: list = []  # per stage: the stream its ops are issued on
        self._devices = [_device_of(s) for s in self.stages]  # (its parameters')

    # -- running ---------------------------------------------------------------------------
    def step(self, args: tuple) -> Tensor:
        """One batch: its loss (the mean of its micro-batch losses), the parameters
        updated."""
        self._reset()
        return from_numpy(np.asarray(self._batch(args, None, None), dtype=np.float32))

    def run(
        self,
        items: Iterable[Any] | Callable[[], Iterable[Any]],
        trace: Any = None,
        memory: dict | None = None,
    ) -> Iterator[np.ndarray]:
        """Each item a batch (a tuple or list: ``x`` and the rest ``build`` gets, or ``x``
        alone); yields each batch's loss. ``trace``: the first batch's timeline there,
        batch k's at ``name.k.json``. ``memory``: the graph's budgets (ActorGraph's)."""
        batches: Any = items() if callable(items) and not hasattr(items, "__iter__") else items
        self._reset()
        for k, item in enumerate(batches):
            args = tuple(item) if isinstance(item, (tuple, list)) else (item,)
            path = trace
            if trace is not None and k:
                p = Path(trace)
                path = p.with_name(f"{p.stem}.{k}{p.suffix}")
            yield np.asarray(self._batch(args, path, memory), dtype=np.float32)

    def _reset(self) -> None:
        n = len(self.stages)
        self.peak_held = [0] * n
        self.peak_saved_bytes = [0] * n
        self.peak_weights_held = [0] * n
        self.peak_weights_bytes = [0] * n

    def _batch(self, args: tuple, trace, memory) -> float:
        """One batch through the graph (a run of it), then the optimizers' steps; where the
        global stages are on ranks of one kind (process ranks), with this thread's kind of
        ranks that one (``ranks_here``), so what the stages, the loss, autograd and the
        optimizers make on a stage's placement (a factory's tensor, a backward's seed, a
        scalar) is made on its ranks (made elsewhere, each op would bring it over through
        this process)."""
        name = type(self.graph).__name__
        self._ranks = _stage_ranks(self.stages, name, self._placed)  # (moved since)
        kinds = {r.kind for r in self._ranks if r is not None}
        self._kind = kinds.pop() if len(kinds) == 1 else None
        if self._kind is None:
            return self._batch_on(args, trace, memory)
        with ranks_here(self._kind):  # (this thread's: not another's)
            return self._batch_on(args, trace, memory)

    def _batch_on(self, args: tuple, trace, memory) -> float:
        stages = self.stages
        n = len(stages)
        for o in self.graph._optimizers:  # (another pipeline's step of them: waited for, so
            o._settle(self._stepped)  # the state and counts read below are its; this one's
        #                              own is checked below, after the batch's commands where
        #                              the workers run it)
        direct = (
            self.loss is not None
            and memory is None
            and self.sim_time is None
            and all(isinstance(r, ProcessRanks) for r in self._ranks)
        )
        x, rest, bounds = self._batch_arrays(args)
        for i, r in enumerate(self._ranks):
            w = self._workers[i]
            if not isinstance(r, HeldRanks):
                w = None
            elif w is None or w.ranks is not r or w.module is not stages[i]:
                w = RankStage(i, n, stages[i], r)
            if w is not None:  # (the loss goes with the last stage where it computes it)
                w.loss = self.loss if direct and i == n - 1 else None
            self._workers[i] = w
        if direct:
            return self._batch_in_workers(x, rest, bounds, trace)
        self._stepped()  # (the optimizers' step the workers were sent after the last batch)
        items = self._micro_batches(x, rest, bounds)
        self._devices = [_device_of(s) for s in stages]
        self._streams = [
            None if r is not None else get_backend(d).stream(f"pipeline stage {i}")
            for i, (d, r) in enumerate(zip(self._devices, self._ranks, strict=True))
        ]
        for w in self._workers:
            if w is not None:
                w.begin()
        g = self._graph_for(items[0], memory)
        params = self._trained()
        self._params = [
            {id(t._impl.blob) for t in list(s.parameters()) + list(s.buffers())} for s in stages
        ]
        for p in params:
            p.grad = None
        self._grads = [[p for p in s.parameters() if p.requires_grad] for s in stages]
        # (build's own parameters, a head applied to the last stage's output: their
        # gradients are written by the last stage's backward)
        staged = {id(p) for s in stages for p in s.parameters()}
        self._grads[-1] += [p for p in params if id(p) not in staged and p.requires_grad]
        self.acts = []
        for f in self._fifos:
            f.clear()
        self._held_bytes = [0] * len(stages)
        losses: list[float] = []
        local = [s for s, w in zip(stages, self._workers, strict=True) if w is None]
        before = _buffers_of(local, self._written)
        try:
            for out in g.run(feed=items, trace=trace):
                losses.append(float(out))
            for i, w in enumerate(self._workers):
                if w is not None:
                    w.finish()  # (the gradients it accumulated: the parameters' here)
                    self.peak_saved_bytes[i] = max(self.peak_saved_bytes[i], w.peak_saved_bytes)
        except BaseException:
            g.join()  # (an act the stop abandoned may still be writing a gradient)
            for p in params:  # (the batch's gradients are dropped: nothing steps)
                p.grad = None
            for w in self._workers:  # (and the graphs and gradients the workers hold)
                if w is not None:
                    w.clear()
            missed = _restore(before)  # (the local stages' buffers: as before the batch)
            if self._written is not None:
                self._written |= missed
            raise
        finally:
            g.join()
            for f in self._fifos:  # (a stopped run's graphs)
                f.clear()
        self._written = _written(before)
        return self._optimize(params, losses)

    def _batch_in_workers(self, x: np.ndarray, rest: list, bounds: Any, trace: Any) -> float:
        """The batch run by the stages' workers among themselves (``pipeline_links.py``),
        then the optimizers' steps: sent to the workers once every report is read, where
        they step the stages' parameters (``stage_steps``; waited for at the next batch,
        or whatever reads what they write next: its commands come after), else here."""
        workers = [w for w in self._workers if w is not None]
        self.actor_graph = None
        params = self._trained()
        for p in params:
            p.grad = None
        self.acts = []
        self._batches += 1
        bounds = tuple(int(b) for b in bounds)
        got = None
        try:
            seeds = [w.begin(start=False) for w in workers]  # (each started by its _run)
            got = stage_steps(workers, self.graph._optimizers)
            reports = run_batch(
                workers,
                self._links,
                self._batches,
                x,
                rest,
                bounds,
                self.buffers,
                self._rest,
                seeds,
                got is not None,
            )
            self._stepped()  # (the last batch's step, run before this one: its error)
            if got is None:
                for w, r in zip(workers, reports, strict=True):  # (the gradients each
                    w.take_grads(r[6], r[4])  # stage accumulated, handed over by its RUN)
        except BaseException as e:
            if got is not None:
                forget_fresh(got[2])
            for p in params:  # (the batch's gradients are dropped: nothing steps)
                p.grad = None
            for w in workers:  # (and the graphs and gradients the workers hold)
                w.clear()
            err = stage_error(workers, e)
            if err is e:
                raise
            raise err from e
        timed = []
        for i, (held, peak, _, acts, _, (w_held, w_peak), _) in enumerate(reports):
            self.peak_held[i] = max(self.peak_held[i], held)
            self.peak_saved_bytes[i] = max(self.peak_saved_bytes[i], peak)
            self.peak_weights_held[i] = max(self.peak_weights_held[i], w_held)
            self.peak_weights_bytes[i] = max(self.peak_weights_bytes[i], w_peak)
            timed += [(start, i, kind, mb, end) for kind, mb, start, end in acts]
        timed.sort()
        last = len(self.stages) - 1
        for _, i, kind, mb, _ in timed:
            if kind == WAIT:
                continue
            if kind == WEIGHTS:
                self.acts.append((i, "W", mb))
            elif i == last:
                self.acts += [(i, "F", mb), (i, "B", mb)]
            else:
                self.acts.append((i, "F" if kind == FORWARD else "B", mb))
        if got is not None:  # (the workers step the optimizers: sent, not waited for)
            steps, counts, fresh = got
            interrupted = None
            try:
                asked = send_steps(workers, steps)
            except StepsSent as e:  # (sent all the same: kept, then raised)
                asked, interrupted = e.asked, e
            except BaseException as e:  # (none sent: the batch's gradients let go)
                forget_fresh(fresh)
                for w in workers:
                    w.clear()
                err = stage_error(workers, e)  # (a worker that ended: its stage named)
                if err is e:
                    raise
                raise err from e
            want = counted(reports, counts, fresh)
            undo = self.graph._schedules_now()
            self._steps = (workers, asked, want, counts, undo)
            self._box[:] = asked
            for o in self.graph._optimizers:
                o._waiting(self._stepped, True)
            self.graph._step_schedules()
            if interrupted is not None:
                raise KeyboardInterrupt from None
            loss = float(np.mean(reports[-1][2]))
        else:
            try:
                loss = self._optimize(params, reports[-1][2])
            except ActorError as e:  # (a worker that ended meanwhile: its stage named)
                err = stage_error(workers, e)
                if err is e:
                    raise
                raise err from e
        if trace is not None:  # (the batch trained: a trace that cannot be written fails
            _write_trace(trace, timed, last)  # the call, not the batch)
        return loss

    def _stepped(self) -> None:
        """Waits for the optimizers' step the workers were sent after the last batch, if
        any (``send_steps``): its error raised here, the schedules set back to before it
        (its counts and state are, by ``stepped``). Called before the next batch's steps
        are checked, before a batch driven from here, by ``close()``, and by the
        optimizers before their state is read or written (``Optimizer._settle``)."""
        pending, self._steps = self._steps, None
        for o in self.graph._optimizers:
            o._waiting(self._stepped, False)
        if pending is None:
            return
        workers, asked, want, counts, undo = pending
        self._box.clear()
        try:
            stepped(workers, asked, want, counts)
        except BaseException as e:
            if not getattr(e, "stepped_any", False):  # (no stage stepped: nor does the
                self.graph._schedules_back(undo)  # schedule; where some did, it keeps
            raise  # their rates moving on)

    def _optimize(self, params: list, losses: list) -> float:
        """After a batch: the optimizers' steps, the gradients let go, the schedules'
        steps; returns the batch's loss (the mean of its micro-batch losses)."""
        graph = self.graph
        try:
            with no_grad():
                for opt in graph._optimizers:
                    opt.step()
        finally:
            for p in params:
                p.grad = None
        graph._step_schedules()
        return float(np.mean(losses))

    def _trained(self) -> list:
        """Every parameter whose ``.grad`` a batch writes and clears: the stages' and those
        the graph's optimizers hold (a module ``build`` applies to the last stage's output
        is in no stage), each once. Each batch starts and ends with their gradients None,
        so an optimizer steps on that batch's gradients only."""
        seen: set = set()
        out = []
        for s in self.stages:
            for p in s.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for opt in self.graph._optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def _batch_arrays(self, args: tuple) -> tuple:
        """The batch's input ``x``, the other leaves (their structure kept in ``_rest``)
        and the micro-batches' bounds along dim 0 (as ``np.array_split``), checked."""
        name = type(self.graph).__name__
        if not args:
            raise TypeError(f"{name}.step(x, *rest): give the batch's input x")
        m = self.micro_batches
        x = _array(args[0], name, "x")
        leaves, self._rest = flatten(tuple(args[1:]))
        rest = [_array(r, name, f"rest leaf {k}") for k, r in enumerate(leaves)]
        if x.ndim == 0:
            raise ValueError(f"{name}.step(x, ...): x is 0-dim; a batch has its rows along dim 0")
        n = x.shape[0]
        if n < m:
            raise ValueError(
                f"{name}.step(x, ...): x has {n} rows (shape {tuple(x.shape)}) and the "
                f"pipeline cuts each batch into micro_batches={m}; give batches of at least "
                f"{m} rows, or fewer micro_batches"
            )
        for k, r in enumerate(rest):
            if r.ndim == 0 or r.shape[0] != n:
                raise ValueError(
                    f"{name}.step(x, *rest): rest leaf {k} has shape {tuple(r.shape)}, but "
                    f"each leaf is cut into micro-batches along dim 0 with x (shape "
                    f"{tuple(x.shape)}): give it {n} rows"
                )
        bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.arange(n), m)])
        return x, rest, bounds

    def _micro_batches(self, x: np.ndarray, rest: list, bounds: Any) -> list:
        """The batch's micro-batches as the source's pieces: ``(x, rows, index, *rest)``,
        each array padded along dim 0 to the largest micro-batch's rows (a register has
        one size)."""
        size = int(bounds[1] - bounds[0])
        return [
            (
                _padded(x[lo:hi], size),
                np.int64(hi - lo),
                np.int64(j),
                *[_padded(r[lo:hi], size) for r in rest],
            )
            for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]

    # -- the graph -------------------------------------------------------------------------
    def _graph_for(self, item: tuple, memory) -> ActorGraph:
        """The graph for micro-batches like ``item``, made again when their layout, a
        module (anything ``structure_version`` counts), the budgets or ``sim_time`` changed
        since the last batch."""
        source = tuple((a.shape, str(a.dtype)) if isinstance(a, np.ndarray) else None for a in item)
        key = (source, structure_version[0], repr(memory), self.sim_time)
        if self.actor_graph is None or key != self._key:
            self._regs = self._layouts(item)
            self.actor_graph = self._actor_graph(self._regs, memory)
            self._key = key
        return self.actor_graph

    def _layouts(self, item: tuple) -> tuple:
        """The Specs of each register: the source's piece, then each stage's output
        activation, found by running the stages on one row of ``item`` in eval mode
        without autograd (no running statistics change, nothing random is drawn), once per
        layout. Every register is declared, so none is sized by an act (a piece that
        sizes its actor travels in a register of its own, outside the count)."""
        size = item[0].shape[0]
        source = tuple(Spec(a.shape, a.dtype) if isinstance(a, np.ndarray) else INDEX for a in item)
        outs = []
        t: Any = np.array(item[0][:1])
        n = len(self.stages)
        with no_grad():
            for i in range(n - 1):
                t = self._run_eval(i, t)
                if not isinstance(t, np.ndarray):  # (in its worker: checked there)
                    checked(f"stage {i} of {n}", t, 1, True)
                outs.append(Spec((size,) + tuple(t.shape[1:]), t.dtype))
            self._last_dtype = None
            if self._workers[-1] is not None:  # (its output is read back here)
                self._last_dtype = as_dtype(self._run_eval(n - 1, t).dtype)
        return source, tuple(outs)

    def _run_eval(self, i: int, t: Any) -> Any:
        """Stage ``i`` on ``t`` (an array, or the last stage's output) in eval mode; in its
        worker for a stage computing there (its output an array)."""
        w = self._workers[i]
        if w is not None:
            return w.probe(t if isinstance(t, np.ndarray) else _host(t))
        m = self.stages[i]
        with eval_mode(m):
            return m(self._tensor(i, t if isinstance(t, np.ndarray) else _host(t)))

    def _actor_graph(self, layouts: tuple, memory: dict | None) -> ActorGraph:
        """The graph of a run: the source of micro-batches, a forward and a backward actor
        per stage (the last stage's one actor), stage 0's backward its sink."""
        source, acts = layouts
        n, m = len(self.stages), self.micro_batches
        g = ActorGraph(memory=memory, resources={f"stage{i}": 1 for i in range(n)})
        fwd_t = bwd_t = None
        if self.sim_time is not None:
            fwd_t, bwd_t = (float(t) for t in self.sim_time)
        src = g.input(source, name="micro_batches", buffers=m)
        forwards = []
        prev = src
        for i in range(n - 1):
            prev = g.actor(
                self._forward_fn(i),
                prev,
                out=(acts[i], INDEX, INDEX),
                name=f"stage{i}.forward",
                resources={f"stage{i}": 1},
                buffers=self.buffers[i],
                time=fwd_t,
            )
            forwards.append(prev)
        last = n - 1
        grad = g.actor(
            self._last_fn(last),
            *((prev, src) if n > 1 else (src,)),
            out=(acts[last - 1], LOSS) if n > 1 else LOSS,
            name=f"stage{last}.forward_backward",
            resources={f"stage{last}": 1},
            buffers=self.buffers[last - 1] if n > 1 else None,
            time=None if fwd_t is None or bwd_t is None else fwd_t + bwd_t,
        )
        for i in range(n - 2, -1, -1):
            grad = g.actor(
                self._backward_fn(i),
                forwards[i],
                grad,
                out=(acts[i - 1], LOSS) if i > 0 else LOSS,
                name=f"stage{i}.backward",
                resources={f"stage{i}": 1},
                buffers=self.buffers[i - 1] if i > 0 else None,
                time=bwd_t,
            )
        g.sink(grad, name="loss")
        return g

    def _note(self, stage: int, kind: str, mb: int) -> None:
        with self._lock:
            self.acts.append((stage, kind, mb))

    def _hold(self, stage: int, mb: int, inp: Tensor | None, out: Tensor | None) -> None:
        """Keeps micro-batch ``mb``'s autograd graph (reached from ``out``) for the stage's
        backward, counting what it saves (None: a stage computing in a worker, which keeps
        the graph and counts its bytes; counted here as held)."""
        fifo = self._fifos[stage]
        nbytes = 0 if out is None else saved_bytes(out, self._params[stage])
        fifo.append((mb, inp, out, nbytes))
        self._held_bytes[stage] += nbytes
        self.peak_held[stage] = max(self.peak_held[stage], len(fifo))
        self.peak_saved_bytes[stage] = max(self.peak_saved_bytes[stage], self._held_bytes[stage])

    def _release(self, stage: int, mb: int) -> tuple:
        fifo = self._fifos[stage]
        held = fifo[0][0] if fifo else None
        if held != mb:  # (registers keep piece order: by construction)
            raise RuntimeError(
                f"stage {stage}: backward of micro-batch {mb}, but the oldest micro-batch "
                f"it holds is {held}"
            )
        _, inp, out, nbytes = fifo.popleft()
        self._held_bytes[stage] -= nbytes
        return inp, out

    def _tensor(self, stage: int, a: np.ndarray) -> Tensor:
        """A copy of ``a`` (from a register, which is reused) on the stage's device; for a
        global stage, a broadcast global tensor on its placement, put on the ranks holding
        its parameters (for process ranks: sent to the stage's worker, not waited for)."""
        ranks = self._ranks[stage]
        if ranks is not None:
            local = from_numpy(np.ascontiguousarray(a))
            part = ranks.put(0, local._impl)  # (reads ``a`` now: the register may be reused)
            return wrap(_global_of(ranks, [part], tuple(a.shape), local.dtype, broadcast))
        t = from_numpy(np.array(a))
        device = self._devices[stage]
        return t if device.type == "cpu" else t.to(device)

    @property
    def ranks(self) -> list:
        """Per stage, the ranks a global stage computes on (``ProcessRanks``: its worker,
        ``.pids``, ``.close()``), None for a local stage."""
        return list(self._ranks)

    def _stream(self, stage: int) -> Any:
        stream = self._streams[stage]
        return contextlib.nullcontext() if stream is None else use_stream(stream)

    def _settle(self, stage: int) -> None:
        """Waits for the work writing the stage's gradients; raises the error a kernel of
        it gave (a stage on inline ranks: its gradients' parts'; a stage computing in a
        worker settles there, in its acts)."""
        ranks, params = self._ranks[stage], self._grads[stage]
        if ranks is None:
            _settle(params)
            return
        grads = [p.grad for p in params if p.grad is not None]
        held = [g for g in grads if g.is_global and g._impl.blob.ranks is ranks]
        _settle([wrap(pt) for g in held for pt in parts_of(g._impl)])
        rest = [g for g in grads if not any(g is h for h in held)]
        for g in rest:  # (a head's, or made on other ranks: read, so its error is raised)
            _host(g)

    def close(self) -> None:
        """For ``stage_ranks=``: brings each stage back to this process (its parameters and
        buffers local again, with their values, and the graph's optimizers' state with
        them) and ends the workers ``stage_ranks=`` started, once no other pipeline's stages
        and no tensor live there (stages made global there by hand keep them; ranks made
        otherwise are left to their maker).
        The graph trains on this process's threads after (or give the stages placements
        again with ``Module.to_global``)."""
        name = type(self.graph).__name__
        failed = None
        # the last batch's step in the workers, and any other pipeline's of the same
        # optimizers, waited for before their state is read; the first error raised last
        for settle in [self._stepped] + [o._settle for o in self.graph._optimizers]:
            try:
                settle()
            except Exception as e:  # noqa: BLE001 - raised once the stages are back
                if failed is None:
                    failed = e
        if not self._placed:
            if failed is not None:
                raise failed
            return
        for w in self._workers:  # (their modules in the workers)
            if w is not None:
                w.forget()
        self._workers = [None] * len(self.stages)
        self._links.drop()  # (and the links between them)
        self._links.forget_folder()
        try:
            self._bring_back()
        finally:
            _end_started(self._placed, self)
            self._placed = []
        self._ranks = _stage_ranks(self.stages, name)
        if failed is not None:
            raise failed

    def _bring_back(self) -> None:
        """The stages local again, with their values, and the optimizers' state too (what
        held their parts is let go of on return)."""
        for m in self.stages:
            if any(t.is_global for t in list(m.parameters()) + list(m.buffers())):
                m.to("cpu")
        for opt in self.graph._optimizers:  # (their state: onto each parameter's device)
            if any(
                isinstance(v, Tensor) and v.is_global
                for st in opt.state.values()
                for v in st.values()
            ):
                opt.load_state_dict(opt.state_dict())

    def _input(self, stage: int, x: np.ndarray, rows: int) -> Tensor:
        inp = self._tensor(stage, x[:rows])
        if stage > 0:
            inp.requires_grad_()
        return inp

    def _forward_fn(self, i: int):
        module, n = self.stages[i], len(self.stages)

        def forward(piece):
            x, rows, mb = piece[0], int(piece[1]), int(piece[2])
            self._note(i, "F", mb)
            w = self._workers[i]
            if w is not None:
                got = w.forward(mb, x[:rows], self._out_dtype(i))
                self._hold(i, mb, None, None)
                return (_padded(got, x.shape[0]), np.int64(rows), np.int64(mb))
            inp = self._input(i, x, rows)
            with enable_grad(), self._stream(i):
                out = checked(f"stage {i} of {n}", module(inp), rows, True)
            self._hold(i, mb, inp, out)
            return (_padded(_host(out.detach()), x.shape[0]), np.int64(rows), np.int64(mb))

        return forward

    def _last_fn(self, i: int):
        module, m = self.stages[i], self.micro_batches

        def forward_backward(*pieces):
            piece, item = pieces[0], pieces[-1]  # (item: the source's, with the rest)
            x, rows, mb = piece[0], int(piece[1]), int(piece[2])
            self._note(i, "F", mb)
            if self._workers[i] is not None:
                return self._last_in_worker(i, x, rows, mb, item)
            inp = self._input(i, x, rows)
            rest = [self._tensor(i, r[:rows]) for r in item[3:]]
            with enable_grad(), self._stream(i):
                out = module(inp)
                loss = self._loss_of(out, rest)
                self._hold(i, mb, inp, loss)
                self._note(i, "B", mb)
                (loss * (1.0 / m)).backward()
            self._settle(i)
            self._release(i, mb)
            value = np.asarray(_host(loss.detach()), dtype=np.float64).reshape(())
            if i == 0:
                return value
            return (_input_grad(inp, x.shape[0]), value)

        return forward_backward

    def _loss_of(self, out: Tensor, rest: list) -> Tensor:
        """A micro-batch's loss: ``loss(out, *rest)`` where the graph was given one, else
        ``build(out, *rest)`` (``rest``: the other leaves' rows, as the batch held them)."""
        args = unflatten(self._rest, rest)
        name = type(self.graph).__name__
        if self.loss is not None:
            return checked_loss(self.loss(out, *args), name, "the loss given (loss=)")
        return checked_loss(self.graph.build(out, *args), name, "build")

    def _out_dtype(self, i: int) -> Any:
        """The dtype of stage ``i``'s output (its register's)."""
        if i == len(self.stages) - 1:
            return self._last_dtype
        return as_dtype(self._regs[1][i].dtype)

    def _last_in_worker(self, i: int, x: np.ndarray, rows: int, mb: int, item: tuple):
        """The last stage's act where it computes in a worker: its forward there, its
        output read back and ``build``'s loss computed here (autograd over a copy of the
        output), the output's gradient the worker's backward's input."""
        w, m = self._workers[i], self.micro_batches
        assert w is not None
        got = w.forward(mb, x[:rows], self._last_dtype)
        self._hold(i, mb, None, None)
        out = from_numpy(got).requires_grad_()
        rest = [from_numpy(np.array(r[:rows])) for r in item[3:]]
        kind = ranks_here(self._kind) if self._kind else contextlib.nullcontext()
        with enable_grad(), kind:  # (on this act's thread: what build makes on a
            #                         stage's placement, made on its worker)
            loss = self._loss_of(out, rest)
            self._note(i, "B", mb)
            (loss * (1.0 / m)).backward()
        _settle([p for p in self._grads[i] if not p.is_global])  # (a head's, here)
        self._release(i, mb)
        g = out.grad
        grad = np.zeros_like(got) if g is None else _host(g)
        dtype = self._out_dtype(i - 1) if i > 0 else None
        gin = w.backward(mb, grad, dtype)
        value = np.asarray(_host(loss.detach()), dtype=np.float64).reshape(())
        if i == 0:
            return value
        assert gin is not None
        return (_padded(gin, x.shape[0]), value)

    def _backward_fn(self, i: int):
        def backward(mine, grad_piece):
            rows, mb = int(mine[1]), int(mine[2])
            self._note(i, "B", mb)
            inp, out = self._release(i, mb)
            w = self._workers[i]
            if w is not None:
                dtype = self._out_dtype(i - 1) if i > 0 else None
                got = w.backward(mb, grad_piece[0][:rows], dtype)
                loss = np.array(grad_piece[1])
                if i == 0:
                    return loss
                return (_padded(got, mine[0].shape[0]), loss)
            if out.requires_grad:  # (else nothing before it needs a gradient: a frozen
                #                    stage 0, or an output made without its input)
                grad = self._tensor(i, grad_piece[0][:rows])
                with enable_grad(), self._stream(i):
                    out.backward(grad)
            self._settle(i)
            loss = np.array(grad_piece[1])
            if i == 0:
                return loss
            return (_input_grad(inp, mine[0].shape[0]), loss)

        return backward


def _stage_ranks(
    stages: Sequence[Module], name: str, placed: Sequence[Any] = ()
) -> list[Ranks | None]:
    """Per stage, None for a local stage (its parameters and buffers on one device), or
    the ranks holding a global stage's: every parameter and buffer global, broadcast on
    one single-rank placement that no other stage uses (``stage.to_global(
    af.placement("cpu", ranks=[i]))``; under ``af.parallel.use_ranks("processes")`` the
    stage then computes in a worker process of its own). Other global stages are refused
    with what is supported. ``placed``: per stage, the ranks ``stage_ranks=`` put it on (a
    stage without parameters or buffers computes there too)."""
    out: list[Ranks | None] = []
    used: dict = {}
    for i, m in enumerate(stages):
        tensors: list[tuple[str, str, Any]] = [("parameter", k, t) for k, t in m.named_parameters()]
        tensors += [("buffer", k, t) for k, t in m.named_buffers()]
        glob = [(kind, k, t) for kind, k, t in tensors if t.is_global]
        if not glob:
            out.append(placed[i] if placed and not tensors else None)
            continue
        kind, key, first = glob[0]
        place, held = first.placement, first._impl.blob.ranks
        for kind, key, t in tensors:
            if (
                not t.is_global
                or t.placement is not place
                or place.size != 1
                or (t.sbp != (broadcast,))
                or t._impl.blob.ranks is not held
            ):
                where = (
                    f"on {t.placement!r} with sbp {t.sbp}"
                    if t.is_global
                    else f"local, on {t.device}"
                )
                if t.is_global and t._impl.blob.ranks is not held:
                    where += (
                        f" but on other ranks than the stage's {glob[0][0]} {glob[0][1]!r} (made "
                        f"under another af.parallel.use_ranks kind: {t._impl.blob.ranks.kind!r} "
                        f"and {held.kind!r})"
                    )
                raise NotImplementedError(
                    f"{name}(stages=...): stage {i}'s {kind} {key!r} (shape "
                    f"{tuple(t.shape)}) is {where}; a pipeline stage over global tensors "
                    f"runs on one rank: every parameter and buffer of the stage broadcast "
                    f"on one single-rank placement of its own (stage.to_global("
                    f"af.placement('cpu', ranks=[{i}])) under af.parallel.use_ranks("
                    f"'processes'), or nn.Graph(stages=..., stage_ranks='processes'), which "
                    f"does that for each stage); stages split over several ranks are not "
                    f"built: keep each stage local (.to('cpu') makes a global module local "
                    f"again), or train the global model without stages="
                )
        j = used.setdefault(place, i)
        if j != i:
            raise NotImplementedError(
                f"{name}(stages=...): stages {j} and {i} are both on {place!r}; give each "
                f"global stage a placement of its own (af.placement('cpu', ranks=[{i}])), "
                f"so that each computes on its own rank"
            )
        out.append(getattr(first._impl.blob, "ranks"))  # noqa: B009 - a GlobalBlob's
    return out


_STAGE_USERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# ranks that stage_ranks= started -> the pipelines (PipelineStep) whose stages are on them


def _to_ranks(stages: Sequence[Module], kind: str, name: str) -> list:
    """``stage_ranks=kind``: stage i made global on ``placement("cpu", ranks=[i])`` on
    ranks of ``kind`` (started here with the cores shared among the stages, or those of
    another pipeline's stage i), all or none: a stage global already is refused before
    any moves, and a failed move brings the moved ones back. Returns each stage's ranks."""
    for i, m in enumerate(stages):
        if any(t.is_global for t in list(m.parameters()) + list(m.buffers())):
            raise ValueError(
                f"{name}(stages=..., stage_ranks={kind!r}): stage {i} is global already; "
                f"give local stages (it makes each global on a placement of its own), or "
                f"leave stage_ranks out"
            )
    moved: list[Module] = []
    started: list = []
    try:
        with ranks_here(kind):
            for i, m in enumerate(stages):
                place = Placement("cpu", ranks=[i])
                started.append(_own_ranks(kind, place, len(stages)))
                started[-1].synchronize()  # (the worker up)
                m.to_global(place)
                moved.append(m)
    except BaseException:
        for m in moved:
            m.to("cpu")
        _end_started(started, None)
        raise
    return started


def _end_started(placed: Sequence[Any], owner: Any) -> None:
    """Ends the ranks of ``placed`` that ``stage_ranks=`` started, once no pipeline
    (``owner`` leaving) has its stages there and no part lives there any more (stages
    made global there by hand, or any tensor of the placement, keep them)."""
    for r in placed:
        users = _STAGE_USERS.get(r)
        if users is None:
            continue  # (not started by stage_ranks=)
        if owner is not None:
            users.discard(owner)
        if users or not isinstance(r, HeldRanks) or r.closed:
            continue
        if r.live_parts():
            gc.collect()  # (a cycle may hold the last handles)
        if not r.live_parts():
            r.close()


def _own_ranks(kind: str, placement: Placement, stages: int) -> Any:
    """The ranks of ``kind`` of a stage's placement made with this machine's cores shared
    among the ``stages`` workers (``ranks_of`` would give a one-rank placement every core:
    its BLAS threads then spin against the other stages' on the same cores). Ranks made
    before (another graph's stage on the same placement) are kept."""
    from ..parallel.ranks import _GROUPS, KINDS

    key = (kind, placement)
    if key not in _GROUPS:
        threads = max(1, (os.cpu_count() or 1) // stages)
        _GROUPS[key] = KINDS[kind](placement, threads=threads)
        _STAGE_USERS[_GROUPS[key]] = weakref.WeakSet()  # (close() may end these)
    return _GROUPS[key]


def _device_of(stage: Module) -> Any:
    """Where a stage computes: its parameters' device (cpu for a stage without any). Each
    stage issues its ops on a stream of its own there, so two stages' kernels run at the
    same time (a stream runs its ops in order: on one, they would take turns)."""
    p = next(iter(stage.parameters()), None)
    return p.device if p is not None else as_device("cpu")


def _forget_asks(box: list) -> None:
    """A pipeline collected with its last step's answer not read: its asks let go of."""
    for ranks, token in box:
        ranks.forget(token)


def _settle(params: list) -> None:
    """Waits for the work writing ``params``' gradients (a backward's act ends when its
    gradients exist, so its time is its own and not the next act's that reads them), and
    raises the error a kernel of it gave."""
    grads = [p.grad for p in params if p.grad is not None]
    settled(grads)
    for t in grads:
        err = t._impl.blob.error
        if err is not None:
            raise err.to_raise()


def _input_grad(inp: Tensor, size: int) -> np.ndarray:
    """The gradient of a stage's input ``inp`` (its rows of a micro-batch), padded along
    dim 0 to the ``size`` rows of its register (the previous stage's output register)."""
    g = inp.grad
    if g is None:  # (the stage's output does not depend on its input: zeros)
        return np.zeros((size,) + tuple(inp.shape[1:]), dtype=inp.dtype.np)
    return _padded(_host(g), size)


def _host(t: Tensor) -> np.ndarray:
    """``t``'s values as a host array (copied over from a device; a global tensor's whole
    value read back from its ranks: for process ranks, waiting for the worker)."""
    if t.is_global:
        return t.numpy()
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def _padded(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with zero rows added along dim 0 up to ``size`` rows."""
    if a.shape[0] == size:
        return a
    out = np.zeros((size,) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def _array(x: Any, name: str, what: str) -> np.ndarray:
    if isinstance(x, Tensor):
        return np.asarray(peek_array(x))
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(
        f"{name}.step(x, *rest): {what} is a {type(x).__name__}; give tensors or numpy "
        f"arrays with the batch along dim 0"
    )


def _check_loss(graph: Any, loss: Any) -> None:
    """``loss=`` of a pipeline graph: a module without parameters or a function, in place
    of ``build`` (one or the other)."""
    if loss is None:
        return
    name = type(graph).__name__
    if any("build" in vars(c) for c in type(graph).__mro__ if not _library(c)):
        raise ValueError(
            f"{name}(stages=..., loss=...): {name} also defines build; give the loss one way: "
            f"loss= (what the last stage's worker can compute) or build (run in this process)"
        )
    if not callable(loss):
        raise TypeError(
            f"{name}(stages=..., loss={type(loss).__name__}): give a module or a function of "
            f"(out, *rest) returning the micro-batch's loss, e.g. nn.CrossEntropyLoss()"
        )
    if isinstance(loss, Module) and any(True for _ in loss.parameters()):
        raise ValueError(
            f"{name}(stages=..., loss={type(loss).__name__}): the loss has parameters; a "
            f"module with parameters belongs in the last stage (its optimizer steps it "
            f"there): give loss= a module without parameters or a function"
        )


def _library(cls: type) -> bool:
    """Whether ``cls`` is ``nn.Graph`` itself (or ``object``), not a subclass."""
    return cls is object or (cls.__module__, cls.__qualname__) == ("actorflow.nn.graph", "Graph")


def _buffers_of(stages: list, written: set | None) -> list:
    """Before a batch, each buffer of ``stages`` as ``(module, name, tensor, version,
    copy)``: a copy of its values where the last batch wrote it (``written``: their
    ``(id(module), name)``; None: the graph's first batch, every buffer), what a failed
    batch sets it back to (``_restore``). A buffer a batch does not write (a constant
    table) is not copied batch after batch."""
    out = []
    with no_grad():
        for s in stages:
            for mod in s.modules():
                for name, b in mod._buffers.items():
                    if b is None:
                        continue
                    copy = None
                    if written is None or (id(mod), name) in written:
                        copy = b.detach().clone()
                    out.append((mod, name, b, b._impl.blob.version, copy))
    return out


def _changed(mod: Any, name: str, b: Tensor, version: int) -> bool:
    """Whether buffer ``name`` of ``mod``, ``b`` at ``version`` before a batch, was written
    by it (in place, or replaced by another tensor)."""
    return mod._buffers.get(name) is not b or b._impl.blob.version != version


def _written(kept: list) -> set:
    """After a batch, the buffers it wrote."""
    return {(id(mod), name) for mod, name, b, version, _ in kept if _changed(mod, name, b, version)}


def _restore(kept: list) -> set:
    """The buffers ``_buffers_of`` copied set back: the tensor the module held (where the
    batch replaced it), its values written back whole (a failed batch's kernel error
    poisoned what its later ops wrote in place: batch norm's running statistics). A buffer
    the failed batch wrote that the batch before had not (so not copied) keeps what it
    wrote: a warning names it; returns those, copied from the next batch on."""
    missed = []
    with no_grad():
        for mod, name, b, version, copy in kept:
            if copy is None:
                if _changed(mod, name, b, version):
                    missed.append((mod, name))
                continue
            if mod._buffers.get(name) is not b:
                setattr(mod, name, b)
            b.copy_(copy)
    if missed:
        names = ", ".join(f"{type(mod).__name__}.{name}" for mod, name in missed)
        warnings.warn(
            f"pipeline: the failed batch wrote the buffer(s) {names} of a local stage, "
            f"which the batch before had not written, so they were not copied before it "
            f"and keep what the failed batch wrote (set them again, or load the module's "
            f"state); they are copied before every batch from now on",
            RuntimeWarning,
            stacklevel=2,
        )
    return {(id(mod), name) for mod, name in missed}


def _write_trace(path: Any, timed: list, last: int) -> None:
    """A batch's acts in the stages' workers as a timeline, a track per actor as a run's
    (``stage{i}.forward`` and ``stage{i}.backward``, the last stage's
    ``forward_backward``, and ``stage{i}.weights`` where a stage's weights parts waited),
    each stage's waits on its forward's track (a credit's: its forward's input there, its
    registers held)."""
    from ..trace_events import TraceEvents

    t0 = timed[0][0] if timed else 0.0
    ev = TraceEvents(t0)
    ev.process(0, "pipeline stages in their workers")
    tracks = [(i, "forward") for i in range(last)] + [(i, "backward") for i in range(last)]
    tracks.append((last, "forward_backward"))
    tracks += sorted({(i, "weights") for _, i, kind, _, _ in timed if kind == WEIGHTS})
    tid = {}
    for k, (i, act) in enumerate(sorted(tracks)):
        tid[i, act] = k
        ev.thread(0, k, f"stage{i}.{act}", sort=k)
    names = {FORWARD: "forward", BACKWARD: "backward", WAIT: "forward", WEIGHTS: "weights"}
    for start, i, kind, mb, end in timed:
        act = "forward_backward" if i == last and kind != WEIGHTS else names[kind]
        dur = (end - start) * 1e6
        if kind == WAIT:
            cause = "credit" if mb == CREDIT else "input"
            ev.complete(0, tid[i, act], "wait", "waiting", ev.us(start), dur, {"cause": cause})
        else:
            ev.complete(0, tid[i, act], "act", f"stage{i}.{act}", ev.us(start), dur, {"piece": mb})
    ev.write(path)
