"""Global tensors in training: data parallelism (the batch split over the ranks, the
parameters broadcast) trains as one model, eagerly and in ``nn.Graph``; the gradients of
broadcast parameters come back broadcast (all-reduced); checkpoints save and resume; the
API's errors name the fix."""

import os
import tempfile

import numpy as np
import pytest

import actorflow as af
from actorflow import nn

pytestmark = pytest.mark.timeout(120)

RANKS = [1, 2, 3]


def _mlp():
    af.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(n=4, batch=10, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((batch, 8)).astype(np.float32), rng.integers(0, 3, batch))
        for _ in range(n)
    ]


class Step(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss(self.model(x), y)
        loss.backward()
        return loss


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("k", RANKS)
def test_eager_data_parallel_training_equals_one_process(k):
    p = af.placement("cpu", k)
    local, glob = _mlp(), _mlp().to_global(p)
    ol = af.optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
    og = af.optim.SGD(glob.parameters(), lr=0.1, momentum=0.9)
    loss = nn.CrossEntropyLoss()
    for x, y in _data(batch=11):  # 11 rows: uneven parts over 2 and 3 ranks
        xl, yl = af.tensor(x), af.tensor(y)
        xg = xl.to_global(p, af.sbp.split(0))
        yg = yl.to_global(p, af.sbp.split(0))
        ll = loss(local(xl), yl)
        ol.zero_grad()
        ll.backward()
        ol.step()
        lg = loss(glob(xg), yg)
        og.zero_grad()
        lg.backward()
        for q in glob.parameters():  # a broadcast parameter's gradient is broadcast
            assert q.grad.sbp == (af.sbp.broadcast,)
        og.step()
        _close(ll.item(), lg.item())
    for a, b in zip(local.parameters(), glob.parameters(), strict=True):
        assert b.sbp == (af.sbp.broadcast,) and b.is_global
        _close(a.numpy(), b.numpy())
        # every rank holds the same parameters
        parts = [b.to_local(rank=r).numpy() for r in range(k)]
        for q in parts[1:]:
            np.testing.assert_array_equal(parts[0], q)


@pytest.mark.parametrize("k", [2, 3])
def test_graph_step_and_run_over_global_parameters_equal_one_process(k):
    p = af.placement("cpu", k)
    ml, mg = _mlp(), _mlp().to_global(p)
    sl = Step(ml, af.optim.SGD(ml.parameters(), lr=0.1, momentum=0.9))
    sg = Step(mg, af.optim.SGD(mg.parameters(), lr=0.1, momentum=0.9))
    data = _data(6)
    for x, y in data[:2]:
        a, b = sl.step(x, y), sg.step(x, y)
        assert b.is_global
        _close(a.item(), b.item())
    outs = list(zip(sl.run(data[2:]), sg.run(data[2:]), strict=True))
    assert len(outs) == 4
    for a, b in outs:
        _close(np.asarray(a), b.item())
    for a, b in zip(ml.parameters(), mg.parameters(), strict=True):
        _close(a.numpy(), b.numpy())
        assert b.grad is None  # a step leaves no gradient behind, as a compiled one


def test_graph_run_over_a_dataloader_splits_each_batch():
    p = af.placement("cpu", 2)
    x = np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 3, 40)
    ds = list(zip(x, y, strict=True))
    ml, mg = _mlp(), _mlp().to_global(p)
    sl = Step(ml, af.optim.SGD(ml.parameters(), lr=0.05))
    sg = Step(mg, af.optim.SGD(mg.parameters(), lr=0.05))
    la = [float(np.asarray(v)) for v in sl.run(af.data.DataLoader(ds, batch_size=8))]
    lb = [v.item() for v in sg.run(af.data.DataLoader(ds, batch_size=8))]
    assert len(la) == len(lb) == 5
    _close(la, lb)


def test_a_global_graph_refuses_options_it_cannot_honour():
    p = af.placement("cpu", 2)
    m = _mlp().to_global(p)
    s = Step(m, af.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(af.PlanError, match="fused=True"):
        list(s.run(_data(1), fused=True))
    mixed = _mlp()
    mixed[0].to_global(p)
    s2 = Step(mixed, af.optim.SGD(mixed.parameters(), lr=0.1))
    with pytest.raises(af.DeviceError, match="some parameters are global"):
        s2.step(*_data(1)[0])


def test_checkpoint_and_resume_give_the_same_parameters():
    p = af.placement("cpu", 2)
    data = _data(6)
    m = _mlp().to_global(p)
    s = Step(m, af.optim.SGD(m.parameters(), lr=0.1))
    for x, y in data[:3]:
        s.step(x, y)
    path = os.path.join(tempfile.mkdtemp(), "ckpt.npz")
    af.save(m.state_dict(), path)
    for x, y in data[3:]:
        s.step(x, y)
    # a fresh run resumes from the checkpoint
    m2 = _mlp().to_global(p)
    m2.load_state_dict(af.load(path))
    s2 = Step(m2, af.optim.SGD(m2.parameters(), lr=0.1))
    for x, y in data[3:]:
        s2.step(x, y)
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert b.sbp == (af.sbp.broadcast,)


def test_errors_name_the_fix():
    p, q = af.placement("cpu", 2), af.placement("cpu", [0, 1, 2])
    x = af.ones(4, 3)
    g = x.to_global(p, af.sbp.split(0))
    with pytest.raises(af.DeviceError, match="to_global"):
        g + x
    with pytest.raises(af.DeviceError, match="one placement"):
        g + x.to_global(q, af.sbp.broadcast)
    with pytest.raises(af.DeviceError, match="needs a placement"):
        x.to_global(sbp=af.sbp.broadcast)
    with pytest.raises(af.ShapeError, match="split"):
        x.to_global(p, af.sbp.split(2))
    with pytest.raises(ValueError, match="sbp"):
        x.to_global(p, "S(0)")
    with pytest.raises(af.DeviceError, match="no placement"):
        x.placement  # noqa: B018 - reading it raises
    with pytest.raises(IndexError, match="ranks"):
        g.to_local(rank=2)
    assert (g * 2).numpy().sum() == 24  # still working after the errors


@pytest.mark.parametrize("k", RANKS)
def test_to_global_round_trips_and_parts(k):
    p = af.placement("cpu", k)
    a = np.arange(35.0).reshape(7, 5)
    x = af.tensor(a)
    for s in (af.sbp.split(0), af.sbp.split(1), af.sbp.broadcast, af.sbp.partial_sum):
        g = x.to_global(p, s)
        assert g.sbp == (s,) and g.shape == (7, 5)
        np.testing.assert_array_equal(g.numpy(), a)
        np.testing.assert_array_equal(g.to_local().numpy(), a)
        parts = [g.to_local(rank=r).numpy() for r in range(k)]
        if s is af.sbp.partial_sum:
            np.testing.assert_array_equal(sum(parts), a)
        elif s is af.sbp.broadcast:
            for q in parts:
                np.testing.assert_array_equal(q, a)
        else:
            np.testing.assert_array_equal(np.concatenate(parts, axis=s.dim), a)


def _cnn():
    af.manual_seed(0)
    # no bias before batch norm: its gradient is zero, and Adam would turn the ranks'
    # rounding noise in it into steps of +-lr
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, 5),
    )


@pytest.mark.parametrize("k", [2, 3])
def test_a_cnn_with_batch_norm_trains_data_parallel_as_one_process(k):
    """Batch norm's statistics are the whole batch's (the split batch is gathered for
    them), so data parallelism trains as one process would, running statistics included."""
    p = af.placement("cpu", k)
    ml, mg = _cnn(), _cnn().to_global(p)
    ol = af.optim.Adam(ml.parameters(), lr=3e-3)
    og = af.optim.Adam(mg.parameters(), lr=3e-3)
    lf = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((7, 1, 8, 8)).astype(np.float32)
        y = rng.integers(0, 5, 7)
        xl, yl = af.tensor(x), af.tensor(y)
        a = lf(ml(xl), yl)
        ol.zero_grad()
        a.backward()
        ol.step()
        b = lf(mg(xl.to_global(p, af.sbp.split(0))), yl.to_global(p, af.sbp.split(0)))
        og.zero_grad()
        b.backward()
        og.step()
        _close(a.item(), b.item())
    for (n, a), (_, b) in zip(ml.state_dict().items(), mg.state_dict().items(), strict=True):
        assert b.is_global, n
        _close(a.numpy(), b.numpy(), 1e-4)


def test_record_shows_the_boxing_of_a_data_parallel_step():
    """The gradients' all-reduces are the step's only communication, one per parameter,
    each moving 2 (k - 1) times the gradient's bytes; the forward moves nothing."""
    p = af.placement("cpu", 2)
    m = _mlp().to_global(p)
    x = af.ones(10, 8).to_global(p, af.sbp.split(0))
    with af.parallel.record() as rec:
        out = m(x)
    assert rec.boxings() == []
    assert [str(c) for c in rec.calls][0] == "matmul: S(0), B -> S(0)"
    with af.parallel.record() as rec:
        out.sum().backward()
    moved = [b for b in rec.boxings() if b.moved]
    # (a weight's gradient is reduced as its transpose, the matmul's own gradient)
    assert sorted(int(np.prod(b.shape)) for b in moved) == sorted(q.numel() for q in m.parameters())
    for b in moved:
        assert (str(b.src), str(b.dst), b.collective) == ("P", "B", "all-reduce")
        assert b.moved == 2 * 4 * int(np.prod(b.shape))
    assert "4 x P -> B (all-reduce)" in rec.summary()


def test_a_partial_sums_gradient_stays_broadcast_inside_the_graph():
    """Cross-entropy over a split batch sums the rows' losses (a partial sum, then its
    all-reduce); the gradient of that sum is the same on every rank, so backward hands it
    on broadcast and splits it locally: its only communication is the parameters'
    all-reduces (made partial again, it cost a reduce-scatter). Values as one process."""
    p = af.placement("cpu", 2)
    ml, mg = _mlp(), _mlp().to_global(p)
    x = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    y = np.arange(10) % 3
    a = nn.CrossEntropyLoss()(ml(af.tensor(x)), af.tensor(y))
    a.backward()
    b = nn.CrossEntropyLoss()(
        mg(af.tensor(x).to_global(p, af.sbp.split(0))), af.tensor(y).to_global(p, af.sbp.split(0))
    )
    with af.parallel.record() as rec:
        b.backward()
    moved = [(str(c.src), str(c.dst), c.collective) for c in rec.boxings() if c.moved]
    assert moved == [("P", "B", "all-reduce")] * len(list(mg.parameters())), moved
    for q, r in zip(ml.parameters(), mg.parameters(), strict=True):
        assert r.grad.sbp == (af.sbp.broadcast,)
        _close(q.grad.numpy(), r.grad.numpy(), 1e-5)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_creation_functions_take_placement_and_sbp(k):
    p = af.placement("cpu", k)
    s0 = af.sbp.split(0)
    t = af.tensor([[1.0, 2.0], [3.0, 4.0]], placement=p, sbp=s0)
    assert t.sbp == (s0,) and t.placement is p
    np.testing.assert_array_equal(t.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    assert [t.to_local(rank=r).shape[0] for r in range(k)] == [
        len(a) for a in np.array_split(np.zeros(2), k)
    ]
    for fn, want in ((af.zeros, 0.0), (af.ones, 1.0)):
        z = fn(5, 3, placement=p, sbp=s0)
        assert z.sbp == (s0,) and z.shape == (5, 3)
        np.testing.assert_array_equal(z.numpy(), np.full((5, 3), want))
    np.testing.assert_array_equal(af.arange(7, placement=p, sbp=s0).numpy(), np.arange(7))
    f = af.full((2, 3), 2.5, placement=p, sbp=af.sbp.partial_sum)
    np.testing.assert_array_equal(f.numpy(), np.full((2, 3), 2.5))  # the sum of the parts
    af.manual_seed(3)
    r = af.randn(6, 2, placement=p, sbp=s0)
    af.manual_seed(3)
    np.testing.assert_array_equal(r.numpy(), af.randn(6, 2).numpy())  # the local draws
    w = af.ones(3, placement=p, sbp=af.sbp.broadcast, requires_grad=True)
    assert w.requires_grad and w.is_leaf
    with pytest.raises(af.DeviceError, match="both placement= and sbp="):
        af.zeros(2, placement=p)
    with pytest.raises(af.DeviceError, match="not both"):
        af.zeros(2, device="cpu", placement=p, sbp=s0)


# -- what a review found (each test fails without its fix) -----------------------------------


def _partial(a, p, k):
    """A global tensor at partial_sum whose summands are not trivial: a / k on each rank
    (made part by part: converting to partial_sum would give rank 0 the value, the others
    zeros)."""
    from actorflow.parallel import interpreter as gi

    ranks = af.parallel.ranks_of(p)
    local = af.tensor(a / k)
    parts = [ranks.put(r, local._impl) for r in range(k)]
    m = local._impl.meta
    return Tensor_of(gi.make(ranks, parts, m.shape, m.dtype, af.sbp.partial_sum))


def Tensor_of(impl):  # noqa: N802 - a Tensor over an impl
    from actorflow.tensor.tensor import wrap

    return wrap(impl)


@pytest.mark.parametrize("k", [2, 3])
def test_a_sum_that_casts_each_summand_does_not_pass_partial_sums(k):
    """sum/cumsum with dtype=int64 cast each element before summing: int(0.6) + int(0.6)
    is not int(1.2), so a partial-sum input is reduced to its value first."""
    p = af.placement("cpu", k)
    a = np.full((2, 3), 1.2 * k / 2, np.float64)
    x = af.tensor(a).to_global(p, af.sbp.broadcast)
    xp = x.to_global(sbp=af.sbp.partial_sum) * 1.0  # (summands: the value and zeros)
    xq = _partial(a, p, k)
    for g in (xp, xq):
        np.testing.assert_array_equal(
            af.sum(g, 1, dtype=af.int64).numpy(), af.sum(af.tensor(a), 1, dtype=af.int64).numpy()
        )
        np.testing.assert_array_equal(
            af.cumsum(g, 1, dtype=af.int64).numpy(),
            af.cumsum(af.tensor(a), 1, dtype=af.int64).numpy(),
        )
    # a widening cast keeps them (no conversion recorded)
    x32 = _partial(a.astype(np.float32), p, k)
    with af.parallel.record() as rec:
        af.sum(x32, 1, dtype=af.float64)
    assert not [b for b in rec.boxings() if str(b.src) == "P"]


@pytest.mark.parametrize("k", [2, 3])
def test_a_mean_over_a_split_dim_sums_the_parts_and_moves_nothing(k):
    p = af.placement("cpu", k)
    a = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32)
    g = af.tensor(a).to_global(p, af.sbp.split(0))
    with af.parallel.record() as rec:
        means = [g.mean(), g.mean(dim=0), g.mean(dim=(0, 1), keepdim=True)]
    assert all(b.src.kind != "S" or b.dst.kind != "P" for b in rec.boxings())  # no padding
    for got, want in zip(means, [a.mean(), a.mean(0), a.mean((0, 1), keepdims=True)], strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
        assert got.sbp == (af.sbp.partial_sum,)


def test_a_view_made_as_a_copy_refuses_to_be_read_after_the_tensor_changed():
    p = af.placement("cpu", 2)
    x = af.tensor(np.arange(6.0).reshape(3, 2)).to_global(p, af.sbp.split(0))
    v, w = x[0], x[:, 0:1]  # x[0] loses the split dim (a copy); w keeps it (a view)
    vv = v.unsqueeze(0)
    x.add_(100)
    np.testing.assert_array_equal(w.numpy().ravel(), [100, 102, 104])  # a view sees it
    for stale in (v, vv):
        with pytest.raises(af.DeviceError, match="made as a copy"):
            stale.numpy()
    np.testing.assert_array_equal(x[0].numpy(), [100, 101])  # taken again: fresh
    v3 = x[1]
    w.mul_(2)  # a write through a view of x makes x's copies stale too
    with pytest.raises(af.DeviceError, match="made as a copy"):
        v3 + 1


def test_inline_ranks_sit_on_the_devices_the_placement_names():
    for ranks in ([2, 3], [1]):
        t = af.zeros(4, placement=af.placement("null", ranks), sbp=af.sbp.split(0))
        parts = af.parallel.interpreter.parts_of(t._impl)
        assert [str(q.meta.device) for q in parts] == [
            "null" if r == 0 else f"null:{r}" for r in ranks
        ]


def test_a_local_tensor_loads_a_global_one():
    p = af.placement("cpu", 2)
    g = _mlp().to_global(p)
    with af.no_grad():
        for q in g.parameters():
            q.mul_(2.0)
    local = _mlp()
    local.load_state_dict(g.state_dict())  # copy_ of global tensors into local ones
    for a, b in zip(local.parameters(), g.parameters(), strict=True):
        assert a.is_local
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("k", [2, 3])
def test_boxing_records_the_bytes_its_conversions_move(k):
    """P -> B: each rank receives the k - 1 other whole parts; P -> S: their slices."""
    p = af.placement("cpu", k)
    a = np.ones((6, 4), np.float32)
    n = a.nbytes
    with af.parallel.record() as rec:
        _partial(a, p, k).to_global(sbp=af.sbp.broadcast)
        _partial(a, p, k).to_global(sbp=af.sbp.split(0))
        af.tensor(a).to_global(p, af.sbp.split(0)).to_global(sbp=af.sbp.broadcast)
    moved = {(str(b.src), str(b.dst)): b.moved for b in rec.boxings() if b.src.kind != "B"}
    assert moved[("P", "B")] == k * (k - 1) * n
    assert moved[("P", "S(0)")] == (k - 1) * n
    assert moved[("S(0)", "B")] == (k - 1) * n


def test_in_place_writes_into_partial_sums_and_factories_check_the_split():
    p = af.placement("cpu", 2)
    a = np.arange(4.0)
    g = _partial(a, p, 2)
    g.mul_(af.tensor(0.5).to_global(p, af.sbp.broadcast))  # (P, B) -> P, broadcasting
    assert g.sbp == (af.sbp.partial_sum,)
    np.testing.assert_array_equal(g.numpy(), a * 0.5)
    with pytest.raises(af.ShapeError, match="split"):
        af.zeros(5, placement=p, sbp=af.sbp.split(1))


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("d", [0, 1])
def test_a_masked_write_into_a_split_tensor_stays_split(k, d):
    """``x[mask] = v`` (a mask of x's shape, a number or 0-dim value) writes each rank's
    part by its part of the mask: no gather; another key is refused with the way out."""
    p = af.placement("cpu", k)
    rng = np.random.default_rng(d)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    mask = a > 0
    want = a.copy()
    want[mask] = 2.0
    want[~mask] = -1.0
    s = af.sbp.split(d)
    x = af.tensor(a).to_global(p, s)
    m = af.tensor(mask).to_global(p, s)
    with af.parallel.record() as rec:
        x[m] = 2.0
        x[~m] = af.tensor(np.float32(-1.0)).to_global(p, af.sbp.broadcast)
    assert x.sbp == (s,) and not [b for b in rec.boxings() if b.moved]
    np.testing.assert_array_equal(x.numpy(), want)
    with pytest.raises(af.DeviceError, match="af.where"):
        x[af.tensor(np.array([0, 2])).to_global(p, af.sbp.broadcast)] = 1.0


@pytest.mark.parametrize("through", ["root written, view saved", "view written, root saved"])
def test_a_write_into_a_global_tensor_or_its_view_after_it_was_saved_raises(through):
    """As for local tensors, autograd refuses to run on saved values that a write in place
    changed since, whether the write went through the tensor or a view of it: a global
    view's version is its root's (the parts it views are the root's)."""
    p = af.placement("cpu", 2)
    b = af.sbp.broadcast
    w = af.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).to_global(p, b)
    w.requires_grad_()
    x = af.tensor(np.ones((2, 3), np.float32)).to_global(p, b)
    if through == "root written, view saved":
        y = (w * x.T.T).sum()  # (mul saves a view of x)
        with af.no_grad():
            x.add_(1.0)
    else:
        y = (w * x).sum()
        with af.no_grad():
            x.T.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


class SquareStep(nn.Graph):
    """A step of one argument: the mean square of the model's output."""

    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x):
        loss = (self.model(x) ** 2).mean()
        loss.backward()
        return loss


@pytest.mark.parametrize("kind", ["list", "tuple", "array"])
def test_global_run_takes_items_as_a_local_run_does(kind):
    """An item is build's arguments: a list or a tuple of them, or the one argument."""
    p = af.placement("cpu", 2)
    data = _data(3)
    if kind == "array":
        items = [x for x, _ in data]
        make = SquareStep
    else:
        items = [list(d) if kind == "list" else tuple(d) for d in data]
        make = Step
    ml, mg = _mlp(), _mlp().to_global(p)
    sl = make(ml, af.optim.SGD(ml.parameters(), lr=0.1))
    sg = make(mg, af.optim.SGD(mg.parameters(), lr=0.1))
    want = [float(np.asarray(v)) for v in sl.run(items)]
    got = [v.item() for v in sg.run(items)]
    assert len(got) == 3
    _close(want, got)
    for a, b in zip(ml.parameters(), mg.parameters(), strict=True):
        _close(a.numpy(), b.numpy())


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW"])
@pytest.mark.parametrize("k", [2, 3])
def test_adam_on_split_parameters_trains_as_one_process(opt_name, k):
    """Weights split along dim 0 over the ranks (a 0-d step count cannot be split: Adam's
    bias corrections are broadcast on the parameters' placement)."""
    p = af.placement("cpu", k)
    make = getattr(af.optim, opt_name)
    local, glob = _mlp(), _mlp().to_global(p, af.sbp.split(0))
    ol, og = make(local.parameters(), lr=0.05), make(glob.parameters(), lr=0.05)
    loss = nn.CrossEntropyLoss()
    for x, y in _data(3):
        for model, opt, xs, ys in (
            (local, ol, af.tensor(x), af.tensor(y)),
            (
                glob,
                og,
                af.tensor(x).to_global(p, af.sbp.broadcast),
                af.tensor(y).to_global(p, af.sbp.broadcast),
            ),
        ):
            opt.zero_grad()
            out = loss(model(xs), ys)
            out.backward()
            opt.step()
    for a, b in zip(local.parameters(), glob.parameters(), strict=True):
        _close(a.numpy(), b.numpy())
    assert glob[0].weight.sbp == (af.sbp.split(0),)


def _train(model, opt, data, place=None):
    loss = nn.CrossEntropyLoss()
    for x, y in data:
        xs, ys = af.tensor(x), af.tensor(y)
        if place is not None:
            xs, ys = xs.to_global(place, af.sbp.split(0)), ys.to_global(place, af.sbp.split(0))
        opt.zero_grad()
        loss(model(xs), ys).backward()
        opt.step()


OPTS = {
    "Adam": lambda ps: af.optim.Adam(ps, lr=0.05),
    "AdamW": lambda ps: af.optim.AdamW(ps, lr=0.05),
    "SGD": lambda ps: af.optim.SGD(ps, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("sbp", [af.sbp.broadcast, af.sbp.split(0)], ids=["B", "S0"])
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_an_optimizer_checkpoint_of_a_global_model_resumes(opt_name, sbp):
    """The optimizer's state saved (af.save) and loaded into a fresh global model's
    optimizer: its state tensors are laid out as their parameters, and training goes on
    as the original does."""
    if opt_name == "SGD" and sbp == af.sbp.split(0):
        pytest.skip("SGD's momentum on split parameters: not this test's subject")
    p = af.placement("cpu", 2)
    data = _data(5)
    m = _mlp().to_global(p, sbp)
    opt = OPTS[opt_name](m.parameters())
    _train(m, opt, data[:2], p)
    path = os.path.join(tempfile.mkdtemp(), "opt.npz")
    af.save(opt.state_dict(), path)
    af.save(m.state_dict(), path + ".model.npz")
    _train(m, opt, data[2:], p)
    m2 = _mlp().to_global(p, sbp)
    m2.load_state_dict(af.load(path + ".model.npz"))
    opt2 = OPTS[opt_name](m2.parameters())
    opt2.load_state_dict(af.load(path))
    for q in m2.parameters():
        for v in opt2.state[q].values():
            if isinstance(v, af.Tensor) and v.ndim:
                assert v.is_global and v.sbp == q.sbp
    _train(m2, opt2, data[2:], p)
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        _close(a.numpy(), b.numpy(), 1e-6)


def test_an_optimizer_state_moves_between_local_and_global_models():
    """A local model's state loaded into a global model's optimizer (and back: a global
    state gathered into a local one), the scalar state (SGD's dampening flag) too."""
    p = af.placement("cpu", 2)
    data = _data(4)
    make = lambda ps: af.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1)  # noqa: E731
    local = _mlp()
    opt = make(local.parameters())
    _train(local, opt, data[:2])
    glob = _mlp().to_global(p)
    glob.load_state_dict(local.state_dict())
    gopt = make(glob.parameters())
    gopt.load_state_dict(opt.state_dict())
    back = _mlp()
    bopt = make(back.parameters())
    _train(glob, gopt, data[2:3], p)
    back.load_state_dict({k: v.to("cpu") for k, v in glob.state_dict().items()})
    bopt.load_state_dict(gopt.state_dict())  # (global state tensors, not saved)
    _train(back, bopt, data[3:])
    _train(local, opt, data[2:])
    for a, b in zip(local.parameters(), back.parameters(), strict=True):
        _close(a.numpy(), b.numpy())


def test_sgd_with_dampening_trains_global_parameters_as_one_process():
    p = af.placement("cpu", 2)
    local, glob = _mlp(), _mlp().to_global(p)
    opts = [
        af.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.5) for m in (local, glob)
    ]
    lf = nn.CrossEntropyLoss()
    for x, y in _data(3):
        for m, o, split in ((local, opts[0], False), (glob, opts[1], True)):
            xs, ys = af.tensor(x), af.tensor(y)
            if split:
                xs, ys = xs.to_global(p, af.sbp.split(0)), ys.to_global(p, af.sbp.split(0))
            o.zero_grad()
            lf(m(xs), ys).backward()
            o.step()
    for a, b in zip(local.parameters(), glob.parameters(), strict=True):
        _close(a.numpy(), b.numpy())


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_an_optimizer_state_made_before_its_model_moved_follows_it(mode):
    """Adagrad makes its state with the optimizer: made before ``model.to_global(...)``,
    each state tensor is put where its parameter is at the next step (eager, and a graph's
    step), laid out as the parameter, and the training equals one process's (it used to
    fail in the update's first op, naming neither the optimizer nor the fix)."""
    p = af.placement("cpu", 2)
    data = _data(3)
    local, glob = _mlp(), _mlp()
    lopt = af.optim.Adagrad(local.parameters(), lr=0.1, initial_accumulator_value=0.1)
    gopt = af.optim.Adagrad(glob.parameters(), lr=0.1, initial_accumulator_value=0.1)
    glob.to_global(p, af.sbp.broadcast)

    def states(o):
        return [v for st in o.state.values() for v in st.values() if isinstance(v, af.Tensor)]

    assert states(gopt) and not any(v.is_global for v in states(gopt))  # (made before)
    if mode == "eager":
        _train(local, lopt, data)
        _train(glob, gopt, data, p)
    else:
        for model, o, place in ((local, lopt, None), (glob, gopt, p)):
            g = Step(model, o)
            for x, y in data:
                xs, ys = af.tensor(x), af.tensor(y)
                if place is not None:
                    s0 = af.sbp.split(0)
                    xs, ys = xs.to_global(place, s0), ys.to_global(place, s0)
                g.step(xs, ys)
    for param, st in gopt.state.items():
        assert st["sum"].placement == param.placement and st["sum"].sbp == param.sbp
    for a, b in zip(local.parameters(), glob.parameters(), strict=True):
        _close(a.numpy(), b.numpy())
    for a, b in zip(lopt.state.values(), gopt.state.values(), strict=True):
        _close(a["sum"].numpy(), b["sum"].numpy())
        assert float(a["step"]) == float(b["step"]) == len(data)
