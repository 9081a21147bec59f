"""The compiler pass over nn.Graph's traced step (tracing/compile.py): what it does to a known
step (kernels, copies dropped, picks, buffers), constants folded, dead values dropped, the
workspace kept across steps, and results equal bit for bit to the step run op by op as
recorded (``compile.ENABLED = False``), for an MLP, a CNN and a transformer."""

import numpy as np
import pytest

import actorflow as af
from actorflow.errors import KernelError
from actorflow.ops import get as op_get
from actorflow.runtime.plan.spec import PieceSpec, Spec
from actorflow.tracing import compile as tc
from actorflow.tracing.program import Program, Step


def _graph(model, opt):
    class TrainStep(af.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.loss = af.nn.CrossEntropyLoss()
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.loss(self.model(x), y)
            loss.backward()
            return loss

    return TrainStep()


def _mlp():
    nn = af.nn
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _cnn():
    nn = af.nn
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 3),
    )
    return model, af.optim.Adam(model.parameters(), lr=1e-2)


def _transformer():
    nn = af.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(7, 8)
            self.layer = nn.TransformerEncoderLayer(
                8, 2, 16, dropout=0.0, batch_first=True, norm_first=True
            )
            self.head = nn.Linear(8, 7)
            self.mask = af.tensor(np.triu(np.full((5, 5), -np.inf, np.float32), 1))

        def forward(self, x):
            return self.head(self.layer(self.tok(x), src_mask=self.mask)).reshape(-1, 7)

    model = LM()
    return model, af.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def _batch(kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return rng.standard_normal((6, 12), dtype=np.float32), rng.integers(0, 4, 6)
    if kind == "cnn":
        return rng.random((4, 1, 4, 4), dtype=np.float32), rng.integers(0, 3, 4)
    x = rng.integers(0, 7, (2, 5))
    return x, rng.integers(0, 7, 10)


MODELS = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer}


def _train(kind, compiled: bool, monkeypatch, fused=False, steps=3):
    """Losses and final parameters of ``steps`` steps from a seeded model."""
    monkeypatch.setattr(tc, "ENABLED", compiled)
    af.manual_seed(0)
    model, opt = MODELS[kind]()
    g = _graph(model, opt)
    batches = [_batch(kind, s) for s in range(steps)]
    if fused:
        losses = [np.asarray(v).copy() for v in g.run(batches, fused=True)]
    else:
        losses = [g.step(af.tensor(x), af.tensor(y)).numpy().copy() for x, y in batches]
    params = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    return losses, params, g


def _program(g):
    return next(c.program for c in g._compiled.values() if c.program is not None)


def _same(a, b):
    la, pa, _ = a
    lb, pb, _ = b
    assert [x.tobytes() for x in la] == [x.tobytes() for x in lb]
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].tobytes() == pb[k].tobytes(), k


@pytest.mark.parametrize("kind", ["mlp", "cnn", "transformer"])
def test_compiled_step_equals_the_recorded_one_bit_for_bit(kind, monkeypatch):
    on = _train(kind, True, monkeypatch)
    off = _train(kind, False, monkeypatch)
    assert _program(on[2]).compiled is not None and _program(off[2]).compiled is None
    _same(on, off)


def test_compiled_fused_run_equals_the_recorded_one(monkeypatch):
    _same(
        _train("mlp", True, monkeypatch, fused=True), _train("mlp", False, monkeypatch, fused=True)
    )


def test_the_pass_on_an_mlp_step(monkeypatch):
    *_, g = _train("mlp", True, monkeypatch, steps=1)
    p = _program(g)
    c = p.compiled
    # 64 recorded ops: 4 copies of contiguous gradients drop; SGD's momentum != 0, made
    # per parameter, is made once (3 merged); its 8 wheres on it pick (6 whole-array
    # ones; 2 read a view of a bias gradient); consecutive elementwise ops run as one
    # kernel each; the 4 parameters' updates are written into them
    assert len(p.steps) == 64
    assert c.copies_dropped == 4 and c.merged == 3 and c.dropped == 0 and c.folded_steps == 0
    assert sum(i.select for i in c.instrs) == 6
    assert len(c.instrs) == 57 and c.kernels == 23
    assert sorted(c.state_of.values()) == [0, 1, 2, 3]
    assert c.buffers < len(p.tmp_specs) and c.in_place > 0


def test_workspace_is_planned_once_and_reused(monkeypatch):
    monkeypatch.setattr(tc, "ENABLED", True)
    af.manual_seed(0)
    g = _graph(*_mlp())
    x, y = _batch("mlp", 0)
    g.step(af.tensor(x), af.tensor(y))
    c = _program(g).compiled
    bound = c._bound

    def planned():  # the arrays written where the plan says (not per run)
        return [
            id(a)
            for i in c.instrs
            for k, a in enumerate(i.outs)
            if (True, k) not in {d[:2] for d in i.dyn}
        ]

    written = planned()
    for s in range(1, 3):
        x, y = _batch("mlp", s)
        g.step(af.tensor(x), af.tensor(y))
    assert c._bound is bound and len(g._compiled) == 1  # not bound nor compiled anew
    assert planned() == written
    # values share buffers: fewer distinct arrays than values written
    assert len(set(written)) < len(written)


def _cpu(shape):
    return Spec(shape, af.float32, "cpu")


def _step(name, ins, outs, attrs=None):
    return Step(op_get(name), op_get(name).kernel_for("cpu"), ins, attrs or {}, outs)


def test_constants_fold_and_dead_values_drop(monkeypatch):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, np.float32)
    steps = [
        _step("add", [("const", 0, 0, None), ("const", 1, 0, None)], [("tmp", 0, 0, None)]),
        _step("mul", [("in", 0, 0, None), ("tmp", 0, 0, None)], [("out", 0, 0, None)]),
        _step("neg", [("in", 0, 0, None)], [("tmp", 1, 0, None)]),  # read by none
        _step("exp", [("tmp", 1, 0, None)], [("tmp", 2, 0, None)]),
    ]  # nor this
    x = np.array([1.0, -2.0, 3.0, 0.25], np.float32)
    results = {}
    for on in (True, False):
        monkeypatch.setattr(tc, "ENABLED", on)
        p = Program(list(steps), PieceSpec(0, [_cpu((4,))]), [_cpu((4,))] * 3, [a, b], [])
        p.compile()
        if on:
            c = p.compiled
            assert c.folded_steps == 1 and c.dropped == 2 and c.kernels == 1
        results[on] = p.run_new([[x]])[0]
    assert results[True].tobytes() == results[False].tobytes() == (x * (a + b)).tobytes()


def test_an_output_copied_from_one_kernels_value_is_written_by_that_kernel(monkeypatch):
    """A copy into an output of a value one kernel makes and nothing else reads (autograd
    copies a weight's first gradient so that ``.grad`` owns its storage) is dropped: the
    kernel writes the output itself. Not where a kernel after it reads an input (an
    output's array may be an input's), nor where another step reads the value. The same
    bits as the program run op by op in each case."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    i0, i1 = ("in", 0, 0, None), ("in", 1, 0, None)
    t0, o0, o1 = ("tmp", 0, 0, None), ("out", 0, 0, None), ("out", 1, 0, None)
    cases = {  # name: (steps, outputs' shapes, copies dropped into an output)
        "direct": ([_step("matmul", [i0, i1], [t0]), _step("copy", [t0], [o0])], [(4, 5)], 1),
        "an input read after": (
            [
                _step("matmul", [i0, i1], [t0]),
                _step("neg", [i0], [o1]),
                _step("copy", [t0], [o0]),
            ],
            [(4, 5), (4, 3)],
            0,
        ),
        "the value read again": (
            [
                _step("matmul", [i0, i1], [t0]),
                _step("copy", [t0], [o0]),
                _step("exp", [t0], [o1]),
            ],
            [(4, 5), (4, 5)],
            0,
        ),
    }
    for name, (steps, shapes, direct) in cases.items():
        got = {}
        for on in (True, False):
            monkeypatch.setattr(tc, "ENABLED", on)
            spec = PieceSpec(0, [_cpu(sh) for sh in shapes])
            p = Program(list(steps), spec, [_cpu((4, 5))], [], [])
            p.compile()
            if on:
                assert p.compiled.outputs_direct == direct, name
                assert len(p.compiled.instrs) == len(steps) - direct, name
            got[on] = [a.tobytes() for a in p.run_new([[x], [w]])]
            assert p.steps == steps  # (the program's own steps as recorded)
        assert got[True] == got[False], name
        assert got[True][0] == (x @ w).tobytes(), name


def test_a_compiled_program_holds_none_of_a_runs_arrays_after_it(monkeypatch):
    """The arrays a run gives the kernels (inputs, outputs: set per run) are let go once it
    ends, also when a kernel raised: a program does not keep a batch's input alive until
    the next run."""
    import gc
    import weakref

    monkeypatch.setattr(tc, "ENABLED", True)
    steps = [
        _step("exp", [("in", 0, 0, None)], [("tmp", 0, 0, None)]),
        _step("mul", [("in", 0, 0, None), ("tmp", 0, 0, None)], [("out", 0, 0, None)]),
        _step("log", [("tmp", 0, 0, None)], [("out", 1, 0, None)]),
    ]
    p = Program(list(steps), PieceSpec(0, [_cpu((4,)), _cpu((4,))]), [_cpu((4,))], [], [])
    p.compile()
    for fails in (False, True):
        x = np.array([1.0, -2.0, 3.0, 0.25], np.float32)
        outs = [np.empty(4, np.float32), np.empty(4, np.float32)]
        if fails:  # (a kernel that raises: the run goes op by op to name it, then raises)
            monkeypatch.setattr(steps[2], "kernel", lambda o, a, at: 1 / 0)
            with pytest.raises(Exception, match="division"):
                p.run(outs, [[x]])
        else:
            p.run(outs, [[x]])
            assert np.array_equal(outs[0], x * np.exp(x))
        held = [weakref.ref(a) for a in (x, *outs)]
        del x, outs
        gc.collect()
        assert all(r() is None for r in held)


def test_a_failing_op_is_named_as_without_the_pass(monkeypatch):
    errors = {}
    for on in (True, False):
        monkeypatch.setattr(tc, "ENABLED", on)
        af.manual_seed(0)
        model, opt = _mlp()
        g = _graph(model, opt)
        x, _ = _batch("mlp", 0)
        before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        g.step(af.tensor(x), af.tensor(np.zeros(6, np.int64)))
        before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        with pytest.raises(KernelError) as e:
            g.step(af.tensor(x), af.tensor(np.full(6, 9, np.int64)))  # class 9 of 4
        errors[on] = (str(e.value), e.value.op, e.value.step)
        after = {k: v.numpy() for k, v in model.state_dict().items()}
        assert all(before[k].tobytes() == after[k].tobytes() for k in before)
    assert errors[True] == errors[False]
