"""Convolution and pooling: forward values against PyTorch over a grid of strides,
paddings, dilations, groups and ceil_mode (float32 and float64), gradients against PyTorch,
max_pool2d's indices equal to PyTorch's, the errors, the layers (init, state_dict, weights
loaded from PyTorch through numpy), and a conv-pool-linear model trained eagerly, under
no_grad, by nn.Graph.step and nn.Graph.run (fused and not) with the same losses, and on
the cuda emulator. (The grad rules' finite-difference cases are in test_autograd.py.)"""

import itertools

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import functional as NF

torch = pytest.importorskip("torch")
TF = torch.nn.functional

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _pair_up(dtype, *shapes):
    arrays = [RNG.standard_normal(s).astype(dtype) for s in shapes]
    return arrays, [af.tensor(a) for a in arrays], [torch.tensor(a) for a in arrays]


def _close(got, want, dtype):
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL[dtype])


CONV_GRID = [
    dict(stride=s, padding=p, dilation=d, groups=g)
    for s, p, d, g in itertools.product(
        [1, (2, 1)], [0, (1, 2), "same", "valid"], [1, (2, 1)], [1, 2]
    )
    if not (p == "same" and s != 1)
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_forward_equals_pytorch_over_the_grid(dtype):
    _, (x, w, w1, b), (tx, tw, tw1, tb) = _pair_up(
        dtype, (2, 4, 7, 6), (6, 2, 3, 2), (6, 4, 3, 2), (6,)
    )
    for kw in CONV_GRID:
        wg, twg = (w, tw) if kw["groups"] == 2 else (w1, tw1)
        _close(NF.conv2d(x, wg, None, **kw).numpy(), TF.conv2d(tx, twg, None, **kw), dtype)
    _close(
        NF.conv2d(x, w, b, padding=1, groups=2).numpy(),
        TF.conv2d(tx, tw, tb, padding=1, groups=2),
        dtype,
    )
    _close(
        af.conv2d(x[0], w, b, 2, 1, 1, 2).numpy(), torch.conv2d(tx[0], tw, tb, 2, 1, 1, 2), dtype
    )  # unbatched (C, H, W)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_transpose2d_and_fold_forward_equal_pytorch(dtype):
    _, (x, w, b), (tx, tw, tb) = _pair_up(dtype, (2, 4, 4, 3), (4, 3, 3, 2), (6,))
    for s, p, op, g, d in [
        (1, 0, 0, 1, 1),
        ((2, 3), 1, (1, 2), 2, 1),
        (2, (0, 1), 1, 1, 2),
        (3, 2, (2, 0), 2, (1, 2)),
    ]:
        got = NF.conv_transpose2d(x, w, b[: 3 * g], s, p, op, g, d)
        _close(got.numpy(), TF.conv_transpose2d(tx, tw, tb[: 3 * g], s, p, op, g, d), dtype)
    _, (u,), (tu,) = _pair_up(dtype, (2, 3, 8, 7))
    _close(
        NF.unfold(u, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)).numpy(),
        TF.unfold(tu, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
        dtype,
    )
    _, (c,), (tc,) = _pair_up(dtype, (2, 12, 18))
    _close(
        NF.fold(c, (5, 6), (2, 3), padding=1, stride=(2, 1)).numpy(),
        TF.fold(tc, (5, 6), (2, 3), padding=1, stride=(2, 1)),
        dtype,
    )


POOL_GRID = list(itertools.product([2, (3, 2)], [None, 1, (2, 1)], [0, 1], [False, True]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pools_forward_and_indices_equal_pytorch(dtype):
    _, (x,), (tx,) = _pair_up(dtype, (2, 3, 9, 8))
    for k, s, p, ceil in POOL_GRID:
        for d in (1, 2):
            v, i = NF.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
            tv, ti = TF.max_pool2d(tx, k, s, p, d, ceil, return_indices=True)
            _close(v.numpy(), tv, dtype)
            assert i.dtype == af.int64 and np.array_equal(i.numpy(), ti.numpy())
        for cip in (True, False):
            _close(
                NF.avg_pool2d(x, k, s, p, ceil, cip).numpy(),
                TF.avg_pool2d(tx, k, s, p, ceil, cip),
                dtype,
            )
    _close(
        NF.avg_pool2d(x, 3, 2, 1, divisor_override=5).numpy(),
        TF.avg_pool2d(tx, 3, 2, 1, divisor_override=5),
        dtype,
    )
    _close(af.max_pool2d(x[0], 3, padding=1).numpy(), torch.max_pool2d(tx[0], 3, padding=1), dtype)
    nan = x.numpy().copy()
    nan[0, 0, 1, 1] = nan[0, 0, 2, 2] = nan[1, 2, 5, 0] = np.nan  # NaN wins, the last one
    nan[1, 1, :2, :2] = nan[0, 1, -1, -3:] = -np.inf  # a -inf maximum: a real position
    v, i = NF.max_pool2d(af.tensor(nan), 3, 1, 1, return_indices=True)
    tv, ti = TF.max_pool2d(torch.tensor(nan), 3, 1, 1, return_indices=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    nan[0, 2, :4, :4] = 1.0  # ties: the first maximum's index
    for k, s in ((2, 2), (3, 1)):  # no padding: the one-pass kernel
        v, i = NF.max_pool2d(af.tensor(nan), k, s, return_indices=True)
        tv, ti = TF.max_pool2d(torch.tensor(nan), k, s, return_indices=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
    for size in (1, 4, (3, 5), (None, 3), (9, 8)):
        _close(NF.adaptive_avg_pool2d(x, size).numpy(), TF.adaptive_avg_pool2d(tx, size), dtype)
    _close(
        NF.adaptive_avg_pool2d(x[1], (2, 3)).numpy(), TF.adaptive_avg_pool2d(tx[1], (2, 3)), dtype
    )


GRAD_CASES = [
    (
        "conv2d",
        lambda f, x, w, b: f.conv2d(
            x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2
        ),
        [(2, 4, 7, 6), (6, 2, 3, 2), (6,)],
    ),
    ("conv2d_same", lambda f, x, w: f.conv2d(x, w, padding="same"), [(2, 3, 5, 6), (4, 3, 2, 3)]),
    ("conv2d_unbatched", lambda f, x, w: f.conv2d(x, w, padding=1), [(3, 5, 4), (4, 3, 3, 3)]),
    ("max_pool2d_unbatched", lambda f, x: f.max_pool2d(x, 2), [(3, 5, 4)]),
    (
        "conv_transpose2d",
        lambda f, x, w, b: f.conv_transpose2d(x, w, b, 2, 1, 1, 2, 1),
        [(2, 4, 4, 3), (4, 3, 3, 2), (6,)],
    ),
    ("max_pool2d", lambda f, x: f.max_pool2d(x, 3, 2, 1, ceil_mode=True), [(2, 3, 8, 7)]),
    ("avg_pool2d", lambda f, x: f.avg_pool2d(x, 3, 2, 1, True, False), [(2, 3, 8, 7)]),
    ("adaptive_avg_pool2d", lambda f, x: f.adaptive_avg_pool2d(x, (3, 5)), [(2, 3, 8, 7)]),
    ("unfold", lambda f, x: f.unfold(x, 3, padding=1, stride=2), [(2, 3, 6, 5)]),
    ("fold", lambda f, x: f.fold(x, (5, 4), 2, stride=(2, 1)), [(2, 8, 6)]),
    # batches longer than the planes' rows: the kernels' batch-innermost layouts
    (
        "conv2d_batch_last",
        lambda f, x, w, b: f.conv2d(x, w, b, padding=1, groups=2),
        [(9, 4, 3, 3), (6, 2, 3, 3), (6,)],
    ),
    (
        "conv_transpose2d_batch_last",
        lambda f, x, w: f.conv_transpose2d(x, w, None, 2, 1, 1),
        [(9, 4, 3, 2), (4, 3, 3, 3)],
    ),
    ("avg_pool2d_batch_last", lambda f, x: f.avg_pool2d(x, 2, 1, 1), [(7, 2, 3, 3)]),
    # output_padding not smaller than the stride but than the dilation: rows past the windows
    (
        "conv_transpose2d_output_padding",
        lambda f, x, w, b: f.conv_transpose2d(x, w, b, 1, 0, (1, 2), 1, (2, 3)),
        [(2, 4, 4, 5), (4, 3, 3, 3), (3,)],
    ),
    (
        "conv_transpose2d_output_padding_batch_last",
        lambda f, x, w: f.conv_transpose2d(x, w, None, (1, 2), 1, (2, 1), 2, 3),
        [(9, 4, 3, 2), (4, 3, 3, 2)],
    ),
    ("fold_batch_last", lambda f, x: f.fold(x, (3, 3), 2), [(5, 8, 4)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_equal_pytorch(case, dtype):
    _, fn, shapes = case
    arrays = [RNG.standard_normal(s).astype(dtype) for s in shapes]
    xs = [af.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = fn(NF, *xs), fn(TF, *ts)
    w = RNG.standard_normal(tuple(ty.shape)).astype(dtype)
    (y * af.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    _close(y.numpy(), ty, dtype)
    for x, t in zip(xs, ts, strict=True):
        _close(x.grad.numpy(), t.grad, dtype)


def test_errors_name_the_op_the_shapes_and_the_fix():
    x, w = af.rand(2, 4, 5, 5), af.rand(6, 3, 3, 3)
    with pytest.raises(
        af.ShapeError,
        match=r"conv2d: the input has 4 channels.*\(6, 3, 3, 3\)"
        r".*groups=1 expects 3",
    ):
        NF.conv2d(x, w)
    with pytest.raises(af.ShapeError, match=r"groups=2 expects 6"):
        NF.conv2d(x, w, groups=2)
    with pytest.raises(af.ShapeError, match=r"kernel \(3x3.*larger than the padded input \(2x2"):
        NF.conv2d(af.rand(1, 3, 2, 2), w)
    with pytest.raises(af.ShapeError, match=r"conv2d: expected a 3-D or 4-D input .* \(5, 5\)"):
        NF.conv2d(af.rand(5, 5), w)
    with pytest.raises(
        af.DTypeError,
        match=r"conv2d: the input \(\S*float32\) and the "
        r"weight \(\S*float64\)",
    ):
        NF.conv2d(af.rand(1, 3, 5, 5), af.rand(6, 3, 3, 3, dtype=af.float64))
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        NF.conv2d(af.rand(1, 3, 5, 5), w, stride=2, padding="same")
    with pytest.raises(ValueError, match="output_padding"):
        NF.conv_transpose2d(af.rand(1, 6, 3, 3), w, stride=2, output_padding=2)
    with pytest.raises(af.ShapeError, match=r"max_pool2d: padding \(2, 2\) must be at most half"):
        NF.max_pool2d(x, 3, padding=2)
    with pytest.raises(af.ShapeError, match=r"avg_pool2d: the kernel \(6, 6\) is larger"):
        NF.avg_pool2d(x, 6)
    with pytest.raises(af.ShapeError, match=r"max_pool2d: expected a 3-D or 4-D input"):
        NF.max_pool2d(af.rand(4, 5), 2)
    with pytest.raises(TypeError, match=r"kernel_size must be an int or a pair"):
        NF.max_pool2d(x, (2, 2, 2))
    with pytest.raises(NotImplementedError, match="padding_mode='reflect'"):
        nn.Conv2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"in_channels \(3\) must be divisible by groups \(2\)"):
        nn.Conv2d(3, 4, 3, groups=2)


def test_conv2d_init_and_state_dict_match_pytorch():
    af.manual_seed(0)
    m = nn.Conv2d(8, 64, (3, 2), groups=2)
    t = torch.nn.Conv2d(8, 64, (3, 2), groups=2)
    assert repr(m) == repr(t)
    sd, tsd = m.state_dict(), t.state_dict()
    assert list(sd) == list(tsd) and all(tuple(sd[k].shape) == tuple(tsd[k].shape) for k in sd)
    bound = 1 / np.sqrt(4 * 3 * 2)  # fan_in = in_channels / groups * kh * kw
    for p in (m.weight.numpy(), m.bias.numpy()):
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.8 * bound
    assert nn.Conv2d(3, 4, 3, bias=False).bias is None
    for args, kw in [
        ((1, 4, 3), dict(padding="same", bias=False)),
        ((2, 4, (3, 2)), dict(stride=2, padding=1, dilation=(1, 2), groups=2)),
    ]:
        assert repr(nn.Conv2d(*args, **kw)) == repr(torch.nn.Conv2d(*args, **kw))
    assert repr(nn.MaxPool2d(2)) == repr(torch.nn.MaxPool2d(2))
    assert repr(nn.AdaptiveAvgPool2d((1, 1))) == repr(torch.nn.AdaptiveAvgPool2d((1, 1)))


def _layers(self, lib, ch):
    """The layers of the model, from ``lib`` (actorflow's nn or PyTorch's)."""
    self.conv1 = lib.Conv2d(1, ch, 3, padding=1)
    self.pool = lib.MaxPool2d(2)
    self.conv2 = lib.Conv2d(ch, ch, 3, padding=1, groups=2)
    self.avg = lib.AvgPool2d(2, ceil_mode=True)
    self.gap = lib.AdaptiveAvgPool2d((1, 2))
    self.fc = lib.Linear(2 * ch, 3)


class Net(nn.Module):
    def __init__(self, ch=4):
        super().__init__()
        _layers(self, nn, ch)

    def forward(self, x):
        x = self.pool(self.conv1(x).relu())
        x = self.gap(self.avg(self.conv2(x).relu()))
        return self.fc(x.reshape(x.shape[0], -1))


class TorchNet(torch.nn.Module):
    def __init__(self, ch=4):
        super().__init__()
        _layers(self, torch.nn, ch)

    forward = Net.forward


def test_pytorch_weights_loaded_through_numpy_give_pytorchs_output():
    torch.manual_seed(0)
    t = TorchNet()
    m = Net()
    m.load_state_dict({k: af.tensor(v.detach().numpy()) for k, v in t.state_dict().items()})
    x = RNG.standard_normal((5, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(
        m(af.tensor(x)).numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6
    )


def _data(n, b=6, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, b))
        for _ in range(n)
    ]


def _fresh():
    af.manual_seed(2)
    m = Net()
    return m, optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


class Step(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model, self.loss = model, nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss(self.model(x), y)
        loss.backward()
        return loss


@pytest.mark.timeout(120)
def test_a_conv_pool_model_trains_the_same_eagerly_and_in_graph_mode():
    data = _data(6)
    m1, o1 = _fresh()
    t = TorchNet()  # PyTorch on the same weights
    t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in m1.state_dict().items()})
    topt = torch.optim.SGD(t.parameters(), lr=0.1, momentum=0.9)
    torch_losses = []
    for x, y in data:
        topt.zero_grad()
        loss = TF.cross_entropy(t(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        topt.step()
        torch_losses.append(loss.item())
    want = []
    for x, y in data:
        o1.zero_grad()
        loss = nn.CrossEntropyLoss()(m1(af.tensor(x)), af.tensor(y))
        loss.backward()
        o1.step()
        want.append(loss.item())
    np.testing.assert_allclose(want, torch_losses, rtol=1e-5)
    m2, o2 = _fresh()
    step = Step(m2, o2)
    got = [step(af.tensor(x), af.tensor(y)).item() for x, y in data[:2]]
    got += [float(v) for v in step.run(data[2:4])]
    got += [float(v) for v in step.run(data[4:], fused=True)]
    assert got == want
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    with af.no_grad():  # under no_grad: no graph, same values
        y = m1(af.tensor(data[0][0]))
    assert y.grad_fn is None
    np.testing.assert_array_equal(y.numpy(), m2(af.tensor(data[0][0])).detach().numpy())


def test_conv_and_pools_run_on_the_cuda_emulator(emu):
    emu()
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)

    def run(device):
        xt = af.tensor(x, device=device, requires_grad=True)
        wt = af.tensor(w, device=device, requires_grad=True)
        y = NF.conv2d(xt, wt, padding=1, groups=2)
        v = NF.max_pool2d(y, 2, ceil_mode=True)
        z = NF.adaptive_avg_pool2d(NF.avg_pool2d(v, 2, 1, 1), 2)
        z.sum().backward()
        return [t.to("cpu").numpy() for t in (z, xt.grad, wt.grad)]

    for got, want in zip(run("cuda:0"), run("cpu"), strict=True):
        np.testing.assert_array_equal(got, want)
