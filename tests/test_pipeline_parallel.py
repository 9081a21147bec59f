"""Pipeline parallelism (nn.Graph(stages=..., micro_batches=M)): a batch cut into
micro-batches flowing through the stages' forward and backward actors trains as one eager
step on the whole batch; the registers bound what each stage holds for its backward and
give 1F1B's order (GPipe's when every micro-batch may be held); a failing stage stops the
batch without touching the parameters."""

import functools
import itertools
import json
import pickle
import warnings

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.errors import ActorError, PlanError
from actorflow.nn import pipeline_links
from test_global_training import _cnn

WIDTHS = [8, 16, 12, 3]  # stage i: Linear(WIDTHS[i], WIDTHS[i+1]) (+ Tanh but the last)


def stages_of(n, seed=0):
    """The model cut into ``n`` stages (2 or 3): the same weights for a given seed."""
    af.manual_seed(seed)
    layers = [
        nn.Sequential(nn.Linear(WIDTHS[0], WIDTHS[1]), nn.Tanh()),
        nn.Sequential(nn.Linear(WIDTHS[1], WIDTHS[2]), nn.Tanh()),
        nn.Linear(WIDTHS[2], WIDTHS[3]),
    ]
    if n == 2:
        return [nn.Sequential(layers[0], layers[1]), layers[2]]
    return layers


def params_of(stages):
    return [p for s in stages for p in s.parameters()]


def make_opt(name, params):
    return optim.SGD(params, lr=0.1, momentum=0.9) if name == "SGD" else optim.Adam(params, lr=1e-2)


class Pipe(nn.Graph):
    def __init__(self, stages, opt=None, **kw):
        super().__init__(stages=stages, **kw)
        self.loss = nn.MSELoss()
        if opt is not None:
            self.add_optimizer(opt)

    def build(self, out, y):
        return self.loss(out, y)


def data(batches, rows=16, seed=1):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((rows, WIDTHS[0])).astype(np.float32),
            rng.standard_normal((rows, WIDTHS[-1])).astype(np.float32),
        )
        for _ in range(batches)
    ]


def eager_steps(stages, opt, batches, after=None):
    """One eager step per batch on the whole batch, one process: the reference (``after``:
    called after each step, a scheduler's ``step``)."""
    model = nn.Sequential(*stages)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = nn.MSELoss()(model(af.tensor(x)), af.tensor(y))
        loss.backward()
        opt.step()
        if after is not None:
            after()
        losses.append(loss.item())
    return losses


def order_1f1b(k, m):
    """1F1B's order of acts on a stage allowed ``k`` micro-batches in flight: ``k``
    forwards (warm-up), then one backward and one forward in turn, then the backwards."""
    w = min(k, m)
    out = [f"F{j}" for j in range(w)]
    for j in range(m):
        out.append(f"B{j}")
        if w + j < m:
            out.append(f"F{w + j}")
    return out


def per_stage(acts, n):
    return [[f"{kind}{mb}" for s, kind, mb in acts if s == i] for i in range(n)]


def held_counts(acts, n):
    """Per stage, the most micro-batches forwarded and not yet backwarded, counted from the
    order of acts."""
    peak, now = [0] * n, [0] * n
    for s, kind, _ in acts:
        now[s] += {"F": 1, "B": -1}.get(kind, 0)  # (a weights act "W": nothing held)
        peak[s] = max(peak[s], now[s])
    return peak


# -- training equals one process --------------------------------------------------------


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("n", [2, 3])
def test_pipeline_trains_as_one_eager_step_on_the_whole_batch(n, opt_name):
    batches = data(4)
    ref = stages_of(n)
    want = eager_steps(ref, make_opt(opt_name, params_of(ref)), batches)
    stages = stages_of(n)
    g = Pipe(stages, make_opt(opt_name, params_of(stages)), micro_batches=4)
    got = [float(g.step(af.tensor(x), af.tensor(y))) for x, y in batches[:2]]  # step()
    got += [float(loss) for loss in g.run(batches[2:])]  # run(): a batch per item
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in params_of(stages))  # (the graph's own)


def test_uneven_micro_batches_weigh_each_micro_batch_mean_equally():
    ((x, y),) = data(1, rows=10)  # 10 rows in 4: 3, 3, 2, 2 (np.array_split)
    ref = stages_of(2)
    model = nn.Sequential(*ref)
    opt = optim.SGD(params_of(ref), lr=0.1)
    parts = np.array_split(np.arange(10), 4)
    losses = [nn.MSELoss()(model(af.tensor(x[p])), af.tensor(y[p])) for p in parts]
    want = (losses[0] + losses[1] + losses[2] + losses[3]) * 0.25
    want.backward()
    opt.step()
    stages = stages_of(2)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4)
    got = float(g.step(x, y))
    np.testing.assert_allclose(got, float(want), rtol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-7)


def test_a_run_with_a_last_smaller_batch_and_a_single_stage():
    batches = data(2) + data(1, rows=6, seed=5)  # the last batch: another layout
    ref = stages_of(2)
    want = eager_steps(ref, optim.SGD(params_of(ref), lr=0.1), batches)
    stages = stages_of(2)
    one = nn.Sequential(*stages)  # one stage: gradient accumulation over micro-batches
    g = Pipe([one], optim.SGD(params_of(stages), lr=0.1), micro_batches=2)
    got = [float(loss) for loss in g.run(batches)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


def test_a_dataloader_and_a_scheduler_stepped_once_per_batch():
    from actorflow.data import DataLoader, TensorDataset

    rows = np.concatenate([x for x, _ in data(3)]), np.concatenate([y for _, y in data(3)])
    ref = stages_of(2)
    opt = optim.SGD(params_of(ref), lr=0.2)
    sch = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    batches = [(rows[0][i : i + 16], rows[1][i : i + 16]) for i in (0, 16, 32)]
    want = eager_steps(ref, opt, batches, after=sch.step)
    stages = stages_of(2)
    opt2 = optim.SGD(params_of(stages), lr=0.2)
    g = Pipe(stages, micro_batches=4)
    g.add_optimizer(opt2, lr_sch=optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5))
    loader = DataLoader(TensorDataset(*rows), batch_size=16, workers=2)
    got = [float(v) for v in g.run(loader)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5**3)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [("cuda:0", "cuda:0"), ("cpu", "cuda:0")])
def test_stages_on_a_cuda_device_train_as_on_the_cpu(emu, devices):
    """On the CUDA emulator: each stage on its parameters' device (the registers between
    them on the host), the same training as one eager process on the cpu."""
    emu()
    batches = data(2)
    ref = stages_of(2)
    want = eager_steps(ref, optim.Adam(params_of(ref), lr=1e-2), batches)
    stages = [s.to(d) for s, d in zip(stages_of(2), devices, strict=True)]
    g = Pipe(stages, optim.Adam(params_of(stages), lr=1e-2), micro_batches=4)
    got = [float(loss) for loss in g.run(batches)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        assert str(b.device) in devices
        np.testing.assert_allclose(b.cpu().numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


# -- the order of acts and what each stage holds -----------------------------------------


def seeded_batch(g, seed, trace=None):
    """One batch under a seeded serial schedule, forwards taking 1 and backwards 2
    simulated seconds: the order of acts then follows from the registers and tokens."""
    g.pipelined.sim_time = (1.0, 2.0)
    with af.testing.seeded(seed):
        return [float(v) for v in g.run(data(1), trace=trace)]


@pytest.mark.parametrize("n,m", [(2, 4), (3, 4), (3, 8)])
@pytest.mark.parametrize("seed", [0, 3])
def test_default_registers_give_1f1b(n, m, seed, tmp_path):
    stages = stages_of(n)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=m)
    seeded_batch(g, seed, trace=tmp_path / "run.json")
    got = per_stage(g.pipelined.acts, n)
    for i in range(n):
        assert got[i] == order_1f1b(n - i, m), f"stage {i}"
    assert held_counts(g.pipelined.acts, n) == [min(n - i, m) for i in range(n)]
    assert g.pipelined.peak_held == [min(n - i, m) for i in range(n)]
    # the run's trace says the same order, act by act
    evs = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    acts = sorted(
        (e["ts"], names[e["tid"]], e["args"]["piece"])
        for e in evs
        if e.get("cat") == "act" and names.get(e.get("tid"), "").startswith("stage")
    )
    from_trace = []
    for _, name, piece in acts:
        stage, kind = name.split(".")
        s = int(stage[len("stage") :])
        from_trace += [(s, k, piece) for k in {"forward": "F", "backward": "B"}.get(kind, "FB")]
    assert from_trace == g.pipelined.acts


@pytest.mark.parametrize("n", [2, 3])
def test_every_micro_batch_held_degenerates_to_gpipe(n):
    m = 4
    stages = stages_of(n)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=m, stage_buffers=[m] * n)
    seeded_batch(g, 1)
    got = per_stage(g.pipelined.acts, n)
    gpipe = [f"F{j}" for j in range(m)] + [f"B{j}" for j in range(m)]
    for i in range(n - 1):  # (the last stage's act is its forward and backward at once)
        assert got[i] == gpipe, f"stage {i}"
    assert g.pipelined.peak_held == [m] * (n - 1) + [1]


@pytest.mark.parametrize("buffers", [None, [1, 1, 1], [2, 1, 1], [4, 3, 1], [1, 3, 2]])
def test_a_stage_never_holds_more_than_its_registers(buffers, tmp_path):
    """On threads (no schedule imposed), over several batches: what each stage holds,
    counted from its acts, in micro-batches and in saved bytes, and its forward and
    backward never acting at once (the stage's token), from the trace."""
    m, rows = 6, 12
    stages = stages_of(3)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.05), micro_batches=m, stage_buffers=buffers)
    k = buffers or [3, 2, 1]
    w, size = WIDTHS, rows // m
    one = [size * (w[i] + w[i + 1]) * 4 for i in range(3)]  # (see the test below)
    for x, y in data(3, rows=rows):
        trace = tmp_path / "run.json"
        list(g.run([(x, y)], trace=trace))
        counted = held_counts(g.pipelined.acts, 3)
        assert all(c <= b for c, b in zip(counted, k, strict=True)), (counted, k)
        assert all(c <= b for c, b in zip(g.pipelined.peak_held, k, strict=True))
        assert all(s <= b * o for s, b, o in zip(g.pipelined.peak_saved_bytes, k, one, strict=True))
        assert sorted(g.pipelined.acts) == sorted(
            (s, kind, j) for s in range(3) for kind in "FB" for j in range(m)
        )
        evs = json.loads(trace.read_text())["traceEvents"]
        names = {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
        for i in range(3):
            spans = sorted(
                (e["ts"], e["ts"] + e["dur"])
                for e in evs
                if e.get("cat") == "act" and names[e["tid"]].startswith(f"stage{i}.")
            )
            assert len(spans) == (2 * m if i < 2 else m)
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert start >= end - 1e-3, f"stage {i}: two acts at once"


@pytest.mark.parametrize("buffers", [None, [4, 4, 4], [2, 2, 1]])
def test_peak_saved_activations_per_stage_equal_the_plan(buffers):
    """Stage i holds k_i micro-batches at its peak; each saves its Linear's input and its
    Tanh's output (the last stage: its Linear's input and the loss's difference), counted
    by hand here: the peak of saved bytes is k_i times that."""
    m, rows = 4, 16
    size = rows // m
    stages = stages_of(3)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=m, stage_buffers=buffers)
    seeded_batch(g, 2)
    k = [min(b, m) for b in (buffers or [3, 2, 1])]
    k[-1] = 1  # (the last stage's forward and backward are one act)
    w = WIDTHS
    one = [size * (w[0] + w[1]) * 4, size * (w[1] + w[2]) * 4, size * (w[2] + w[3]) * 4]
    assert g.pipelined.peak_held == k
    assert g.pipelined.peak_saved_bytes == [ki * b for ki, b in zip(k, one, strict=True)]


# -- errors -------------------------------------------------------------------------------


class Fails(nn.Module):
    """Raises on the forward of micro-batch ``at`` in training mode (counted per call; the
    graph runs each stage once in eval mode on one row to learn its output's layout)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.at + 1:
                return self.fail(x)
        return x

    def fail(self, x):
        raise ValueError("this stage failed")


def test_a_failing_stage_names_itself_and_the_micro_batch_and_updates_nothing():
    stages = stages_of(3)
    bad = Fails(at=2)
    stages[1] = nn.Sequential(stages[1], bad)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4)
    before = [p.numpy().copy() for p in params_of(stages)]
    (x, y), later = data(2)
    with pytest.raises(ActorError) as e:
        g.step(x, y)
    assert e.value.actor == "stage1.forward" and e.value.piece == 2
    assert isinstance(e.value.original, ValueError)
    for a, p in zip(before, params_of(stages), strict=True):
        assert np.array_equal(a, p.numpy())
        assert p.grad is None
    # the next batch trains as usual
    bad.at = -1
    assert np.isfinite(float(g.step(*later)))
    after = [p.numpy() for p in params_of(stages)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


class SpoilsItsBackward(nn.Module):
    """On micro-batch ``at`` (in training mode) writes over a tensor its own backward
    reads, so that backward raises."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        h = x * 1.0
        y = h * h
        if self.training:
            self.calls += 1
            if self.calls == self.at + 1:
                with af.no_grad():
                    h.add_(1.0)
        return y


def test_a_failing_backward_names_itself_and_updates_nothing():
    stages = stages_of(3)
    stages[1] = nn.Sequential(stages[1], SpoilsItsBackward(at=1))
    g = Pipe(stages, optim.Adam(params_of(stages), lr=0.1), micro_batches=4)
    before = [p.numpy().copy() for p in params_of(stages)]
    with pytest.raises(ActorError) as e:
        g.step(*data(1)[0])
    assert e.value.actor == "stage1.backward" and e.value.piece == 1
    assert "modified" in str(e.value.original), e.value.original
    for a, p in zip(before, params_of(stages), strict=True):
        assert np.array_equal(a, p.numpy())
        assert p.grad is None


def test_a_failing_loss_names_the_last_stage():
    class BadLoss(Pipe):
        def build(self, out, y):
            return out  # not a one-element loss

    stages = stages_of(2)
    g = BadLoss(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2)
    with pytest.raises(ActorError, match="one-element") as e:
        g.step(*data(1)[0])
    assert e.value.actor == "stage1.forward_backward" and e.value.piece == 0


def test_more_micro_batches_than_rows_is_refused():
    stages = stages_of(2)
    g = Pipe(stages, micro_batches=8)
    x, y = data(1, rows=5)[0]
    with pytest.raises(ValueError, match=r"x has 5 rows .* micro_batches=8"):
        g.step(x, y)
    with pytest.raises(ValueError, match="rest leaf 0 has shape"):
        g.step(np.zeros((8, WIDTHS[0]), np.float32), y)


SHARED = nn.Linear(2, 2)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(stages=[]), "non-empty list of modules"),
        (dict(stages=[nn.Linear(2, 2), "relu"]), "stage 1 is a str"),
        (dict(stages=[nn.Linear(2, 2)], micro_batches=0), "micro_batches=0"),
        (
            dict(stages=[nn.Linear(2, 2), nn.Linear(2, 2)], stage_buffers=[1]),
            "one whole number >= 1 per stage",
        ),
        (dict(micro_batches=4), "give stages="),
        (dict(stages=[SHARED, nn.Sequential(nn.Tanh(), SHARED)]), "in stage 0 and in stage 1"),
    ],
)
def test_bad_pipeline_arguments_are_refused(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        nn.Graph(**kw)


def test_run_options_of_a_traced_step_are_refused():
    g = Pipe(stages_of(2), micro_batches=2)
    with pytest.raises(PlanError, match=r"run\(fused=True\)"):
        next(iter(g.run(data(1), fused=True)))


# -- what build applies, frozen stages ----------------------------------------------------


class HeadPipe(nn.Graph):
    """A pipeline whose build applies a head (a module in no stage) to the last stage's
    output; the optimizer holds the stages' and the head's parameters."""

    def __init__(self, stages, head, **kw):
        super().__init__(stages=stages, **kw)
        self.head, self.loss = head, nn.MSELoss()
        self.add_optimizer(optim.SGD(params_of(stages) + list(head.parameters()), lr=0.1))

    def build(self, out, y):
        return self.loss(self.head(out), y)


def test_a_head_applied_in_build_steps_on_each_batch_gradient_only():
    batches = data(3)

    def model():
        layers = stages_of(3)
        return layers[:2], layers[2]  # two stages, the last Linear as build's head

    ref_stages, ref_head = model()
    ref_params = params_of(ref_stages) + list(ref_head.parameters())
    want = eager_steps(ref_stages + [ref_head], optim.SGD(ref_params, lr=0.1), batches)
    stages, head = model()
    g = HeadPipe(stages, head, micro_batches=2)
    got = [float(g.step(x, y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(ref_params, params_of(stages) + list(head.parameters()), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in head.parameters())


def test_a_failed_batch_leaves_no_gradient_on_builds_head():
    layers = stages_of(3)
    bad = Fails(at=1)  # the last stage fails on micro-batch 1, after 0's backward
    stages, head = [layers[0], nn.Sequential(layers[1], bad)], layers[2]
    g = HeadPipe(stages, head, micro_batches=2)
    before = [p.numpy().copy() for p in head.parameters()]
    with pytest.raises(ActorError) as e:
        g.step(*data(1)[0])
    assert e.value.actor == "stage1.forward_backward" and e.value.piece == 1
    for a, p in zip(before, head.parameters(), strict=True):
        assert np.array_equal(a, p.numpy())
        assert p.grad is None


def eager_sgd(model_stages, batches):
    params = [p for p in params_of(model_stages) if p.requires_grad]
    return eager_steps(model_stages, optim.SGD(params, lr=0.1), batches)


def test_a_frozen_first_stage_trains_the_others_as_one_process():
    batches = data(2)
    ref = stages_of(3)
    for p in ref[0].parameters():
        p.requires_grad_(False)
    want = eager_sgd(ref, batches)
    stages = stages_of(3)
    for p in stages[0].parameters():
        p.requires_grad_(False)
    trained = [p for p in params_of(stages) if p.requires_grad]
    g = Pipe(stages, optim.SGD(trained, lr=0.1), micro_batches=2)
    got = [float(g.step(x, y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


class Cut(nn.Module):
    """Keeps the first 4 columns; ``detach``: of its input detached (its output does not
    require grad), else of a parameter (its output does not depend on its input)."""

    def __init__(self, detach):
        super().__init__()
        self.detach = detach
        self.w = nn.Parameter(af.ones(4))

    def forward(self, x):
        if self.detach:
            return x.detach()[:, :4]
        return x[:, :4].detach() * 0.0 + self.w


@pytest.mark.parametrize("detach", [True, False])
def test_a_stage_whose_output_is_not_made_from_its_input(detach):
    """The gradient sent to the stage before is zeros shaped as that stage's output (16
    columns), not as this stage's (4)."""
    batches = data(2)

    def model():
        layers = stages_of(3)
        return [layers[0], Cut(detach), nn.Linear(4, WIDTHS[-1])]

    ref = model()
    want = eager_sgd(ref, batches)
    stages = model()
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2)
    got = [float(g.step(x, y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


def test_global_stages_are_refused_with_what_to_do():
    place = af.placement("cpu", ranks=2)
    stages = stages_of(2)
    stages[1].to_global(place)
    with pytest.raises(NotImplementedError, match=r"stage 1's parameter 'weight'.*keep each"):
        Pipe(stages, micro_batches=2)
    stages = stages_of(2)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2)
    stages[0].to_global(place, af.sbp.split(0))  # made global after the graph
    with pytest.raises(NotImplementedError, match=r"stage 0's parameter '0.0.weight'"):
        g.step(*data(1)[0])
    for s in stages:
        s.to("cpu")  # local again: it trains
    assert np.isfinite(float(g.step(*data(1)[0])))


# -- stages on process ranks: each stage computes in a worker process of its own ---------

processes = pytest.mark.timeout(60)


def on_process_ranks(stages, which=None):
    """Each stage in ``which`` (default all) made global on a one-rank placement of its
    own under process ranks: the recipe ``stage_ranks="processes"`` follows."""
    with af.parallel.use_ranks("processes"):
        for i, s in enumerate(stages):
            if which is None or i in which:
                s.to_global(af.placement("cpu", ranks=[i]))
    return stages


def workers_of(stages):
    """Per stage, its ranks (None for a local stage)."""
    out = []
    for s in stages:
        p = next(iter(s.parameters()))
        out.append(p._impl.blob.ranks if p.is_global else None)
    return out


def ended(pids):
    import os

    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:  # (a zombie not reaped yet has ended too)
            if f.read().split(") ")[1][0] != "Z":
                return False
    return True


@processes
@pytest.mark.parametrize("how", ["stage_ranks", "to_global", "only the last"])
def test_stages_on_process_ranks_train_as_one_process(how):
    batches = data(3)
    ref = stages_of(2)
    want = eager_steps(ref, optim.SGD(params_of(ref), lr=0.1, momentum=0.9), batches)
    stages = stages_of(2)
    kw = {}
    if how == "stage_ranks":
        kw["stage_ranks"] = "processes"
    else:
        on_process_ranks(stages, None if how == "to_global" else {1})
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1, momentum=0.9), micro_batches=4, **kw)
    ranks = workers_of(stages)
    try:
        assert all(
            isinstance(r, af.parallel.ProcessRanks) for r in ranks[1 if how[0] == "o" else 0 :]
        )
        got = [float(g.step(*batches[0]))] + [float(v) for v in g.run(batches[1:])]
        # another process's BLAS: equal within float rounding
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(params_of(ref), params_of(stages), strict=True):
            assert b.is_global == (
                how != "only the last" or any(b is q for q in stages[1].parameters())
            )
            assert b.grad is None
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
        held = [r for r in ranks if r is not None]
        pids = [pid for r in held for pid in r.pids]
        assert len(set(pids)) == len(held) and all(pid is not None for pid in pids)
    finally:
        if how == "stage_ranks":
            g.pipelined.close()  # the stages back here, their workers ended
        else:
            for r in ranks:
                if r is not None:
                    r.close()
    assert ended(pids)
    if how == "stage_ranks":
        assert not any(p.is_global for p in params_of(stages))
        for a, b in zip(params_of(ref), params_of(stages), strict=True):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
        assert np.isfinite(float(g.step(*data(1, seed=7)[0])))  # on threads again


def test_single_rank_stages_on_inline_ranks_train_as_one_process():
    """The same stages on inline ranks (each rank's part a tensor of this process): the
    reference the process ranks are the parallel form of."""
    batches = data(2)
    ref = stages_of(2)
    want = eager_steps(ref, optim.Adam(params_of(ref), lr=1e-2), batches)
    stages = stages_of(2)
    for i, s in enumerate(stages):
        s.to_global(af.placement("cpu", ranks=[i]))
    g = Pipe(stages, optim.Adam(params_of(stages), lr=1e-2), micro_batches=4)
    assert [type(r).__name__ for r in g.pipelined.ranks] == ["InlineRanks"] * 2
    got = [float(v) for v in g.run(batches)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_of(ref), params_of(stages), strict=True):
        assert b.is_global and b.grad is None
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


@processes
@pytest.mark.parametrize("n,m", [(2, 4), (3, 4)])
def test_stages_on_process_ranks_keep_1f1b(n, m):
    stages = stages_of(n)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=m, stage_ranks="processes")
    try:
        seeded_batch(g, 0)
        got = per_stage(g.pipelined.acts, n)
        for i in range(n):
            assert got[i] == order_1f1b(n - i, m), f"stage {i}"
        assert g.pipelined.peak_held == [min(n - i, m) for i in range(n)]
        # on threads, unseeded, no simulated times: never more than the registers allow
        g.pipelined.sim_time = None
        list(g.run(data(2)))
        counted = held_counts(g.pipelined.acts, n)
        assert all(c <= min(n - i, m) for i, c in enumerate(counted)), counted
    finally:
        g.pipelined.close()


class GathersBadly(nn.Module):
    """Gathers column 99 of each input row that holds NaN (the index is checked by the
    kernel, in the worker holding the stage), adding nothing to the others: the
    micro-batch whose rows a test made NaN (``poisoned``) fails there, in a compiled act as
    in an eager one."""

    def forward(self, x):
        idx = (x != x).to(af.int64) * 99
        return x + af.gather(x, 1, idx) * 0.0


def poisoned(x, mb, m):
    """The batch ``x`` with micro-batch ``mb``'s rows (of ``m``) NaN."""
    x = x.copy()
    rows = len(x)
    x[mb * rows // m : (mb + 1) * rows // m] = np.nan
    return x


def held_in(ex, key, outs):
    """(Run in a worker) how many micro-batches stage ``key`` holds, and its gradients."""
    from actorflow.creation import from_numpy

    st = ex.kept[key]
    grads = sum(p.grad is not None for p in st.params)
    ex.parts[outs[0]] = from_numpy(np.array([len(st.fifo), grads], dtype=np.int64))._impl


@processes
@pytest.mark.parametrize(
    "ranks,given",
    [(None, "build"), ("processes", "build"), ("processes", "loss")],
    ids=["threads", "processes", "processes-loss="],
)
def test_a_failed_batch_leaves_the_stages_buffers_as_they_were(ranks, given):
    """Batch norm after an op that fails on micro-batch 1: the failed batch's kernel error
    no longer poisons the running statistics, nor do micro-batch 0's updates stay: the next
    batch trains as if the failed one never ran (its statistics bit for bit)."""
    (x, y), (x2, y2) = data(2)
    got = []
    for fail in (False, True):
        af.manual_seed(0)
        stages = [
            nn.Sequential(stages_of(2)[0], GathersBadly(), nn.BatchNorm1d(12)),
            nn.Linear(12, 3),
        ]
        cls = LossPipe if given == "loss" else Pipe
        g = cls(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4, stage_ranks=ranks)
        try:
            if fail:
                with pytest.raises(ActorError):
                    g.step(poisoned(x, 1, 4), y)
            g.step(x2, y2)
        finally:
            g.pipelined.close()
        got.append([b.numpy().copy() for b in stages[0][2].buffers()])
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a, b)


class Ema(nn.Module):
    """Replaces its buffer with a new tensor on each forward in training mode."""

    def __init__(self, n):
        super().__init__()
        self.register_buffer("ema", af.zeros(n))

    def forward(self, x):
        if self.training:
            self.ema = self.ema * 0.9 + x.detach().mean(0) * 0.1
        return x


def test_a_failed_batch_sets_back_a_buffer_the_forward_replaced():
    (x, y), (x2, y2) = data(2)
    stages = [nn.Sequential(stages_of(2)[0], Ema(12), GathersBadly()), nn.Linear(12, 3)]
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4)
    g.step(x2, y2)
    before = stages[0][1].ema.numpy().copy()
    with pytest.raises(ActorError):
        g.step(poisoned(x, 1, 4), y)
    assert np.array_equal(stages[0][1].ema.numpy(), before)


class WritesWhen(nn.Module):
    """Adds its input's mean into a buffer while ``on`` (a buffer some batches write)."""

    def __init__(self, n):
        super().__init__()
        self.on = False
        self.register_buffer("seen", af.zeros(n))

    def forward(self, x):
        if self.on and self.training:
            with af.no_grad():
                self.seen.add_(x.detach().mean(0))
        return x


def test_a_buffer_the_batch_before_did_not_write_is_named_when_a_failed_batch_writes_it():
    """A local stage copies before a batch the buffers the batch before wrote: one written
    for the first time by a failed batch keeps that write, and a warning names it; from
    then on it is copied, and set back."""
    (x, y), (x2, y2) = data(2)
    w = WritesWhen(12)
    stages = [nn.Sequential(stages_of(2)[0], w, GathersBadly()), nn.Linear(12, 3)]
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4)
    g.step(x2, y2)  # (the graph's first batch: every buffer copied; this one not written)
    g.step(x2, y2)
    w.on = True
    with pytest.warns(RuntimeWarning, match=r"WritesWhen\.seen .*keep what the failed batch"):
        with pytest.raises(ActorError):
            g.step(poisoned(x, 1, 4), y)
    kept = w.seen.numpy().copy()  # (micro-batches 0 and 1 wrote it: their rows' means)
    assert not np.array_equal(kept, np.zeros(12, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ActorError):
            g.step(poisoned(x, 1, 4), y)
    assert np.array_equal(w.seen.numpy(), kept, equal_nan=True)  # (copied: set back)


@processes
def test_a_stage_in_a_worker_whose_forward_replaces_a_buffer_is_refused():
    stages = [nn.Sequential(stages_of(2)[0], Ema(12)), nn.Linear(12, 3)]
    g = LossPipe(stages, micro_batches=2, stage_ranks="processes")
    try:
        with pytest.raises(ActorError) as e:
            g.step(*data(1)[0])
        assert "replaces its tensor 'ema' with a new one" in str(e.value)
        assert "writes a buffer in place" in str(e.value)
    finally:
        g.pipelined.close()


class DoesNotPickle:
    def __reduce__(self):
        raise TypeError("this attribute does not pickle")


@processes
def test_a_batch_that_fails_before_its_acts_sets_no_buffer_back():
    """A stage that no longer pickles fails the batch at its start: the other stages'
    buffers keep what the batch before wrote (none of it is undone)."""
    batches = data(3)
    got = []
    for fail in (False, True):
        af.manual_seed(0)
        stages = [stages_of(2)[0], nn.Sequential(nn.BatchNorm1d(12), nn.Linear(12, 3))]
        g = LossPipe(
            stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes"
        )
        try:
            g.step(*batches[0])
            if fail:
                stages[0].bad = DoesNotPickle()
                with pytest.raises(TypeError, match="does not pickle"):
                    g.step(*batches[1])
                del stages[0].bad
            g.step(*batches[2])
        finally:
            g.pipelined.close()
        got.append([b.numpy().copy() for b in stages[1][0].buffers()])
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a, b)


@processes
def test_an_error_in_a_stages_worker_is_the_stages_actor_error():
    from actorflow.errors import IndexOutOfBoundsError

    stages = stages_of(2)
    stages[0] = nn.Sequential(stages[0], GathersBadly())
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4, stage_ranks="processes")
    try:
        e = failed_batch_then_trains(g, stages, 2, 4)
        assert e.actor == "stage0.forward" and e.piece == 2
        assert isinstance(e.original, IndexOutOfBoundsError), e.original
        assert "out of bounds" in str(e.original)
    finally:
        g.pipelined.close()


def failed_batch_then_trains(g, stages, mb, m):
    """A batch whose micro-batch ``mb`` (of ``m``) fails (its rows NaN, a ``GathersBadly``
    among the stages): its ActorError, once checked that nothing was updated and the
    workers hold nothing of it, and that the next batch trains."""
    before = [p.numpy().copy() for p in params_of(stages)]
    (x, y), later = data(2)
    with pytest.raises(ActorError) as e:
        g.step(poisoned(x, mb, m), y)
    for a, p in zip(before, params_of(stages), strict=True):
        assert np.array_equal(a, p.numpy())
        assert p.grad is None
    for w in g.pipelined._workers:  # (nothing of the failed batch held there)
        (part,) = w.ranks.call_fn(0, held_in, (w.key,), (af.int64,))
        assert w.ranks.read(0, part).tolist() == [0, 0]
    assert np.isfinite(float(g.step(*later)))  # the workers go on: the next batch trains
    after = [p.numpy() for p in params_of(stages)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    return e.value


@processes
def test_a_stages_worker_killed_is_the_stages_actor_error():
    import os
    import signal

    stages = stages_of(2)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        assert np.isfinite(float(g.step(*data(1)[0])))
        ranks = workers_of(stages)
        os.kill(ranks[1].pids[0], signal.SIGKILL)
        with pytest.raises(ActorError) as e:
            g.step(*data(1)[0])
        assert e.value.actor.startswith("stage1."), e.value.actor
        assert "rank 0 of placement(type='cpu', ranks=[1])" in str(e.value), e.value
        assert "SIGKILL" in str(e.value)
    finally:
        for r in workers_of(stages):
            if r is not None:
                r.close()
    assert ended(ranks[0].pids)


def test_global_stages_other_than_one_rank_each_are_refused():
    stages = stages_of(2)
    for s in stages:
        s.to_global(af.placement("cpu", ranks=[0]))  # (inline ranks: nothing starts)
    with pytest.raises(NotImplementedError, match=r"stages 0 and 1 are both on .*of its own"):
        Pipe(stages, micro_batches=2)
    stages = stages_of(2)
    stages[1].to_global(af.placement("cpu", ranks=[1]), af.sbp.split(0))
    with pytest.raises(NotImplementedError, match=r"stage 1's parameter 'weight'.*broadcast"):
        Pipe(stages, micro_batches=2)
    stages = stages_of(2)
    with pytest.raises(ValueError, match="stage 1 is global already"):
        stages[1].to_global(af.placement("cpu", ranks=[5]))
        Pipe(stages, micro_batches=2, stage_ranks="processes")
    with pytest.raises(ValueError, match="stage_ranks='yes'"):
        Pipe(stages_of(2), micro_batches=2, stage_ranks="yes")
    with pytest.raises(ValueError, match="stage_ranks='processes'"):
        nn.Graph(stage_ranks="processes")


def issued_to(ranks_list, record):
    """Wraps each ranks' ``_issue`` to append ``(stage, kind, function name)`` to
    ``record``; returns a function undoing it."""
    from actorflow.parallel import workers as W

    undo = []
    for i, r in enumerate(ranks_list):
        orig = r._issue

        def issue(rank, cmd, *rest, i=i, orig=orig):
            name = getattr(cmd[1], "__name__", None) if cmd[0] == W.RUN else None
            record.append((i, W.NAMES[cmd[0]], name))
            return orig(rank, cmd, *rest)

        r._issue = issue
        undo.append(lambda r=r: r.__dict__.pop("_issue"))
    return lambda: [u() for u in undo]


@processes
def test_a_stage_on_process_ranks_runs_each_act_as_one_command_in_its_worker():
    """Each forward and backward act is one RUN in the stage's worker (with the put of its
    input and the read of its output), whatever the micro-batch count: the only ops sent op
    by op are the optimizer's, once per batch."""
    stages = stages_of(2)
    g2 = None
    try:
        on_process_ranks(stages)
        g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1, momentum=0.9), micro_batches=2)
        g.step(*data(1)[0])  # (the stages defined in their workers, the momentum made)
        calls = {}
        for m in (2, 4):
            g2 = Pipe(stages, optim.SGD(params_of(stages), lr=0.1, momentum=0.9), micro_batches=m)
            g2.step(*data(1)[0])
            record = []
            undo = issued_to(workers_of(stages), record)
            try:
                g2.step(*data(1, seed=m)[0])
            finally:
                undo()
            runs = [(i, f) for i, kind, f in record if kind == "RUN"]
            for i in range(2):
                assert [f for j, f in runs if j == i] == (
                    ["_start"] + sorted_acts(record, i) + ["_finish"]
                )
                assert sum(1 for j, f in runs if j == i and f == "_forward") == m
                assert sum(1 for j, f in runs if j == i and f == "_backward") == m
            calls[m] = [sum(1 for j, k, _ in record if j == i and k == "CALL") for i in range(2)]
        sizes = [len(list(s.parameters())) for s in stages]
        # (SGD with momentum: a few in-place ops per parameter, none per micro-batch)
        assert calls[2] == calls[4] and all(
            0 < c <= 4 * k for c, k in zip(calls[2], sizes, strict=True)
        ), calls
        assert [type(w).__name__ for w in g2.pipelined._workers] == ["RankStage"] * 2
    finally:
        for r in workers_of(stages):
            if r is not None:
                r.close()


def sorted_acts(record, stage):
    """The stage's forward and backward RUNs in the order they were issued."""
    return [f for j, kind, f in record if j == stage and f in ("_forward", "_backward")]


@processes
def test_stages_in_workers_follow_the_modules_changes_between_batches():
    """What a batch's stage computes with is the module here at that batch: a frozen
    parameter, a layer replaced, values loaded with load_state_dict, eval mode; each as the
    same change made to one process's model."""
    batches = data(4)
    ref, stages = stages_of(2), stages_of(2)
    ref_opt = optim.SGD(params_of(ref), lr=0.1)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    fresh = stages_of(2, seed=5)

    def change(k, s):
        if k == 1:
            s[0][0][0].bias.requires_grad_(False)
        elif k == 2:
            s[0][0][1] = nn.ReLU()
        elif k == 3:
            s[1].load_state_dict(fresh[1].state_dict())

    try:
        for k, (x, y) in enumerate(batches):
            change(k, ref)
            change(k, stages)
            want = eager_steps(ref, ref_opt, [(x, y)])[0]
            got = float(g.step(x, y))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            for a, b in zip(params_of(ref), params_of(stages), strict=True):
                np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
        bias = stages[0][0][0].bias
        assert bias.grad is None and not bias.requires_grad
        np.testing.assert_array_equal(bias.numpy(), ref[0][0][0].bias.numpy())
    finally:
        g.pipelined.close()


class Counts(nn.Module):
    """Counts its training-mode calls; refuses eval mode on more than one row (so the
    worker's copy says which mode it runs in; the layouts are found here on one row)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        elif x.shape[0] > 1:
            raise RuntimeError("Counts ran in eval mode on a micro-batch")
        return x


@processes
def test_eval_mode_reaches_the_worker_and_attributes_it_changes_stay_there():
    stages = stages_of(2)
    c = Counts()
    stages[1] = nn.Sequential(stages[1], c)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        g.step(*data(1)[0])
        assert c.calls == 0  # the forward ran on the worker's copy
        stages[1].eval()
        with pytest.raises(ActorError, match="Counts ran in eval mode"):
            g.step(*data(1)[0])
        stages[1].train()
        assert np.isfinite(float(g.step(*data(1)[0])))
    finally:
        g.pipelined.close()


class Head(Pipe):
    """build applies a head of this process to the last stage's output."""

    def __init__(self, stages, head, opt, **kw):
        super().__init__(stages, opt, **kw)
        self.head = head

    def build(self, out, y):
        return self.loss(self.head(out), y)


@processes
def test_a_head_in_build_and_saved_bytes_with_stages_in_workers():
    """The last stage's output is read back and build runs here: a head module of this
    process trains with the stages in workers as on threads; each stage's saved bytes per
    micro-batch held (measured in its worker) are the threads' (stages 0 and 1 of 3; the
    last stage's loss is computed here, outside the worker's count)."""
    x, y = data(1)[0]
    y = y[:, :2]
    runs = {}
    for procs in (False, True):
        stages = stages_of(3)
        af.manual_seed(3)
        head = nn.Linear(WIDTHS[-1], 2)
        opt = optim.Adam(params_of(stages) + list(head.parameters()), lr=1e-2)
        g = Head(stages, head, opt, micro_batches=4, stage_ranks="processes" if procs else None)
        try:
            losses = [float(g.step(x, y)) for _ in range(2)]
            runs[procs] = (
                losses,
                [p.numpy() for p in params_of(stages) + list(head.parameters())],
                list(g.pipelined.peak_saved_bytes),
                list(g.pipelined.peak_held),
            )
            assert all(p.grad is None for p in head.parameters())
        finally:
            g.pipelined.close()
    (l0, p0, s0, h0), (l1, p1, s1, h1) = runs[False], runs[True]
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6)
    for a, b in zip(p0, p1, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    # (how many micro-batches a stage held at its peak depends on timing, within its
    # registers: the bytes each one saves are the same on threads and in workers)
    assert all(v > 0 for v in s1) and all(0 < h <= 3 - i for i, h in enumerate(h1)), (s1, h1)
    assert [s0[i] / h0[i] for i in (0, 1)] == [s1[i] / h1[i] for i in (0, 1)], (s0, h0, s1, h1)


class Unpicklable(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = lambda t: t * 2

    def forward(self, x):
        return self.act(x)


class LoadsOnlyHere(nn.Module):
    """A module whose unpickling fails (in the worker: it is pickled here only)."""

    def forward(self, x):
        return x

    def __setstate__(self, state):
        raise RuntimeError("LoadsOnlyHere cannot be loaded in a worker")


@processes
@pytest.mark.parametrize(
    "bad,error,words",
    [
        (Unpicklable, TypeError, r"stage 1 of 2 \(Sequential\) .* does not pickle"),
        (LoadsOnlyHere, RuntimeError, "stage 1 of 2's module could not be loaded in its worker"),
    ],
)
def test_a_stage_that_does_not_pickle_or_load_is_refused_and_the_graph_goes_on(bad, error, words):
    """A module that does not pickle is refused here (TypeError, what to do); one the
    worker cannot load fails the batch's start there (before any act: the registers'
    layouts are found in the workers); with the module fixed, the graph trains."""
    stages = stages_of(2)
    stages[1] = nn.Sequential(stages[1], bad())
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        with pytest.raises(error, match=words) as e:
            g.step(*data(1)[0])
        if bad is LoadsOnlyHere:  # (the error the loading raised, named)
            assert "LoadsOnlyHere cannot be loaded in a worker" in str(e.value)
        stages[1][1] = nn.Identity()  # (the module changed: sent again, and loads)
        assert np.isfinite(float(g.step(*data(1)[0])))
    finally:
        g.pipelined.close()


@processes
def test_a_worker_forgets_a_stage_once_its_handle_is_dropped():
    stages = stages_of(2)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        g.step(*data(1)[0])
        w = g.pipelined._workers[1]
        key, ranks = w.key, w.ranks
        kept = ranks.call_fn(0, kept_keys, (), (af.int64,))[0]
        assert key in ranks.read(0, kept).tolist()  # the stage is kept under its marker
        w.forget()  # (its marker's handle dropped: the worker forgets the module)
        ranks.synchronize()
        kept = ranks.call_fn(0, kept_keys, (), (af.int64,))[0]
        assert key not in ranks.read(0, kept).tolist()
    finally:
        g.pipelined.close()


def kept_keys(ex, outs):
    """(Run in a worker) the ids its RUNs keep things under, as an int64 part."""
    from actorflow.creation import from_numpy

    ex.parts[outs[0]] = from_numpy(np.array(sorted(ex.kept), dtype=np.int64))._impl


def threads_and_workers(make_stages, batches, graph=None, between=None, m=2):
    """The same stages trained on threads and with ``stage_ranks="processes"``: per way,
    the losses and the parameters after (``between(k, stages)`` before batch k)."""
    out = []
    for ranks in (None, "processes"):
        stages = make_stages()
        opt = optim.SGD(params_of(stages), lr=0.1)
        g = (graph or Pipe)(stages, opt, micro_batches=m, stage_ranks=ranks)
        try:
            losses = []
            for k, b in enumerate(batches):
                if between is not None:
                    between(k, stages)
                losses.append(float(g.step(*b)))
            out.append((losses, [p.numpy().copy() for p in params_of(stages)]))
        finally:
            g.pipelined.close()
    (l0, p0), (l1, p1) = out
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6)
    for a, b in zip(p0, p1, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    return out


class Tied(nn.Module):
    """A weight used by two layers of one stage (tied the usual way, or held in a list)."""

    def __init__(self, how):
        super().__init__()
        self.a, self.b = nn.Linear(WIDTHS[0], WIDTHS[0]), nn.Linear(WIDTHS[0], WIDTHS[1])
        if how == "attribute":
            self.c = nn.Linear(WIDTHS[0], WIDTHS[0])
            self.c.weight = self.a.weight
        else:
            self.c = [self.a]  # (not registered: reached through a list)

    def forward(self, x):
        c = self.c if isinstance(self.c, nn.Module) else self.c[0]
        return af.tanh(self.b(af.tanh(c(af.tanh(self.a(x))))))


@processes
@pytest.mark.parametrize("how", ["attribute", "list"])
def test_a_tensor_a_stage_reaches_twice_is_one_tensor_in_its_worker(how):
    def make():
        af.manual_seed(0)
        return [Tied(how), nn.Linear(WIDTHS[1], WIDTHS[-1])]

    threads_and_workers(make, data(3, rows=8))


class Penalized(Pipe):
    """build adds a penalty on the last stage's weight (a parameter of a stage)."""

    def build(self, out, y):
        w = self.pipelined.stages[-1].weight
        pen = (w * w).sum()
        return self.loss(out, y) + 0.1 * (pen.to_local() if pen.is_global else pen)


@processes
def test_a_stage_parameter_build_uses_too_gets_both_gradients():
    threads_and_workers(lambda: stages_of(2), data(2, rows=8), graph=Penalized)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = {"scale": 1.0}

    def forward(self, x):
        return x * self.cfg["scale"]


@processes
def test_a_module_changed_in_place_is_sent_again_and_only_then():
    """An attribute changed in place (a dict's item: no counter sees it) reaches the worker
    at the next batch; a module made elsewhere (a loss in build) sends nothing again."""

    def make():
        s = stages_of(2)
        return [s[0], nn.Sequential(s[1], Scaled())]

    def between(k, stages):
        if k == 1:
            stages[1][1].cfg["scale"] = 5.0

    threads_and_workers(make, data(3, rows=8), between=between)
    stages = make()
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        record = []
        undo = issued_to(g.pipelined.ranks, record)
        try:
            for b in data(4, rows=8):
                nn.MSELoss()  # (a module made: the process's module counter moves)
                g.step(*b)
            assert sum(1 for _, _, f in record if f == "_define") == 2  # (once a stage)
            stages[1][1].cfg["scale"] = 2.0
            g.step(*data(1, rows=8)[0])
            assert sum(1 for _, _, f in record if f == "_define") == 3  # (stage 1 again)
        finally:
            undo()
    finally:
        g.pipelined.close()


GAIN = 1.0  # (read by ClassScaled.forward)


class ClassScaled(nn.Module):
    """``x * scale * GAIN``: a class attribute and a global of its module."""

    scale = 1.0

    def forward(self, x):
        return x * self.scale * GAIN


@processes
def test_a_class_attribute_and_a_global_a_stage_reads_reach_its_worker():
    """Set on the class, or rebound in its module, between batches: the worker's copy
    computes with the new value from the next batch, as the stages on threads do."""

    def make():
        s = stages_of(2)
        return [s[0], nn.Sequential(s[1], ClassScaled())]

    def between(k, stages):
        global GAIN
        ClassScaled.scale = (1.0, 3.0, 3.0, 3.0)[k]
        GAIN = (1.0, 1.0, 0.5, 0.5)[k]

    global GAIN
    try:
        threads_and_workers(make, data(4, rows=8), between=between)
    finally:
        ClassScaled.scale, GAIN = 1.0, 1.0


def test_a_stage_sends_the_constants_its_classes_read_by_name():
    """What goes to a stage's worker besides its module: the class attributes and globals
    its forward reads that hold constants, its classes named (one made inside a function
    is named by nothing: left out, and the module still pickles)."""
    from actorflow.nn.pipeline_ranks import _shared

    class Local(nn.Module):
        k = 3.0

        def forward(self, x):
            return x * self.k

    shared = _shared(nn.Sequential(nn.Linear(2, 2), ClassScaled(), Local()))
    mod = ClassScaled.__module__
    assert shared == [
        (mod, "ClassScaled", None, "scale", 1.0),
        (mod, "ClassScaled", ("forward", 0), "GAIN", 1.0),  # (where forward reads it)
    ]
    pickle.loads(pickle.dumps(shared))


class Masks(Pipe):
    """Records the last stage's output (read back here) in build."""

    seen: list = []

    def build(self, out, y):
        Masks.seen.append(out.numpy().copy())
        return self.loss(out, y)


@processes
def test_dropout_in_stage_workers_draws_per_stage_and_follows_manual_seed():
    """Two stages of dropout over ones: their masks are drawn from streams of their own
    (the same stream would drop the same elements in both: half the output nonzero, not a
    quarter), and the same again after af.manual_seed."""
    x = np.ones((64, 16), np.float32)

    def run():
        Masks.seen = []
        stages = [nn.Dropout(0.5), nn.Dropout(0.5)]
        g = Masks(stages, None, micro_batches=2, stage_ranks="processes")
        try:
            af.manual_seed(7)
            g.step(x, x)
            g.step(x, x)
        finally:
            g.pipelined.close()
        return np.concatenate(Masks.seen)

    a, b = run(), run()
    np.testing.assert_array_equal(a, b)
    masks = [m != 0 for m in np.split(a, 4)]  # (each micro-batch of each batch: its own)
    assert all(not np.array_equal(p, q) for p, q in itertools.combinations(masks, 2))
    kept = float((a != 0).mean())
    assert 0.18 < kept < 0.32, kept  # (each element kept by both: ~1/4)
    assert set(np.unique(a).tolist()) <= {0.0, 4.0}


@processes
def test_closing_one_pipeline_leaves_anothers_stages_on_the_same_workers():
    a_st, b_st = stages_of(2), stages_of(2, seed=3)
    a = Pipe(a_st, optim.SGD(params_of(a_st), lr=0.1), micro_batches=2, stage_ranks="processes")
    b = Pipe(b_st, optim.SGD(params_of(b_st), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        ranks = a.pipelined.ranks
        assert ranks == b.pipelined.ranks  # (stage i's placement: one worker)
        a.step(*data(1)[0])
        b.step(*data(1)[0])
        a.pipelined.close()
        assert not any(p.is_global for p in params_of(a_st))
        assert np.isfinite(float(b.step(*data(1, seed=4)[0])))  # b's stages still there
        assert all(p.is_global for p in params_of(b_st))
    finally:
        b.pipelined.close()
    assert not any(p.is_global for p in params_of(b_st))
    assert all(r.closed for r in b.pipelined._placed or ranks)  # (the last user ended them)


@processes
def test_a_bad_argument_with_stage_ranks_leaves_the_stages_local():
    stages = stages_of(2)
    with pytest.raises(ValueError, match="stage_buffers"):
        Pipe(stages, micro_batches=2, stage_buffers=[2], stage_ranks="processes")
    stages[1].to_global(af.placement("cpu", ranks=[3]))  # (inline ranks)
    with pytest.raises(ValueError, match="stage 1 is global already"):
        Pipe(stages, micro_batches=2, stage_ranks="processes")
    assert not any(p.is_global for p in stages[0].parameters())  # (nothing moved)
    stages[1].to("cpu")
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        assert np.isfinite(float(g.step(*data(1)[0])))
    finally:
        g.pipelined.close()


def test_ranks_here_is_the_calling_threads_only():
    import threading

    from actorflow.parallel.ranks import ranks_here

    p = af.placement("cpu", ranks=[9])
    seen = []
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(10)
        seen.append(type(af.parallel.ranks_of(p)).__name__)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with ranks_here("inline"):
        inside.set()
        done.wait(10)
    t.join(10)
    assert seen == ["InlineRanks"]
    with pytest.raises(ValueError, match="kind must be one of"):
        ranks_here("gpus")


@processes
def test_close_leaves_workers_that_stages_made_global_by_hand_use():
    """close() ends the workers stage_ranks= started only once nothing lives on them:
    a pipeline made global by hand on the same placements keeps training; a stage
    brought back by hand before close() leaves no worker running."""
    a_st, b_st = stages_of(2), stages_of(2, seed=3)
    a = Pipe(a_st, optim.SGD(params_of(a_st), lr=0.1), micro_batches=2, stage_ranks="processes")
    on_process_ranks(b_st)
    b = Pipe(b_st, optim.SGD(params_of(b_st), lr=0.1), micro_batches=2)
    try:
        assert a.pipelined.ranks == b.pipelined.ranks  # (the same workers)
        a.step(*data(1)[0])
        a.pipelined.close()
        assert np.isfinite(float(b.step(*data(1, seed=4)[0])))  # b's parts still there
        assert not any(r.closed for r in b.pipelined.ranks)
    finally:
        for r in b.pipelined.ranks:
            r.close()
    c_st = stages_of(2)
    c = Pipe(c_st, optim.SGD(params_of(c_st), lr=0.1), micro_batches=2, stage_ranks="processes")
    ranks = c.pipelined.ranks
    c.step(*data(1)[0])
    c_st[1].to("cpu")  # (brought back by hand first)
    c.pipelined.close()
    assert all(r.closed for r in ranks)
    assert ended([pid for r in ranks for pid in r.pids if pid is not None])


class Masked(nn.Module):
    """A stage holding a plain (not registered) tensor its forward uses."""

    def __init__(self):
        super().__init__()
        self.mask = af.tensor(np.array([1.0, 0.0, 1.0], np.float32))

    def forward(self, x):
        return x * self.mask


@processes
def test_a_stage_with_a_plain_tensor_attribute_computes_in_its_worker():
    def make():
        s = stages_of(2)
        return [s[0], nn.Sequential(s[1], Masked())]

    threads_and_workers(make, data(2, rows=8))


@processes
def test_a_stage_whose_tensors_are_on_other_ranks_of_its_placement_is_refused():
    stages = stages_of(2)
    g = Pipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes")
    try:
        g.step(*data(1)[0])
        other = nn.Linear(WIDTHS[2], WIDTHS[3])
        other.to_global(af.placement("cpu", ranks=[1]))  # (inline ranks: the default)
        stages[1].weight = other.weight
        with pytest.raises(NotImplementedError, match="on other ranks than the stage's"):
            g.step(*data(1)[0])
    finally:
        stages[1].weight = nn.Parameter(af.zeros(WIDTHS[3], WIDTHS[2]))
        g.pipelined.close()


def cnn_stages():
    """The models issue's CNN with batch norm (``test_global_training``'s), cut in two
    stages."""
    m = _cnn()
    return [m[:4], m[4:]]


class Classify(nn.Graph):
    def __init__(self, stages, opt, **kw):
        super().__init__(stages=stages, **kw)
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, out, y):
        return self.loss(out, y)


@processes
@pytest.mark.parametrize("ranks", [None, "processes"])
def test_a_cnn_with_batch_norm_trains_pipelined_as_one_process(ranks):
    """The CNN with batch norm over 2 stages, 4 micro-batches (on threads, and each stage
    in a worker process) trains as one process running the same micro-batches in turn,
    each normalized by its own statistics, their gradients added (scaled 1/4) before one
    step: losses, parameters and running statistics."""
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((12, 1, 8, 8)).astype(np.float32), rng.integers(0, 5, 12))
        for _ in range(3)
    ]
    ref = nn.Sequential(*cnn_stages())
    opt = optim.Adam(ref.parameters(), lr=3e-3)
    want = []
    for x, y in batches:
        opt.zero_grad()
        losses = []
        for xs, ys in zip(np.array_split(x, 4), np.array_split(y, 4), strict=True):
            loss = nn.CrossEntropyLoss()(ref(af.tensor(xs)), af.tensor(ys))
            (loss * 0.25).backward()
            losses.append(loss.item())
        opt.step()
        want.append(float(np.mean(losses)))
    stages = cnn_stages()
    g = Classify(
        stages,
        optim.Adam(params_of(stages), lr=3e-3),
        micro_batches=4,
        stage_ranks=ranks,
    )
    try:
        got = [float(v) for v in g.run(batches)]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        mine = {k: v.numpy() for k, v in nn.Sequential(*stages).state_dict().items()}
    finally:
        g.pipelined.close()
    for k, v in ref.state_dict().items():  # (the running statistics too)
        np.testing.assert_allclose(mine[k], v.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


# -- loss=: the last stage computes the loss; on process ranks, the workers run the batch --


class LossPipe(nn.Graph):
    """A pipeline given its loss as ``loss=`` (no build): on process ranks each batch runs
    in the stages' workers among themselves (nn/pipeline_links.py)."""

    def __init__(self, stages, opt=None, loss=None, **kw):
        super().__init__(stages=stages, loss=nn.MSELoss() if loss is None else loss, **kw)
        if opt is not None:
            self.add_optimizer(opt)


def mse_of(out, y):
    """A loss given as a function (at a module's top level: its worker imports it)."""
    return ((out - y) ** 2).mean()


def with_dropout(stages):
    stages[0] = nn.Sequential(stages[0], nn.Dropout(0.25))
    return stages


def check_acts(acts, n, m, buffers, weights=False):
    """Each stage's acts are its forwards and backwards in micro-batch order, each backward
    after its forward, never more micro-batches held than its registers (the last stage:
    its forward then its backward, one act). Where the workers run the batch
    (``weights``), each stage whose input gets a gradient (all but stage 0) has a weights
    act per micro-batch too but the batch's last (its optimizers' step runs that one): in
    micro-batch order, each after its backward, never more than WEIGHT_SLOTS waiting."""
    for i, mine in enumerate(per_stage(acts, n)):
        assert [a for a in mine if a[0] == "F"] == [f"F{j}" for j in range(m)], (i, mine)
        assert [a for a in mine if a[0] == "B"] == [f"B{j}" for j in range(m)], (i, mine)
        if i == n - 1:
            fb = [a for a in mine if a[0] != "W"]
            assert fb == [f"{k}{j}" for j in range(m) for k in "FB"], mine
        ws = [a for a in mine if a[0] == "W"]
        assert ws == ([f"W{j}" for j in range(m - 1)] if weights and i > 0 else []), (i, mine)
        waiting = 0
        for a in mine:
            waiting += {"B": int(weights and i > 0), "W": -1}.get(a[0], 0)
            assert 0 <= waiting <= pipeline_links.WEIGHT_SLOTS, (i, mine)
    counted = held_counts(acts, n)
    assert all(c <= min(buffers[i], m) for i, c in enumerate(counted)), counted


@pytest.mark.parametrize("loss", [nn.MSELoss(), mse_of], ids=["module", "function"])
def test_loss_given_trains_as_build_does_on_threads(loss):
    batches = data(3)
    a, b = stages_of(3), stages_of(3)
    ga = Pipe(a, optim.SGD(params_of(a), lr=0.1, momentum=0.9), micro_batches=4)
    gb = LossPipe(b, optim.SGD(params_of(b), lr=0.1, momentum=0.9), loss=loss, micro_batches=4)
    want = [float(v) for v in ga.run(batches)]
    got = [float(v) for v in gb.run(batches)]
    assert got == want  # (the same ops in the same order: bit for bit)
    for p, q in zip(params_of(a), params_of(b), strict=True):
        assert np.array_equal(p.numpy(), q.numpy())
    check_acts(gb.pipelined.acts, 3, 4, [3, 2, 1])


def _weights_plan(stage, rows, m):
    """The bytes the weights part of a last stage with the MSE loss holds while it waits,
    for micro-batches of ``rows`` rows: the plan of its programs compiled here."""
    from actorflow.nn.stage_programs import StagePrograms

    x = np.zeros((rows, WIDTHS[2]), np.float32)
    y = np.zeros((rows, WIDTHS[3]), np.float32)
    acts = StagePrograms(stage, "stage 1 of 2", 1).of(x, [y], True, nn.MSELoss(), 1.0 / m)
    assert acts.first.weights_bytes == acts.later.weights_bytes
    return acts.first.weights_bytes


def test_a_stages_weights_parts_wait_in_two_registers_and_train_as_at_once():
    """Where the workers run the batch, a stage whose input gets a gradient sends it back
    before computing its parameters' gradients; that part waits in the registers of the
    stage's weights actor (zero-bubble pipelines' B/W split) and runs where nothing else
    is ready, at the batch's end, or (the batch's last) first thing in the stage's
    optimizers' step, in piece order: the gradients accumulate as when each backward act
    computes them at once (stages driven from here), bit for bit. Never more than two
    wait, and their bytes are the plan's: what the part reads."""
    m, rows = 4, 16
    batches = data(2, rows=rows)
    a, b = (
        [s0, nn.Sequential(Busy(100), s1)] for s0, s1 in (stages_of(2), stages_of(2))
    )  # (stage 1's acts ~30 ms each: stage 0's next forward, microseconds, is there first)
    kw = dict(micro_batches=m, stage_ranks="processes")
    ga = Pipe(a, optim.SGD(params_of(a), lr=0.1, momentum=0.9), **kw)
    gb = LossPipe(b, optim.SGD(params_of(b), lr=0.1, momentum=0.9), **kw)
    try:
        want = [float(v) for v in ga.run(batches)]
        got = [float(v) for v in gb.run(batches)]
        assert got == want
        for p, q in zip(params_of(a), params_of(b), strict=True):
            assert np.array_equal(p.numpy(), q.numpy())
        p = gb.pipelined
        check_acts(p.acts, 2, m, [2, 1], weights=True)
        mine = per_stage(p.acts, 2)[1]
        # a part waited: micro-batch j's weights ran after micro-batch j+1's act
        assert any(mine.index(f"W{j}") > mine.index(f"F{j + 1}") for j in range(m - 1)), mine
        assert f"W{m - 1}" not in mine  # (the batch's last part: run by the step)
        assert p.peak_weights_held[0] == 0  # (stage 0: no input gradient, nothing to split)
        assert 1 <= p.peak_weights_held[1] <= pipeline_links.WEIGHT_SLOTS
        # what a part holds: what the plan says it reads (the stage compiled here), at
        # least the Linear's input and its output's gradient
        plan = _weights_plan(nn.Sequential(Busy(1), stages_of(2)[1]), rows // m, m)
        assert plan >= (rows // m) * (WIDTHS[2] + WIDTHS[3]) * 4
        assert p.peak_weights_bytes == [0, p.peak_weights_held[1] * plan]
    finally:
        ga.pipelined.close()
        gb.pipelined.close()


def test_loss_given_is_checked():
    class Both(nn.Graph):
        def __init__(self):
            super().__init__(stages=stages_of(2), loss=nn.MSELoss())

        def build(self, out, y):
            return out.sum()

    with pytest.raises(ValueError, match=r"Both also defines build; give the loss one way"):
        Both()
    with pytest.raises(ValueError, match=r"the loss has parameters.*belongs in the last stage"):
        LossPipe(stages_of(2), loss=nn.Linear(3, 1))
    with pytest.raises(TypeError, match=r"loss=int.*give a module or a function"):
        LossPipe(stages_of(2), loss=3)
    with pytest.raises(ValueError, match=r"loss=\.\.\.\): these cut a pipeline's batches"):
        nn.Graph(loss=nn.MSELoss())
    g = LossPipe(stages_of(2), loss=lambda out, y: (out, y), micro_batches=2)
    with pytest.raises(ActorError) as e:
        g.step(*data(1)[0])
    assert e.value.actor == "stage1.forward_backward"
    assert "the loss given (loss=) returned a tuple" in str(e.value)


@processes
@pytest.mark.parametrize(
    "n,m,buffers", [(2, 4, None), (3, 5, None), (3, 4, [4, 4, 1]), (2, 1, None)]
)
def test_stages_in_workers_run_the_batch_among_themselves(n, m, buffers, tmp_path):
    """With loss= and every stage on process ranks, the workers pass the micro-batches to
    each other: the same training as the actor graph driving them from here (bit for bit:
    the same kernels in the same processes), and as one process (within rounding)."""
    batches = data(3, rows=16)  # (uneven micro-batches where m does not divide 16)
    a, b = with_dropout(stages_of(n)), with_dropout(stages_of(n))
    kw = dict(micro_batches=m, stage_ranks="processes", stage_buffers=buffers)
    ga = Pipe(a, optim.SGD(params_of(a), lr=0.1, momentum=0.9), **kw)
    gb = LossPipe(b, optim.SGD(params_of(b), lr=0.1, momentum=0.9), **kw)
    try:
        af.manual_seed(5)  # (the seeds each stage's dropout draws from, per batch)
        want = [float(v) for v in ga.run(batches)]
        af.manual_seed(5)
        got = [float(v) for v in gb.run(batches, trace=tmp_path / "run.json")]
        assert got == want
        for p, q in zip(params_of(a), params_of(b), strict=True):
            assert np.array_equal(p.numpy(), q.numpy())
            assert q.grad is None
        p = gb.pipelined
        assert p.actor_graph is None  # (no actor graph here: the workers ran the batch)
        # what a stage held for backward: as many micro-batches as it held (how many, at
        # its peak, depends on timing, in both), each the same bytes in both
        a_held, a_bytes = ga.pipelined.peak_held, ga.pipelined.peak_saved_bytes
        assert p.peak_saved_bytes[-1] == a_bytes[-1] > 0
        if 16 % m == 0:
            for i in range(n):
                assert p.peak_saved_bytes[i] * a_held[i] == a_bytes[i] * p.peak_held[i], i
        regs = buffers or [n - i for i in range(n)]
        check_acts(p.acts, n, m, regs, weights=True)
        counted = held_counts(p.acts, n)  # (the last batch's; peak_held: the run's)
        assert all(
            c <= h <= min(regs[i], m)
            for i, (c, h) in enumerate(zip(counted, p.peak_held, strict=True))
        )
        # the last batch's trace: an event per act, on a track per actor as a run's, the
        # order of acts the same as the graph says
        evs = json.loads((tmp_path / "run.2.json").read_text())["traceEvents"]
        tracks = {e["tid"]: e["args"]["name"] for e in evs if e["name"] == "thread_name"}
        want = [f"stage{i}.{k}" for i in range(n - 1) for k in ("backward", "forward")]
        want.append(f"stage{n - 1}.forward_backward")
        want += [f"stage{i}.weights" for i in range(1, n) if m > 1]  # (the last: the step's)
        assert sorted(tracks.values()) == sorted(want)
        acts = [e for e in evs if e["ph"] == "X" and e["cat"] == "act"]
        assert len(acts) == 2 * m * (n - 1) + m + (m - 1) * (n - 1)  # (weights: all but 0)
        assert all(e["dur"] > 0 and e["ts"] >= 0 for e in acts)
        assert all(tracks[e["tid"]] == e["name"] for e in acts)
        from_trace = []
        for e in sorted(acts, key=lambda e: e["ts"]):
            s, kind = int(e["name"][5]), e["name"].split(".")[1]
            from_trace += [
                (s, k, e["args"]["piece"])
                for k in {"forward": "F", "backward": "B", "weights": "W"}.get(kind, "FB")
            ]
        assert from_trace == p.acts
        for i in range(n):  # (a stage's acts and waits do not overlap: one thread runs them)
            mine = sorted(
                (e["ts"], e["ts"] + e["dur"])
                for e in evs
                if e["ph"] == "X" and tracks[e["tid"]].startswith(f"stage{i}.")
            )
            assert all(x[1] <= y[0] + 1e-3 for x, y in itertools.pairwise(mine))
        waits = [e for e in evs if e["ph"] == "X" and e["cat"] == "wait"]
        assert all(tracks[e["tid"]].endswith(("forward", "forward_backward")) for e in waits)
        assert all(e["args"]["cause"] in ("credit", "input") for e in waits)
    finally:
        ga.pipelined.close()
        gb.pipelined.close()


def mse_of_either(out, y):
    """A loss taking its target as an array or as ``{"t": array}`` (doubled then)."""
    return mse_of(out, y["t"] * 2.0 if isinstance(y, dict) else y)


@processes
def test_a_batch_whose_rest_comes_in_another_structure_is_traced_anew():
    """The last stage's compiled act is kept per layout of the rest of the batch, its
    structure included: the same shapes given as a dict compute the loss the dict asks."""
    ((x, y),) = data(1)
    want = []
    for ranks in (None, "processes"):
        stages = stages_of(2)
        g = LossPipe(stages, loss=mse_of_either, micro_batches=2, stage_ranks=ranks)
        try:
            want.append([float(g.step(x, y)), float(g.step(x, {"t": y}))])
        finally:
            g.pipelined.close()
    assert want[1] == want[0] and want[0][0] != want[0][1]


class HalfLinear(nn.Module):
    """A Linear in bfloat16 between float32 edges (``edge``: returns bfloat16 instead)."""

    def __init__(self, a, b, edge=False):
        super().__init__()
        self.lin, self.edge = nn.Linear(a, b).bfloat16(), edge

    def forward(self, x):
        y = self.lin(x.bfloat16())
        return y if self.edge else y.float()


def bfloat16_mse(out, y):
    """A loss in bfloat16 (the last stage's bfloat16 output against bfloat16 targets)."""
    return ((out - y.bfloat16()) ** 2).mean()


@processes
def test_a_bfloat16_loss_in_the_last_stages_worker_is_read_as_its_value():
    batches = data(2)
    got = []
    for ranks in (None, "processes"):
        af.manual_seed(0)
        stages = [stages_of(3)[0], HalfLinear(16, 3, edge=True)]
        g = LossPipe(
            stages,
            optim.SGD(params_of(stages), lr=0.1),
            loss=bfloat16_mse,
            micro_batches=2,
            stage_ranks=ranks,
        )
        try:
            got.append([float(v) for v in g.run(batches)])
        finally:
            g.pipelined.close()
    assert got[1] == got[0] and all(0 < v < 10 for v in got[0]), got


@processes
def test_a_stage_with_bfloat16_parameters_trains_as_on_threads():
    """Its gradients accumulate in bfloat16 as eager backward's do, and come back as the
    bfloat16 parameters' .grad; a bfloat16 tensor at a stage's edge is refused, naming
    the cast."""
    batches = data(2)
    got = []
    for ranks in (None, "processes"):
        af.manual_seed(0)
        stages = [nn.Sequential(HalfLinear(8, 16), nn.Tanh()), stages_of(3)[1:]]
        stages[1] = nn.Sequential(*stages[1])
        g = LossPipe(
            stages,
            optim.SGD(params_of(stages), lr=0.1, momentum=0.9),
            micro_batches=4,
            stage_ranks=ranks,
        )
        try:
            losses = [float(v) for v in g.run(batches)]
        finally:
            g.pipelined.close()
        got.append((losses, [p.float().numpy() for p in params_of(stages)]))
    assert got[1][0] == got[0][0]
    for a, b in zip(got[0][1], got[1][1], strict=True):
        assert np.array_equal(a, b)
    stages = [HalfLinear(8, 12, edge=True), stages_of(3)[1]]
    g = LossPipe(stages, micro_batches=2, stage_ranks="processes")
    try:
        with pytest.raises(ActorError) as e:
            g.step(*batches[0])
        assert e.value.actor == "stage0.forward"
        assert "returns a bfloat16 tensor at its edge" in str(e.value)
        assert ".float() on what it returns" in str(e.value)
    finally:
        g.pipelined.close()


@processes
def test_stages_in_workers_train_as_one_process():
    batches = data(3)
    ref = stages_of(3)
    want = eager_steps(ref, optim.SGD(params_of(ref), lr=0.1, momentum=0.9), batches)
    stages = stages_of(3)
    g = LossPipe(
        stages,
        optim.SGD(params_of(stages), lr=0.1, momentum=0.9),
        micro_batches=4,
        stage_ranks="processes",
    )
    pids = [pid for r in workers_of(stages) for pid in r.pids]
    try:
        got = [float(g.step(*batches[0]))] + [float(v) for v in g.run(batches[1:])]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for p, q in zip(params_of(ref), params_of(stages), strict=True):
            np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-5, atol=1e-6)
    finally:
        g.pipelined.close()
    assert ended(pids)  # (the links between the workers let go too)


@processes
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_error_in_a_worker_running_the_batch_names_its_act(stage):
    from actorflow.errors import IndexOutOfBoundsError

    stages = stages_of(3)
    stages[stage] = nn.Sequential(GathersBadly(), stages[stage])
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4, stage_ranks="processes"
    )
    try:
        e = failed_batch_then_trains(g, stages, 2, 4)
        act = "forward_backward" if stage == 2 else "forward"
        assert e.actor == f"stage{stage}.{act}" and e.piece == 2, e
        assert isinstance(e.original, IndexOutOfBoundsError), e.original
    finally:
        g.pipelined.close()


@processes
@pytest.mark.parametrize("stage", [0, 1])
def test_a_worker_killed_while_the_workers_run_the_batch(stage):
    import os
    import signal

    stages = stages_of(2)
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes"
    )
    try:
        assert np.isfinite(float(g.step(*data(1)[0])))
        ranks = workers_of(stages)
        os.kill(ranks[stage].pids[0], signal.SIGKILL)
        with pytest.raises(ActorError) as e:
            g.step(*data(1)[0])
        assert e.value.actor == f"stage{stage}", e.value.actor
        assert f"rank 0 of placement(type='cpu', ranks=[{stage}])" in str(e.value), e.value
        assert "SIGKILL" in str(e.value)
    finally:
        for r in workers_of(stages):
            if r is not None:
                r.close()
    assert ended(ranks[1 - stage].pids)


class Busy(nn.Module):
    """On every forward, ``k`` products of a 256x256 matrix (a buffer, the identity),
    their result added to the input as zero: a slow stage whose acts compute (a compiled
    act runs no Python, so a sleep would be the trace's alone)."""

    def __init__(self, k):
        super().__init__()
        self.k = k
        self.register_buffer("a", af.tensor(np.eye(256, dtype=np.float32)))

    def forward(self, x):
        t = self.a
        for _ in range(self.k):
            t = t @ self.a
        return x + t[:1, :1] * 0.0


class ToInt(nn.Module):
    def forward(self, x):
        return (x * 0).long()


def _refuse():
    raise ImportError("this loss cannot be loaded here")


class LoadsNowhere:
    """A loss that pickles but does not load in a worker (as a notebook's function)."""

    def __call__(self, out, y):
        return mse_of(out, y)

    def __reduce__(self):
        return (_refuse, ())


@processes
def test_a_loss_that_does_not_load_in_its_worker_stops_the_batch_at_once():
    stages = stages_of(3)
    g = LossPipe(
        stages,
        optim.SGD(params_of(stages), lr=0.1),
        loss=LoadsNowhere(),
        micro_batches=4,
        stage_ranks="processes",
    )
    pids = [pid for r in workers_of(stages) for pid in r.pids]
    before = [p.numpy().copy() for p in params_of(stages)]
    for _ in range(2):  # (the neighbours are told to stop: no wait for them to give up)
        with pytest.raises(ImportError, match="stage 2 of 3's module could not be loaded"):
            g.step(*data(1)[0])
    g.pipelined.close()  # (every worker alive: the stages come back with their values)
    for a, p in zip(before, params_of(stages), strict=True):
        assert not p.is_global and np.array_equal(a, p.numpy())
    assert ended(pids)


@processes
def test_a_slow_batch_of_the_workers_is_waited_for(monkeypatch):
    """Each worker bounds its waits for its neighbours; this process waits for the batch
    as a whole (a batch longer than the ranks' wait, each act shorter, is not given up)."""
    import threading
    import time

    from actorflow.parallel import workers
    from actorflow.parallel.ranks import ProcessRanks

    stages = stages_of(2)
    stages[0] = nn.Sequential(Busy(40), stages[0])
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=8, stage_ranks="processes"
    )
    busy = ProcessRanks.busy
    others: list = []

    def busy_then_asked(self, rank, seconds):
        mark = busy(self, rank, seconds)
        if self is workers_of(stages)[1] and not others:  # (its batch's commands sent)
            others.append(threading.Thread(target=self.synchronize))
            others[0].start()
        return mark

    try:
        assert np.isfinite(float(g.step(*data(1)[0])))  # (compiled, outside the wait below)
        t = time.perf_counter()
        assert np.isfinite(float(g.step(*data(1)[0])))
        batch = time.perf_counter() - t  # (a batch of its compiled acts, here and now)
        monkeypatch.setattr(workers, "WAIT_S", batch / 2)  # (this process's: a batch is more)
        # another thread's request to a worker running the batch (asked once the batch's
        # commands are sent, the worker marked busy) waits for it too
        monkeypatch.setattr(ProcessRanks, "busy", busy_then_asked)
        assert np.isfinite(float(g.step(*data(1)[0])))
        others[0].join()
        assert all(not r.closed for r in workers_of(stages))
    finally:
        monkeypatch.undo()
        g.pipelined.close()


@processes
def test_a_batch_given_up_with_ctrl_c_leaves_the_next_one_right(monkeypatch):
    """Ctrl-C while this process waits for the workers' reports raises at once; the
    workers end that batch by themselves, and the next batch trains as if it never ran."""

    def pipe():
        stages = [nn.Sequential(Busy(10), s) for s in stages_of(3)]
        return stages, LossPipe(
            stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=8, stage_ranks="processes"
        )

    b = data(3)
    ref_stages, ref = pipe()
    try:
        want = [float(ref.step(*b[0])), float(ref.step(*b[2]))]
        want_params = [p.numpy().copy() for p in params_of(ref_stages)]
    finally:
        ref.pipelined.close()
    stages, g = pipe()
    read = pipeline_links.read_report
    later: list = []

    def counted(a):
        later.append(1)
        return read(a)

    def interrupted(a):
        monkeypatch.setattr(pipeline_links, "read_report", counted)
        raise KeyboardInterrupt

    try:
        got = [float(g.step(*b[0]))]
        monkeypatch.setattr(pipeline_links, "read_report", interrupted)
        with pytest.raises(KeyboardInterrupt):
            g.step(*b[1])
        assert later == []  # (raised at once: no other stage's report waited for)
        assert all(p.grad is None for p in params_of(stages))
        links = g.pipelined._links
        assert len(links.in_flight) == 3  # (its reports: waited for by the next batch)
        # a second Ctrl-C while the next batch waits for them: nothing let go too early
        from actorflow.parallel.ranks import ProcessRanks

        read_part = ProcessRanks.read

        def read_interrupted(self, rank, part):
            monkeypatch.setattr(ProcessRanks, "read", read_part)
            raise KeyboardInterrupt

        monkeypatch.setattr(ProcessRanks, "read", read_interrupted)
        with pytest.raises(KeyboardInterrupt):
            g.step(*b[1])
        assert len(links.in_flight) == 3
        assert all(r._busy[0] for r in workers_of(stages))  # (still running that batch)
        got.append(float(g.step(*b[2])))
        assert links.in_flight == [] and all(not r._busy[0] for r in workers_of(stages))
        assert got == want
        for a, p in zip(want_params, params_of(stages), strict=True):
            assert np.array_equal(a, p.numpy())
    finally:
        g.pipelined.close()


@processes
@pytest.mark.parametrize("victim", [0, 1, 2])
def test_a_worker_killed_in_the_middle_of_the_batch_is_its_stages_error(victim, monkeypatch):
    import os
    import signal

    stages = [nn.Sequential(Busy(20), s) for s in stages_of(3)]
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=6, stage_ranks="processes"
    )
    try:
        assert np.isfinite(float(g.step(*data(1)[0])))
        ranks = workers_of(stages)
        confirm = pipeline_links.Links.confirm

        def confirm_then_kill(links, made):  # (the batch's commands are sent, the workers
            confirm(links, made)  # at it: the victim dies with its part of the batch, 6
            os.kill(ranks[victim].pids[0], signal.SIGKILL)  # acts at least, ahead of it)

        monkeypatch.setattr(pipeline_links.Links, "confirm", confirm_then_kill)
        with pytest.raises(ActorError) as e:
            g.step(*data(1)[0])
        assert e.value.actor == f"stage{victim}", e.value
        assert f"ranks=[{victim}])" in str(e.value) and "SIGKILL" in str(e.value), e.value
    finally:
        for r in workers_of(stages):
            if r is not None:
                r.close()


@processes
def test_two_graphs_sharing_stage_workers_step_from_two_threads():
    import threading

    batches = data(6)
    want = []
    for seed in (0, 1):  # (each graph alone, one after the other: the reference)
        s = stages_of(3, seed)
        g = LossPipe(s, optim.SGD(params_of(s), lr=0.1), micro_batches=4, stage_ranks="processes")
        want.append([float(g.step(*b)) for b in batches])
        g.pipelined.close()
    graphs = []
    for seed in (0, 1):  # (the two share the workers of placements [0], [1], [2])
        s = stages_of(3, seed)
        graphs.append(
            LossPipe(s, optim.SGD(params_of(s), lr=0.1), micro_batches=4, stage_ranks="processes")
        )
    got: dict = {}

    def train(i):
        try:
            got[i] = [float(graphs[i].step(*b)) for b in batches]
        except BaseException as e:  # noqa: BLE001 - reported below
            got[i] = e

    threads = [threading.Thread(target=train, args=(i,)) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert got == {0: want[0], 1: want[1]}
    finally:
        for g in graphs:
            g.pipelined.close()


@processes
def test_loss_given_errors_on_process_ranks_name_what_to_change():
    g = LossPipe(
        stages_of(2), loss=lambda out, y: mse_of(out, y), micro_batches=2, stage_ranks="processes"
    )
    try:
        with pytest.raises(TypeError, match=r"loss= \(function\) is sent to the last stage's"):
            g.step(*data(1)[0])
    finally:
        g.pipelined.close()
    stages = stages_of(2)
    stages[0] = nn.Sequential(stages[0], ToInt())
    g = LossPipe(stages, micro_batches=2, stage_ranks="processes")
    try:
        with pytest.raises(ActorError) as e:
            g.step(*data(1)[0])
        assert e.value.actor == "stage1.forward_backward" and e.value.piece == 0
        assert "floating point" in str(e.value)
    finally:
        g.pipelined.close()


@processes
def test_an_error_while_a_batch_is_sent_takes_back_what_was_not_sent(monkeypatch):
    """A batch whose commands could not all be sent takes back those kept (a stage's
    command without its neighbours' would wait for them): the next batch runs at once,
    and no worker is left marked busy."""
    from actorflow.parallel.ranks import ProcessRanks

    stages = stages_of(2)
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=4, stage_ranks="processes"
    )
    call_fn = ProcessRanks.call_fn
    armed = [True]

    def fails_on_stage_1(self, rank, fn, args, dtypes):
        if fn is pipeline_links._run and armed[0] and args[0] == g.pipelined._workers[1].key:
            armed[0] = False
            raise RuntimeError("sending failed")  # (stage 0's command kept, not sent)
        return call_fn(self, rank, fn, args, dtypes)

    try:
        monkeypatch.setattr(ProcessRanks, "call_fn", fails_on_stage_1)
        with pytest.raises(RuntimeError, match="sending failed"):
            g.step(*data(1)[0])
        monkeypatch.undo()
        assert np.isfinite(float(g.step(*data(1)[0])))  # (no stale command waits first)
        assert all(not r._busy[0] for r in workers_of(stages))
    finally:
        monkeypatch.undo()
        g.pipelined.close()


def nothing(ex, outs):
    """(Run in a worker) nothing: a command that only takes its place in the queue."""


def seed_of(ex, key, outs):
    """(Run in a worker) the seed of the last batch stage ``key`` started."""
    from actorflow.creation import from_numpy

    ex.parts[outs[0]] = from_numpy(np.array([ex.kept[key].batch_seed], np.int64))._impl


def _queue_full_before(ranks, rank, call_fn):
    """Commands kept for ``rank`` up to one short of a batch (``ranks.BATCH``): the next
    one issued would send them all, where nothing holds them."""
    from actorflow.parallel import ranks as R

    while len(ranks._pending[rank]) < R.BATCH - 1:
        call_fn(ranks, rank, nothing, (), ())


@processes
@pytest.mark.parametrize("what", ["batch", "step"])
def test_commands_sent_together_are_all_or_none_with_a_full_queue(what, monkeypatch):
    """A batch's commands, and the optimizers' steps after it, go to the stages' workers
    all or none: with stage 0's queue one command short of being sent by itself, its
    command is kept (``HeldRanks.held``) while stage 1's fails to be issued, and taken
    back: stage 0's worker runs no part of that batch, and no step."""
    from actorflow.parallel.ranks import ProcessRanks

    stages = stages_of(2)
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes"
    )
    fn_of = {"batch": pipeline_links._run, "step": pipeline_links._step}[what]
    call_fn = ProcessRanks.call_fn
    armed = [False]

    def full_then_failing(self, rank, fn, args, dtypes):
        if fn is fn_of and armed[0]:
            if args[0] == g.pipelined._workers[0].key:
                _queue_full_before(self, rank, call_fn)
            else:
                armed[0] = False
                raise RuntimeError("sending failed")
        return call_fn(self, rank, fn, args, dtypes)

    try:
        assert np.isfinite(float(g.step(*data(1)[0])))
        g.pipelined._stepped()
        w0 = g.pipelined._workers[0]
        (part,) = w0.ranks.call_fn(0, seed_of, (w0.key,), (af.int64,))
        seed = w0.ranks.read(0, part).tolist()
        before = [p.numpy() for p in params_of(stages)]
        monkeypatch.setattr(ProcessRanks, "call_fn", full_then_failing)
        armed[0] = True
        with pytest.raises(RuntimeError, match="sending failed"):
            g.step(*data(2)[1])
        monkeypatch.undo()
        assert not armed[0]  # (it did fail where meant to)
        (part,) = w0.ranks.call_fn(0, seed_of, (w0.key,), (af.int64,))
        if what == "batch":  # (stage 0 started no batch since)
            assert w0.ranks.read(0, part).tolist() == seed
        else:  # (the batch ran; neither stage stepped)
            for p, a in zip(params_of(stages), before, strict=True):
                assert np.array_equal(p.numpy(), a)
        assert np.isfinite(float(g.step(*data(1)[0])))  # (and the next batch trains)
        g.pipelined._stepped()
    finally:
        monkeypatch.undo()
        g.pipelined.close()


@processes
def test_one_stage_in_a_worker_leaves_no_folder_behind(tmp_path, monkeypatch):
    import glob
    import tempfile

    # (a folder of this test's own: another test running beside it makes links too)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pattern = f"{tmp_path}/actorflow-links-*"
    before = set(glob.glob(pattern))
    stages = [nn.Sequential(*stages_of(2))]
    g = LossPipe(
        stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2, stage_ranks="processes"
    )
    try:
        for _ in range(2):
            assert np.isfinite(float(g.step(*data(1)[0])))
    finally:
        g.pipelined.close()
    assert set(glob.glob(pattern)) == before


class WithUnused(nn.Module):
    """A layer with a parameter its forward never reads (it gets no gradient)."""

    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.unused = nn.Parameter(af.zeros(3))

    def forward(self, x):
        return self.lin(x)


class OwnStep(optim.SGD):
    """An optimizer with a step() of its own: this process runs it."""

    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure)


class RefusingSGD(optim.SGD):
    """SGD whose update raises while ``refuse`` is set (an attribute: its stand-in in a
    stage's worker has it too)."""

    def update(self, p, grad, group, state, writes=optim.optimizer.OUT_OF_PLACE, rates=None):
        if getattr(self, "refuse", False):
            raise RuntimeError("update refused")
        return super().update(p, grad, group, state, writes, rates)


class ScaledSGD(optim.SGD):
    """SGD whose update reads a private attribute that is not plain data (a worker is not
    sent it: stepped here)."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self._scale = np.float32(0.5)

    def update(self, p, grad, group, state, writes=optim.optimizer.OUT_OF_PLACE, rates=None):
        return super().update(p, grad * float(self._scale), group, state, writes, rates)


class WrappedStepSGD(optim.SGD):
    """A step of its own that carries Optimizer.step's name (functools.wraps)."""

    @functools.wraps(optim.optimizer.Optimizer.step)
    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure)


class RefusingAdam(optim.Adam):
    """Adam as RefusingSGD (its counts)."""

    def update(self, p, grad, group, state, writes=optim.optimizer.OUT_OF_PLACE, rates=None):
        if getattr(self, "refuse", False):
            raise RuntimeError("update refused")
        return super().update(p, grad, group, state, writes, rates)


def _steps_stages():
    stages = stages_of(3)
    stages[1] = nn.Sequential(stages[1], WithUnused(WIDTHS[2]))
    stages[0][0].bias.requires_grad_(False)  # (frozen: no gradient, no state)
    return stages


def _opt_of(kind, stages):
    params = params_of(stages)
    if kind == "sgd-cycle":
        return optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "sgd":  # (two groups, dampening's flag, Nesterov's, weight decay)
        return optim.SGD(
            [
                {"params": params[:3], "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3},
                {"params": params[3:], "momentum": 0.8, "nesterov": True},
            ],
            lr=0.05,
        )
    if kind == "adam":  # (its step counts)
        return optim.Adam(params, lr=1e-2, weight_decay=1e-3)
    if kind == "adamw":
        return optim.AdamW(params, lr=1e-2)
    if kind == "rmsprop":
        return optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True)
    return optim.Adagrad(params, lr=1e-2)


@processes
@pytest.mark.parametrize("kind", ["sgd", "sgd-cycle", "adam", "adamw", "rmsprop", "adagrad"])
def test_the_workers_step_the_optimizers_as_this_process_does(kind, monkeypatch):
    """With loss= on process ranks each stage's worker steps the optimizers over its own
    parameters once every report is read: the same losses, parameters and optimizer state
    bit for bit as this process stepping them (``STEP_IN_WORKERS = False``), schedules
    read per batch; a parameter without a gradient (frozen, or unused) gets no state."""
    batches = data(4)
    runs = {}
    sent = []
    send = pipeline_links.send_steps
    monkeypatch.setattr(pipeline_links, "send_steps", lambda *a: sent.append(1) or send(*a))
    import actorflow.nn.pipeline_graph as pg

    monkeypatch.setattr(pg, "send_steps", pipeline_links.send_steps)
    for in_workers in (True, False):
        monkeypatch.setattr(pipeline_links, "STEP_IN_WORKERS", in_workers)
        stages = _steps_stages()
        opt = _opt_of(kind, stages)
        g = LossPipe(stages, micro_batches=4, stage_ranks="processes")
        if kind == "sgd-cycle":  # (its momentum scheduled too, from the second step)
            sch = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=8)
        else:
            sch = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        g.add_optimizer(opt, lr_sch=sch)
        try:
            losses = [float(g.step(*batches[0]))] + [float(v) for v in g.run(batches[1:3])]
            opt.load_state_dict(opt.state_dict())  # (its state in new tensors, new parts)
            losses.append(float(g.step(*batches[3])))
        finally:
            g.pipelined.close()
        state = opt.state_dict()
        runs[in_workers] = (losses, [p.numpy() for p in params_of(stages)], state, opt)
        assert len(sent) == (4 if in_workers else 0)
        sent.clear()
    (la, pa, sa, _), (lb, pb, sb, _) = runs[True], runs[False]
    assert la == lb
    for a, b in zip(pa, pb, strict=True):
        assert np.array_equal(a, b)
    _same_state(sa, sb)  # (the schedule's rates too)
    stages = _steps_stages()
    at = {id(p): i for i, p in enumerate(params_of(stages))}
    frozen, unused = at[id(stages[0][0].bias)], at[id(stages[1][1].unused)]
    if kind == "adagrad":  # (its state made with the optimizer, as PyTorch's: not stepped)
        assert sa["state"][frozen]["step"] == sa["state"][unused]["step"] == 0
    else:
        assert frozen not in sa["state"] and unused not in sa["state"]
        assert len(sa["state"]) == len(at) - 2
    if kind == "adam":
        assert all(st["step"] == 4 for st in sa["state"].values())


@processes
def test_an_optimizer_with_its_own_step_is_stepped_here():
    batches = data(3)
    ref = stages_of(2)
    want = eager_steps(ref, optim.SGD(params_of(ref), lr=0.1, momentum=0.9), batches)
    stages = stages_of(2)
    opt = OwnStep(params_of(stages), lr=0.1, momentum=0.9)
    g = LossPipe(stages, opt, micro_batches=4, stage_ranks="processes")
    try:
        got = [float(v) for v in g.run(batches)]
    finally:
        g.pipelined.close()
    assert opt.calls == 3  # (this process ran it, once per batch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(params_of(ref), params_of(stages), strict=True):
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-5, atol=1e-6)
    # an attribute that is not plain data (a worker is given plain data only): here too
    stages = stages_of(2)
    opt = optim.SGD(params_of(stages), lr=0.1, momentum=0.9)
    opt.note = lambda: None
    g = LossPipe(stages, opt, micro_batches=4, stage_ranks="processes")
    try:
        g.step(*batches[0])
        assert g.pipelined._steps is None  # (nothing sent to the workers to step)
        assert pipeline_links.stage_steps(g.pipelined._workers, [opt]) is None
        got = [float(g.step(*batches[1])), float(g.step(*batches[2]))]
    finally:
        g.pipelined.close()
    np.testing.assert_allclose(got, want[1:], rtol=1e-5, atol=1e-6)


@processes
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_step_that_fails_in_a_worker_is_raised_by_the_next_step_and_changes_nothing(kind):
    """The step a stage's worker runs after a batch is waited for at the next batch: its
    error is raised there as the ActorError of ``stage{i}.step``; that stage's
    parameters and state, its counts and the schedule here, are as before it, and the
    batch that raises it changes nothing; training goes on once the cause is gone. The
    optimizer's ``state_dict()`` and ``close()`` raise it too."""
    b = data(5)

    def pipe():
        stages = stages_of(2)
        if kind == "sgd":
            opt = RefusingSGD(params_of(stages), lr=0.1, momentum=0.9, dampening=0.1)
        else:
            opt = RefusingAdam(params_of(stages), lr=1e-2)
        g = LossPipe(stages, micro_batches=2, stage_ranks="processes")
        g.add_optimizer(opt, lr_sch=optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
        return stages, opt, g

    ref_stages, ref_opt, ref = pipe()
    stages, opt, g = pipe()
    try:
        want = [float(ref.step(*b[0])), float(ref.step(*b[3]))]
        want_params = [p.numpy() for p in params_of(ref_stages)]
        want_state = ref_opt.state_dict()
        got = [float(g.step(*b[0]))]
        before = [p.numpy() for p in params_of(stages)]
        saved = opt.state_dict()
        opt.refuse = True
        g.step(*b[1])  # (its loss; its step sent, not waited for)
        with pytest.raises(ActorError) as e:
            g.step(*b[2])
        assert e.value.actor == "stage0.step"
        assert "update refused" in str(e.value)
        base = 0.1 if kind == "sgd" else 1e-2
        assert opt.param_groups[0]["lr"] == base * 0.5  # (the schedule: one step, b[0]'s)
        for p, a in zip(params_of(stages), before, strict=True):
            assert np.array_equal(p.numpy(), a)
            assert p.grad is None
        _same_state(opt.state_dict(), saved)
        opt.refuse = False
        got.append(float(g.step(*b[3])))
        assert got == want
        for p, a in zip(params_of(stages), want_params, strict=True):
            assert np.array_equal(p.numpy(), a)
        _same_state(opt.state_dict(), want_state)
        opt.refuse = True
        g.step(*b[4])
        with pytest.raises(ActorError, match="update refused"):  # (read: waited for)
            opt.state_dict()
        _same_state(opt.state_dict(), want_state)
        g.step(*b[4])
    finally:
        ref.pipelined.close()
        with pytest.raises(ActorError, match="update refused"):
            g.pipelined.close()
    assert not any(p.is_global for p in params_of(stages))  # (closed all the same)


def weights_fail_in_the_step(ex, fail, outs):
    """(Run in a worker) from now on, the weights part a stage's optimizers' step runs
    first (its batch's last) raises MemoryError while ``fail``."""
    import sys

    from actorflow.nn.stage_programs import StagePrograms

    run = getattr(StagePrograms, "_weights_run", StagePrograms.weights)
    StagePrograms._weights_run = run

    def weights(self, left):
        if fail and sys._getframe(1).f_code.co_name == "_step":
            raise MemoryError("no memory for the weights part")
        return run(self, left)

    StagePrograms.weights = weights


@processes
def test_a_weights_part_left_to_the_step_that_fails_is_that_steps_error():
    """A batch's last weights part runs first thing in its stage's optimizers' step: its
    error is that step's, raised by the next step as the ActorError of ``stage1.step``
    naming ``stage1.weights`` and the micro-batch; stage 1's parameters are as before
    that step, stage 0's stepped (the stages out of step, as when a stage's update
    fails), and training goes on once the cause is gone."""
    m = 4
    b = data(4)
    stages = stages_of(2)
    g = LossPipe(
        stages,
        optim.SGD(params_of(stages), lr=0.1, momentum=0.9),
        micro_batches=m,
        stage_ranks="processes",
    )
    try:
        g.step(*b[0])
        ranks = g.pipelined._workers[1].ranks
        ranks.call_fn(0, weights_fail_in_the_step, (True,), ())
        ranks.synchronize()  # (batch 0's step ran before it: sent first)
        s0 = [p.numpy() for p in stages[0].parameters()]
        s1 = [p.numpy() for p in stages[1].parameters()]
        assert np.isfinite(float(g.step(*b[1])))  # (its acts all ended well: its loss)
        with pytest.raises(ActorError) as e:
            g.step(*b[2])
        assert e.value.actor == "stage1.step"
        assert "stage1.weights" in str(e.value) and f"piece {m - 1}" in str(e.value)
        assert "no memory for the weights part" in str(e.value)
        for p, a in zip(stages[1].parameters(), s1, strict=True):  # (not stepped)
            assert np.array_equal(p.numpy(), a)
        assert any(  # (stage 0's step went through)
            not np.array_equal(p.numpy(), a)
            for p, a in zip(stages[0].parameters(), s0, strict=True)
        )
        assert all(p.grad is None for p in params_of(stages))
        ranks.call_fn(0, weights_fail_in_the_step, (False,), ())
        assert np.isfinite(float(g.step(*b[3])))
        g.pipelined._stepped()  # (its step, waited for: went through)
    finally:
        g.pipelined.close()


def _same_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i, st in a["state"].items():
        assert st.keys() == b["state"][i].keys()
        for name, v in st.items():
            w = b["state"][i][name]
            if isinstance(v, af.Tensor):
                assert np.array_equal(v.numpy(), w.numpy()), (i, name)
            else:
                assert v == w, (i, name)


@processes
def test_what_the_workers_cannot_step_is_stepped_here_and_caches_stay_here():
    """An optimizer class made inside a function (a worker cannot load it by name) is
    stepped here; an optimizer's private caches (Adam's bias corrections, tensors) are
    not sent, and it is stepped in the workers."""

    class Local(optim.SGD):
        pass

    for make in (ScaledSGD, WrappedStepSGD):  # (not plain data; a step of its own)
        opt = make(params_of(stages_of(2)), lr=0.1, momentum=0.9)
        assert make is ScaledSGD or not opt.steps_by_update()
        assert pipeline_links.stage_steps([], [opt]) is None

    batches = data(2)
    ref = stages_of(2)
    want = eager_steps(ref, optim.SGD(params_of(ref), lr=0.1, momentum=0.9), batches)
    stages = stages_of(2)
    g = LossPipe(
        stages,
        Local(params_of(stages), lr=0.1, momentum=0.9),
        micro_batches=4,
        stage_ranks="processes",
    )
    try:
        got = [float(v) for v in g.run(batches)]
        assert g.pipelined._steps is None
    finally:
        g.pipelined.close()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stages = stages_of(2)
    opt = optim.Adam(params_of(stages), lr=1e-2)
    opt._corrections[(1, 0.01, (0.9, 0.999))] = (af.ones(()), af.ones(()))
    assert "_corrections" not in pipeline_links.attrs_of(opt)
    g = LossPipe(stages, opt, micro_batches=4, stage_ranks="processes")
    try:
        g.step(*batches[0])
        assert g.pipelined._steps is not None  # (sent to the workers)
    finally:
        g.pipelined.close()


@processes
def test_a_batch_whose_steps_cannot_all_be_sent_steps_none(monkeypatch, tmp_path):
    """Where issuing a stage's step fails (its ranks gone), the steps issued before it
    are taken back: no stage steps, nothing is left asked; a trace that cannot be written
    fails the call after the batch trained."""
    from actorflow.parallel.ranks import ProcessRanks

    b = data(2)
    stages = stages_of(2)
    opt = optim.SGD(params_of(stages), lr=0.1, momentum=0.9)
    g = LossPipe(stages, opt, micro_batches=2, stage_ranks="processes")
    call_fn = ProcessRanks.call_fn
    seen = []

    def failing(self, rank, fn, args, dtypes):
        if fn is pipeline_links._step:
            seen.append(self)
            if len(seen) == 2:
                raise RuntimeError("ranks gone")
        return call_fn(self, rank, fn, args, dtypes)

    try:
        before = [p.numpy() for p in params_of(stages)]
        monkeypatch.setattr(ProcessRanks, "call_fn", failing)
        with pytest.raises(RuntimeError, match="ranks gone"):
            g.step(*b[0])
        monkeypatch.setattr(ProcessRanks, "call_fn", call_fn)
        for p, a in zip(params_of(stages), before, strict=True):
            assert np.array_equal(p.numpy(), a)  # (stage 0's step taken back)
        assert opt.state == {} and g.pipelined._steps is None
        assert all(r._early == {} for r in workers_of(stages))
        (tmp_path / "file").write_text("")
        with pytest.raises(OSError):  # (a trace that cannot be written: after the batch)
            list(g.pipelined.run([b[1]], trace=tmp_path / "file" / "trace.json"))
        assert g.pipelined._steps is not None  # (the batch trained, its step sent)
        moved = [
            np.array_equal(p.numpy(), a) for p, a in zip(params_of(stages), before, strict=True)
        ]
        assert not all(moved)
    finally:
        g.pipelined.close()


@processes
def test_a_pipeline_collected_with_its_last_step_unread_lets_its_ask_go():
    import gc

    from actorflow.parallel import ProcessRanks

    stages = stages_of(2)
    with af.parallel.use_ranks("processes"):
        for i, s in enumerate(stages):  # (ranks made here: kept after the graph goes)
            s.to_global(af.placement("cpu", ranks=[i]), af.sbp.broadcast)
    ranks = workers_of(stages)
    assert all(isinstance(r, ProcessRanks) for r in ranks)
    g = LossPipe(stages, optim.SGD(params_of(stages), lr=0.1), micro_batches=2)
    g.step(*data(1)[0])
    assert any(r._early for r in ranks)
    del g
    gc.collect()
    assert all(r._early == {} for r in ranks)
    for s in stages:
        s.to("cpu")


class ShyAdam(optim.Adam):
    """Adam whose update raises for parameters of the last stage's shape while ``refuse``
    is set (one stage's step fails, the other's goes through)."""

    def update(self, p, grad, group, state, writes=optim.optimizer.OUT_OF_PLACE, rates=None):
        if getattr(self, "refuse", False) and tuple(p.shape)[0] == WIDTHS[-1]:
            raise RuntimeError("update refused")
        return super().update(p, grad, group, state, writes, rates)


@processes
def test_a_step_that_fails_on_one_stage_only_keeps_the_schedule_moving():
    """Where one stage's step fails and another's goes through, the error is raised as
    that stage's; the stages are then out of step with each other (the failed one's
    parameters and counts as before), and the schedule keeps moving (the stage that
    stepped does not take the same rate twice)."""
    b = data(3)
    stages = stages_of(2)
    opt = ShyAdam(params_of(stages), lr=1e-2)
    g = LossPipe(stages, micro_batches=2, stage_ranks="processes")
    g.add_optimizer(opt, lr_sch=optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    try:
        g.step(*b[0])
        before = [p.numpy() for p in params_of(stages)]
        opt.refuse = True
        g.step(*b[1])
        with pytest.raises(ActorError) as e:
            g.step(*b[2])
        assert e.value.actor == "stage1.step"
        params = params_of(stages)
        moved = [not np.array_equal(p.numpy(), a) for p, a in zip(params, before, strict=True)]
        n0 = len(list(stages[0].parameters()))
        assert all(moved[:n0]) and not any(moved[n0:])
        assert [opt.state[p]["step"] for p in params] == [2] * n0 + [1] * (len(params) - n0)
        assert opt.param_groups[0]["lr"] == 1e-2 * 0.25  # (two steps of the schedule)
    finally:
        g.pipelined.close()


@processes
def test_two_pipelines_sharing_an_optimizer_wait_for_each_others_steps():
    """Two pipelines over the same stages and optimizer (one made with ``stage_ranks=``,
    the other over the stages it placed): a batch of either first waits for the other's
    step still running in the workers, so a failed one is raised there, before the batch
    reads the optimizer's counts; the optimizer's ``state_dict()`` waits for both. The
    training then equals one pipeline's that never ran the failed batch, bit for bit."""
    b = data(4)
    ref_stages = stages_of(2)
    ref_opt = optim.Adam(params_of(ref_stages), lr=1e-2)
    ref = LossPipe(ref_stages, ref_opt, micro_batches=2, stage_ranks="processes")
    stages = stages_of(2)
    opt = RefusingAdam(params_of(stages), lr=1e-2)
    a = LossPipe(stages, opt, micro_batches=2, stage_ranks="processes")
    other = LossPipe(stages, opt, micro_batches=2)  # (the stages a placed: its workers)
    try:
        want = [float(ref.step(*b[0])), float(ref.step(*b[2])), float(ref.step(*b[3]))]
        got = [float(a.step(*b[0]))]
        opt.refuse = True
        a.step(*b[1])  # (its step sent to the workers, where it fails)
        opt.refuse = False
        with pytest.raises(ActorError, match="update refused") as e:
            other.step(*b[2])
        assert e.value.actor == "stage0.step"
        assert all(st["step"] == 1 for st in opt.state_dict()["state"].values())
        got.append(float(other.step(*b[2])))
        got.append(float(a.step(*b[3])))
        # a's step pending (other's was checked by a's batch): the state read waits
        assert len(opt._waits) == 1
        saved = opt.state_dict()
        assert opt._waits == ()
        assert all(st["step"] == 3 for st in saved["state"].values())
        assert got == want
        for p, q in zip(params_of(stages), params_of(ref_stages), strict=True):
            assert np.array_equal(p.numpy(), q.numpy())
        _same_state(saved, ref_opt.state_dict())
    finally:
        ref.pipelined.close()
        other.pipelined.close()
        a.pipelined.close()


@processes
def test_closing_a_pipeline_waits_for_another_ones_step_and_brings_the_state_back():
    """``close()`` waits for every pending step of its optimizers, another pipeline's
    too, before it reads their state: that one's error is raised once the stages and the
    optimizer's state are back here (it used to escape halfway, the state left global on
    workers nothing would end)."""
    b = data(2)
    stages = stages_of(2)
    opt = RefusingAdam(params_of(stages), lr=1e-2)
    a = LossPipe(stages, opt, micro_batches=2, stage_ranks="processes")
    other = LossPipe(stages, opt, micro_batches=2)
    try:
        a.step(*b[0])
        opt.refuse = True
        other.step(*b[1])  # (its step sent to the workers, where it fails)
        opt.refuse = False
        with pytest.raises(ActorError, match="update refused"):
            a.pipelined.close()
        assert not any(p.is_global for p in params_of(stages))
        state = [v for st in opt.state.values() for v in st.values() if isinstance(v, af.Tensor)]
        assert state and not any(v.is_global for v in state)
        assert all(st["step"] == 1 for st in opt.state_dict()["state"].values())
    finally:
        other.pipelined.close()
        a.pipelined.close()
