"""A pipeline stage's acts compiled in its worker: the stage's forward and backward traced
per micro-batch layout into Programs run in turn (``tracing.split_programs``), as
``nn.Graph`` compiles a step, so an act runs numpy's kernels over planned buffers instead
of eager ops through autograd.

A call is recorded on placeholders: the stage's module on ``x``, then (where a gradient
flows) ``out.backward(g)``; the recording is split where the backward begins, and the
backward again, where the input gets a gradient, into the nodes that gradient needs and the
rest (the parameters' gradients): a backward act computes the input's gradient, hands it to
the stage before (``send``), and leaves the weights' part to its caller, which runs it at
once or after later acts (``weights``; zero-bubble pipelines' B/W split: the stage before
waits for the input's gradient alone, and the weights' part can fill a wait). What a
weights' part holds meanwhile is what it reads of its act (``weights_bytes``, the plan's);
what it reads of the stage's state is the parameters (not written during a batch), since
autograd refuses a saved tensor a later in-place write changed (its version check), so a
later act's buffer write cannot reach it. The forward part gives ``out`` and what the
backward parts read of the forward's values and of its input (``kept``: exactly what the
stage holds for a micro-batch between its two acts, so the bytes a stage holds are the
plan's, counted from the programs rather than from an autograd graph). The last stage of a
pipeline whose loss its worker computes (``loss=``) records its module, the loss and the
backward of ``loss / M``: its forward, the loss and the input's gradient are one part, the
weights' gradients the next (left as a backward act leaves it). The parameters, buffers and
the tensors the module reads from outside are the programs' state, read from their own
storage every act (an optimizer's update here is seen); a buffer the forward writes (batch
norm's running statistics) is written back by it. A random op (dropout) draws as a compiled
step's does (``rand_step``: counter-based, keyed by the stage's index), at the count the
caller gives per micro-batch (the batch's seed and the micro-batch's place:
``pipeline_ranks``), so the draws do not depend on which worker ran what before.

The parameters' gradients are accumulated over a batch's micro-batches as eager backward
accumulates them: each layout is recorded in two forms (``StageActs``), the batch's first
micro-batch's (its gradients are the first) and the later ones', whose backward is given
the gradients so far as inputs (each parameter's ``.grad`` set to one while recorded) and
adds each use of a parameter into them in turn, so a parameter used twice gets eager's
((a0 + b0) + a1) + b1, not acc + (a1 + b1): the same additions in the same order, and the
training is eager autograd's bit for bit (bfloat16 parameters' too: their gradients are
added by the programs' bfloat16 kernels and handed over as bfloat16). The later form
writes each gradient over the array of the one so far that it adds into (where every
kernel reading that array runs before, or is, the one writing it:
``Program.may_write_over``), so a batch makes one gradient array per parameter, at its
first micro-batch: an array as large as a 1024x1024 weight made anew per act cost 0.3-1
ms of page faults an act here, with the same bits. A later micro-batch
of another layout runs the later form as soon as an earlier micro-batch's act gave any of
its parameters a gradient this batch (its weights part run or waiting: ``issued``), those
without one given -0.0 as the part runs (the exact identity of addition: a parameter the
stage uses only at some shapes). A stage none of whose parameters gets a gradient is
recorded once, its one form. What cannot be traced (an op whose output shape depends on
values, an in-place write into a traced tensor) is the act's error, naming the op; so is
a bfloat16 input, or a bfloat16 output of a stage that passes it on (a stage's edges are
numpy arrays: numpy has no bfloat16; a last stage's bfloat16 output feeding its loss
stays inside).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import enable_grad
from ..creation import zeros_like
from ..dtype import bfloat16, bfloat16_values, int64
from ..errors import DTypeError, TraceError
from ..parallel.workers import adopt
from ..runtime.plan.spec import Spec
from ..runtime_api import lend_arrays, written_outside
from ..tensor.tensor import Tensor, wrap
from ..tracing.recording import Recording, mark, more_input, standing_in
from ..tracing.trace import crossing, split_programs


class StageProgram:
    """A stage's acts for one micro-batch layout: ``parts``, Programs run in turn
    (``tracing.split_programs``): for a stage that passes its output on, its forward, then
    its backward (with an input gradient: first what that gradient needs, then the
    parameters' gradients, so the gradient goes back to the stage before while they are
    computed); for a last stage with its loss, its forward, the loss and what the input's
    gradient needs as one part, then the parameters' gradients. ``given[k]``: the recorded
    inputs part k is given (0: the input rows, then the targets; 1: the output's gradient),
    ``reads``/``made``: ``split_programs``'; ``kept``: what the forward act keeps for the
    backward act (the input, values it made), its bytes ``saved_bytes``; ``grads``: the
    parameters with a gradient (indices into the stage's parameters), made by the last
    part; ``input_grad``: whether the input gets one (the first output of the part after
    the forward, or of the last stage's first part after the loss)."""

    def __init__(self, parts, given, reads, made, kept, grads, input_grad, saved_bytes):
        self.parts, self.given, self.reads, self.made = parts, given, reads, made
        self.kept, self.grads = kept, grads
        self.input_grad, self.saved_bytes = input_grad, saved_bytes
        self.accs: list = []  # (parameter index, the input its gradient so far is given as)
        self.into: dict = {}  # part -> {output: input}: a gradient added into its input
        self.weights_bytes = 0  # (what its weights part holds while it waits: the plan's)


class StageActs:
    """A stage's compiled acts for one micro-batch layout, in two forms: ``first``, the
    batch's first micro-batch's (its gradients are the parameters' first), and ``later``
    (None where no parameter gets one), whose backward is given the gradients so far and
    adds each use of a parameter into them in turn, as eager backward adds into ``.grad``
    (a parameter used twice: its two gradients added one after the other, not summed
    first). The forward is the same part in both, and so is what their backwards read of
    it (``kept``, its bytes ``saved_bytes``: the first's, checked when made)."""

    def __init__(self, first: StageProgram, later: StageProgram | None) -> None:
        self.first, self.later = first, later
        self.kept = first.kept
        self.saved_bytes = first.saved_bytes
        self.input_grad = first.input_grad


class StagePrograms:
    """What a worker keeps of a stage's compiled acts: its tensors (parameters, buffers),
    the step count its random ops read, the programs per micro-batch layout, and the
    gradients accumulated over the batch."""

    def __init__(self, module: Any, label: str, index: int) -> None:
        self.module, self.label, self.seed = module, label, index  # (the draws' key)
        self.params = list(module.parameters())
        self.tensors = self.params + [b for b in module.buffers()]
        self.count = np.zeros((), np.int64)  # (a program's state: its random ops' count)
        self.programs: dict = {}
        self.grads: list = [None] * len(self.params)  # (this batch's, accumulated)
        self.steps: dict = {}  # the optimizers' steps compiled (StageStep), by their key
        self.rates: dict = {}  # (optimizer, group, option) -> its value, None once changed
        self.before: dict = {}  # buffer (index in tensors) -> its values before the batch
        self.issued: set = set()  # the parameters this batch's acts give a gradient so far

    # -- compiling ----------------------------------------------------------------------
    def of(self, x: np.ndarray, rest: list, input_grad: bool, loss: Any, scale: float):
        """The programs for input rows ``x`` (and, for a last stage with its ``loss``, the
        targets ``rest`` and the loss's ``scale``, 1/M), compiled on first use."""
        modes = tuple(m.training for m in self.module.modules())
        key = (
            x.shape,
            x.dtype.str,
            tuple((r.shape, r.dtype.str) for r in rest),
            input_grad,
            loss is not None and (scale, getattr(loss, "structure", None)),
            modes,
            tuple(p.requires_grad for p in self.params),
        )
        got = self.programs.get(key)
        if got is None:
            try:
                got = self._compile(x, rest, input_grad, loss, scale)
            except TraceError as e:
                raise TraceError(
                    f"{self.label}: a stage computing in a worker runs its acts compiled "
                    f"(its forward and backward traced per micro-batch layout, as "
                    f"nn.Graph's build is), and this one cannot be: {e}. Keep the stage "
                    f"local (no stage_ranks) to run it eagerly, or change what it does"
                ) from e
            self.programs[key] = got
        return got

    def _record(self, specs: list, body: Any) -> tuple:
        """``body`` recorded on placeholders of ``specs`` with the stage's tensors standing
        for their states (and the draw count after them): the Recording and each state's
        new value (a buffer written in place: its last one; the count: None)."""
        tensors = self.tensors
        state = [Spec(t.shape, t.dtype, t.device) for t in tensors]
        state.append(Spec((), int64, "cpu"))
        new_states: list = []

        def traced(*leaves, states):
            with standing_in(tensors, states[: len(tensors)]):
                out = body(*leaves)
            new_states.extend([*states[: len(tensors)], None])
            return out

        held = [
            (mod, kind, name, t)
            for mod in self.module.modules()
            for kind in ("_parameters", "_buffers")
            for name, t in getattr(mod, kind).items()
        ]
        try:
            rec = Recording(
                traced,
                specs,
                lambda leaves: leaves,
                state_specs=state,
                live=True,
                count=len(tensors),
                seed=self.seed,
            )
        finally:  # (a tensor the forward replaced: its own again, and refused below)
            replaced = [(mod, n, t) for mod, k, n, t in held if getattr(mod, k).get(n) is not t]
            for mod, name, t in replaced:
                setattr(mod, name, t)
        if replaced:
            raise TraceError(
                f"{self.label}'s forward replaces its tensor {replaced[0][1]!r} with a new "
                f"one ({type(replaced[0][0]).__name__}.{replaced[0][1]} = ...): a compiled "
                f"act writes a buffer in place (self.{replaced[0][1]}.mul_(0.9).add_(...), "
                f"or .copy_(...)), as nn.Graph's build does"
            )
        return rec, new_states

    def _compile(self, x, rest, input_grad, loss, scale) -> StageActs:
        first = self._variant(x, rest, input_grad, loss, scale, [])
        later = None
        if first.grads:
            later = self._variant(x, rest, input_grad, loss, scale, first.grads)
        if later is not None and loss is None:
            if not set(later.kept) <= set(first.kept):  # (the same forward in both forms)
                raise RuntimeError(f"{self.label}: its two forms read different forwards")
            later.parts[0] = None  # (the forward act runs first's: no workspace for it)
        for sp in (first, later):
            if sp is not None:
                self._done(sp)
        return StageActs(first, later)

    def _variant(self, x, rest, input_grad, loss, scale, accs: list) -> StageProgram:
        """The acts recorded with the gradients so far of the parameters ``accs`` (indices)
        given as inputs the backward adds into (none: a batch's first micro-batch)."""
        module, label, params = self.module, self.label, self.params
        x_spec = Spec(x.shape, _dtype(x, label), "cpu")
        rows = x.shape[0]
        marks: list = []
        grads: list = []
        # the gradients accumulated so far (a later micro-batch's): inputs the backward adds
        # into as eager backward adds into .grad, each use of a parameter in turn
        acc_specs = [Spec(params[i].shape, params[i].dtype, "cpu") for i in accs]

        def preset(leaves):
            for i, t in zip(accs, leaves, strict=True):
                params[i].grad = t

        if loss is not None:  # (the last stage, its loss here: one act)
            specs = [x_spec] + [Spec(r.shape, _dtype(r, label), "cpu") for r in rest]
            own = len(specs)

            def last(x, *leaves):
                targets, held = leaves[: own - 1], leaves[own - 1 :]
                with enable_grad():
                    if input_grad:
                        x.requires_grad_()
                    out = checked(label, module(x), rows, False)
                    marks.append(mark())
                    value = checked_loss(loss(out, *targets), label, "the loss given (loss=)")
                    marks.append(mark())
                    preset(held)
                    (value * scale).backward()
                return [value, *_grads(x, params, input_grad, grads)]

            rec, new = self._record(specs + acc_specs, last)
            given = [tuple(range(own)), ()]
            nbytes = _bytes(rec, crossing(rec, marks[0], marks[1]))
            first = marks[1]  # (the backward's first node)
        else:

            def stage(x, *held):
                with enable_grad():
                    if input_grad:
                        x.requires_grad_()
                    out = checked(label, module(x), rows, True)
                    if out.dtype is bfloat16:
                        raise DTypeError(_EDGE.format(label=label, what="returns"))
                    marks.append(mark())
                    g = more_input(Spec(out.shape, out.dtype, "cpu"))  # (leaf 1 + len(held))
                    if out.requires_grad:
                        preset(held)
                        out.backward(g)
                return [out, *_grads(x, params, input_grad, grads)]

            rec, new = self._record([x_spec] + acc_specs, stage)
            given = [(0,), (1 + len(accs),), ()]  # (the output's gradient: the last leaf)
            first = marks[0]
        # outs: the output (or the loss), the input's gradient where it gets one, then the
        # parameters'; the backward's nodes: what the input's gradient needs, then the rest
        outs, n = rec.outputs, len(rec.nodes)
        if input_grad:
            need = _needed(rec, [outs[1]], first)
            back = [[i for i in range(first, n) if i in need]]
            back.append([i for i in range(first, n) if i not in need])
            results = [outs[:1], outs[1:2], outs[2:]]
        else:
            back, results = [list(range(first, n))], [outs[:1], outs[1:]]
        parts = [list(range(first))] + back
        if loss is not None:  # (its forward, the loss and the first of the backward: one)
            parts = [parts[0] + parts[1]] + parts[2:]
            results = [results[0] + results[1]] + results[2:]
        states = [new] + [[None] * len(new)] * (len(parts) - 1)
        given = given[: len(parts)]
        programs, reads, made = split_programs(rec, parts, given, results, states)
        kept: list = []
        if loss is None:  # (what the forward act keeps: read later, its own or its input)
            mine = set(made[0]) | {("in", 0)}
            kept = list(dict.fromkeys(s for r in reads[1:] for s in r if s in mine))
            nbytes = _bytes(rec, kept)
        for p in programs:
            p.captured = rec.captured
        sp = StageProgram(programs, given, reads, made, kept, grads, input_grad, nbytes)
        sp.accs = [(i, ("in", 1 + len(rest) * (loss is not None) + a)) for a, i in enumerate(accs)]
        if input_grad:  # (what its weights part holds while it waits: its reads but the
            sums = {src for _, src in sp.accs}  # gradients so far, given as it runs)
            sp.weights_bytes = sum(_nbytes(rec, s) for s in reads[-1] if s not in sums)
        return sp

    def _done(self, sp: StageProgram) -> StageProgram:
        for p in sp.parts:
            if p is None:
                continue
            p.compile()
            p.tmp = [np.empty(s.shape, s.dtype.np) for s in p.tmp_specs]
            p.bound = True
        # a later micro-batch's gradients are written over the gradients so far they add
        # into (an array as large as the parameter, made anew per act, costs its page
        # faults each time: 0.3-1 ms an act for a 1024x1024 weight, measured)
        k = len(sp.parts) - 1
        n = len(sp.parts[k].out_spec.specs)
        given = [("in", j) for j in sp.given[k]] + list(sp.reads[k])  # (as _run gives them)
        into = {}
        for i, src in sp.accs:
            if i in sp.grads and src in given:
                out, pos = n - len(sp.grads) + sp.grads.index(i), given.index(src)
                if sp.parts[k].may_write_over(out, pos):
                    into[out] = pos
        if into:
            sp.into[k] = into
        return sp

    # -- running --------------------------------------------------------------------------
    def _run(self, sp: StageProgram, k: int, values: dict) -> list:
        """Part ``k`` on ``values`` (source -> array: what it is given and reads), its
        outputs added to them; returns its outputs."""
        p = sp.parts[k]
        p.state_arrays = (
            lend_arrays(self.tensors)
            + [self.count]
            + [np.asarray(t._impl.array()) for t in p.captured]
        )
        for i, _ in p.assigns:  # (a buffer this batch writes first: its values before it)
            if len(self.params) <= i < len(self.tensors) and i not in self.before:
                self.before[i] = p.state_arrays[i].copy()
        ins = [values[("in", j)] for j in sp.given[k]] + [values[s] for s in sp.reads[k]]
        into = sp.into.get(k)
        if into is None:
            outs = p.run_new([ins])
        else:  # (a gradient written over the one so far, given as an input)
            outs = [
                ins[into[o]] if o in into else np.empty(s.shape, s.dtype.np)
                for o, s in enumerate(p.out_spec.specs)
            ]
            try:
                p.run(outs, [ins])
            except BaseException:  # (partly written, and again by the op-by-op run that
                self.clear()  # names the error: the batch's gradients are no more)
                raise
        if p.assigns:
            written_outside(self.tensors[len(self.params) :])  # (a buffer it wrote)
        values.update(zip(sp.made[k], outs, strict=True))
        return outs

    def _form(self, acts: StageActs) -> StageProgram:
        """The form of the acts this micro-batch runs: ``later`` once an earlier
        micro-batch of the batch gives any of the parameters it gives a gradient
        (micro-batches of other layouts may give some and not others: a parameter a stage
        uses only at some shapes), whether that micro-batch's weights part ran yet or
        waits (``weights`` runs them in piece order, so this one's adds into theirs)."""
        later = acts.later
        sp = acts.first
        if later is not None and not self.issued.isdisjoint(acts.first.grads):
            sp = later
        self.issued.update(sp.grads)
        return sp

    def forward(self, acts: StageActs, x: np.ndarray, count: int) -> tuple:
        """The forward act: ``(out, kept)`` (what the backward act is handed back)."""
        self.count[()] = count
        values = {("in", 0): x}
        out = self._run(acts.first, 0, values)[0]
        return out, {s: values[s] for s in acts.kept}

    def backward(self, acts: StageActs, g: np.ndarray, kept: dict, send: Any = None):
        """The backward act on what the forward act kept: the input's gradient (None
        where it gets none) computed and given to ``send``; returns ``(that gradient, the
        part left)``: the part computing the parameters' gradients (``weights`` runs it,
        at once or after later acts: zero-bubble pipelines' B/W split, the stage before
        waiting for the input's gradient alone), None where the act ran it (a stage whose
        input gets no gradient: its backward is that part)."""
        values = dict(kept)
        sp = self._form(acts)
        values[("in", sp.given[1][0])] = g
        if not sp.input_grad:
            self.weights((sp, values))
            return None, None
        gx = self._run(sp, 1, values)[0]
        if send is not None:
            send(gx)
        return gx, self._left(sp, values)

    def last(self, acts: StageActs, x: np.ndarray, rest: list, count: int, send=None):
        """The last stage's one act: its forward, the loss and the input's gradient
        (given to ``send``); returns ``(loss, that gradient or None, the part left)``, as
        ``backward`` does."""
        values = {("in", j): a for j, a in enumerate([x, *rest])}
        sp = self._form(acts)
        if not sp.input_grad:  # (one part: the parameters' gradients too)
            self._sums(sp, values)
        self.count[()] = count
        outs = self._run(sp, 0, values)
        loss = outs[0].reshape(-1)[:1]
        if sp.parts[0].out_spec.specs[0].dtype is bfloat16:  # (stored as its bits)
            loss = bfloat16_values(loss)
        loss = float(loss[0])
        if not sp.input_grad:
            self._accumulate(sp, outs[1:])
            return loss, None, None
        if send is not None:
            send(outs[1])
        return loss, outs[1], self._left(sp, values)

    def _left(self, sp: StageProgram, values: dict) -> tuple | None:
        """The weights part of ``sp`` with what it reads of ``values`` (the gradients so
        far are given when it runs); None where it gives no parameter a gradient (a
        frozen stage: nothing to run)."""
        if not sp.grads:
            return None
        return sp, {s: values[s] for s in sp.reads[-1] if s in values}

    def weights(self, left: tuple) -> None:
        """Runs a weights part ``backward`` or ``last`` left, its gradients accumulated:
        each batch's in piece order (a later micro-batch's adds into the gradients so far,
        so they must be there). A parameter the earlier micro-batches gave no gradient
        is given -0.0, the exact identity of addition (-0.0 + a is a, bit for bit, a
        zero's sign included)."""
        sp, values = left
        self._sums(sp, values)
        self._accumulate(sp, self._run(sp, len(sp.parts) - 1, values))
        values.clear()  # (what it held let go, whoever still holds the part)

    def _sums(self, sp: StageProgram, values: dict) -> None:
        """The gradients so far that ``sp``'s last part adds into, given in ``values``."""
        for i, src in sp.accs:
            g = self.grads[i]
            values[src] = g if g is not None else _negative_zeros(self.params[i])

    def _accumulate(self, sp: StageProgram, outs: list) -> None:
        """The parameters' gradients so far (the first of ``outs``, in ``sp.grads``'
        order): a later micro-batch's program added its own into what it was given."""
        for i, g in zip(sp.grads, outs, strict=False):
            self.grads[i] = g

    def restore(self) -> None:
        """After a failed batch: the buffers it wrote set back to their values before it
        (copied as each was first written: batch norm's running statistics)."""
        for i, a in self.before.items():
            np.copyto(lend_arrays([self.tensors[i]])[0], a)
            written_outside([self.tensors[i]])
        self.before = {}

    def take_grads(self) -> None:
        """At the end of a batch that succeeded: its gradients become the parameters'
        ``.grad`` (as eager backward leaves them), and are let go here, as are the copies
        of the buffers it wrote."""
        self.before = {}
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = None if g is None else wrap(adopt(g, p.dtype))  # (g: its storage)
        self.clear()

    def clear(self) -> None:
        self.grads = [None] * len(self.params)
        self.issued = set()


def _negative_zeros(p: Tensor) -> np.ndarray:
    """-0.0 in ``p``'s shape and storage dtype (bfloat16: its bits, 0x8000)."""
    if p.dtype is bfloat16:
        return np.full(tuple(p.shape), 0x8000, np.uint16)
    return np.full(tuple(p.shape), -0.0, p.dtype.np)


def _dtype(a: np.ndarray, label: str = "a stage"):
    """The dtype of an array a stage is given (its input rows, the targets, the output's
    gradient); bfloat16 (stored as uint16, which numpy has no float type for) is refused:
    a stage's edges are numpy arrays in its worker."""
    from ..dtype import from_numpy_dtype

    if a.dtype == np.uint16:
        raise DTypeError(_EDGE.format(label=label, what="is given"))
    return from_numpy_dtype(a.dtype)


_EDGE = (
    "{label} {what} a bfloat16 tensor at its edge; a stage computing in a worker passes its "
    "input, output and their gradients on as numpy arrays, and numpy has no bfloat16: cast "
    "at the stage's edges (x.bfloat16() inside, .float() on what it returns); bfloat16 "
    "parameters and values inside the stage are fine"
)


def _grads(x: Tensor, params: list, input_grad: bool, which: list) -> list:
    """What a stage's backward gives: the input's gradient (where asked; zeros where the
    output does not depend on the input), then each parameter's that got one (their
    indices appended to ``which``)."""
    out = []
    if input_grad:
        out.append(x.grad if x.grad is not None else zeros_like(x.detach()))
    for i, p in enumerate(params):
        if p.grad is not None:
            which.append(i)
            out.append(p.grad)
    return out


def _needed(rec: Recording, wanted: list, first: int) -> set:
    """The nodes from ``first`` on that the tensors ``wanted`` (of the call) are made from."""
    need: set = set()
    stack = [rec.source(t._impl) for t in wanted]
    while stack:
        src = stack.pop()
        if src[0] != "node" or src[1] < first or src[1] in need:
            continue
        need.add(src[1])
        stack.extend(s for s, _ in rec.nodes[src[1]].refs)
    return need


def _bytes(rec: Recording, sources: list) -> int:
    """The bytes of the recorded values ``sources`` (an input: its leaf; a node: its
    output), the stage's input only among the inputs."""
    return sum(_nbytes(rec, s) for s in sources if s[0] != "in" or s[1] == 0)


def _nbytes(rec: Recording, src: tuple) -> int:
    """The bytes of the recorded value ``src``."""
    m = rec.meta_of(src)
    return m.numel * m.dtype.itemsize


# -- what a stage gives back, checked (every kind of stage: here, in a worker, compiled) --


def checked(label: str, out: Any, rows: int, passes_on: bool) -> Tensor:
    """``out``, what a stage returned for a micro-batch of ``rows`` rows, if it is one
    tensor (with those rows along dim 0 where it ``passes_on`` to the next stage)."""
    if not isinstance(out, Tensor) or (passes_on and (out.ndim == 0 or out.shape[0] != rows)):
        raise _wrong_output(label, out, rows, passes_on)
    return out


def _wrong_output(label: str, out: Any, rows: int, passes_on: bool) -> TypeError:
    """The error of a stage that returned ``out`` for a micro-batch of ``rows`` rows."""
    if not passes_on:
        return TypeError(
            f"{label} returned {described(out)}; the last stage of a pipeline computing in a "
            f"worker returns one tensor (the loss's input: build's, read back into this "
            f"process, or loss='s, in the worker)"
        )
    return TypeError(
        f"{label} returned {described(out)} for a micro-batch of {rows} "
        f"{'row' if rows == 1 else 'rows'}; a stage that is "
        f"not the last returns one tensor with the micro-batch's rows along dim 0 (the "
        f"next stage's input)"
    )


def checked_loss(loss: Any, who: str, what: str) -> Tensor:
    """``loss`` (what ``who``'s ``what``, ``build`` or ``loss=``, returned for a micro-batch)
    if it is one tensor of one element."""
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise TypeError(
            f"{who}: {what} returned {described(loss)} for (out, *rest); a pipeline's "
            f"{what} returns the micro-batch's loss, a one-element tensor computed from out "
            f"(it does not call backward: the graph does)"
        )
    return loss


def described(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


class StageStep:
    """The optimizers' step of a stage's parameters in its worker, compiled: each
    optimizer's formula (``Optimizer.update``, traced ``OUT_OF_PLACE`` as ``nn.Graph``
    traces it) over the parameters with a gradient, one stateful Program
    (``tracing.stateful_program``, no input) whose state is those parameters, their
    optimizer state (tensors over their parts; each count a float64 scalar), each group's
    scheduled options that are not ``fixed`` (float64 scalars, filled before each run) and
    the batch's gradients (never written: a ``where`` on a scheduled option may then pick a
    gradient's array, as it picks a state's; an input is never picked). So a step runs
    numpy's kernels over planned buffers, its elementwise chains fused and the new values
    written into the state itself (``tracing.compile``: the same bits as the eager
    ``step()`` this process would run on the parts, which an eager step over 1.5M
    parameters here took 1.1-1.25 ms of against about 0.8), and a kernel that raises leaves
    every parameter and state as it was. Compiled once per key: the optimizers, their
    options that decide the ops (``graph_key``), the parameters with a gradient and their
    state's names, and the scheduled options that are ``fixed`` ({(row, name): value}:
    read as numbers, as the eager step reads them, while they have not changed: SGD's
    momentum then decides its ops once, rather than a ``where`` per value picking them
    each step and a copy of the buffer it picked, ~0.3 ms of the 1.5M parameters' step here)."""

    def __init__(self, rows: list, grads: list, view: Any, fixed: dict) -> None:
        from ..autograd import no_grad
        from ..tracing import stateful_program

        params = [p for _, _, mine in rows for p, _ in mine]
        specs = [_spec_of(p) for p in params]  # (the state's, in order)
        self.slots: list = []  # per state after the parameters: ("part" | "value", (row,
        #                        param, name)): a state tensor's part, a count; or ("rate",
        #                        (row, name))
        layout = []  # per row: (rate names and their state index, per parameter its own)
        at = 0
        for r, (shell, group, mine) in enumerate(rows):
            names = []
            for k, (_, entries) in enumerate(mine):
                own = {}
                for name, (kind, v) in entries.items():
                    own[name] = len(specs)
                    t = view(v) if kind == "part" else None  # (its layout: not kept)
                    specs.append(Spec((), "float64", "cpu") if t is None else _spec_of(t))
                    self.slots.append((kind, (r, k, name)))
                names.append((at + k, own))
            rates: dict = {}
            for name, _ in shell.flat_rates(group):
                if (r, name) in fixed:
                    rates[name] = ("value", fixed[r, name])
                    continue
                rates[name] = ("state", len(specs))
                specs.append(Spec((), "float64", "cpu"))
                self.slots.append(("rate", (r, name)))
            layout.append((rates, names))
            at += len(mine)
        at_grads = len(specs)  # (the gradients: state, after the rest)
        specs += [_spec_of(p) for p in params]

        def fn(states):
            new = [None] * len(states)
            piece = states[at_grads:]
            with no_grad():
                for (shell, group, _), (rates, names) in zip(rows, layout, strict=True):
                    given = {n: states[v] if k == "state" else v for n, (k, v) in rates.items()}
                    for j, own in names:
                        st = {name: states[i] for name, i in own.items()}
                        p, g = states[j], piece[j]
                        new_p, new_st = shell.update(p, g, group, st, rates=given)  # (out of
                        #                                                   place: traced)
                        new[j] = new_p
                        for name, i in own.items():
                            new[i] = new_st.get(name)
            return [], new

        self.program = stateful_program(fn, [], specs)
        p = self.program
        p.tmp = [np.empty(s.shape, s.dtype.np) for s in p.tmp_specs]
        p.bound = True
        self.params = params

    def run(self, rows: list, grads: list, view: Any) -> list:
        """One step with ``grads`` (per parameter with one, in ``rows``' order): the
        state's arrays taken anew (the parts ``rows`` names now, as a loaded state's are
        new ones; its counts and options); returns the counts after it, in ``rows``'
        order."""
        arrays = lend_arrays(self.params)
        counts = []
        views = []
        options = [dict(shell.flat_rates(group)) for shell, group, _ in rows]
        for kind, what in self.slots:
            if kind == "rate":
                r, name = what
                arrays.append(np.array(float(options[r][name]), np.float64))
                continue
            r, k, name = what
            v = rows[r][2][k][1][name][1]  # (its part's id now, or the count)
            if kind == "part":
                views.append(view(v))
                arrays.append(lend_arrays(views[-1:])[0])
            else:
                counts.append(np.array(float(v), np.float64))
                arrays.append(counts[-1])
        p = self.program
        p.state_arrays = arrays + list(grads) + [np.asarray(t._impl.array()) for t in p.captured]
        p.run([], [])
        written_outside(self.params + views)
        return [int(a) for a in counts]


def _spec_of(t: Tensor) -> Spec:
    return Spec(t.shape, t.dtype, "cpu")
