"""A pipeline stage's acts compiled in its worker: the stage's forward and backward traced
once per micro-batch layout into two Programs (``tracing.cut_programs``), as ``nn.Graph``
compiles a step, so an act runs numpy's kernels over planned buffers instead of eager ops
through autograd.

One call is recorded on placeholders: the stage's module on ``x``, then (where a gradient
flows) ``out.backward(g)``; the recording is cut where the backward begins. The forward
program gives ``out`` and what the backward reads of the forward's values (the *saved*
values: exactly what the stage holds for a micro-batch between its two acts, so the bytes
a stage holds are the plan's, counted from the programs rather than from an autograd
graph); the backward program gives the input's gradient and each parameter's. The last
stage of a pipeline whose loss its worker computes (``loss=``) records its module, the loss
and the backward of ``loss / M`` as one program (its one act). The parameters, buffers and
the tensors the module reads from outside are the programs' state, read from their own
storage every act (an optimizer's update here is seen); a buffer the forward writes (batch
norm's running statistics) is written back by it. A random op (dropout) draws as a
compiled step's does (``rand_step``: counter-based, keyed by the stage's seed), the count
being the micro-batch's place in the run (``count``), so the draws do not depend on which
worker ran what before.

The parameters' gradients are accumulated over a batch's micro-batches as eager backward
accumulates them (the first is ``.grad``, the later ones added into it in place): the same
additions in the same order. What cannot be traced (an op whose output shape depends on
values, an in-place write into a traced tensor) is the act's error, naming the op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import enable_grad
from ..creation import from_numpy, zeros_like
from ..dtype import int64
from ..runtime.plan.spec import Spec
from ..runtime_api import lend_arrays, written_outside
from ..tensor.tensor import Tensor
from ..tracing.recording import Recording, mark, standing_in
from ..tracing.trace import crossing, cut_programs


class StageProgram:
    """A stage's acts for one micro-batch layout: ``forward`` (None for a last stage with
    its loss) and ``backward`` (that last stage's one act), the saved values' places
    (``cut_programs``' ``saved``), the parameters with a gradient (indices into the stage's
    tensors), whether the input gets one, and the bytes a micro-batch holds for backward."""

    def __init__(self, forward, backward, saved, grads, input_grad, saved_bytes) -> None:
        self.forward, self.backward, self.saved = forward, backward, saved
        self.grads, self.input_grad, self.saved_bytes = grads, input_grad, saved_bytes


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
            loss is not None and scale,
            modes,
            tuple(p.requires_grad for p in self.params),
        )
        got = self.programs.get(key)
        if got is None:
            got = self.programs[key] = self._compile(x, rest, input_grad, loss, scale)
        return got

    def _record(self, specs: list, body: Any) -> Recording:
        tensors = self.tensors
        state = [Spec(t.shape, t.dtype, t.device) for t in tensors]
        state.append(Spec((), int64, "cpu"))

        def fn(*leaves, states):
            with standing_in(tensors, states[: len(tensors)]):
                out = body(*leaves)
                new = list(states[: len(tensors)]) + [None]  # (a buffer written: its value)
            return out, new

        new_states: list = []

        def traced(*leaves, states):
            out, new = fn(*leaves, states=states)
            new_states.extend(new)
            return out

        rec = Recording(
            traced,
            specs,
            lambda leaves: leaves,
            state_specs=state,
            live=True,
            count=len(tensors),
            seed=self.seed,
        )
        rec.new_states = new_states  # type: ignore[attr-defined]  # (read by _compile)
        return rec

    def _compile(self, x, rest, input_grad, loss, scale) -> StageProgram:
        module, label, params = self.module, self.label, self.params
        x_spec = Spec(x.shape, _dtype(x), "cpu")
        rows = x.shape[0]
        marks: list = []
        if loss is not None:  # (the last stage, its loss here: one act, one program)
            specs = [x_spec] + [Spec(r.shape, _dtype(r), "cpu") for r in rest]

            def last(x, *targets):
                with enable_grad():
                    if input_grad:
                        x.requires_grad_()
                    out = checked(label, module(x), rows, False)
                    marks.append(mark())
                    value = checked_loss(loss(out, *targets), label, "the loss given (loss=)")
                    marks.append(mark())
                    (value * scale).backward()
                return [value, *_grads(x, params, input_grad, grads)]

            grads: list = []
            rec = self._record(specs, last)
            nbytes = _bytes(rec, crossing(rec, marks[0], marks[1]))
            new = _kept_states(rec)
            from ..tracing.trace import _program

            program = _program(rec, [(0, j, s) for j, s in enumerate(specs)], new)
            program.captured = rec.captured
            return self._done(StageProgram(None, program, [], grads, input_grad, nbytes))
        out_spec = self._out_spec(x_spec, rows)
        g_spec = Spec(out_spec.shape, out_spec.dtype, "cpu")

        def stage(x, g):
            with enable_grad():
                if input_grad:
                    x.requires_grad_()
                out = checked(label, module(x), rows, True)
                marks.append(mark())
                if out.requires_grad:
                    out.backward(g)
            return [out, *_grads(x, params, input_grad, grads)]

        grads = []
        rec = self._record([x_spec, g_spec], stage)
        outs = rec.outputs
        new = _kept_states(rec)
        forward, backward, saved = cut_programs(
            rec,
            marks[0],
            ((0,), (1,)),
            (outs[:1], outs[1:]),
            (new, [None] * len(new)),
        )
        nbytes = sum(forward.out_spec.specs[j].nbytes for k, j in saved if k == "out")
        nbytes += sum(x_spec.nbytes for k, _ in saved if k == "in")
        for p in (forward, backward):
            p.captured = rec.captured
        return self._done(StageProgram(forward, backward, saved, grads, input_grad, nbytes))

    def _out_spec(self, x_spec: Spec, rows: int) -> Spec:
        """The layout of the stage's output for input ``x_spec``: its forward recorded
        alone (no kernel runs)."""

        def fwd(x):
            with enable_grad():
                return checked(self.label, self.module(x), rows, True)

        out = self._record([x_spec], fwd).outputs[0]
        return Spec(out.shape, out.dtype, "cpu")

    def _done(self, sp: StageProgram) -> StageProgram:
        for p in (sp.forward, sp.backward):
            if p is not None:
                p.compile()
                p.tmp = [np.empty(s.shape, s.dtype.np) for s in p.tmp_specs]
                p.bound = True
        return sp

    # -- running --------------------------------------------------------------------------
    def _state(self, program: Any) -> None:
        program.state_arrays = (
            lend_arrays(self.tensors)
            + [self.count]
            + [np.asarray(t._impl.array()) for t in program.captured]
        )

    def forward(self, sp: StageProgram, x: np.ndarray, count: int) -> tuple:
        """The forward act: ``(out, saved)`` (what the backward act is handed back)."""
        p = sp.forward
        self.count[()] = count
        self._state(p)
        outs = p.run_new([[x]])
        written_outside(self.tensors[len(self.params) :])  # (a buffer it wrote)
        saved = [x if k == "in" else outs[j] for k, j in sp.saved]
        return outs[0], saved

    def backward(self, sp: StageProgram, g: np.ndarray, saved: list) -> np.ndarray | None:
        """The backward act: the parameters' gradients accumulated; the input's returned
        (None where it gets none)."""
        p = sp.backward
        self._state(p)
        outs = p.run_new([[g, *saved]])
        return self._accumulate(sp, outs)

    def last(self, sp: StageProgram, x: np.ndarray, rest: list, count: int) -> tuple:
        """The last stage's one act: ``(loss, the input's gradient or None)``."""
        p = sp.backward
        self.count[()] = count
        self._state(p)
        outs = p.run_new([[x, *rest]])
        written_outside(self.tensors[len(self.params) :])
        return float(outs[0].reshape(-1)[0]), self._accumulate(sp, outs[1:])

    def _accumulate(self, sp: StageProgram, outs: list) -> np.ndarray | None:
        at = 1 if sp.input_grad else 0
        for i, g in zip(sp.grads, outs[at:], strict=True):
            acc = self.grads[i]
            if acc is None:
                self.grads[i] = g
            else:
                np.add(acc, g, out=acc)
        return outs[0] if sp.input_grad else None

    def take_grads(self) -> None:
        """The batch's gradients become the parameters' ``.grad`` (as eager backward
        leaves them), and are let go here."""
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = None if g is None else from_numpy(g)
        self.grads = [None] * len(self.params)

    def clear(self) -> None:
        self.grads = [None] * len(self.params)


def _dtype(a: np.ndarray):
    from ..dtype import from_numpy_dtype

    return from_numpy_dtype(a.dtype)


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


def _kept_states(rec: Recording) -> list:
    return rec.new_states  # type: ignore[attr-defined]


def _bytes(rec: Recording, sources: list) -> int:
    """The bytes of the recorded values ``sources`` (an input: its leaf; a node: its
    output), the stage's input only among the inputs."""
    total = 0
    for src in sources:
        if src[0] == "in" and src[1] != 0:
            continue
        m = rec.meta_of(src)
        n = m.dtype.itemsize
        for s in m.shape:
            n *= s
        total += n
    return total


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
