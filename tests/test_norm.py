"""Normalization and the math ops against PyTorch: sin, cos, rsqrt, erf, var/std, silu
(forward in float32 and float64); batch_norm (training and eval, affine or not, 1d and 2d,
momentum None, without running statistics), BatchNorm1d/2d's buffers and state_dict,
GroupNorm, layer_norm (its op and backward); the errors; batch norm's running statistics as
state in nn.Graph (step, run fused and not); and on the cuda emulator. Gradients are checked
in tests/test_autograd.py's CASES (finite differences and PyTorch)."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)

RNG = np.random.default_rng(7)
NF = nn.functional


def _close(got, want, dtype):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=tol, atol=tol)


# -- the math ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["sin", "cos", "rsqrt", "erf"])
def test_math_ops_match_torch_as_functions_and_methods(name, dtype):
    x = (RNG.standard_normal((4, 5)) * 3).astype(dtype)
    if name == "rsqrt":
        x = np.abs(x) + 0.1
    want = getattr(torch, name)(torch.tensor(x))
    _close(getattr(af, name)(af.tensor(x)).numpy(), want, dtype)
    _close(getattr(af.tensor(x), name)().numpy(), want, dtype)
    assert getattr(af, name)(af.tensor(x)).dtype == af.tensor(x).dtype


def test_math_ops_of_integers_give_floats_and_rsqrt_of_zero_is_inf_as_torch():
    ints = np.array([0, 1, 4], np.int64)
    for name in ("sin", "cos", "rsqrt", "erf"):
        got = getattr(af, name)(af.tensor(ints))
        want = getattr(torch, name)(torch.tensor(ints))
        assert got.dtype == af.float32
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((), {}),
        ((1,), {}),
        ((), dict(dim=(0, 2), keepdim=True)),
        ((), dict(correction=0)),
        ((), dict(dim=1, correction=2)),
        ((1, False), {}),
        ((1, True, True), {}),
        ((False,), {}),
        ((), dict(dim=-1, unbiased=False, keepdim=True)),
    ],
)
def test_var_and_std_match_torch(args, kwargs, dtype):
    x = RNG.standard_normal((3, 4, 5)).astype(dtype)
    for name in ("var", "std"):
        want = getattr(torch, name)(torch.tensor(x), *args, **kwargs)
        _close(getattr(af, name)(af.tensor(x), *args, **kwargs).numpy(), want, dtype)
        _close(getattr(af.tensor(x), name)(*args, **kwargs).numpy(), want, dtype)


def test_var_with_no_degrees_of_freedom_is_inf_or_nan_as_torch():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, c in (([1.0, 2.0], 5), ([3.0], 1)):
            want = torch.var(torch.tensor(x), correction=c).item()
            got = af.var(af.tensor(x), correction=c).item()
            assert np.isnan(got) == np.isnan(want) and (np.isnan(got) or got == want)
        # the gradient: PyTorch's 2 (x - mean) / (N - correction), +-inf for N == correction
        x = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 3.0]])
        for name in ("var", "std"):
            for c in (3, 3.5, 4):
                a = af.tensor(x, requires_grad=True)
                t = torch.tensor(x, requires_grad=True)
                getattr(af, name)(a, dim=1, correction=c).sum().backward()
                getattr(torch, name)(t, dim=1, correction=c).sum().backward()
                np.testing.assert_allclose(
                    a.grad.numpy(), t.grad.numpy(), rtol=1e-12, err_msg=f"{name}, correction={c}"
                )


def test_var_refuses_integers_and_two_divisors():
    with pytest.raises(
        af.DTypeError,
        match=r"var: needs a floating point tensor, got "
        r"int64; convert with .float\(\)",
    ):
        af.var(af.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=r"std\(\): got unbiased=False and correction=2"):
        af.std(af.tensor([1.0, 2.0]), unbiased=False, correction=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu_and_its_layer_match_torch(dtype):
    x = RNG.standard_normal((3, 4)).astype(dtype)
    want = torch.nn.functional.silu(torch.tensor(x))
    _close(NF.silu(af.tensor(x)).numpy(), want, dtype)
    _close(nn.SiLU()(af.tensor(x)).numpy(), want, dtype)
    t = af.tensor(x)
    assert NF.silu(t, inplace=True) is t
    _close(t.numpy(), want, dtype)


# -- batch norm --------------------------------------------------------------------------------


def _pair(cls, tcls, **kw):
    """An actorflow layer and PyTorch's with the same random weights (loaded through numpy
    from torch's state_dict)."""
    t = tcls(3, **kw).double()
    if t.affine:
        with torch.no_grad():
            t.weight.normal_()
            t.bias.normal_()
    m = cls(3, dtype=af.float64, **kw)
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    return m, t


def _assert_state_equal(m, t):
    sd, st = m.state_dict(), t.state_dict()
    assert list(sd) == list(st)
    for k in st:
        assert tuple(sd[k].shape) == tuple(st[k].shape), k
        assert sd[k].dtype.name == str(st[k].dtype).split(".")[-1], k
        np.testing.assert_allclose(sd[k].numpy(), st[k].numpy(), rtol=1e-12, atol=1e-12)


LAYERS = [
    (nn.BatchNorm1d, torch.nn.BatchNorm1d, (5, 3)),
    (nn.BatchNorm1d, torch.nn.BatchNorm1d, (4, 3, 2)),
    (nn.BatchNorm2d, torch.nn.BatchNorm2d, (2, 3, 2, 3)),
]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(momentum=None),
        dict(affine=False),
        dict(momentum=0.3, eps=1e-3),
        dict(track_running_stats=False),
    ],
)
@pytest.mark.parametrize("layer", LAYERS, ids=["1d", "1d-L", "2d"])
def test_batch_norm_layers_train_and_eval_as_torch(layer, kw):
    cls, tcls, shape = layer
    m, t = _pair(cls, tcls, **kw)
    for _ in range(3):  # training: batch statistics
        x = RNG.standard_normal(shape) * 2 + 1
        xa, xt = af.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        w = RNG.standard_normal(shape)
        ya, yt = m(xa), t(xt)
        _close(ya.numpy(), yt, np.float64)
        (ya * af.tensor(w)).sum().backward()
        (yt * torch.tensor(w)).sum().backward()
        _close(xa.grad.numpy(), xt.grad, np.float64)
    if t.affine:
        _close(m.weight.grad.numpy(), t.weight.grad, np.float64)
        _close(m.bias.grad.numpy(), t.bias.grad, np.float64)
    _assert_state_equal(m, t)
    m.eval()
    t.eval()  # eval: the running statistics
    x = RNG.standard_normal(shape)
    _close(m(af.tensor(x)).numpy(), t(torch.tensor(x)), np.float64)
    with af.no_grad():
        _close(m(af.tensor(x)).numpy(), t(torch.tensor(x)), np.float64)
    _assert_state_equal(m, t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
def test_functional_batch_norm_matches_torch_and_updates_the_running_statistics(training, dtype):
    x = RNG.standard_normal((6, 3, 4)).astype(dtype)
    w, b = RNG.standard_normal(3).astype(dtype), RNG.standard_normal(3).astype(dtype)
    rm, rv = RNG.standard_normal(3).astype(dtype), (RNG.random(3) + 0.5).astype(dtype)
    am, av, tm, tv = af.tensor(rm), af.tensor(rv), torch.tensor(rm), torch.tensor(rv)
    got = NF.batch_norm(af.tensor(x), am, av, af.tensor(w), af.tensor(b), training, 0.2, 1e-3)
    want = torch.nn.functional.batch_norm(
        torch.tensor(x), tm, tv, torch.tensor(w), torch.tensor(b), training, 0.2, 1e-3
    )
    _close(got.numpy(), want, dtype)
    _close(am.numpy(), tm, dtype)
    _close(av.numpy(), tv, dtype)
    assert training or np.array_equal(am.numpy(), rm)


def test_batch_norm_state_dict_keys_are_torchs_and_torch_weights_load_through_numpy():
    t = torch.nn.Sequential(
        torch.nn.Linear(4, 3),
        torch.nn.BatchNorm1d(3),
        torch.nn.ReLU(),
        torch.nn.GroupNorm(1, 3),
        torch.nn.BatchNorm1d(3, affine=False),
        torch.nn.BatchNorm1d(3, track_running_stats=False),
    )
    m = nn.Sequential(
        nn.Linear(4, 3),
        nn.BatchNorm1d(3),
        nn.ReLU(),
        nn.GroupNorm(1, 3),
        nn.BatchNorm1d(3, affine=False),
        nn.BatchNorm1d(3, track_running_stats=False),
    )
    t.train()
    for _ in range(2):
        t(torch.randn(8, 4))
    assert list(m.state_dict()) == list(t.state_dict())
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in t.named_buffers()]
    m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    _assert_state_equal(m, t)
    assert m.state_dict()["1.num_batches_tracked"].dtype == af.int64
    m.eval()
    t.eval()
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    _close(m(af.tensor(x)).numpy(), t(torch.tensor(x)), np.float32)


def test_batch_norm_layers_reprs_and_resets_are_torchs():
    m = nn.BatchNorm2d(4, momentum=None, affine=False)
    assert repr(m) == repr(torch.nn.BatchNorm2d(4, momentum=None, affine=False))
    assert repr(nn.BatchNorm1d(2, bias=False)) == repr(torch.nn.BatchNorm1d(2, bias=False))
    assert repr(nn.GroupNorm(2, 4)) == repr(torch.nn.GroupNorm(2, 4))
    assert list(nn.GroupNorm(2, 4, bias=False).state_dict()) == ["weight"]
    m(af.tensor(RNG.standard_normal((2, 4, 2, 2)).astype(np.float32)))
    assert int(m.num_batches_tracked) == 1
    m.reset_running_stats()
    assert int(m.num_batches_tracked) == 0 and m.running_var.numpy().tolist() == [1.0] * 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape, groups, affine", [((2, 4, 3), 2, True), ((3, 6, 2, 2), 3, False), ((2, 4), 2, True)]
)
def test_group_norm_matches_torch(shape, groups, affine, dtype):
    t = torch.nn.GroupNorm(groups, shape[1], affine=affine, dtype=torch.float64)
    if affine:
        with torch.no_grad():
            t.weight.normal_()
            t.bias.normal_()
    m = nn.GroupNorm(
        groups, shape[1], affine=affine, dtype=af.float64 if dtype == np.float64 else af.float32
    )
    m.load_state_dict({k: v.numpy().astype(dtype) for k, v in t.state_dict().items()})
    x = RNG.standard_normal(shape)
    t = t.to(torch.float64 if dtype == np.float64 else torch.float32)
    _close(m(af.tensor(x.astype(dtype))).numpy(), t(torch.tensor(x.astype(dtype))), dtype)


def test_half_statistics_are_computed_in_float32_as_torch():
    # deviations of 300 square past float16's 65504: torch computes the statistics in float32
    x = np.array([[[0.0, 600.0, 0.0, 600.0], [0.0, 600.0, 0.0, 600.0]]], np.float32)
    rng = np.random.default_rng(11)  # (its own: the data must not depend on order)
    for _ in range(20):
        w = rng.standard_normal(2).astype(np.float32)
        b = rng.standard_normal(2).astype(np.float32)
        got = NF.group_norm(af.tensor(x).half(), 1, af.tensor(w).half(), af.tensor(b).half())
        want = torch.nn.functional.group_norm(
            torch.tensor(x).half(), 1, torch.tensor(w).half(), torch.tensor(b).half()
        )
        assert got.dtype == af.float16
        # within one float16 ulp: PyTorch's cpu kernel rounds its affine step its own way
        # (about 1 draw in 25 of the weight and bias differs by one ulp from float32 math)
        np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-3)
    y = RNG.standard_normal((3, 8)).astype(np.float32) * 300
    for f in ("std", "var"):
        for dim in (None, 1):
            got = getattr(af, f)(af.tensor(y).half(), dim)
            want = getattr(torch, f)(torch.tensor(y).half(), dim)
            assert got.dtype == af.float16
            np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-3)


# -- errors ------------------------------------------------------------------------------------


def test_a_wrong_channel_count_names_both_shapes():
    bn = nn.BatchNorm2d(3)
    with pytest.raises(
        af.ShapeError,
        match=r"batch_norm: the input has 4 channels \(shape "
        r"\(2, 4, 2, 2\), channels in dim 1\) but "
        r"running_mean has shape \(3,\)",
    ):
        bn(af.zeros(2, 4, 2, 2))
    with pytest.raises(
        af.ShapeError,
        match=r"weight has shape \(2,\): one value per channel, "
        r"shape \(3,\)",
    ):
        NF.batch_norm(af.zeros(2, 3), None, None, af.ones(2), training=True)
    with pytest.raises(
        af.ShapeError,
        match=r"group_norm: num_groups=4 must be an int > 0 "
        r"that divides the 6 channels",
    ):
        NF.group_norm(af.zeros(2, 6, 3), 4)
    with pytest.raises(
        ValueError,
        match=r"num_channels \(6\) must be divisible by "
        r"num_groups \(4\)",
    ):
        nn.GroupNorm(4, 6)


def test_batch_norm_layers_refuse_the_wrong_number_of_dims():
    with pytest.raises(
        ValueError,
        match=r"BatchNorm1d: expected 2D or 3D input \(got 4D "
        r"input of shape \(2, 3, 1, 1\)\)",
    ):
        nn.BatchNorm1d(3)(af.zeros(2, 3, 1, 1))
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected 4D input \(got 2D"):
        nn.BatchNorm2d(3)(af.zeros(2, 3))


def test_training_on_one_value_per_channel_is_refused_as_torch_and_eval_takes_it():
    bn = nn.BatchNorm1d(3)
    with pytest.raises(
        ValueError,
        match=r"expected more than 1 value per channel when "
        r"training, got input of shape \(1, 3\)",
    ):
        bn(af.ones(1, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        torch.nn.BatchNorm1d(3)(torch.ones(1, 3))
    bn.eval()
    assert bn(af.ones(1, 3)).shape == (1, 3)
    assert nn.BatchNorm1d(3)(af.ones(1, 3, 2)).shape == (1, 3, 2)  # two values per channel


def test_batch_norm_refuses_integers_and_mixed_dtypes_naming_them():
    with pytest.raises(
        af.DTypeError,
        match=r"batch_norm: needs a floating point input, got "
        r"int64; convert with .float\(\)",
    ):
        NF.batch_norm(af.zeros(2, 3, dtype=af.int64), None, None, training=True)
    with pytest.raises(
        af.DTypeError,
        match=r"batch_norm: weight is float64 but the input is "
        r"float32; convert it with .to\(af.float32\)",
    ):
        NF.batch_norm(af.zeros(2, 3), None, None, af.ones(3, dtype=af.float64), training=True)


def test_functional_batch_norm_refuses_a_momentum_of_none_as_torch():
    with pytest.raises(TypeError, match=r"momentum must be a float, got None"):
        NF.batch_norm(af.zeros(2, 3), af.zeros(3), af.ones(3), training=True, momentum=None)


# -- graph mode: the running statistics are state ----------------------------------------------


class _Math(nn.Module):
    """The math ops and var/std in one layer."""

    def forward(self, x):
        return (
            x.sin() * x.erf()
            + x.cos()
            + (x.var(dim=1, keepdim=True) + 1).rsqrt() * x.std(dim=0, keepdim=True, correction=0)
        )


def _cnn(momentum):
    af.manual_seed(3)
    return nn.Sequential(
        nn.Linear(4, 6),
        nn.BatchNorm1d(6, momentum=momentum),
        nn.ReLU(),
        nn.Linear(6, 6),
        nn.BatchNorm1d(6),
        nn.SiLU(),
        _Math(),
        nn.GroupNorm(2, 6),
        nn.Linear(6, 2),
    )


class _Train(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = NF.mse_loss(self.model(x), y)
        loss.backward()
        return loss


class _Eval(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


_DATA = [
    (RNG.standard_normal((8, 4)).astype(np.float32), RNG.standard_normal((8, 2)).astype(np.float32))
    for _ in range(4)
]


def _eager(model, opt):
    losses = []
    for x, y in _DATA:
        opt.zero_grad()
        loss = NF.mse_loss(model(af.tensor(x)), af.tensor(y))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("how", ["step", "run", "run-fused"])
def test_a_graph_trains_batch_norm_as_eager_mode_running_statistics_included(how, momentum):
    want_model = _cnn(momentum)
    want = _eager(want_model, optim.Adam(want_model.parameters(), lr=0.05))
    model = _cnn(momentum)
    g = _Train(model, optim.Adam(model.parameters(), lr=0.05))
    if how == "step":
        got = [float(g.step(x, y)) for x, y in _DATA]
    else:
        got = [float(np.asarray(out)) for out in g.run(_DATA, fused=how == "run-fused")]
    assert got == want
    wsd = want_model.state_dict()
    for k, v in model.state_dict().items():  # parameters and every buffer, bit for bit
        assert np.array_equal(v.numpy(), wsd[k].numpy()), k
    assert int(model.state_dict()["1.num_batches_tracked"]) == len(_DATA)
    model.eval()
    want_model.eval()  # eval in a graph: the running statistics
    x = _DATA[0][0]
    assert np.array_equal(_Eval(model).step(x).numpy(), want_model(af.tensor(x)).numpy())
    assert int(model.state_dict()["1.num_batches_tracked"]) == len(_DATA)


def test_one_graph_follows_train_and_eval_of_its_batch_norm():
    model, want = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    g = _Eval(model)
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    for mode in ("train", "eval", "train"):
        getattr(model, mode)()
        getattr(want, mode)()
        assert np.array_equal(g.step(x).numpy(), want(af.tensor(x)).numpy())
        assert np.array_equal(model.running_var.numpy(), want.running_var.numpy())
    assert int(model.num_batches_tracked) == 2


class _Counts(nn.Module):
    """A module writing its buffers in place in forward, as batch norm does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", af.zeros((), dtype=af.int64))
        self.register_buffer("total", af.zeros(4))

    def forward(self, x):
        with af.no_grad():
            self.calls.add_(1)
            self.total.copy_(self.total + x.sum(dim=0).double())  # (cast to float32)
            self.total.mul_(0.5)
        return x * self.total  # reads the value just written


@pytest.mark.parametrize("how", ["step", "run", "run-fused"])
def test_in_place_writes_of_whole_buffers_in_build_are_state_written_in_piece_order(how):
    eager, graph = _Counts(), _Counts()
    want = [eager(af.tensor(x)).numpy() for x, _ in _DATA]
    g = _Eval(graph)
    if how == "step":
        got = [g.step(x).numpy() for x, _ in _DATA]
    else:
        got = [np.asarray(out) for out in g.run([x for x, _ in _DATA], fused=how == "run-fused")]
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
    assert int(graph.calls) == len(_DATA)
    assert np.array_equal(graph.total.numpy(), eager.total.numpy())


def test_a_partial_in_place_write_into_a_buffer_in_build_is_still_refused():
    class Half(nn.Graph):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def build(self, x):
            self.bn.running_mean[0] = 1.0
            return x.sum()

    with pytest.raises(
        af.TraceError,
        match=r"in-place ops are refused.*a view of shape \(\) "
        r"into a tensor of shape \(3,\)",
    ):
        Half().step(af.zeros(2, 3))


def test_a_graph_under_no_grad_normalizes_with_batch_statistics_and_updates_them():
    model = nn.BatchNorm1d(3)
    want = nn.BatchNorm1d(3)
    x = RNG.standard_normal((5, 3)).astype(np.float32)

    class Fwd(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = model

        def build(self, x):
            with af.no_grad():
                return self.m(x)

    got = Fwd().step(x)
    with af.no_grad():
        expect = want(af.tensor(x))
    assert np.array_equal(got.numpy(), expect.numpy())
    assert np.array_equal(model.running_var.numpy(), want.running_var.numpy())


def test_the_layers_under_no_grad_compute_the_same_values_and_record_nothing():
    model = _cnn(0.1)
    x = af.tensor(_DATA[0][0])
    with af.no_grad():
        y = model(x)
    want = _cnn(0.1)(x)
    assert not y.requires_grad and want.requires_grad
    assert np.array_equal(y.numpy(), want.numpy())


# -- the cuda device (emulator) ----------------------------------------------------------------


def test_norm_layers_and_math_ops_on_cuda_equal_cpu(emu, one_launch_per_op):
    # (one launch per op: an eager run on cuda whose members sum a gradient from two
    # branches fails whatever its ops, e.g. (x.sigmoid() + x.exp()) backward: a fault of
    # device runs, not of these ops)
    emu()
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    out = {}
    for dev in ("cpu", "cuda:0"):
        bn = nn.BatchNorm2d(3, device=dev)
        gn = nn.GroupNorm(3, 3, device=dev)
        xt = af.tensor(x, device=dev, requires_grad=True)
        y = gn(bn(xt)).sin() + xt.cos() * xt.erf() + (xt * xt + 1).rsqrt() + NF.silu(xt)
        (y * y).sum().backward()
        bn.eval()
        out[dev] = [
            a.to("cpu").numpy()
            for a in (y, xt.grad, bn.running_mean, bn.running_var, bn(xt), xt.var(dim=1), xt.std())
        ]
    for got, want in zip(out["cuda:0"], out["cpu"], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_graph_step_on_cuda_trains_batch_norm_as_on_cpu(emu):
    emu()
    got, start = {}, None
    for dev in ("cpu", "cuda:0"):
        af.manual_seed(3)
        model = nn.Sequential(
            nn.Linear(4, 6, device=dev),
            nn.BatchNorm1d(6, momentum=None, device=dev),
            nn.ReLU(),
            _Math(),
            nn.GroupNorm(2, 6, device=dev),
            nn.Linear(6, 2, device=dev),
        )
        if start is None:
            start = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        else:  # the same initial weights
            model.load_state_dict(start)
        g = _Train(model, optim.SGD(model.parameters(), lr=0.1))
        losses = [
            float(g.step(af.tensor(x, device=dev), af.tensor(y, device=dev))) for x, y in _DATA
        ]
        got[dev] = losses, {k: v.to("cpu").numpy() for k, v in model.state_dict().items()}
    assert got["cpu"][0] == got["cuda:0"][0]
    for k, v in got["cpu"][1].items():
        assert np.array_equal(got["cuda:0"][1][k], v), k


# -- layer norm: one op with its own backward ---------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape, normalized, affine",
    [
        ((3, 4, 8), (8,), True),
        ((2, 3, 4), (3, 4), True),
        ((5,), (5,), False),
        ((2, 6), (6,), False),
    ],
)
def test_layer_norm_matches_torch_with_gradients(shape, normalized, affine, dtype):
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    w = RNG.standard_normal(normalized).astype(dtype) if affine else None
    b = RNG.standard_normal(normalized).astype(dtype) if affine else None
    gy = RNG.standard_normal(shape).astype(dtype)
    ours = [af.tensor(a, requires_grad=True) for a in (x, w, b) if a is not None]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b) if a is not None]
    y = NF.layer_norm(*ours[:1], normalized, *ours[1:], eps=1e-4)
    ty = torch.nn.functional.layer_norm(*theirs[:1], normalized, *theirs[1:], eps=1e-4)
    (y * af.tensor(gy)).sum().backward()
    (ty * torch.tensor(gy)).sum().backward()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=tol, atol=tol)
    for a, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol * 10)
    with af.no_grad():  # the same values, nothing recorded
        z = NF.layer_norm(*ours[:1], normalized, *ours[1:], eps=1e-4)
    assert not z.requires_grad and np.array_equal(z.numpy(), y.numpy())


def test_layer_norm_refuses_bad_shapes_and_dtypes_naming_them():
    with pytest.raises(
        af.ShapeError,
        match=r"layer_norm: normalized_shape \(3,\) must be the "
        r"last dims of the input",
    ):
        NF.layer_norm(af.zeros(2, 4), (3,))
    with pytest.raises(
        af.ShapeError,
        match=r"layer_norm: weight must have the normalized "
        r"shape \(4,\).*got shape \(3,\)",
    ):
        NF.layer_norm(af.zeros(2, 4), (4,), af.ones(3))
    with pytest.raises(
        af.DTypeError,
        match=r"layer_norm: bias is float64 but the input is "
        r"float32; convert it with .to\(af.float32\)",
    ):
        NF.layer_norm(af.zeros(2, 4), (4,), None, af.zeros(4, dtype=af.float64))
    with pytest.raises(
        af.DTypeError,
        match=r"layer_norm: needs a floating point input, got "
        r"int64; convert with .float\(\) first",
    ):
        NF.layer_norm(af.zeros(2, 4, dtype=af.int64), (4,))


def _ln_model():
    af.manual_seed(5)
    return nn.Sequential(
        nn.Linear(4, 6),
        nn.LayerNorm(6),
        nn.ReLU(),
        nn.LayerNorm(6, elementwise_affine=False),
        nn.Linear(6, 2),
    )


@pytest.mark.parametrize("how", ["step", "run", "run-fused"])
def test_a_graph_trains_layer_norm_as_eager_mode(how):
    want_model = _ln_model()
    want = _eager(want_model, optim.Adam(want_model.parameters(), lr=0.05))
    model = _ln_model()
    g = _Train(model, optim.Adam(model.parameters(), lr=0.05))
    if how == "step":
        got = [float(g.step(x, y)) for x, y in _DATA]
    else:
        got = [float(np.asarray(out)) for out in g.run(_DATA, fused=how == "run-fused")]
    assert got == want
    wsd = want_model.state_dict()
    for k, v in model.state_dict().items():
        assert np.array_equal(v.numpy(), wsd[k].numpy()), k


def test_layer_norm_on_cuda_equals_cpu(emu):
    emu()
    x = RNG.standard_normal((3, 5, 6)).astype(np.float32)
    out = {}
    for dev in ("cpu", "cuda:0"):
        af.manual_seed(2)
        ln = nn.LayerNorm(6, device=dev)
        xt = af.tensor(x, device=dev, requires_grad=True)
        y = ln(xt)
        (y * y.sin()).sum().backward()
        out[dev] = [a.to("cpu").numpy() for a in (y, xt.grad, ln.weight.grad, ln.bias.grad)]
    for got, want in zip(out["cuda:0"], out["cpu"], strict=True):
        np.testing.assert_array_equal(got, want)


def test_batch_norm_of_a_float16_channels_last_view_equals_its_contiguous_copy():
    # a float16 output is computed in a float32 scratch array: made in the view's layout,
    # its rows were a copy and the result was never written
    xn = np.random.default_rng(0).standard_normal((2, 3, 3, 4)).astype(np.float16)
    base = af.tensor(xn, requires_grad=True)
    dense = af.tensor(np.ascontiguousarray(xn.transpose(0, 3, 1, 2)), requires_grad=True)
    y = af.nn.functional.batch_norm(base.permute(0, 3, 1, 2), None, None, training=True)
    z = af.nn.functional.batch_norm(dense, None, None, training=True)
    np.testing.assert_array_equal(y.numpy(), z.numpy())
    (y * y).sum().backward()
    (z * z).sum().backward()
    np.testing.assert_array_equal(base.grad.numpy().transpose(0, 3, 1, 2), dense.grad.numpy())
