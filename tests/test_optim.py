"""Optimizers, learning-rate schedules and gradient clipping against PyTorch's, step for
step: RMSprop and Adagrad in every option, parameter groups of different options in every
optimizer, each scheduler's rates over many steps, clip_grad_norm_/clip_grad_value_; and
in nn.Graph: the same numbers bit for bit as eager mode, a schedule's rates read as state
of the compiled step (no compile per step), clipping traced into the step."""

import math

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import graph as graph_module
from actorflow.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

OPTIONS = {
    "SGD": [
        dict(lr=0.1),
        dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True),
    ],
    "Adam": [dict(lr=0.01), dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)],
    "AdamW": [dict(lr=0.01), dict(lr=0.02, weight_decay=0.3, eps=1e-6, maximize=True)],
    "RMSprop": [
        dict(),
        dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1),
        dict(lr=0.01, momentum=0.9),
        dict(lr=0.01, centered=True),
        dict(lr=0.005, momentum=0.5, centered=True, weight_decay=0.05, maximize=True),
    ],
    "Adagrad": [
        dict(),
        dict(lr=0.1, lr_decay=0.01),
        dict(lr=0.1, weight_decay=0.1, initial_accumulator_value=0.5),
        dict(lr=0.05, lr_decay=0.001, eps=1e-6, maximize=True),
    ],
}
CASES = [(name, kw) for name, kws in OPTIONS.items() for kw in kws]
IDS = [f"{name}-{i}" for name, kws in OPTIONS.items() for i in range(len(kws))]


def torch_opt(name, params, **kw):
    extra = {} if name == "SGD" else dict(foreach=False)
    return getattr(torch.optim, name)(params, **kw, **extra)


def run_both(name, groups, steps, shapes=((4, 3), (3,))):
    """Trains one float64 tensor per shape, in ``groups`` (options per group; each group
    takes the tensors at its indices), with actorflow and with PyTorch on the same loss;
    returns both sets of tensors after every step."""
    rng = np.random.default_rng(5)
    w0 = [rng.standard_normal(s) for s in shapes]
    tgt = [rng.standard_normal(s) for s in shapes]
    ps = [af.tensor(w, requires_grad=True) for w in w0]
    tps = [torch.tensor(w, requires_grad=True) for w in w0]
    opt = getattr(optim, name)([dict(g, params=[ps[i] for i in idx]) for idx, g in groups])
    topt = torch_opt(name, [dict(g, params=[tps[i] for i in idx]) for idx, g in groups])
    for step in range(steps):
        for o, qs, T in ((opt, ps, af.tensor), (topt, tps, torch.tensor)):
            o.zero_grad()
            loss = sum(
                (((q - T(t)) ** 2) * (step + 1.0) + q**3 * 0.1).sum()
                for q, t in zip(qs, tgt, strict=True)
            )
            loss.backward()
            o.step()
        for a, b in zip(ps, tps, strict=True):
            np.testing.assert_allclose(
                a.detach().numpy(),
                b.detach().numpy(),
                rtol=1e-9,
                atol=1e-12,
                err_msg=f"{name} step {step}",
            )
    return opt, topt


@pytest.mark.parametrize(
    "name,kw",
    [c for c in CASES if c[0] in ("RMSprop", "Adagrad")],
    ids=[i for i in IDS if i.split("-")[0] in ("RMSprop", "Adagrad")],
)
def test_rmsprop_and_adagrad_match_pytorch_step_for_step(name, kw):
    opt, topt = run_both(name, [((0, 1), kw)], 25)
    mine, theirs = opt.state_dict(), topt.state_dict()
    assert mine["param_groups"][0].keys() <= theirs["param_groups"][0].keys()
    for i, st in theirs["state"].items():
        assert set(mine["state"][i]) == set(st)
        assert mine["state"][i]["step"] == int(st["step"])
        for k, v in st.items():
            if k != "step":
                np.testing.assert_allclose(
                    mine["state"][i][k].numpy(), v.numpy(), rtol=1e-9, atol=1e-12
                )


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_optimizer_takes_groups_of_different_options(name):
    a, b = OPTIONS[name][0], OPTIONS[name][-1]
    run_both(name, [((0,), a), ((1, 2), b)], 8, shapes=((4, 3), (3,), (2, 2)))


# -- learning-rate schedules -------------------------------------------------------------------


def schedulers(lib, opt, kind):
    S = lib.optim.lr_scheduler if lib is torch else sched
    if kind == "step":
        return S.StepLR(opt, step_size=7, gamma=0.5)
    if kind == "multistep":
        return S.MultiStepLR(opt, milestones=[5, 12, 12, 30], gamma=0.3)
    if kind == "cosine":
        return S.CosineAnnealingLR(opt, T_max=13, eta_min=0.001)
    if kind == "lambda":
        return S.LambdaLR(opt, [lambda e: 0.95**e, lambda e: 1.0 / (e + 1)])
    if kind == "linear":
        return S.LinearLR(opt, start_factor=0.25, end_factor=0.9, total_iters=17)
    if kind == "sequential":
        return S.SequentialLR(
            opt,
            [
                S.LinearLR(opt, start_factor=0.1, total_iters=5),
                S.CosineAnnealingLR(opt, T_max=20),
                S.StepLR(opt, 4, 0.7),
            ],
            milestones=[5, 25],
        )
    base, kw = kind.split(":") if ":" in kind else (kind, "")
    kw = dict(
        anneal_strategy="linear" if "linear" in kw else "cos",
        three_phase="three" in kw,
        cycle_momentum="nomom" not in kw,
    )
    return S.OneCycleLR(opt, max_lr=[0.5, 0.2], total_steps=60, pct_start=0.25, **kw)


KINDS = [
    "step",
    "multistep",
    "cosine",
    "lambda",
    "linear",
    "sequential",
    "onecycle",
    "onecycle:linear",
    "onecycle:three",
    "onecycle:three-linear-nomom",
]


def two_groups(lib, name):
    if lib is torch:
        ps = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
        make = getattr(torch.optim, name)
    else:
        ps = [af.zeros(2, requires_grad=True), af.zeros(3, requires_grad=True)]
        make = getattr(optim, name)
    kw = dict(momentum=0.9) if name == "SGD" else {}
    return make([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.03}], lr=0.1, **kw)


@pytest.mark.filterwarnings("ignore:Detected call of")  # (PyTorch's: no optimizer steps)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_schedules_give_pytorchs_rates_step_for_step(kind, name):
    opt, topt = two_groups(af, name), two_groups(torch, name)
    s, ts = schedulers(af, opt, kind), schedulers(torch, topt, kind)
    keys = ("lr", "momentum", "betas")
    for step in range(60 if kind.startswith("onecycle") else 45):
        assert s.get_last_lr() == ts.get_last_lr(), (kind, step)
        assert s.last_epoch == ts.last_epoch
        for g, tg in zip(opt.param_groups, topt.param_groups, strict=True):
            assert [g.get(k) for k in keys] == [tg.get(k) for k in keys], (kind, step)
        if step < 59:
            s.step()
            ts.step()
    theirs = ts.state_dict()
    mine = s.state_dict()
    assert set(mine) == set(theirs) - {"_get_lr_called_within_step"}
    for k, v in mine.items():
        if k not in ("_schedulers", "lr_lambdas"):
            assert v == theirs[k], k


def test_a_schedule_resumes_from_its_state_dict():
    opt = two_groups(af, "SGD")
    s = sched.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        s.step()
    saved, opt_saved = s.state_dict(), opt.state_dict()
    want = []
    for _ in range(5):
        s.step()
        want.append(s.get_last_lr())
    opt2 = two_groups(af, "SGD")
    opt2.load_state_dict(opt_saved)
    s2 = sched.CosineAnnealingLR(opt2, T_max=10, last_epoch=3)
    s2.load_state_dict(saved)
    got = []
    for _ in range(5):
        s2.step()
        got.append(s2.get_last_lr())
    assert got == want


def test_schedule_arguments_are_checked():
    opt = two_groups(af, "SGD")
    with pytest.raises(TypeError, match="not an Optimizer"):
        sched.StepLR(object(), 3)
    with pytest.raises(ValueError, match="start_factor"):
        sched.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="total_steps"):
        sched.OneCycleLR(opt, 0.1)
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        sched.OneCycleLR(optim.Adagrad([af.zeros(2, requires_grad=True)]), 0.1, 10)
    with pytest.raises(ValueError, match="one milestone fewer"):
        sched.SequentialLR(opt, [sched.StepLR(opt, 2)], [3])
    with pytest.raises(ValueError, match="2 lr_lambdas"):
        sched.LambdaLR(opt, [lambda e: 1.0])
    s = sched.OneCycleLR(opt, 0.1, total_steps=2)
    s.step()
    s.step()
    with pytest.raises(ValueError, match="past total_steps=2"):
        s.step()


# -- graph mode ----------------------------------------------------------------------------------


def batches(n, seed=0, b=6):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 8)).astype(np.float32), rng.integers(0, 3, b)) for _ in range(n)
    ]


def make(name, kw, groups=False, seed=0):
    af.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    params = (
        [
            {"params": model[0].parameters()},
            {"params": model[2].parameters(), "lr": kw.get("lr", 0.01) / 2},
        ]
        if groups
        else model.parameters()
    )
    return model, getattr(optim, name)(params, **kw)


class TrainStep(nn.Graph):
    """backward, then (with ``clip``) the gradients clipped, then the optimizers' update."""

    def __init__(self, model, opt, clip=None):
        super().__init__()
        self.model, self.clip = model, clip
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        if self.clip is not None:
            kind, value = self.clip
            if kind == "value":
                nn.utils.clip_grad_value_(self.model.parameters(), value)
            else:
                norm = nn.utils.clip_grad_norm_(self.model.parameters(), value, kind)
                return loss, norm
        return loss


def eager_steps(model, opt, data, schedule=None, clip=None, per_epoch=None):
    out = []
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(af.tensor(x)), af.tensor(y))
        loss.backward()
        norm = []
        if clip is not None:
            kind, value = clip
            if kind == "value":
                nn.utils.clip_grad_value_(model.parameters(), value)
            else:
                norm = [float(nn.utils.clip_grad_norm_(model.parameters(), value, kind))]
        opt.step()
        out += [loss.item()] + norm
        if schedule is not None and (per_epoch is None or (i + 1) % per_epoch == 0):
            schedule.step()
    return out


def same_params(m1, m2):
    for (name, a), b in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), name


GRAPH_CASES = [c for c in CASES if c[0] in ("RMSprop", "Adagrad")] + [
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("AdamW", dict(lr=0.01)),
]


@pytest.mark.parametrize(
    "name,kw", GRAPH_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(GRAPH_CASES)]
)
def test_graph_steps_equal_eager_steps_bit_for_bit(name, kw):
    data = batches(6)
    m1, o1 = make(name, kw, groups=True)
    want = eager_steps(m1, o1, data)
    m2, o2 = make(name, kw, groups=True)
    step = TrainStep(m2, o2)
    got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data[:2]]
    got += [float(v) for v in step.run(data[2:4])]
    got += [float(v) for v in step.run(data[4:], fused=True)]
    assert got == want
    same_params(m1, m2)
    assert o1.state_dict()["state"].keys() == o2.state_dict()["state"].keys()


def counting(monkeypatch, name):
    calls = []
    real = getattr(graph_module, name)
    monkeypatch.setattr(graph_module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize(
    "name,kw,kind",
    [
        ("SGD", dict(lr=0.1, momentum=0.9), "onecycle"),  # cycles SGD's momentum
        ("Adam", dict(lr=0.01), "onecycle:three-linear"),  # cycles Adam's beta1
        ("RMSprop", dict(lr=0.01, momentum=0.5), "cosine"),
        ("Adagrad", dict(lr=0.1, lr_decay=0.01), "sequential"),
    ],
)
def test_a_schedule_reaches_the_compiled_step_without_compiling_it_again(
    monkeypatch, name, kw, kind
):
    data = batches(20, seed=2)
    m1, o1 = make(name, kw, groups=True)
    kind = kind if name != "Adagrad" else kind
    want = eager_steps(m1, o1, data, schedulers(af, o1, kind))
    compiles = counting(monkeypatch, "stateful_program")
    m2, o2 = make(name, kw, groups=True)
    s2 = schedulers(af, o2, kind)
    step = TrainStep(m2, o2)
    got = []
    for x, y in data:
        got.append(step(af.tensor(x), af.tensor(y)).item())
        s2.step()
    assert len(compiles) == 1
    assert got == want
    same_params(m1, m2)
    assert o2.param_groups[0]["lr"] == o1.param_groups[0]["lr"]


@pytest.mark.parametrize("fused", [False, True])
def test_run_over_a_loader_with_the_schedule_stepped_per_epoch(monkeypatch, fused):
    from actorflow.data import DataLoader, TensorDataset

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((24, 8)).astype(np.float32), rng.integers(0, 3, 24)
    m1, o1 = make("Adam", dict(lr=0.02))
    data = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 24, 6)] * 4
    want = eager_steps(m1, o1, data, sched.StepLR(o1, 1, gamma=0.5), per_epoch=4)
    graphs = counting(monkeypatch, "stateful_graph" if not fused else "stateful_program")
    m2, o2 = make("Adam", dict(lr=0.02))
    s2 = sched.StepLR(o2, 1, gamma=0.5)
    step = TrainStep(m2, o2)
    loader = DataLoader(TensorDataset(x, y), batch_size=6)
    got = []
    for _ in range(4):  # epochs
        got += [float(v) for v in step.run(loader, fused=fused)]
        s2.step()
    assert len(graphs) == 1
    assert got == want
    same_params(m1, m2)
    with pytest.raises(af.TraceError, match="step it between runs|between runs"):
        for _ in step.run(loader, fused=fused):  # per batch inside a run: refused
            s2.step()


@pytest.mark.parametrize(
    "clip", [("value", 0.05), (2.0, 0.5), (math.inf, 0.1), (1.0, 0.3), (3.0, 0.2)]
)
def test_clipping_traces_into_the_step_and_equals_eager(clip):
    data = batches(5, seed=4)
    m1, o1 = make("SGD", dict(lr=0.5, momentum=0.9))
    want = eager_steps(m1, o1, data, clip=clip)
    m2, o2 = make("SGD", dict(lr=0.5, momentum=0.9))
    step = TrainStep(m2, o2, clip=clip)
    got = []
    for out in (
        [step(af.tensor(x), af.tensor(y)) for x, y in data[:3]]
        + list(step.run(data[3:4]))
        + list(step.run(data[4:], fused=True))
    ):
        got += [float(v) for v in out] if isinstance(out, (tuple, list)) else [float(out)]
    assert got == want
    same_params(m1, m2)


# -- gradient clipping against PyTorch -----------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, "inf", -math.inf, 3.0, 0.5, 0.0])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
@pytest.mark.parametrize("with_grad", [1, 2])  # (one: the norm of one norm)
def test_clip_grad_norm_matches_pytorch(norm_type, max_norm, with_grad):
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(s) for s in ((3, 4), (4,), (2, 2))]
    grads[0][0, :2] = 0.0  # (order 0 counts the others)
    ps = [af.zeros(g.shape, dtype="float64", requires_grad=True) for g in grads]
    tps = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, tp, g in zip(
        ps[:with_grad], tps[:with_grad], grads[:with_grad], strict=True
    ):  # the rest have none
        p.grad, tp.grad = af.tensor(g), torch.tensor(g)
    total = nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
    want = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type, foreach=False)
    np.testing.assert_allclose(total.numpy(), want.numpy(), rtol=1e-12)
    assert total.shape == () and total.dtype == af.float64
    for p, tp in zip(ps[:with_grad], tps[:with_grad], strict=True):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)
    assert all(p.grad is None for p in ps[with_grad:])


def test_clip_grad_value_and_the_edge_cases_match_pytorch():
    g = np.array([[-2.0, 0.5], [0.05, 3.0]])
    p, tp = af.zeros(2, 2, requires_grad=True), torch.zeros(2, 2, requires_grad=True)
    p.grad, tp.grad = af.tensor(g, dtype="float32"), torch.tensor(g, dtype=torch.float32)
    nn.utils.clip_grad_value_(p, 0.1)
    torch.nn.utils.clip_grad_value_(tp, 0.1)
    assert np.array_equal(p.grad.numpy(), tp.grad.numpy())
    grad = p.grad
    nn.utils.clip_grad_norm_([p], 0.01)  # in place, as PyTorch's
    assert p.grad is grad
    assert float(nn.utils.clip_grad_norm_([af.zeros(2, requires_grad=True)], 1.0)) == 0.0
    p.grad = af.tensor([[np.inf, 1.0], [0.0, 0.0]])
    with pytest.raises(RuntimeError, match="non-finite|is inf.*error_if_nonfinite=False"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    with pytest.raises(TypeError, match="parameters must be tensors"):
        nn.utils.clip_grad_norm_([1.0], 1.0)


def test_a_schedule_and_clipping_in_a_graph_step_on_cuda_equal_cpu(cuda):
    from cuda_fixtures import CUDA, assert_same

    def train(device):
        af.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(8, 16, device=device), nn.Tanh(), nn.Linear(16, 3, device=device)
        )
        opt = optim.RMSprop(model.parameters(), lr=0.01, momentum=0.5)
        s = sched.OneCycleLR(opt, 0.05, total_steps=6)
        step = TrainStep(model, opt, clip=(2.0, 0.5))
        out = []
        for x, y in batches(5, seed=6):
            out += [
                float(v) for v in step(af.tensor(x, device=device), af.tensor(y, device=device))
            ]
            s.step()
        return out, [p.numpy() for p in model.parameters()], len(step._compiled)

    got, params, compiled = train(CUDA)
    want, want_params, _ = train("cpu")
    assert compiled == 1
    assert_same(np.float32(got), np.float32(want), exact=False)  # (float32 losses)
    for p, q in zip(params, want_params, strict=True):
        assert_same(p, q, exact=False)


def test_a_flag_state_is_made_and_loaded_on_its_parameters_device(cuda):
    """SGD's ``started`` flag (dampening) is made where its parameter is, and loaded there
    (a flag on the cpu beside a cuda parameter failed the step)."""
    runs = {}
    for dev in ("cpu", "cuda:0"):
        p = af.nn.Parameter(af.tensor(np.arange(3, dtype=np.float32), device=dev))
        opt = af.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5)
        for _ in range(2):
            p.grad = af.tensor(np.ones(3, np.float32), device=dev)
            opt.step()
            assert opt.state[p]["started"].device == p.device
            opt.load_state_dict(opt.state_dict())
            assert opt.state[p]["started"].device == p.device
        runs[dev] = p.numpy()
    assert np.array_equal(runs["cpu"], runs["cuda:0"])


def test_settle_waits_for_every_pending_step_and_raises_the_first_error():
    """``Optimizer._settle``: every pending wait (a pipeline's step running elsewhere) is
    waited for, the first error raised once all were, the later ones in its notes; the
    asking pipeline's own is left pending; a Ctrl-C keeps the waits not reached yet."""
    opt = af.optim.SGD([af.nn.Parameter(af.zeros(2))], lr=0.1)
    calls = []

    class Pipe:
        def __init__(self, name, error=None):
            self.name, self.error = name, error

        def stepped(self):
            calls.append(self.name)
            opt._waiting(self.stepped, False)
            if self.error is not None:
                raise self.error

    a, b, c = Pipe("a", RuntimeError("a failed")), Pipe("b", ValueError("b failed")), Pipe("c")
    for p in (a, b, c):
        opt._waiting(p.stepped, True)
    with pytest.raises(RuntimeError, match="a failed") as e:
        opt._settle(c.stepped)
    assert calls == ["a", "b"] and "b failed" in "".join(e.value.__notes__)
    assert [w() for w in opt._waits] == [c.stepped]  # (the asking pipeline's own)
    d = Pipe("d", KeyboardInterrupt())
    opt._waiting(d.stepped, True)
    opt._waiting(a.stepped, True)
    a.error = None
    with pytest.raises(KeyboardInterrupt):
        opt._settle()
    assert [w() for w in opt._waits] == [a.stepped]  # (c waited for, d raised, a kept)
    opt._settle()
    assert calls == ["a", "b", "c", "d", "a"] and opt._waits == ()
    # an error, then Ctrl-C: the error noted on it; the asking pipeline's own wait kept once
    a.error, b.error = ValueError("a failed again"), KeyboardInterrupt()
    for p in (a, b, c, d):
        opt._waiting(p.stepped, True)
    d.error = None
    with pytest.raises(KeyboardInterrupt) as e:
        opt._settle(c.stepped)
    if hasattr(e.value, "__notes__"):  # (Python 3.11+)
        assert "a failed again" in "".join(e.value.__notes__)
    assert [w() for w in opt._waits] == [c.stepped, d.stepped]
