"""bfloat16 as a storage dtype: conversions bit for bit as PyTorch's (round to nearest even,
NaN kept), PyTorch's promotion, ops computing in float32 and rounding their bfloat16
outputs, numpy() as float32, af.save/af.load, a model in bfloat16 (Module.to/.bfloat16())
eager and in nn.Graph, and the refusal on cuda."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)


def torch_bits(a: np.ndarray) -> np.ndarray:
    return torch.tensor(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def bits(t) -> np.ndarray:
    """A bfloat16 tensor's storage bits (numpy() widens them)."""
    return af.dtype.bfloat16_bits(t.numpy())


def test_float32_to_bfloat16_rounds_as_pytorch_bit_for_bit_and_back_exactly():
    patterns = RNG.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [
            0x3F808000,
            0x3F818000,
            0x3F80FFFF,
            0x7F7FFFFF,
            0x7F7F7FFF,
            0x00000001,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0xFF800001,
        ],
        np.uint32,
    )  # ties to even both ways, overflow to inf, subnormals
    x = np.concatenate([patterns, special]).view(np.float32)
    t = af.tensor(x).bfloat16()
    assert t.dtype is af.bfloat16
    got, want = bits(t), torch_bits(x)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(t.numpy()[nan]).all()  # NaN stays NaN
    back = t.float().numpy()
    np.testing.assert_array_equal(
        back[~nan], torch.tensor(x).to(torch.bfloat16).float().numpy()[~nan]
    )
    # float64 goes through float32 first, as PyTorch's conversion does
    v = np.array([1 + 2**-8 + 2**-30, -3.0000001, 1e39])
    np.testing.assert_array_equal(
        af.tensor(v).to(af.bfloat16).numpy(), torch.tensor(v).to(torch.bfloat16).float().numpy()
    )
    np.testing.assert_array_equal(
        af.tensor(v, dtype=af.bfloat16).numpy(),
        torch.tensor(v, dtype=torch.bfloat16).float().numpy(),
    )


def test_promotion_is_pytorchs():
    b = af.ones(2, dtype=af.bfloat16)
    assert (b + af.ones(2, dtype=af.float16)).dtype is af.float32
    assert (b + af.ones(2)).dtype is af.float32
    assert (b + af.ones(2, dtype=af.float64)).dtype is af.float64
    assert (af.ones(2, dtype=af.int64) + b).dtype is af.bfloat16
    assert (b * 2.5).dtype is af.bfloat16 and (b + 1).dtype is af.bfloat16
    assert (b > 0).dtype is af.bool
    assert af.promote_types(af.bfloat16, af.float16) is af.float32
    assert af.promote_types(af.float16, af.bfloat16) is af.float32
    assert af.promote_types(af.int32, af.bfloat16) is af.bfloat16
    for a, c in [("bfloat16", "float16"), ("bfloat16", "float32"), ("int64", "bfloat16")]:
        want = torch.promote_types(getattr(torch, a), getattr(torch, c))
        assert af.promote_types(getattr(af, a), getattr(af, c)).name == str(want)[6:]


def test_ops_compute_in_float32_and_round_their_outputs_as_pytorch():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    y = RNG.standard_normal((4, 6)).astype(np.float32) + 3.0
    a, b = af.tensor(x).bfloat16(), af.tensor(y).bfloat16()
    ta, tb = torch.tensor(x).bfloat16(), torch.tensor(y).bfloat16()
    for f in (
        lambda p, q: p + q,
        lambda p, q: p * q,
        lambda p, q: p / q,
        lambda p, q: p - 0.3,
        lambda p, q: -p,
        lambda p, q: p.clamp(-0.5, 0.5),
    ):
        got, want = f(a, b), f(ta, tb)
        assert got.dtype is af.bfloat16
        np.testing.assert_array_equal(got.numpy(), want.float().numpy())
    for f in (
        lambda p: p.exp(),
        lambda p: p.sum(dim=1),
        lambda p: p.mean(),
        lambda p: p @ p.T,
        lambda p: af.softmax(p, dim=1) if isinstance(p, af.Tensor) else torch.softmax(p, dim=1),
        lambda p: p.cumsum(1),
        lambda p: p.sort(dim=1).values,
        lambda p: p.topk(2).values,
        lambda p: p.max(dim=0).values,
    ):
        got, want = f(a), f(ta)
        assert got.dtype is af.bfloat16
        np.testing.assert_allclose(got.numpy(), want.float().numpy(), rtol=2**-7, atol=1e-2)
    z = a.clone()  # in place, through a view
    z[1:, ::2] += 1.0
    tz = ta.clone()
    tz[1:, ::2] += 1.0
    np.testing.assert_array_equal(z.numpy(), tz.float().numpy())
    assert af.where(a > 0, a, 0.0).dtype is af.bfloat16
    np.testing.assert_array_equal(
        af.gather(a, 1, af.tensor([[0, 5]] * 4)).numpy(),
        ta.gather(1, torch.tensor([[0, 5]] * 4)).float().numpy(),
    )


def test_a_number_meets_a_bfloat16_tensor_bit_for_bit_as_pytorch():
    # mul and div take the number unrounded (float32), add and sub round it to bfloat16
    # first, number / x is x's reciprocal (rounded) times the number: as PyTorch's cpu kernels
    x = (RNG.standard_normal(2000) * RNG.choice([1e-3, 1.0, 30.0, 1e4], 2000)).astype(np.float32)
    a, t = af.tensor(x).bfloat16(), torch.tensor(x).bfloat16()
    ops = [
        lambda p, s: p + s,
        lambda p, s: p - s,
        lambda p, s: p * s,
        lambda p, s: p / s,
        lambda p, s: s + p,
        lambda p, s: s - p,
        lambda p, s: s * p,
        lambda p, s: s / p,
        lambda p, s: p // s,
    ]
    for s in (0.9, 3.3333, 1.1, 0.1234, -2.71828, 1e-3, 123.456, 1 / 3, 7, 257):
        for i, f in enumerate(ops):
            got, want = f(a, s), f(t, s)
            assert got.dtype is af.bfloat16
            np.testing.assert_array_equal(
                bits(got),
                want.view(torch.int16).numpy().view(np.uint16),
                err_msg=f"op {i}, number {s}",
            )
    z, tz = a.clone(), t.clone()  # in place
    z *= 0.9
    tz *= 0.9
    np.testing.assert_array_equal(bits(z), tz.view(torch.int16).numpy().view(np.uint16))


def test_numpy_item_tolist_and_factories():
    t = af.tensor([1.0, 2.5, 1.00390625], dtype=af.bfloat16)
    a = t.numpy()
    assert a.dtype == np.float32  # numpy has no bfloat16: float32 values
    np.testing.assert_array_equal(a, [1.0, 2.5, 1.0])
    assert t[1].item() == 2.5 and t.tolist() == [1.0, 2.5, 1.0]
    assert af.zeros(3, dtype=af.bfloat16).dtype is af.bfloat16
    np.testing.assert_array_equal(
        af.full((2,), 3.3, dtype=af.bfloat16).numpy(),
        torch.full((2,), 3.3, dtype=torch.bfloat16).float().numpy(),
    )
    assert af.tensor(t).dtype is af.bfloat16
    assert "dtype=actorflow.bfloat16" in repr(t)
    with pytest.raises(af.DTypeError, match="numpy dtype uint16 is not supported"):
        af.from_numpy(np.zeros(2, np.uint16))  # a uint16 array is no bfloat16


def test_save_and_load_keep_bfloat16_bit_for_bit(tmp_path):
    t = af.tensor(RNG.standard_normal(7).astype(np.float32)).bfloat16()
    af.save({"w": t, "f": af.ones(2)}, tmp_path / "ckpt.npz")
    back = af.load(tmp_path / "ckpt.npz")
    assert back["w"].dtype is af.bfloat16 and back["f"].dtype is af.float32
    np.testing.assert_array_equal(bits(back["w"]), bits(t))


def _models(seed=0):
    af.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    return m, tm


def test_a_model_in_bfloat16_runs_forward_backward_and_a_step():
    m, tm = _models()
    params = list(m.parameters())
    opt = af.optim.SGD(m.parameters(), lr=0.1)
    assert m.bfloat16() is m and m.to(af.bfloat16) is m
    tm.bfloat16()
    assert all(p.dtype is af.bfloat16 for p in m.parameters())
    assert list(m.parameters()) == params  # the same Parameter objects
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    y = m(af.tensor(x).bfloat16())
    ty = tm(torch.tensor(x).bfloat16())
    assert y.dtype is af.bfloat16
    np.testing.assert_allclose(
        y.detach().numpy(), ty.detach().float().numpy(), rtol=2**-6, atol=2e-2
    )
    y.sum().backward()
    assert m[0].weight.grad.dtype is af.bfloat16
    before = m[0].weight.detach().numpy().copy()
    opt.step()
    assert m[0].weight.dtype is af.bfloat16
    assert not np.array_equal(m[0].weight.detach().numpy(), before)
    m.float()
    assert all(p.dtype is af.float32 for p in m.parameters())
    with pytest.raises(TypeError, match="only floating point dtypes"):
        m.to(af.int64)


def test_a_bfloat16_model_in_an_inference_graph_equals_eager():
    m, _ = _models(1)
    m.bfloat16()

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):  # (a step's inputs and outputs are numpy's dtypes)
            return self.m(x.bfloat16()).float()

    x = af.tensor(RNG.standard_normal((4, 8)).astype(np.float32))
    with af.no_grad():
        want = m(x.bfloat16()).numpy()
    got = Infer()(x)
    np.testing.assert_array_equal(got.numpy(), want)


def test_bfloat16_step_inputs_and_outputs_are_refused_naming_the_fix():
    m, _ = _models(1)
    m.bfloat16()

    class Infer(nn.Graph):
        def __init__(self, cast):
            super().__init__()
            self.m, self.cast = m, cast

        def build(self, x):
            return self.m(x.bfloat16() if self.cast else x)

    x = af.tensor(RNG.standard_normal((4, 8)).astype(np.float32))
    fix = r"numpy has no bfloat16\); feed float32 and cast inside build \(x\.bfloat16\(\)\)"
    for call in (
        lambda: Infer(False)(x.bfloat16()),
        lambda: list(Infer(False).run([x.bfloat16()])),
    ):
        with pytest.raises(af.DTypeError, match=r"Infer: build's input 0 is bfloat16.*" + fix):
            call()
    for call in (
        lambda: Infer(True)(x),
        lambda: list(Infer(True).run([x])),
        lambda: list(Infer(True).run([x], fused=True)),
    ):
        with pytest.raises(
            af.DTypeError,
            match=r"Infer: build's output 0 is bfloat16.*"
            r"return float32 \(y\.float\(\)\)",
        ):
            call()


def test_bfloat16_is_refused_on_cuda_naming_cpu(emu):
    emu()
    t = af.ones(2, dtype=af.float32, device="cuda:0")
    with pytest.raises(
        af.DTypeError,
        match=r"bfloat16 tensors are computed on cpu only.*"
        r"\.to\('cpu'\)",
    ):
        t.bfloat16()
