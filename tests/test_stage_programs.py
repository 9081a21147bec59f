"""A pipeline stage's acts compiled (nn/stage_programs.py, tracing.split_programs): a
recorded call split into programs run in turn computes what the whole call does, each part
reading only what earlier parts pass on; a stage's compiled forward and backward equal
eager autograd bit for bit (outputs, the input's gradient, the parameters' gradients
accumulated over micro-batches, batch norm's running statistics), hold exactly what the
backward reads, and hand the input's gradient on before computing the weights'."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn
from actorflow.autograd import enable_grad
from actorflow.errors import TraceError
from actorflow.nn.stage_programs import StagePrograms
from actorflow.runtime.plan.spec import Spec
from actorflow.tracing.recording import Recording, mark
from actorflow.tracing.trace import _program, split_programs


def _record(fn, specs):
    marks = []

    def body(*xs):
        return fn(marks, *xs)

    return Recording(body, specs, lambda leaves: leaves), marks


def test_a_call_split_in_parts_computes_the_whole_and_passes_on_what_later_parts_read():
    def fn(marks, x, g):
        a = af.exp(x)
        b = a * 2.0  # (read by both later parts)
        c = a + 1.0  # (read by no later part: not passed on)
        marks.append(mark())
        d = b * g  # (part 1)
        e = d + x  # (part 1: x, the first part's input)
        f = b - d  # (part 2: reads part 0's b and part 1's d)
        return [c, e, f]

    specs = [Spec((3, 4), af.float32, "cpu"), Spec((3, 4), af.float32, "cpu")]
    rec, marks = _record(fn, specs)
    c, e, f = rec.outputs
    cut, n = marks[0], len(rec.nodes)
    programs, reads, made = split_programs(
        rec,
        [list(range(cut)), [cut, cut + 1], [cut + 2]],
        [(0,), (1,), ()],
        [[c], [e], [f]],
        [[], [], []],
    )
    assert n == cut + 3
    rng = np.random.default_rng(0)
    x, g = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    want = _program(rec, [(0, 0, specs[0]), (0, 1, specs[1])]).run_new([[x, g]])
    values = {("in", 0): x, ("in", 1): g}
    got = []
    for k, p in enumerate(programs):
        ins = [values[("in", j)] for j in [(0,), (1,), ()][k]] + [values[s] for s in reads[k]]
        outs = p.run_new([ins])
        values.update(zip(made[k], outs, strict=True))
        got.append(outs[0])
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    b_src = ("node", 1, 0)  # (exp, then b: what later parts read of part 0)
    assert reads == [[], [b_src, ("in", 0)], [b_src, ("node", cut, 0)]]
    assert len(made[0]) == 2 and made[0][1] == b_src  # (c, then b: passed on)
    assert [s.op.name for s in programs[0].steps] == ["exp", "mul_scalar", "add_scalar"]
    assert [s.op.name for s in programs[1].steps] == ["mul", "add"]
    assert [s.op.name for s in programs[2].steps] == ["sub"]


def mlp_stage(bn=False):
    af.manual_seed(0)
    layers = [nn.Linear(6, 5)] + ([nn.BatchNorm1d(5)] if bn else []) + [nn.ReLU()]
    return nn.Sequential(*layers)


def eager_stage(stage, xs, gs):
    """The reference: eager autograd on each micro-batch, gradients accumulated."""
    outs, xgrads = [], []
    for x, g in zip(xs, gs, strict=True):
        t = af.tensor(x).requires_grad_()
        with enable_grad():
            out = stage(t)
            out.backward(af.tensor(g))
        outs.append(out.detach().numpy())
        xgrads.append(t.grad.numpy())
    return (
        outs,
        xgrads,
        [p.grad.numpy() if p.grad is not None else None for p in stage.parameters()],
    )


def backward_now(sp, prog, g, kept, send=None):
    """A backward act with its weights part run at once: the input's gradient."""
    gx, left = sp.backward(prog, g, kept, send)
    if left is not None:
        sp.weights(left)
    return gx


@pytest.mark.parametrize("bn", [False, True], ids=["linear-relu", "batch-norm"])
def test_a_stages_compiled_acts_equal_eager_autograd_bit_for_bit(bn):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(3)]
    gs = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(3)]
    ref = mlp_stage(bn)
    want_out, want_x, want_p = eager_stage(ref, xs, gs)
    stage = mlp_stage(bn)
    sp = StagePrograms(stage, "stage 0 of 2", 0)
    held = []
    for j, x in enumerate(xs):  # (forwards first, then backwards, as a stage holding 3)
        prog = sp.of(x, [], True, None, 1.0)
        out, saved = sp.forward(prog, x, j)
        assert np.array_equal(out, want_out[j])
        held.append((prog, saved))
    for j, (prog, kept) in enumerate(held):
        sent = []
        assert np.array_equal(backward_now(sp, prog, gs[j], kept, sent.append), want_x[j])
        assert len(sent) == 1 and sent[0] is not None
    sp.take_grads()
    for p, w in zip(stage.parameters(), want_p, strict=True):
        assert np.array_equal(p.grad.numpy(), w)
    for b, w in zip(stage.buffers(), ref.buffers(), strict=True):  # (running statistics)
        assert np.array_equal(b.numpy(), w.numpy())
    assert len(sp.programs) == 1  # (one layout: compiled once)


def test_a_stage_holds_what_its_backward_reads():
    stage = mlp_stage()
    sp = StagePrograms(stage, "stage 1 of 2", 1)
    x = np.ones((4, 6), np.float32)
    prog = sp.of(x, [], True, None, 1.0)
    out, kept = sp.forward(prog, x, 0)
    # the weight's gradient reads the input, relu's the output: nothing else is held
    assert sorted(a.shape for a in kept.values()) == [(4, 5), (4, 6)]
    assert prog.saved_bytes == sum(a.nbytes for a in kept.values()) == (4 * 5 + 4 * 6) * 4
    # the backward in two parts: what the input's gradient needs, then the weights'
    parts = prog.first.parts
    assert len(parts) == 3
    assert "matmul" in [s.op.name for s in parts[1].steps]  # (g @ W)
    assert [s.op.name for s in parts[2].steps].count("matmul") == 1  # (g.T @ x)
    # a later micro-batch's weights' part adds into the gradients so far
    assert "add" in [s.op.name for s in prog.later.parts[2].steps]
    first = StagePrograms(mlp_stage(), "stage 0 of 2", 0)  # (no input gradient asked)
    assert first.of(x, [], False, None, 1.0).saved_bytes == prog.saved_bytes


def test_the_last_stage_with_its_loss_equals_eager_and_sends_its_input_gradient_first():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = rng.integers(0, 5, 4)
    ref, stage = mlp_stage(), mlp_stage()
    t = af.tensor(x).requires_grad_()
    with enable_grad():
        loss = nn.CrossEntropyLoss()(ref(t), af.tensor(y))
        (loss * 0.5).backward()
    sp = StagePrograms(stage, "stage 1 of 2", 1)
    prog = sp.of(x, [y], True, nn.CrossEntropyLoss(), 0.5)
    assert len(prog.first.parts) == 2  # (forward, loss and the input's gradient; the weights')
    sent = []
    value, gx, left = sp.last(prog, x, [y], 0, sent.append)
    assert sent[0] is gx and not any(g is not None for g in sp.grads)  # (none yet)
    sp.weights(left)
    sp.take_grads()
    assert value == float(loss.numpy()) and np.array_equal(gx, t.grad.numpy())
    for p, q in zip(ref.parameters(), stage.parameters(), strict=True):
        assert np.array_equal(p.grad.numpy(), q.grad.numpy())
    assert prog.saved_bytes == (4 * 5 + 4 * 6) * 4  # (the module's, not the loss's)


@pytest.mark.parametrize("model", ["linear-relu", "used-twice"])
def test_later_micro_batches_add_their_gradients_into_the_arrays_of_the_first(model):
    """A later micro-batch's weights' part writes each parameter's gradient over the one
    so far (no array as large as the parameter made per act), with eager's bits: the
    arrays the batch's first micro-batch made hold the batch's gradients at its end; a
    parameter used twice too (its second use's add reads what its first use's wrote)."""
    make, features = (mlp_stage, 6) if model == "linear-relu" else (Twice, 5)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((4, features)).astype(np.float32) for _ in range(3)]
    gs = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(3)]
    _, want_x, want_p = eager_stage(make(), xs, gs)
    stage = make()
    sp = StagePrograms(stage, "stage 1 of 3", 1)
    first = None
    for j, (x, g) in enumerate(zip(xs, gs, strict=True)):
        prog = sp.of(x, [], True, None, 1.0)
        out, kept = sp.forward(prog, x, j)
        assert np.array_equal(backward_now(sp, prog, g, kept), want_x[j])
        first = first or list(sp.grads)
    assert prog.later.into  # (the later form's weights' part: in place)
    assert all(a is b for a, b in zip(sp.grads, first, strict=True))
    sp.take_grads()
    for p, w in zip(stage.parameters(), want_p, strict=True):
        assert np.array_equal(p.grad.numpy(), w)


def test_a_frozen_stage_leaves_no_weights_part():
    """A stage none of whose parameters trains sends its input's gradient and leaves
    nothing for its weights actor to run or hold."""
    stage = mlp_stage()
    for p in stage.parameters():
        p.requires_grad_(False)
    sp = StagePrograms(stage, "stage 1 of 3", 1)
    x, g = np.ones((4, 6), np.float32), np.ones((4, 5), np.float32)
    prog = sp.of(x, [], True, None, 1.0)
    gx, left = sp.backward(prog, g, sp.forward(prog, x, 0)[1])
    assert gx.shape == x.shape and left is None and prog.first.grads == []


def test_a_later_act_that_fails_leaves_no_half_added_gradients():
    """A kernel of a later micro-batch's weights' part raising after a gradient was written
    over the one so far (and again by the op-by-op run naming the error): the batch's
    gradients are let go, none left half added for anything to read."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    gs = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2)]
    sp = StagePrograms(mlp_stage(), "stage 1 of 3", 1)
    prog = sp.of(xs[0], [], True, None, 1.0)
    backward_now(sp, prog, gs[0], sp.forward(prog, xs[0], 0)[1])
    assert all(g is not None for g in sp.grads) and prog.later.into
    last = prog.later.parts[2].compiled.instrs[-1].step
    kernel = last.kernel

    def boom(outs, args, attrs):
        raise FloatingPointError("injected")

    last.kernel = boom
    try:
        kept = sp.forward(prog, xs[1], 1)[1]
        with pytest.raises(Exception, match="injected"):
            backward_now(sp, prog, gs[1], kept)
    finally:
        last.kernel = kernel
    assert sp.grads == [None] * len(sp.params)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_output_is_written_over_an_input_only_once_that_input_is_read(compiled):
    """``Program.may_write_over``: an output may take an input's array where every kernel
    reading that input runs before the one writing the output, or is it (elementwise)."""

    def fn(marks, acc, x):
        first = acc + x  # (reads acc, writes output 0)
        second = acc * 2.0  # (reads acc after output 0 was written: output 1)
        return [first, second]

    specs = [Spec((3, 4), af.float32, "cpu"), Spec((3, 4), af.float32, "cpu")]
    rec, _ = _record(fn, specs)
    p = _program(rec, [(0, 0, specs[0]), (0, 1, specs[1])])
    if compiled:
        p.compile()
    assert p.may_write_over(1, 0)  # (acc's last reader writes output 1)
    assert not p.may_write_over(0, 0)  # (acc read again after output 0)
    assert p.may_write_over(0, 1) and p.may_write_over(1, 1)  # (x: its one reader first)


class Twice(nn.Module):
    """One Linear applied twice: its parameters get two gradients per micro-batch."""

    def __init__(self):
        super().__init__()
        af.manual_seed(3)
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        return self.lin(af.tanh(self.lin(x)))


@pytest.mark.parametrize("wait", [False, True], ids=["at-once", "weights-wait"])
def test_a_parameter_used_twice_accumulates_as_eager_does(wait):
    """Eager backward adds each use's gradient into .grad as it comes (over micro-batches:
    ((a0 + b0) + a1) + b1); summing a micro-batch's two first, acc + (a1 + b1), rounds
    otherwise."""
    acts_equal_eager(Twice, [4, 4, 4, 4], seed=4, wait=wait)


def acts_equal_eager(make, rows, seed, wait=False):
    """A stage made by ``make()`` on micro-batches of ``rows`` rows (a forward then a
    backward each, random inputs and output gradients): the input's gradients and the
    accumulated parameters' gradients of its compiled acts equal eager autograd's, bit
    for bit (a parameter with none in both). ``wait``: every weights part runs after the
    last backward, in piece order, as a stage's weights actor may run them."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((r, 5)).astype(np.float32) for r in rows]
    gs = [rng.standard_normal((r, 5)).astype(np.float32) for r in rows]
    _, want_x, _ = eager_stage(ref := make(), xs, gs)
    stage = make()
    sp = StagePrograms(stage, "stage 1 of 3", 1)
    left = []
    for j, (x, g) in enumerate(zip(xs, gs, strict=True)):
        prog = sp.of(x, [], True, None, 1.0)
        out, kept = sp.forward(prog, x, j)
        gx, part = sp.backward(prog, g, kept)
        assert np.array_equal(gx, want_x[j])
        left.append(part)
        if not wait:
            sp.weights(left.pop())
    for part in left:
        sp.weights(part)
    sp.take_grads()
    for p, q in zip(ref.parameters(), stage.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert np.array_equal(p.grad.numpy(), q.grad.numpy())


class Branch(nn.Module):
    """Applies ``b`` only to micro-batches of fewer than 4 rows (declared first or second:
    which parameter a later micro-batch's form is chosen by)."""

    def __init__(self, b_first):
        super().__init__()
        af.manual_seed(5)
        if b_first:
            self.b = nn.Linear(5, 5)
        self.a = nn.Linear(5, 5)
        if not b_first:
            self.b = nn.Linear(5, 5)

    def forward(self, x):
        y = self.a(x)
        return self.b(y) if x.shape[0] < 4 else y


@pytest.mark.parametrize("wait", [False, True], ids=["at-once", "weights-wait"])
@pytest.mark.parametrize("rows", [(4, 3, 3), (3, 4, 4)])
@pytest.mark.parametrize("b_first", [True, False])
def test_a_parameter_used_at_some_layouts_only_accumulates_as_eager_does(rows, b_first, wait):
    """Uneven micro-batches of a stage that uses a parameter only at some shapes: a later
    micro-batch's form adds into the gradients so far, -0.0 for those it gives first; its
    form is chosen by the micro-batches before it, whether their weights parts ran yet or
    wait (they run in piece order: each adds into what the one before left)."""
    acts_equal_eager(lambda: Branch(b_first), rows, seed=6, wait=wait)


class Masked(nn.Module):
    def forward(self, x):
        return x[x > 0]  # (a shape known only from the values)


def test_a_stage_that_cannot_be_traced_names_the_op():
    sp = StagePrograms(nn.Sequential(nn.Linear(6, 5), Masked()), "stage 0 of 2", 0)
    with pytest.raises(TraceError, match="depends on the values") as e:
        sp.of(np.ones((4, 6), np.float32), [], False, None, 1.0)
    assert "stage 0 of 2: a stage computing in a worker runs its acts compiled" in str(e.value)
    assert "Keep the stage local (no stage_ranks)" in str(e.value)
