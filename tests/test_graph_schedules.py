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
    if kind == "onecycle":                              # cycles the momentum (beta1)
        return sched.OneCycleLR(opt, max_lr=[0.2, 0.1], total_steps=steps, pct_start=0.3)
    warm = sched.LinearLR(opt, start_factor=0.1, total_iters=3)      # warm-up, then cosine
    return sched.SequentialLR(opt, [warm, sched.CosineAnnealingLR(opt, T_max=steps - 3)],
                              milestones=[3])


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
@pytest.mark.parametrize("name,kw,kind", [("SGD", dict(lr=0.1, momentum=0.9), "onecycle"),
                                          ("Adam", dict(lr=0.01), "onecycle"),
                                          ("SGD", dict(lr=0.1), "warmup-cosine")])
def test_a_per_batch_schedule_inside_runs_over_a_loader_equals_eager(
        monkeypatch, name, kw, kind, fused):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((24, 8)).astype(np.float32), rng.integers(0, 3, 24)
    data = [(x[i:i + 6], y[i:i + 6]) for i in range(0, 24, 6)] * 2     # 2 epochs of 4
    m1, o1 = make(name, kw, groups=True)
    s1 = schedule(o1, kind, 8)
    want, after = [], []
    for epoch in range(2):
        want += eager_steps(m1, o1, data[4 * epoch:4 * epoch + 4], s1)
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
        break                               # the source made pieces ahead: set back
    k = s2.last_epoch
    assert 1 <= k <= 8
    m1, o1 = make("SGD", dict(lr=0.1, momentum=0.9), groups=True)
    s1 = schedule(o1, "onecycle", 8)
    eager_steps(m1, o1, data[:k], s1)
    same_params(m1, m2)
    same_schedule(s1, o1, s2, o2)


def test_lr_sch_is_checked():
    m, o = make("SGD", dict(lr=0.1))
    _, other = make("SGD", dict(lr=0.1))
    with pytest.raises(ValueError, match="lr_sch \\(StepLR\\) schedules another optimizer"):
        Step(m, o, sched.StepLR(other, 2))
    with pytest.raises(TypeError, match="lr_sch must be a learning-rate scheduler.*got str"):
        Step(m, o, "cosine")
    with pytest.raises(TypeError, match="got SGD"):     # a torch-like object is refused
        Step(m, o, optim.SGD(m.parameters(), lr=0.1))


def test_a_per_batch_schedule_in_a_run_on_cuda_equals_cpu(cuda):
    from cuda_fixtures import CUDA, assert_same

    def train(device, fused):
        af.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16, device=device), nn.Tanh(),
                              nn.Linear(16, 3, device=device))
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        s = sched.OneCycleLR(opt, 0.3, total_steps=8)
        step = Step(model, opt, s)
        data = batches(4, seed=6)
        out = [float(v) for v in step.run(data, fused=fused)]
        out += [float(v) for v in step.run(data, fused=fused)]
        return out, [p.numpy() for p in model.parameters()], s.get_last_lr()
    want, want_params, want_lr = train("cpu", False)
    for fused in (False, True):
        got, params, lr = train(CUDA, fused)
        assert lr == want_lr
        assert_same(got, want, exact=False)
        for p, q in zip(params, want_params):
            assert_same(p, q, exact=False)
