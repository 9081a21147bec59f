"""Per-batch schedules in nn.Graph (``add_optimizer(opt, lr_sch=...)``): the graph steps
the scheduler once after every step, so ``step()`` equals an eager loop ``opt.step();
sched.step()`` and inside one ``run()`` piece k trains with step k's rates (carried with
the piece from the run's source side), bit for bit: losses, parameters, the scheduler's
and the groups' state, over epochs of a DataLoader or a list, fused or not, compiled once."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.data import DataLoader, TensorDataset
from actorflow.optim import lr_scheduler as sched
from test_optim import batches, counting, eager_steps, make, same_params

pytestmark = pytest.mark.timeout(120)


class Step(nn.Graph):
    def __init__(self, model, opt, lr_sch=None):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=lr_sch)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def schedule(opt, kind, steps):
    if kind == "onecycle":  # cycles the momentum (beta1)
        return sched.OneCycleLR(opt, max_lr=[0.2, 0.1], total_steps=steps, pct_start=0.3)
    warm = sched.LinearLR(opt, start_factor=0.1, total_iters=3)  # warm-up, then cosine
    return sched.SequentialLR(
        opt, [warm, sched.CosineAnnealingLR(opt, T_max=steps - 3)], milestones=[3]
    )


def rates(opt):
    return [{k: g[k] for k in opt.scheduled} for g in opt.param_groups]


def same_schedule(s1, o1, s2, o2):
    assert s2.last_epoch == s1.last_epoch
    assert s2.get_last_lr() == s1.get_last_lr()
    assert rates(o2) == rates(o1)


def test_step_steps_the_scheduler_as_an_eager_loop():
    data = batches(20, seed=1)
    m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s1 = schedule(o1, "onecycle", 20)
    want = eager_steps(m1, o1, data, s1)
    m2, o2 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s2 = schedule(o2, "onecycle", 20)
    step = Step(m2, o2, s2)
    got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data]
    assert got == want
    same_params(m1, m2)
    same_schedule(s1, o1, s2, o2)
    assert len(step._compiled) == 1


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    "name,kw,kind",
    [
        ("SGD", dict(lr=0.1, momentum=0.9), "onecycle"),
        ("Adam", dict(lr=0.01), "onecycle"),
        ("SGD", dict(lr=0.1), "warmup-cosine"),
    ],
)
def test_a_per_batch_schedule_inside_runs_over_a_loader_equals_eager(
    monkeypatch, name, kw, kind, fused
):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((24, 8)).astype(np.float32), rng.integers(0, 3, 24)
    data = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 24, 6)] * 2  # 2 epochs of 4
    m1, o1 = make(name, kw, groups=True)
    s1 = schedule(o1, kind, 8)
    want, after = [], []
    for epoch in range(2):
        want += eager_steps(m1, o1, data[4 * epoch : 4 * epoch + 4], s1)
        after.append((s1.last_epoch, s1.get_last_lr(), rates(o1)))
    compiles = counting(monkeypatch, "stateful_program" if fused else "stateful_graph")
    m2, o2 = make(name, kw, groups=True)
    s2 = schedule(o2, kind, 8)
    step = Step(m2, o2, s2)
    loader = DataLoader(TensorDataset(x, y), batch_size=6)
    got = []
    for epoch in range(2):
        got += [float(v) for v in step.run(loader, fused=fused)]
        assert (s2.last_epoch, s2.get_last_lr(), rates(o2)) == after[epoch]
    assert got == want
    same_params(m1, m2)
    same_schedule(s1, o1, s2, o2)
    assert len(compiles) == 1


@pytest.mark.parametrize("fused", [False, True])
def test_a_per_batch_schedule_over_a_list_then_steps_equals_eager(fused):
    data = batches(10, seed=5)
    m1, o1 = make("Adam", dict(lr=0.01), groups=True)
    s1 = schedule(o1, "warmup-cosine", 12)
    want = eager_steps(m1, o1, data, s1)
    m2, o2 = make("Adam", dict(lr=0.01), groups=True)
    s2 = schedule(o2, "warmup-cosine", 12)
    step = Step(m2, o2, s2)
    got = [float(v) for v in step.run(data[:4], fused=fused)]
    got += [float(v) for v in step.run(data[4:8], fused=fused)]
    got += [step(af.tensor(x), af.tensor(y)).item() for x, y in data[8:]]
    assert got == want
    same_params(m1, m2)
    same_schedule(s1, o1, s2, o2)


@pytest.mark.parametrize("fused", [False, True])
def test_a_run_stopped_early_leaves_the_schedule_at_the_pieces_it_trained(fused):
    data = batches(8, seed=7)
    m2, o2 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s2 = schedule(o2, "onecycle", 8)
    step = Step(m2, o2, s2)
    for _ in step.run(data, fused=fused):
        break  # the source made pieces ahead: set back
    k = s2.last_epoch
    assert 1 <= k <= 8
    m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s1 = schedule(o1, "onecycle", 8)
    eager_steps(m1, o1, data[:k], s1)
    same_schedule(s1, o1, s2, o2)
    if fused:  # (as below: a whole number of pieces written)
        same_params(m1, m2)


def test_lr_sch_is_checked():
    m, o = make("SGD", dict(lr=0.1))
    _, other = make("SGD", dict(lr=0.1))
    with pytest.raises(ValueError, match="lr_sch \\(StepLR\\) schedules another optimizer"):
        Step(m, o, sched.StepLR(other, 2))
    with pytest.raises(TypeError, match="lr_sch must be a learning-rate scheduler.*got str"):
        Step(m, o, "cosine")
    with pytest.raises(TypeError, match="got SGD"):  # a torch-like object is refused
        Step(m, o, optim.SGD(m.parameters(), lr=0.1))


@pytest.mark.parametrize("source", ["list", "cuda tensors", "loader", "cuda loader"])
def test_a_per_batch_schedule_in_a_run_on_cuda_equals_cpu(cuda, source):
    from cuda_fixtures import CUDA, assert_same

    data = batches(4, seed=6, b=6)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])

    def train(device, fused, source):
        af.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(8, 16, device=device), nn.Tanh(), nn.Linear(16, 3, device=device)
        )
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        s = sched.OneCycleLR(opt, 0.3, total_steps=8)
        step = Step(model, opt, s)
        feed = {
            "list": data,
            "loader": DataLoader(TensorDataset(x, y), batch_size=6),
            "cuda loader": DataLoader(TensorDataset(x, y), batch_size=6, device=CUDA),
            "cuda tensors": [
                (af.tensor(a, device=CUDA), af.tensor(b, device=CUDA)) for a, b in data
            ],
        }.get(source)
        out = [float(v) for _ in range(2) for v in step.run(feed, fused=fused)]
        return out, [p.numpy() for p in model.parameters()], s.get_last_lr()

    want, want_params, want_lr = train("cpu", False, "list")
    for fused in (False, True):
        got, params, lr = train(CUDA, fused, source)
        assert lr == want_lr
        assert_same(np.float32(got), np.float32(want), exact=False)  # (float32 losses)
        for p, q in zip(params, want_params, strict=True):
            assert_same(p, q, exact=False)


class TwoOptimizers(nn.Graph):
    def __init__(self, model, scheduled, sch, free):
        super().__init__()
        self.model = model
        self.add_optimizer(scheduled, lr_sch=sch)
        self.add_optimizer(free)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def test_the_rate_of_an_optimizer_without_a_scheduler_changed_in_a_run_stops_it():
    m, _ = make("SGD", dict(lr=0.1))
    o1 = optim.SGD(m[0].parameters(), lr=0.1, momentum=0.9)
    o2 = optim.Adam(m[2].parameters(), lr=0.01)
    step = TwoOptimizers(m, o1, sched.OneCycleLR(o1, 0.3, total_steps=12), o2)
    assert len(list(step.run(batches(6)))) == 6  # the scheduled one: no change seen
    with pytest.raises(af.TraceError, match=r"lr_sch=...\) to step it per batch"):
        for _ in step.run(batches(6)):
            o2.param_groups[0]["lr"] = 0.5


@pytest.mark.parametrize("fused", [False, True])
def test_a_failed_run_leaves_the_schedule_at_the_pieces_it_trained(fused):
    data = batches(6, seed=8)
    data[3] = (data[3][0], np.full(6, 7))  # piece 3: a class out of range
    m2, o2 = make("Adam", dict(lr=0.01), groups=True)
    s2 = schedule(o2, "onecycle", 8)
    step = Step(m2, o2, s2)
    with pytest.raises(af.ActorError):
        list(step.run(data, fused=fused))
    k = s2.last_epoch  # the pieces written back: 3 fused; not fused, the
    assert k == 3 if fused else k <= 3  # run may stop before the pieces before it finish
    m1, o1 = make("Adam", dict(lr=0.01), groups=True)
    s1 = schedule(o1, "onecycle", 8)
    eager_steps(m1, o1, data[:k], s1)
    same_schedule(s1, o1, s2, o2)
    if fused:  # (not fused, a stopped run's state writers may
        same_params(m1, m2)  # have written part of a piece: ActorGraph's way)


def test_a_loaders_last_smaller_batch_goes_on_with_the_schedule():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((20, 8)).astype(np.float32), rng.integers(0, 3, 20)
    data = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 20, 6)] * 2  # 3 whole, 1 of 2
    m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s1 = schedule(o1, "warmup-cosine", 8)
    want = eager_steps(m1, o1, data, s1)
    m2, o2 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s2 = schedule(o2, "warmup-cosine", 8)
    step = Step(m2, o2, s2)
    loader = DataLoader(TensorDataset(x, y), batch_size=6)
    got = [float(v) for _ in range(2) for v in step.run(loader)]
    assert got == want
    same_params(m1, m2)
    same_schedule(s1, o1, s2, o2)


def torch_loop(model, name, kw, data, **sch):
    """PyTorch's eager loop on a copy of ``model`` (one Linear): its parameters, momentum
    buffers and the momenta its steps used."""
    import torch

    w = torch.tensor(model.weight.numpy(), requires_grad=True)
    b = torch.tensor(model.bias.numpy(), requires_grad=True)
    opt = getattr(torch.optim, name)([w, b], **kw)
    s = torch.optim.lr_scheduler.OneCycleLR(opt, **sch)
    used = []
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(torch.tensor(x) @ w.T + b, torch.tensor(y)).backward()
        used.append(opt.param_groups[0]["momentum"])
        opt.step()
        s.step()
    return (
        [w.detach().numpy(), b.detach().numpy()],
        [opt.state[p]["momentum_buffer"].numpy() for p in (w, b)],
        used,
    )


@pytest.mark.parametrize("how", ["step", "run", "run-fused"])
@pytest.mark.parametrize(
    "name,kw",
    [
        ("SGD", dict(lr=0.1, momentum=0.9)),
        ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3)),
        ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
        ("RMSprop", dict(lr=0.01, momentum=0.5)),
    ],
)
def test_a_momentum_scheduled_through_0_keeps_the_buffer_as_pytorch(monkeypatch, name, kw, how):
    pytest.importorskip("torch")
    data = batches(10, seed=9)
    sch = dict(max_lr=0.3, total_steps=10, base_momentum=0.0, max_momentum=0.9)
    af.manual_seed(0)
    m = nn.Linear(8, 3)
    want, bufs, used = torch_loop(m, name, kw, data, **sch)
    assert 0.0 in used and used[0] > 0  # (a step with momentum 0, a buffer)
    compiles = counting(monkeypatch, "stateful_graph" if how == "run" else "stateful_program")
    o = getattr(optim, name)(m.parameters(), **kw)
    step = Step(m, o, sched.OneCycleLR(o, **sch))
    if how == "step":
        for x, y in data:
            step(af.tensor(x), af.tensor(y))
    else:
        assert len(list(step.run(data, fused=how == "run-fused"))) == 10
    assert len(compiles) == 1
    for p, w, buf in zip(m.parameters(), want, bufs, strict=True):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(o.state[p]["momentum_buffer"].numpy(), buf, rtol=1e-5, atol=1e-6)


def eager_until_the_schedule_fails(data):
    m, o = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s = sched.OneCycleLR(o, [0.3, 0.2], total_steps=4)
    with pytest.raises(ValueError, match="past total_steps=4"):
        eager_steps(m, o, data, s)  # 5 steps, then the 5th step() fails
    return m, o, s


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("source", ["list", "loader"])
def test_a_scheduler_failing_in_a_run_fails_after_the_pieces_eager_trains(fused, source):
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((42, 8)).astype(np.float32), rng.integers(0, 3, 42)
    data = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 42, 6)]
    m1, o1, s1 = eager_until_the_schedule_fails(data)
    assert (s1.last_epoch, s1._step_count) == (5, 6)
    m2, o2 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s2 = sched.OneCycleLR(o2, [0.3, 0.2], total_steps=4)
    feed = data if source == "list" else DataLoader(TensorDataset(x, y), batch_size=6)
    got = []
    with pytest.raises(ValueError, match="past total_steps=4"):  # the scheduler's own
        for v in Step(m2, o2, s2).run(feed, fused=fused):
            got.append(float(v))
    k = s2.last_epoch
    if source == "list":  # the 5 pieces eager trained
        assert len(got) == k == 5
    else:  # (a loader's next batch failed: those before it that trained)
        assert len(got) <= k <= 5
    if k < 5:
        m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
        s1 = sched.OneCycleLR(o1, [0.3, 0.2], total_steps=4)
        eager_steps(m1, o1, data[:k], s1)
    same_schedule(s1, o1, s2, o2)
    assert s2._step_count == s1._step_count
    if fused or k == 5:  # (not fused, a stopped run may have written part of a piece)
        same_params(m1, m2)
