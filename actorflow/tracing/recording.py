"""Recording a function of tensors: a lazy interpreter that records op calls on placeholder
tensors instead of running them (``Tracer``), and ``Recording``, one recorded call with
what the builders (``trace.op_program``, ``build.traced_graph``) read from it.

The recorder is installed with ``use_interpreter`` for the duration of one call of the
function; its inputs are placeholder tensors (shape, dtype and device from a Spec, no data).
An op call with a placeholder among its inputs is recorded; one without (a constant made
inside the function) runs eagerly, and its result is captured as a constant.

A tensor the function reads from outside (a global, a closure variable, an attribute that
is not a parameter or buffer) is a *captured* tensor. By default it is a constant, copied
once when traced (``af.trace``, ``ActorGraph.op``). A recording made with ``live=True``
(``nn.Graph``'s step) reads it as state instead, from its own storage every piece, so later
writes to it are seen as in eager mode: every op on it is recorded (none runs once at trace
time), and writing into it in place is refused. Writing in place into a traced tensor is
refused (``inplace_error`` says why and the out-of-place form), except into a whole given
state (``nn.Graph``'s buffers: batch norm's running statistics): that write is recorded out
of place and its result is the state's value from then on, written back by the step.

A random op (``rand``, ``randn``: dropout's mask) is recorded only where the recording has
a step count (``count``: ``nn.Graph``'s step, whose state it is): as ``rand_step`` /
``randn_step`` reading that count, keyed by ``seed`` (the graph's) and the op's place among
the recording's random ops, and the step adds one to the count (``counted``). Elsewhere
(``af.trace``, ``ActorGraph.op``) a random op is refused: it would run once, while tracing,
and repeat its values every piece.
"""

from __future__ import annotations

import contextlib

from ..autograd.nodes import Meta
from ..backends import get_backend
from ..eager.interpreter import EagerInterpreter, Interpreter, check_same_device, use_interpreter
from ..errors import TraceError
from ..functional import add
from ..ops import get as op_get
from ..runtime.plan.spec import Spec, flatten
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import contiguous_meta, is_contiguous
from ..tensor.tensor import Tensor, wrap

_RANDOM = ("rand", "randn")
_STEP_FORM = {"rand": op_get("rand_step"), "randn": op_get("randn_step")}
_CAST = op_get("cast")


class TracedBlob(Blob):
    """The storage of a placeholder or of a recorded op's output: it never holds data."""

    __slots__ = ()
    traced = True


class Node:
    """One recorded op call: ``refs`` per input ``(source, meta)``, its output blobs."""

    __slots__ = ("op", "refs", "attrs", "outs", "metas")

    def __init__(self, op, refs, attrs, outs, metas):
        self.op, self.refs, self.attrs, self.outs, self.metas = op, refs, attrs, outs, metas


class Tracer(Interpreter):
    """Records op calls on placeholders. ``where[blob]`` says what made a traced blob:
    ``("in", j)`` placeholder leaf j, ``("state", i)`` state i, or ``("node", n, i)``
    output i of node n.

    ``live``: captured tensors are state read every piece (``captured``: their TensorImpls,
    state ``first_live + c`` for the c-th), not constants; ``made`` holds the blobs of the
    constants the function made while traced (eager ops on nothing captured), which stay
    constants. ``state_names``: what each state is, for error messages. ``count``: the
    index of the state holding the step's count, which random ops read (None: they are
    refused); ``seed``: their key's seed; ``draws``: how many were recorded."""

    def __init__(
        self, live: bool = False, first_live: int = 0, state_names=None, count=None, seed=None
    ):
        self.nodes: list = []
        self.where: dict = {}
        self.states: dict = {}  # a given state's placeholder blob -> its index
        self.consts: dict = {}  # id(impl) -> (const index, TensorImpl kept alive)
        self.live = live
        self.first_live = first_live
        self.captured: list = []  # TensorImpls read live (kept alive with the program)
        self._live_of: dict = {}  # id(impl) -> state index
        self.made: set = set()  # blobs of the constants made while tracing (live)
        self.state_names = list(state_names or ())
        self._grads: dict = {}  # id(Meta) -> (Meta, its grad): see restore_grads
        self._eager = EagerInterpreter()
        self.count, self.seed = count, seed
        self.leaf_specs: list = []  # (the recording's: more_input adds to them)
        self.draws = 0
        self._count: Tensor | None = None  # the count's placeholder

    def placeholder(self, spec: Spec, j: int) -> Tensor:
        dev = spec.device
        impl = TensorImpl(
            contiguous_meta(spec.shape, spec.dtype, dev),
            TracedBlob(dev, get_backend(dev), spec.nbytes),
        )
        self.where[impl.blob] = ("in", j)
        return wrap(impl)

    def state(self, spec: Spec, i: int) -> Tensor:
        """A placeholder for state ``i``: an array the program reads and may write back
        (``nn.Graph``'s parameters and optimizer state), held across pieces."""
        t = self.placeholder(spec, -1)
        self.where[t._impl.blob] = ("state", i)
        self.states[t._impl.blob] = i
        if i == self.count:
            self._count = t
        return t

    def source(self, impl):
        blob = impl.blob
        if blob.traced:
            src = self.where.get(blob)
            if src is None:
                raise TraceError(
                    "a tensor traced by another trace was used here; trace one function at a time"
                )
            return src
        ag = impl.ag
        if ag is not None and id(ag) not in self._grads:
            self._grads[id(ag)] = (ag, ag.grad)
        if self.live and blob not in self.made:
            i = self._live_of.get(id(impl))  # one state per tensor (views included)
            if i is None:
                i = self._live_of[id(impl)] = self.first_live + len(self.captured)
                self.captured.append(impl)
            return ("state", i)
        entry = self.consts.get(id(impl))  # one copy per tensor (views included)
        if entry is None:
            entry = (len(self.consts), impl)
            self.consts[id(impl)] = entry
        return ("const", entry[0])

    def restore_grads(self) -> None:
        """A captured tensor that requires grad keeps the ``grad`` it had: a backward
        traced through it would leave a traced tensor there (the program computes no
        ``grad`` of it, as it writes none of the parameters' either)."""
        for ag, grad in self._grads.values():
            ag.grad = grad

    def _recorded(self, impl) -> bool:
        """Is ``impl`` one the program reads (traced, or captured and read live)?"""
        blob = impl.blob
        return blob.traced or (self.live and blob not in self.made)

    def apply(self, op, inputs, attrs, device=None, outs=None):
        touched = inputs if outs is None else list(inputs) + list(outs)
        if not any(self._recorded(i) for i in touched):
            if op.name in _RANDOM:
                return self._draw(op, attrs, device)
            out_impls = self._eager.apply(op, inputs, attrs, device, outs)
            if self.live:
                self.made.update(o.blob for o in out_impls)
            return out_impls
        if outs is not None:
            if self._state_written(outs):
                return self._renew_state(op, inputs, attrs, device, outs[0])
            raise TraceError(self.inplace_error(op, outs[0]))
        if op.dynamic:
            raise TraceError(
                f"{op.name}: its output shape depends on the values, so it "
                f"cannot be planned ahead; run it eagerly outside the traced "
                f"function"
            )
        metas = [i.meta for i in inputs]
        dev = device or check_same_device(inputs, op.name)
        refs = [(self.source(i), i.meta) for i in inputs]
        specs = op.infer(metas, attrs)
        backend = get_backend(dev)
        out_impls = []
        n = len(self.nodes)
        for k, (shape, dtype) in enumerate(specs):
            nbytes = dtype.itemsize
            for s in shape:
                nbytes *= s
            impl = TensorImpl(contiguous_meta(shape, dtype, dev), TracedBlob(dev, backend, nbytes))
            self.where[impl.blob] = ("node", n, k)
            out_impls.append(impl)
        self.nodes.append(
            Node(op, refs, attrs, [o.blob for o in out_impls], [o.meta for o in out_impls])
        )
        return out_impls

    def _draw(self, op, attrs, device):
        """Records random op ``op`` in its step form, reading the step's count (see the
        module doc); refused where there is no count."""
        if self._count is None:
            raise TraceError(
                f"{op.name}: a random op inside a traced function would run "
                f"once, while tracing, and repeat the same values for every "
                f"piece; af.trace and ActorGraph.op record no step count to draw "
                f"new values from (nn.Graph's build does): make the random "
                f"values outside and pass them in, or train in nn.Graph"
            )
        step = dict(attrs, key=(self.seed, self.draws))
        step.pop("seed", None)
        self.draws += 1
        return self.apply(_STEP_FORM[op.name], [self._count._impl], step, device)

    def counted(self):
        """The step's count plus one, recorded, when a random op read it (what the step
        writes back to it); None when none did."""
        if not self.draws:
            return None
        return add(self._count, 1)

    def _state_written(self, outs) -> bool:
        """Is this in-place write one of a whole given state (a module's buffer, as batch
        norm's running statistics; a parameter under no_grad)? Captured tensors are not."""
        t = outs[0]
        return len(outs) == 1 and t.base is None and t.blob in self.states

    def _renew_state(self, op, inputs, attrs, device, target):
        """Records an in-place write of a whole state out of place: the op's output (cast
        to the state's dtype as the write would) is the state's value from here on, for
        the ops recorded after it and as what the step writes back (its source), while
        the ops recorded before it read the value the piece started with."""
        m = target.meta
        new = self.apply(op, inputs, attrs, device or m.device)[0]
        if new.meta.shape != m.shape:
            raise TraceError(
                self.inplace_error(op, target) + f" (a whole state written in "
                f"place is recorded as its new value only when the op's result "
                f"has its shape {tuple(m.shape)}, not {tuple(new.meta.shape)})"
            )
        if new.meta.dtype is not m.dtype:
            new = self.apply(_CAST, [new], {"dtype": m.dtype})[0]
        self.where[target.blob] = self.source(new)
        return [target]

    def const_arrays(self) -> list:
        ordered = sorted(self.consts.values(), key=lambda e: e[0])
        return [wrap(impl).numpy() for _, impl in ordered]

    def describe(self, impl) -> str:
        """What the tensor ``impl`` is, in words, for an error message."""
        m = impl.meta
        what = f"a tensor of shape {tuple(m.shape)} and dtype {m.dtype.name}"
        if impl.base is not None:
            b = impl.base.meta
            what = (
                f"a view of shape {tuple(m.shape)} into a tensor of shape "
                f"{tuple(b.shape)} and dtype {b.dtype.name}"
            )
        blob = impl.blob
        if not blob.traced:
            if self.live and blob not in self.made:
                return (
                    f"{what} captured from outside the traced function (a global, a "
                    f"closure variable or an attribute that is not a parameter or "
                    f"buffer), which it reads but never writes"
                )
            return f"{what} made inside the traced function"
        src = self.where.get(blob, ("?",))
        if src[0] == "in":
            return f"{what}, an input of the traced function"
        if src[0] == "state":
            i = src[1]
            name = self.state_names[i] if i < len(self.state_names) else f"state {i}"
            return f"{what}, {name} (state the step reads and writes back itself)"
        if src[0] == "node":
            return f"{what} computed by op '{self.nodes[src[1]].op.name}'"
        return what

    def inplace_error(self, op, target) -> str:
        """Why an in-place op cannot be recorded, what it wrote into, and the way out."""
        return (
            f"in-place ops are refused in a traced function: op '{op.name}' "
            f"({_inplace_form(op.name)}) writes into {self.describe(target)}. A traced "
            f"function is recorded once, as out-of-place kernels that each write a new "
            f"output, so an in-place write cannot be recorded (later pieces would not "
            f"repeat it, and what was recorded before it reads the old value). Use the "
            f"out-of-place form and its result: y = x + 1 instead of x.add_(1) or "
            f"x += 1, af.where(mask, v, x) instead of x[mask] = v, af.zeros_like(x) "
            f"instead of x.zero_()"
        )


def more_input(spec: Spec) -> Tensor:
    """A further input of the recording in progress on this thread, made inside the call
    (its leaf index the next one): an input whose layout is known only from what the call
    computed first (a pipeline stage's output gradient, shaped as its output)."""
    tracer = _tracer("more_input()")
    specs = tracer.leaf_specs
    specs.append(spec)
    return tracer.placeholder(spec, len(specs) - 1)


def _tracer(what: str) -> Tracer:
    from ..eager.interpreter import STATE

    tracer = STATE.interpreter
    if not isinstance(tracer, Tracer):
        raise TraceError(f"{what}: no recording is in progress on this thread")
    return tracer


def mark() -> int:
    """How many op calls the recording in progress on this thread has recorded so far: a
    place to cut it at (``trace.split_programs``)."""
    return len(_tracer("mark()").nodes)


@contextlib.contextmanager
def standing_in(tensors: list, placeholders: list):
    """While tracing a step: each of ``tensors`` (a module's parameters and buffers, read
    by ``build`` through the modules that hold them) stands for its state placeholder, so
    what ``build`` computes from it is recorded as reading that state, and a gradient
    backward gives it lands on the placeholder's record, never on the tensor's own. A
    tensor that requires grad makes its placeholder a leaf that requires grad. Each
    tensor is itself again on leaving, whatever happened inside."""
    own = [t._impl for t in tensors]
    try:
        for t, ph in zip(tensors, placeholders, strict=True):
            if t.requires_grad:
                ph._impl.ag = Meta()
            t._impl = ph._impl
        yield
    finally:
        for t, impl in zip(tensors, own, strict=True):
            t._impl = impl


def _inplace_form(name: str) -> str:
    """How user code writes op ``name`` in place, for an error message."""
    if name == "full":
        return "as x.fill_(v), x.zero_() or x[i] = v do"
    if name == "copy":
        return "as x.copy_(y) or x[i] = y do"
    base = name[: -len("_scalar")] if name.endswith("_scalar") else name
    return f"as x.{base}_(...) or an in-place operator (x += y, x *= y...) does"


class Recording:
    """One call of ``fn`` recorded on placeholders of ``leaf_specs`` (placeholder j has leaf
    spec j; ``args_of(placeholders)`` arranges them into ``fn``'s arguments), and of
    ``state_specs`` when given (``fn(..., states=[placeholder per state])``).

    ``nodes``: the recorded op calls; ``outputs``: the tensors ``fn`` returned, flattened,
    with ``structure``. A *source* says what made a tensor: ``("in", j)``, ``("node", n,
    i)``, ``("state", i)`` or ``("const", c)``. With ``live`` (see the module doc),
    ``captured`` lists the tensors read live, in the order of their state indices after
    the given ones, and ``state_specs`` ends with their specs; ``state_names`` name the
    given states in error messages. ``count`` and ``seed``: as ``Tracer``'s (random ops
    read state ``count``); ``counted``: what the step writes back to it (None: keep it)."""

    def __init__(
        self,
        fn,
        leaf_specs,
        args_of,
        kwargs=None,
        state_specs=None,
        live=False,
        state_names=None,
        count=None,
        seed=None,
    ):
        self.leaf_specs = list(leaf_specs)
        self.state_specs = list(state_specs or ())
        self.tracer = rec = Tracer(live, len(self.state_specs), state_names, count, seed)
        rec.leaf_specs = self.leaf_specs  # (more_input adds to them)
        args = args_of([rec.placeholder(s, j) for j, s in enumerate(self.leaf_specs)])
        kwargs = dict(kwargs or {})
        if state_specs is not None:  # fn(*args, states=[placeholder per state], **kwargs)
            kwargs["states"] = [rec.state(s, i) for i, s in enumerate(self.state_specs)]
        try:
            with use_interpreter(rec):
                result = fn(*args, **kwargs)
                self.counted = rec.counted()
        finally:
            rec.restore_grads()
        self.captured = [wrap(impl) for impl in rec.captured]
        self.state_specs += [Spec(t.shape, t.dtype, t.device) for t in self.captured]
        leaves, self.structure = flatten(result)
        for x in leaves:
            if not isinstance(x, Tensor):
                raise TraceError(
                    f"a traced function must return tensors (or tuples/lists/"
                    f"dicts of them), got {type(x).__name__}"
                )
        self.outputs = leaves
        self.nodes = rec.nodes

    def source(self, impl):
        """What made the tensor ``impl`` (see the class doc)."""
        return self.tracer.source(impl)

    def const_arrays(self) -> list:
        """The values of the constants, by constant index."""
        return self.tracer.const_arrays()

    def meta_of(self, src):
        """The meta of the whole array a source names (None for a constant)."""
        if src[0] == "in":
            s = self.leaf_specs[src[1]]
            return contiguous_meta(s.shape, s.dtype, s.device)
        if src[0] == "node":
            return self.nodes[src[1]].metas[src[2]]
        if src[0] == "state":
            s = self.state_specs[src[1]]
            return contiguous_meta(s.shape, s.dtype, s.device)
        return None

    def ref(self, src, meta, port_of):
        """A Program ref ``(kind, i, j, view meta)`` for reading source ``src`` through
        ``meta``; ``port_of(src)`` maps a source to ``(kind, i, j)``. The view meta is None
        when the whole array is read as it is."""
        kind, i, j = port_of(src)
        if kind == "const" or (kind == "state" and src[1] >= self.tracer.first_live):
            return (kind, i, j, None)  # captured as the tensor reads it
        whole = self.meta_of(src)
        if (
            whole is not None
            and meta.shape == whole.shape
            and meta.offset == 0
            and is_contiguous(meta.shape, meta.strides)
        ):
            meta = None  # the whole array, as it is
        return (kind, i, j, meta)
