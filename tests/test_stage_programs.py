"""A pipeline stage's acts compiled (nn/stage_programs.py, tracing.cut_programs): a recorded
call cut in two programs computes what the whole call does, the second reading only what
the first passes on; a stage's compiled forward and backward equal eager autograd bit for
bit (outputs, the input's gradient, the parameters' gradients accumulated over
micro-batches, batch norm's running statistics), and hold exactly what the backward
reads."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn
from actorflow.autograd import enable_grad
from actorflow.errors import TraceError
from actorflow.nn.stage_programs import StagePrograms
from actorflow.runtime.plan.spec import Spec
from actorflow.tracing.recording import Recording, mark
from actorflow.tracing.trace import _program, cut_programs


def _record(fn, specs):
    marks = []

    def body(*xs):
        return fn(marks, *xs)

    return Recording(body, specs, lambda leaves: leaves), marks


def test_a_call_cut_in_two_computes_the_whole_and_passes_on_what_the_second_reads():
    def fn(marks, x, g):
        a = af.exp(x)
        b = a * 2.0  # (read after the cut)
        c = a + 1.0  # (not read after the cut: not passed on)
        marks.append(mark())
        return [c, b * g + x]  # (x: the first part's input, read after the cut)

    specs = [Spec((3, 4), af.float32, "cpu"), Spec((3, 4), af.float32, "cpu")]
    rec, marks = _record(fn, specs)
    outs = rec.outputs
    first, second, saved = cut_programs(
        rec, marks[0], ((0,), (1,)), ([outs[0]], [outs[1]]), ([], [])
    )
    rng = np.random.default_rng(0)
    x, g = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    whole = _program(rec, [(0, 0, specs[0]), (0, 1, specs[1])])
    want = whole.run_new([[x, g]])
    got1 = first.run_new([[x]])
    passed = [x if k == "in" else got1[j] for k, j in saved]
    got2 = second.run_new([[g, *passed]])
    assert np.array_equal(got1[0], want[0]) and np.array_equal(got2[0], want[1])
    assert [k for k, _ in saved] == ["out", "in"]  # (b made before the cut, then x)
    assert len(first.out_spec.specs) == 2  # (c, then b: passed on)
    assert [s.op.name for s in first.steps] == ["exp", "mul_scalar", "add_scalar"]
    assert [s.op.name for s in second.steps] == ["mul", "add"]


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
    return outs, xgrads, [p.grad.numpy() for p in stage.parameters()]


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
    for j, (prog, saved) in enumerate(held):
        assert np.array_equal(sp.backward(prog, gs[j], saved), want_x[j])
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
    out, saved = sp.forward(prog, x, 0)
    # the weight's gradient reads the input, relu's the output: nothing else is held
    assert sorted(a.shape for a in saved) == [(4, 5), (4, 6)]
    assert prog.saved_bytes == sum(a.nbytes for a in saved) == (4 * 5 + 4 * 6) * 4
    first = StagePrograms(mlp_stage(), "stage 0 of 2", 0)  # (no input gradient asked)
    assert first.of(x, [], False, None, 1.0).saved_bytes == prog.saved_bytes


def test_the_last_stage_with_its_loss_is_one_program_equal_to_eager():
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
    assert prog.forward is None
    value, gx = sp.last(prog, x, [y], 0)
    sp.take_grads()
    assert value == float(loss.numpy()) and np.array_equal(gx, t.grad.numpy())
    for p, q in zip(ref.parameters(), stage.parameters(), strict=True):
        assert np.array_equal(p.grad.numpy(), q.grad.numpy())
    assert prog.saved_bytes == (4 * 5 + 4 * 6) * 4  # (the module's, not the loss's)


class Masked(nn.Module):
    def forward(self, x):
        return x[x > 0]  # (a shape known only from the values)


def test_a_stage_that_cannot_be_traced_names_the_op():
    sp = StagePrograms(nn.Sequential(nn.Linear(6, 5), Masked()), "stage 0 of 2", 0)
    with pytest.raises(TraceError, match="depends on the values"):
        sp.of(np.ones((4, 6), np.float32), [], False, None, 1.0)
