"""nn.Graph: a training step traced once (forward, backward, optimizer update) and run as a
program with its parameters and optimizer state held across pieces; the same numbers as
eager mode, bit for bit, by step() and by a pipelined run()."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim


def batches(n, seed=0, b=6):  # noqa: D401 - (n >= 6 for the bit-for-bit test)
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 8)).astype(np.float32), rng.integers(0, 3, b)) for _ in range(n)
    ]


def make(opt_name, kwargs, seed=0):
    af.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    return model, getattr(optim, opt_name)(model.parameters(), **kwargs)


class TrainStep(nn.Graph):
    def __init__(self, model, opt, **graph_kw):
        super().__init__(**graph_kw)
        self.model = model
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss(self.model(x), y)
        loss.backward()
        return loss


def eager_losses(model, opt, data):
    out = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(af.tensor(x)), af.tensor(y))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


OPTS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.2)),
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.05)),
]


@pytest.mark.parametrize("opt_name,kwargs", OPTS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPTS)])
def test_graph_steps_equal_eager_steps_bit_for_bit(opt_name, kwargs):
    data = batches(6)
    m1, o1 = make(opt_name, kwargs)
    want = eager_losses(m1, o1, data)
    m2, o2 = make(opt_name, kwargs)
    step = TrainStep(m2, o2)
    got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data[:3]]  # step()
    got += [float(loss) for loss in step.run(data[3:5])]  # op actors
    got += [float(loss) for loss in step.run(data[5:], fused=True)]  # one actor
    assert got == want
    for (name, a), b in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), name


@pytest.mark.parametrize(
    "opt_name,kwargs",
    [
        ("Adam", dict(lr=1e-2)),
        ("SGD", dict(lr=0.05, momentum=0.9)),
        ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.2)),
    ],
)
def test_eager_and_graph_steps_interleave_on_one_optimizer_state(opt_name, kwargs):
    data = batches(6, seed=1)
    m1, o1 = make(opt_name, kwargs)
    want = eager_losses(m1, o1, data)
    m2, o2 = make(opt_name, kwargs)
    got = eager_losses(m2, o2, data[:2])  # eager first
    step = TrainStep(m2, o2)
    got += [float(v) for v in step.run(data[2:4])]  # graph continues its state
    if opt_name == "Adam":
        assert o2.state[next(iter(m2.parameters()))]["step"] == 4
    got += eager_losses(m2, o2, data[4:5])  # and eager again
    got += [float(v) for v in step.run(data[5:])]  # and the same graph again
    assert got == want
    # (the last update counts too)
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW"])
def test_bias_corrections_are_the_same_numbers_in_eager_and_graph_mode(opt_name):
    """Betas whose powers a Python float and a float64 kernel round differently (0.7 ** 4
    and 0.99 ** 3 on some machines): eager and graph steps still agree bit for bit, on
    float64 weights, where a last-digit difference of the step size shows."""
    data = [(x.astype(np.float64), y) for x, y in batches(6, seed=4)]

    def fresh():
        af.manual_seed(4)
        model = nn.Linear(8, 3, dtype="float64")
        return model, getattr(optim, opt_name)(
            model.parameters(), lr=0.05, betas=(0.7, 0.99), weight_decay=0.1
        )

    m1, o1 = fresh()
    want = eager_losses(m1, o1, data)
    m2, o2 = fresh()
    step = TrainStep(m2, o2)
    got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data[:3]]
    got += [float(v) for v in step.run(data[3:])]
    assert got == want
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    assert o2.state_dict()["state"][0]["step"] == 6


def test_optimizer_state_loaded_between_graph_steps_is_the_state_the_graph_uses():
    """The graph steps the optimizer's own state tensors: state loaded into the optimizer
    (PyTorch's layout here, the count a tensor) is what the next graph step reads, as the
    next eager step would."""
    data = batches(5, seed=3)
    m1, o1 = make("Adam", dict(lr=1e-2))
    eager_losses(m1, o1, data[:2])
    # copies (the next steps write the live tensors in place), the count as a tensor
    weights = {k: v.clone() for k, v in m1.state_dict().items()}
    saved = o1.state_dict()
    saved["state"] = {
        i: {k: af.tensor(float(v)) if k == "step" else v.clone() for k, v in st.items()}
        for i, st in saved["state"].items()
    }
    want = eager_losses(m1, o1, data[2:])
    m2, o2 = make("Adam", dict(lr=1e-2), seed=1)
    step = TrainStep(m2, o2)
    step(*map(af.tensor, data[4]))  # a state of its own, then...
    m2.load_state_dict(weights)
    o2.load_state_dict(saved)  # ...the one loaded
    assert [float(v) for v in step.run(data[2:])] == want
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    assert [st["step"] for st in o2.state_dict()["state"].values()] == [5] * 6


def test_inference_graph_equals_the_eager_forward():
    af.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Softmax(dim=1))

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    with af.no_grad():
        want = model(af.tensor(x)).numpy()
    g = Infer()
    assert np.array_equal(g(af.tensor(x)).numpy(), want)
    assert np.array_equal(next(iter(g.run([x]))), want)
    assert "(model): Sequential(" in repr(g)


def test_run_is_an_actor_per_op_planned_under_a_budget():
    m, o = make("SGD", dict(lr=0.1, momentum=0.9))
    step = TrainStep(m, o)
    with pytest.raises(af.PlanError, match="set state 0.*workspace"):
        list(step.run(batches(2), memory={"cpu": "1KiB"}))
    losses = list(step.run(batches(4), memory={"cpu": "64MiB"}))
    assert len(losses) == 4
    s = step.stats()
    assert s.state == "finished"
    acts = {name: r["acts"] for name, r in s.actors.items()}
    assert acts["inputs of TrainStep"] == 4
    ops = [n for n in acts if n not in ("inputs of TrainStep", "(output)")]
    assert len(ops) > 30 and all(acts[n] == 4 for n in ops)  # every op acted per piece
    params = len(list(m.parameters()))
    writers = [n for n in ops if n.startswith("set state")]
    assert len(writers) == 2 * params  # each parameter and its momentum buffer
    assert {"matmul", "log_softmax", "gelu_backward"} <= set(ops)


def test_random_ops_inside_build_draw_in_train_mode_and_none_trace_in_eval():
    af.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.5))
    opt = optim.SGD(model.parameters(), lr=0.1)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    step = Step()
    drawn = step(af.ones(2, 8))  # dropout drawn per step (test_graph_random)
    assert drawn.shape == () and int(step._count) == 1
    model.eval()  # dropout off: nothing random is traced
    ev = Step()
    assert ev(af.ones(2, 8)).shape == ()
    (compiled,) = ev._compiled.values()
    assert "rand_step" not in [s.op.name for s in compiled.program.steps]
    assert int(ev._count) == 0


def test_graph_leaves_eager_grads_alone_and_build_is_required():
    m, o = make("SGD", dict(lr=0.1))
    x, y = batches(1)[0]
    loss = nn.CrossEntropyLoss()(m(af.tensor(x)), af.tensor(y))
    loss.backward()
    g0 = m[0].weight.grad.numpy()
    TrainStep(m, o)(af.tensor(x), af.tensor(y))
    assert np.array_equal(m[0].weight.grad.numpy(), g0)

    class NoBuild(nn.Graph):
        pass

    with pytest.raises(NotImplementedError, match="build"):
        NoBuild()(af.ones(2))
    with pytest.raises(TypeError, match="optimizer"):
        NoBuild().add_optimizer(object())


@pytest.mark.parametrize("seed", range(6))
def test_state_gates_keep_reads_and_writes_in_piece_order(seed):
    """A state written by one actor per piece and read by two: each read of piece k sees
    the write of piece k-1, whatever order the scheduler tries ready actors in."""
    import random as _random
    import time as _time

    state = [0]
    delay = _random.Random(seed)

    def read(x):
        _time.sleep(delay.random() * 0.002)
        return np.array([state[0]])

    def write(x, r1, r2):
        state[0] = int(x[0]) + 1
        return np.array([state[0]])

    g = af.ActorGraph(seed=seed, buffers=3)
    src = g.source(lambda: (np.array([i]) for i in range(12)), buffers=4)
    r1 = g.actor(read, src, name="r1")
    r2 = g.actor(read, src, name="r2", inline=True)
    w = g.actor(write, src, r1, r2, name="w")
    r1.state_reads = r2.state_reads = ("s",)
    w.state_writes = ("s",)
    g.sink(r1, name="r1")
    g.sink(r2, name="r2")
    g.sink(w, name="w")
    outs = list(g.run())
    assert [int(o["r1"][0]) for o in outs] == list(range(12))
    assert [int(o["r2"][0]) for o in outs] == list(range(12))
    assert state[0] == 12


def test_a_new_learning_rate_or_mode_compiles_the_step_anew():
    data = batches(4, seed=2)
    m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9))
    m2, o2 = make("SGD", dict(lr=0.1, momentum=0.9))
    step = TrainStep(m2, o2)
    want, got = [], []
    for i, (x, y) in enumerate(data):
        for o in (o1, o2):
            for g in o.param_groups:
                g["lr"] = 0.1 / (i + 1)  # a schedule: every step its own lr
        want += eager_losses(m1, o1, [(x, y)])
        got.append(step(af.tensor(x), af.tensor(y)).item())
    assert got == want
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


def test_frozen_parameters_buffers_and_builds_that_return_nothing():
    import itertools

    model = nn.Linear(4, 2)
    model.bias.requires_grad_(False)  # frozen, though in the optimizer
    model.register_buffer("scale", af.ones(2))
    opt = optim.SGD(model.parameters(), lr=0.1)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = model
            self.add_optimizer(opt)

        def build(self, x):
            (self.m(x) * self.m.scale).sum().backward()  # returns nothing

    bias = model.bias.numpy().copy()
    x = np.ones((3, 4), np.float32)
    step = Step()
    assert list(itertools.islice(step.run([x, x]), 5)) == [None, None]  # it ends
    assert np.array_equal(model.bias.numpy(), bias)
    w = model.weight.numpy().copy()
    with af.no_grad():
        af.zero_(model.scale)  # a buffer is read live, not frozen
    list(step.run([x]))
    assert np.array_equal(model.weight.numpy(), w)  # zero scale: zero gradient


def test_run_takes_a_loaders_last_smaller_batch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 8)).astype(np.float32)
    y = rng.integers(0, 3, 100)
    m1, m2 = nn.Sequential(nn.Linear(8, 3)), nn.Sequential(nn.Linear(8, 3))
    m2.load_state_dict(m1.state_dict())
    o1, o2 = optim.Adam(m1.parameters(), lr=1e-2), optim.Adam(m2.parameters(), lr=1e-2)

    def loader():
        return af.data.DataLoader(af.data.TensorDataset(x, y), batch_size=32, shuffle=True, seed=1)

    got = [float(v) for v in TrainStep(m2, o2).run(loader())]
    want = []
    for xb, yb in loader():
        o1.zero_grad()
        loss = nn.CrossEntropyLoss()(m1(xb), yb)
        loss.backward()
        o1.step()
        want.append(loss.item())
    assert len(got) == 4 and got == want


from hypothesis import HealthCheck, given, settings  # noqa: E402 - with its section
from hypothesis import strategies as hs  # noqa: E402 - with its section

ACTS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
OPT_CHOICES = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.01)),
    ("Adam", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    widths=hs.lists(hs.integers(2, 9), min_size=1, max_size=3),
    acts=hs.lists(hs.sampled_from(sorted(ACTS)), min_size=3, max_size=3),
    opt=hs.sampled_from(range(len(OPT_CHOICES))),
    norm=hs.booleans(),
    mode=hs.sampled_from(["step", "run", "fused"]),
    seed=hs.integers(0, 2**16),
)
def test_random_models_train_the_same_in_graph_and_eager_mode(widths, acts, opt, norm, mode, seed):
    def model_and_opt():
        af.manual_seed(seed)
        layers, d = [], 8
        for k, w in enumerate(widths):
            layers += [nn.Linear(d, w), ACTS[acts[k]]()]
            d = w
        if norm:
            layers.append(nn.LayerNorm(d))
        layers.append(nn.Linear(d, 3))
        m = nn.Sequential(*layers)
        name, kwargs = OPT_CHOICES[opt]
        return m, getattr(optim, name)(m.parameters(), **kwargs)

    data = batches(4, seed=seed, b=5)
    m1, o1 = model_and_opt()
    want = eager_losses(m1, o1, data)
    m2, o2 = model_and_opt()
    step = TrainStep(m2, o2)
    if mode == "step":
        got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data]
    else:
        got = [float(v) for v in step.run(data, fused=mode == "fused")]
    assert got == want
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
