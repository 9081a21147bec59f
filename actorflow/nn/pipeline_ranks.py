"""Pipeline stages that compute in a worker: a stage of ``nn.Graph(stages=...)`` whose
parameters and buffers are global on a one-rank placement of held ranks (process ranks: a
worker process; Ray ranks: a Ray actor) runs its forward and backward acts there, one
command each, as the stage's compiled programs (``stage_programs.py``: the module's forward
and its backward traced per micro-batch layout, as ``nn.Graph`` compiles a step),
instead of being driven op by op from this process.

The two sides of one protocol, in one file:

- This process (``RankStage``, one per such stage, kept by ``PipelineStep``): at a batch's
  start ``begin()`` sends the stage's module to the worker when it is not there yet or
  changed since (``define``: the module pickled with each parameter and buffer replaced by
  the id of its part, so the worker's module computes on the very parts the global
  tensors name: an optimizer's in-place update of a global parameter here is a write into
  the worker module's parameter), and clears what the worker kept of the last batch
  (``start``, with the seed the batch's random ops draw from). A forward act puts the
  micro-batch's input rows, has the worker run the stage's forward program (``forward``:
  it keeps what the backward reads) and reads the output back (one round trip); a
  backward act puts the output's gradient, has the worker run the backward program on the
  oldest micro-batch it keeps, in piece order (``backward``), and reads the input's
  gradient back (a kernel's error there is the act's). After the
  batch's last backward ``finish()`` makes each parameter's gradient, accumulated in the
  worker over the micro-batches, the ``.grad`` of the global parameter here (a global
  tensor over the worker's part: nothing copied), so the graph's optimizers step the
  stage's parameters as they step any global parameter (their commands run in the worker
  after the acts).
- The worker (the functions ``RUN`` commands name, ``workers.Executor.run_fn``): what it
  keeps of a stage (``_Kept``: its module, its compiled programs, what its micro-batches
  in flight hold for their backward, their bytes and peak) in ``Executor.kept``.

What the stage keeps for its backward lives in the worker; the registers here bound it as
they bound a local stage's (the worker's count is checked against the piece order). The
last stage's loss: its output is read back and ``build`` runs here (with autograd over a
local copy of the output), and the gradient of that output is the worker's backward's
input, so ``build`` may use anything of this process (a head module, the rest leaves).
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..code_reads import set_shared
from ..parallel.workers import adopt
from ..tensor.tensor import Tensor, wrap
from .module import Module, Parameter
from .stage_programs import StagePrograms, checked

# -- the worker's side -------------------------------------------------------------------


class _Kept:
    """A stage as its worker keeps it."""

    def __init__(self, module: Module, loss: Any, index: int, label: str, passes_on: bool) -> None:
        self.module = module
        self.loss = loss  # (the last stage's, where the workers run the batch: pipeline_links)
        self.index = index
        self.label = label  # "stage i of n", for errors
        self.passes_on = passes_on  # (not the last stage: its output is the next's input)
        self.params = list(module.parameters())
        self.fifo: deque = deque()  # (micro-batch, its acts, what they keep, the input's part)
        self.held = 0
        self.peak = 0
        self.held_most = 0  # (the most micro-batches held at once: pipeline_links)
        self.left: Any = None  # (micro-batch, weights part): a batch's last, which the
        #                       optimizers' step runs first (pipeline_links._step)
        self.weights_held = 0  # (bytes the weights parts waiting hold: pipeline_links)
        self.weights_peak = 0
        self.weights_most = 0  # (the most weights parts waiting at once)
        self.compiled: Any = None  # (its acts compiled: stage_programs.StagePrograms)
        self.batch_seed = 0  # (what the batch's random ops draw from: _start's)

    def programs(self) -> Any:
        """The stage's compiled acts (made on first use)."""
        if self.compiled is None:
            self.compiled = StagePrograms(self.module, self.label, self.index)
        return self.compiled

    def draws(self, mb: int) -> int:
        """The count micro-batch ``mb``'s random ops draw at (``stage_programs``): the
        batch's seed in the high bits, the micro-batch in the low 20."""
        return (self.batch_seed >> 20 << 20) | mb


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, ex: Any) -> None:
        super().__init__(io.BytesIO(data))
        self.ex = ex
        self.made: dict = {}  # (a tensor the module reaches twice is one tensor here)

    def persistent_load(self, pid: Any) -> Any:
        kind, ref, param, requires_grad = pid
        if kind == "part":
            t = self.made.get(ref)
            if t is None:
                t = self.made[ref] = self._tensor(ref, param, requires_grad)
            return t
        from ..creation import from_numpy  # ("array": a local tensor's values)

        return _as(from_numpy(np.array(ref)), param, requires_grad)

    def _tensor(self, ref: int, param: bool, requires_grad: bool) -> Any:
        return _as(part_view(self.ex, ref), param, requires_grad)


def part_view(ex: Any, ref: int) -> Tensor:
    """A tensor over the storage of part ``ref`` of this worker (a view: the commands
    writing the part in place write it, and its in-place writes are the part's, while
    autograd marks the view alone); the error the part holds is raised as its own."""
    got = ex.inputs([ref])
    if isinstance(got, bytes):
        _raise(got)
    impl = got[0]
    m = impl.meta
    return wrap(impl.view(m.shape, m.strides, m.offset))


def _as(t: Tensor, param: bool, requires_grad: bool) -> Tensor:
    if param:
        return Parameter(t, requires_grad)
    return t.requires_grad_() if requires_grad else t


def _raise(err: bytes) -> None:
    """Raises the error a part holds (``workers.error_bytes``) as its own."""
    words, _, data = pickle.loads(err)
    raise pickle.loads(data) if data else RuntimeError(words)


def _define(ex: Any, blob: bytes, index: int, label: str, passes_on: bool, outs: list) -> None:
    """The stage's module loaded, kept under the id of the part ``outs[0]`` (an empty
    marker): dropping that part (the controller let go of its handle) forgets it; where
    the module does not load, that part holds the error, raised by every act."""
    from ..creation import from_numpy

    try:
        module, loss, shared = _Unpickler(blob, ex).load()
        for where in shared:
            set_shared(*where)
    except (AttributeError, ImportError) as e:
        raise type(e)(
            f"{label}'s module could not be loaded in its worker ({e}); the classes and "
            f"functions a stage holds are loaded there by their module's name: define them "
            f"in a module the worker can import, not in the script run as __main__"
        ) from e
    except Exception as e:
        raise RuntimeError(
            f"{label}'s module could not be loaded in its worker: {type(e).__name__}: {e}"
        ) from e
    kept = _Kept(module, loss, index, label, passes_on)
    ex.parts[outs[0]] = from_numpy(np.zeros(0, np.float32))._impl
    ex.kept[outs[0]] = kept


def _shared(module: Module, loss: Any = None) -> list:
    """What the code of ``module``'s classes (and of ``loss``, a module or a function)
    reads besides them that a worker keeps a copy of (``code_reads.shared_constants``)."""
    from ..code_reads import ModelReads, shared_constants

    modules = list(module.modules())
    functions = []
    if isinstance(loss, Module):
        modules += list(loss.modules())
    elif loss is not None:
        functions.append(loss)
    return shared_constants(ModelReads(modules, functions=functions))


def _kept(ex: Any, key: int) -> _Kept:
    """The stage kept under ``key``; the error its loading raised is raised again."""
    st = ex.kept.get(key)
    if st is None:
        got = ex.inputs([key])  # (the marker's error: the module's loading's)
        if isinstance(got, bytes):
            _raise(got)
        raise RuntimeError(f"no pipeline stage {key} on this rank")
    return st


def _start(ex: Any, key: int, seed: int | None, outs: list) -> None:
    """Before a batch (``seed``: what the worker's random ops draw from in it), or after a
    failed one (None): the graphs and gradients of the last one let go, the buffers it
    wrote set back (batch norm's running statistics: a failed batch changes no state)."""
    if seed is not None:
        from ..creation import manual_seed

        manual_seed(seed)
    st = ex.kept.get(key)
    if st is None:
        return  # (its loading failed: raised by the acts)
    if seed is not None:
        st.batch_seed = seed
    if st.compiled is not None:  # (a batch that did not end well: what it wrote set back;
        st.compiled.restore()  # after one that did, nothing is kept to set back)
        st.compiled.clear()
    st.fifo.clear()
    st.left = None
    st.held = st.peak = st.held_most = 0
    st.weights_held = st.weights_peak = st.weights_most = 0
    for p in st.params:
        p.grad = None


def _contiguous(ex: Any, t: Tensor) -> Any:
    """``t``'s impl, copied when it is not C-contiguous from offset 0 (the layout the
    controller's parts assume)."""
    impl = t._impl
    m = impl.meta
    if m.offset != 0 or m.strides != ex._strides(m.shape):
        impl = ex.apply(ex.copy, [impl], {})[0]
    return impl


def _forward(ex: Any, key: int, mb: int, in_id: int, needs_grad: bool, outs: list) -> None:
    """The stage's forward act on micro-batch ``mb`` (its compiled program): its output
    the part ``outs[0]``, what its backward reads kept."""
    from ..creation import from_numpy

    st = _kept(ex, key)
    got = ex.inputs([in_id])
    if isinstance(got, bytes):
        return ex.fail(outs, got)
    x = ex.read(got[0], np.ascontiguousarray, "pipeline stage")
    sp = st.programs()
    prog = sp.of(x, [], needs_grad, None, 1.0)
    out, saved = sp.forward(prog, x, st.draws(mb))
    part = got[0] if ("in", 0) in prog.kept else None  # (alive while its rows are kept)
    st.fifo.append((mb, prog, saved, part))
    st.held += prog.saved_bytes
    st.peak = max(st.peak, st.held)
    ex.parts[outs[0]] = from_numpy(out)._impl
    return None


def _probe(ex: Any, key: int, in_id: int, outs: list) -> None:
    """The stage on one row in eval mode without autograd (its output's layout: nothing
    of the module changes, nothing random is drawn)."""
    from ..autograd import no_grad

    st = _kept(ex, key)
    got = ex.inputs([in_id])
    if isinstance(got, bytes):
        return ex.fail(outs, got)
    x = wrap(got[0])
    with no_grad(), eval_mode(st.module):
        out = checked(st.label, st.module(x), x.shape[0], st.passes_on)
    ex.parts[outs[0]] = _contiguous(ex, out)
    return None


def _backward(ex: Any, key: int, mb: int, grad_id: int, input_grad: bool, outs: list) -> None:
    """The stage's backward act on micro-batch ``mb``, the oldest it holds: the
    parameters' gradients accumulated, the input's the part ``outs[0]`` (an empty part
    where none is asked: stage 0)."""
    from ..creation import from_numpy

    st = _kept(ex, key)
    held = st.fifo[0][0] if st.fifo else None
    if held != mb:  # (registers keep piece order: by construction)
        raise RuntimeError(
            f"{st.label}: backward of micro-batch {mb}, but the oldest micro-batch it "
            f"holds is {held}"
        )
    _, prog, saved, _ = st.fifo.popleft()
    st.held -= prog.saved_bytes
    got = ex.inputs([grad_id])
    if isinstance(got, bytes):
        return ex.fail(outs, got)
    g = ex.read(got[0], np.ascontiguousarray, "pipeline stage")
    sp = st.programs()
    gx, left = sp.backward(prog, g, saved)
    if left is not None:  # (its weights part at once: the command's answer is the act's)
        sp.weights(left)
    if not input_grad:  # (stage 0: an empty part, read to say the act is done)
        gx = np.zeros(0, np.float32)
    ex.parts[outs[0]] = from_numpy(gx)._impl
    return None


def _finish(ex: Any, key: int, outs: list) -> None:
    """The gradients the batch accumulated become the parts ``outs[1:]`` (one per
    parameter, in order; none for a parameter without one), and ``outs[0]`` an int64
    array: the peak of saved bytes, then 1 or 0 per parameter (whether it has one)."""
    from ..creation import from_numpy

    st = _kept(ex, key)
    has = handed_over(ex, st, outs[1:])
    ex.parts[outs[0]] = from_numpy(np.array([st.peak, *has], np.int64))._impl


def handed_over(ex: Any, st: _Kept, outs: list) -> list:
    """The gradients the batch accumulated become the parts ``outs`` (one per parameter,
    in order; none for a parameter without one), let go here; returns per parameter 1 or
    0 (whether it has one)."""
    st.programs().take_grads()
    has = []
    for p, out in zip(st.params, outs, strict=True):
        if p.grad is None:
            has.append(0)
            continue
        ex.parts[out] = _contiguous(ex, p.grad)
        p.grad = None
        has.append(1)
    return has


def saved_bytes(out: Tensor, exclude: set) -> int:
    """The bytes the autograd graph behind ``out`` saves for backward: each saved blob once,
    those in ``exclude`` (ids: parameters, buffers) left out."""
    ag = out._impl.ag
    start = ag.grad_fn if ag is not None else None
    seen_nodes: set = set()
    seen_blobs: set = set()
    total = 0
    stack = [start] if start is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        blobs = [t.blob for t in (node.saved_in or ()) if t is not None]
        blobs += [b for b, _ in (node.saved_out or ())]
        for b in blobs:
            if id(b) not in seen_blobs and id(b) not in exclude:
                seen_blobs.add(id(b))
                total += b.nbytes
        for e in node.edges:
            if e is not None and hasattr(e[0], "edges"):  # (a node; a leaf's Meta has none)
                stack.append(e[0])
    return total


@contextlib.contextmanager
def eval_mode(module: Module) -> Iterator[None]:
    """``module`` and its submodules in eval mode for the block, set back after (as
    ``eval()`` does, not counted as a change of the module)."""
    modes = [(sub, sub.training) for sub in module.modules()]
    try:
        for sub, _ in modes:
            object.__setattr__(sub, "training", False)
        yield
    finally:
        for sub, mode in modes:
            object.__setattr__(sub, "training", mode)


# -- this process's side -----------------------------------------------------------------


class RankStage:
    """Stage ``index`` of ``n``, ``module``, computing in the worker of ``ranks`` (held
    ranks of a one-rank placement holding every parameter and buffer of the module)."""

    def __init__(self, index: int, n: int, module: Module, ranks: Any) -> None:
        self.index, self.n, self.module, self.ranks = index, n, module, ranks
        self.loss: Any = None  # the last stage's loss where its worker computes it
        self._marker: Any = None  # the part whose id keys the stage in the worker
        self._defined: Any = None  # what the worker's module was made from
        self.peak_saved_bytes = 0

    def _tensors(self) -> list:
        m = self.module
        return list(m.parameters()) + list(m.buffers())

    def begin(self, start: bool = True) -> int:
        """Before a batch: the module defined in the worker where it is not there as it is
        here (the module pickled again each batch with the constants its classes' methods
        read, ``_shared``, and sent again where the bytes differ: an attribute, a layer, a
        mode, a frozen parameter, a parameter's part, a class attribute changed),
        what the worker kept of the last batch cleared, its random ops seeded (``_start``;
        with ``start`` False, by the command that runs the batch: given the seed this
        returns, as ``pipeline_links._run`` is)."""
        from ..creation import spawned_seed
        from ..dtype import float32
        from ..parallel.interpreter import parts_of

        tensors = self._tensors()
        ids = [parts_of(t._impl)[0].id for t in tensors]
        blob = self._pickled(dict(zip(map(id, tensors), ids, strict=True)))
        state = (self.ranks, blob)
        if state != self._defined:
            self._defined = None
            label = f"stage {self.index} of {self.n}"
            passes_on = self.index < self.n - 1
            (self._marker,) = self.ranks.call_fn(
                0, _define, (blob, self.index, label, passes_on), (float32,)
            )  # (the one before dropped with its handle: the worker forgets that module)
            self._defined = state
        seed = spawned_seed()
        if start:
            self.ranks.call_fn(0, _start, (self.key, seed), ())
        return seed

    def clear(self) -> None:
        """After a failed batch: the worker lets go of its graphs and gradients."""
        if self._marker is not None and not self.ranks.closed:
            try:
                self.ranks.call_fn(0, _start, (self.key, None), ())
            except Exception:  # noqa: BLE001 - the ranks failed: nothing held there now
                pass

    def _pickled(self, ids: dict) -> bytes:
        buf = io.BytesIO()
        where = f"stage {self.index} of {self.n} ({type(self.module).__name__})"

        class Pickler(pickle.Pickler):
            def persistent_id(self, obj: Any) -> Any:
                if not isinstance(obj, Tensor):
                    return None
                param = isinstance(obj, Parameter)
                i = ids.get(id(obj))
                if i is not None:
                    return ("part", i, param, obj.requires_grad)
                if obj.is_global:
                    raise TypeError(
                        f"{where} holds a global tensor of shape {tuple(obj.shape)} on "
                        f"{obj.placement!r} that is not one of its parameters or buffers; "
                        f"a stage computing in a worker takes its own parameters and "
                        f"buffers there only: make it a parameter or buffer of the stage"
                    )
                return ("array", obj.detach().numpy(), param, obj.requires_grad)

        unpicklable = (pickle.PicklingError, TypeError, AttributeError)
        try:
            Pickler(buf, protocol=5).dump((self.module, self.loss, _shared(self.module, self.loss)))
        except unpicklable as e:
            try:  # (the loss's, where it is the loss that does not pickle)
                Pickler(io.BytesIO(), protocol=5).dump(self.loss)
            except unpicklable as f:
                raise TypeError(
                    f"the pipeline's loss= ({type(self.loss).__name__}) is sent to the last "
                    f"stage's worker pickled, and it does not pickle ({type(f).__name__}: "
                    f"{f}); give a module, or a function defined at a module's top level "
                    f"(not a lambda or a function made inside another)"
                ) from f
            raise TypeError(
                f"{where} is sent to its worker pickled, and it does not pickle "
                f"({type(e).__name__}: {e}); keep the stage's module to what pickles "
                f"(layers, and functions defined at a module's top level, no lambdas or "
                f"hooks made inside functions), or keep the stage local"
            ) from e
        return buf.getvalue()

    @property
    def key(self) -> int:
        return self._marker.id

    def forget(self) -> None:
        """The worker drops its module (also when this is collected: its marker's drop)."""
        self._marker = None
        self._defined = None

    def _put(self, a: np.ndarray) -> Any:
        from ..creation import from_numpy

        return self.ranks.put(0, from_numpy(np.ascontiguousarray(a))._impl)

    def _read(self, part: Any, raw: bool = False) -> np.ndarray:
        """The part's values (no tensor made here: an array freed as soon as dropped;
        ``raw``: as stored, whatever the part's dtype)."""
        a = self.ranks.read(0, part)
        if not raw and a.dtype != part.dtype.np:  # (a dtype stored as another: its values)
            from ..runtime_api import peek_array

            return np.asarray(peek_array(wrap(adopt(a, part.dtype))))
        return a

    def probe(self, x: np.ndarray) -> np.ndarray:
        """The stage's output for the rows ``x`` in eval mode without autograd, computed in
        the worker (what the registers' layouts are found with)."""
        from ..dtype import float32

        part = self._put(x)
        (out,) = self.ranks.call_fn(0, _probe, (self.key, part.id), (float32,))
        return self._read(out, raw=True)

    def forward(self, mb: int, x: np.ndarray, dtype: Any) -> np.ndarray:
        """Micro-batch ``mb``'s forward over the input rows ``x``: its output's values
        (``dtype``: the output's), the autograd graph kept in the worker."""
        part = self._put(x)
        (out,) = self.ranks.call_fn(0, _forward, (self.key, mb, part.id, self.index > 0), (dtype,))
        return self._read(out)

    def backward(self, mb: int, grad: np.ndarray, dtype: Any) -> np.ndarray | None:
        """Micro-batch ``mb``'s backward from its output's gradient ``grad``: the gradient
        of its input (None for stage 0), once every gradient it writes is written."""
        from ..dtype import float32

        part = self._put(grad)
        first = self.index == 0
        (out,) = self.ranks.call_fn(
            0, _backward, (self.key, mb, part.id, not first), (float32 if first else dtype,)
        )
        got = self._read(out)
        return None if first else got

    def finish(self) -> None:
        """After the batch's last backward: each parameter's accumulated gradient made the
        ``.grad`` of the global parameter here (or None, where the batch gave it none),
        and the worker's peak of saved bytes read."""
        from ..dtype import int64

        params = list(self.module.parameters())
        info, *grads = self.ranks.call_fn(
            0, _finish, (self.key,), (int64, *(p.dtype for p in params))
        )
        got = self._read(info)
        self.peak_saved_bytes = int(got[0])
        self.take_grads(grads, got[1:])

    def take_grads(self, grads: list, has: Any) -> None:
        """The parts ``grads`` (one per parameter; ``has``: whether the worker made it)
        made the ``.grad`` of the global parameters here."""
        from ..parallel.interpreter import make
        from ..sbp import broadcast

        params = list(self.module.parameters())
        for p, part, made in zip(params, grads, has, strict=True):
            if made:
                g = wrap(make(self.ranks, [part], tuple(p.shape), p.dtype, broadcast))
                # (build used the parameter too: its gradient here, added)
                p.grad = g if p.grad is None else p.grad + g
