"""gather, scatter_add, cumsum, sort/argsort/topk and nn.functional.pad: forward values
against PyTorch (float32 and float64), ties, index bounds checked in the kernel before
anything is written, argument errors, no_grad, nn.Graph (step, and run with and without
fused) and the cuda device on the emulator. Gradients: tests/test_autograd.py's CASES."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)
F = af.nn.functional


def both(a):
    return af.tensor(a), torch.tensor(a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_and_scatter_add_equal_pytorchs(dtype):
    x = RNG.standard_normal((3, 5)).astype(dtype)
    index = np.array([[0, 4, 4], [1, 1, 0], [3, 2, 1]])
    src = RNG.standard_normal((4, 4)).astype(dtype)  # larger than index: allowed
    (ax, tx), (ai, ti), (asrc, tsrc) = both(x), both(index), both(src)
    for dim in (0, 1, -1):
        i = np.minimum(index, x.shape[dim] - 1)
        ai, ti = both(i)
        np.testing.assert_array_equal(
            af.gather(ax, dim, ai).numpy(), torch.gather(tx, dim, ti).numpy()
        )
        np.testing.assert_allclose(
            af.scatter_add(ax, dim, ai, asrc).numpy(),
            torch.scatter_add(tx, dim, ti, tsrc).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )
    y = ax.clone()
    assert y.scatter_add_(1, ai, asrc) is y
    np.testing.assert_allclose(
        y.numpy(), tx.clone().scatter_add_(1, ti, tsrc).numpy(), rtol=1e-5, atol=1e-6
    )
    ai, ti = both(np.minimum(index, 2)[:2])  # smaller than x in dim 1 too
    np.testing.assert_array_equal(ax.gather(0, ai).numpy(), tx.gather(0, ti).numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
def test_cumsum_equals_pytorchs_with_its_dtypes(dtype):
    x = (RNG.standard_normal((3, 4)) * 3).astype(dtype)
    a, t = both(x)
    for dim in (0, 1, -2):
        got, want = af.cumsum(a, dim), torch.cumsum(t, dim)
        assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    h = af.tensor(np.full(3000, 0.1, np.float16))  # half sums in float32, as PyTorch
    np.testing.assert_array_equal(
        af.cumsum(h, 0).numpy(), torch.cumsum(torch.tensor(h.numpy()), 0).numpy()
    )
    got = a.cumsum(1, dtype=af.float64)
    assert got.dtype is af.float64
    np.testing.assert_allclose(got.numpy(), torch.cumsum(t, 1, dtype=torch.float64).numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_sort_and_argsort_equal_pytorchs_stable_sort_ties_included(dtype):
    x = RNG.integers(0, 4, (3, 7)).astype(dtype)  # many ties
    a, t = both(x)
    for dim in (0, 1, -1):
        for desc in (False, True):
            got = af.sort(a, dim, descending=desc)
            want = torch.sort(t, dim=dim, descending=desc, stable=True)
            np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
            np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
            np.testing.assert_array_equal(
                a.argsort(dim=dim, descending=desc).numpy(),
                torch.argsort(t, dim=dim, descending=desc, stable=True).numpy(),
            )
    values, indices = a.sort()  # a named tuple, as PyTorch's
    assert type(a.sort()).__name__ == "sort"
    assert values.shape == (3, 7) and indices.dtype is af.int64


def test_sort_puts_nan_above_every_number_as_pytorch():
    x = np.array([1.0, np.nan, -np.inf, 3.0, np.nan, np.inf])
    a, t = both(x)
    for desc in (False, True):
        got = af.sort(a, descending=desc)
        want = torch.sort(t, descending=desc, stable=True)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_values_equal_pytorchs_and_indices_point_at_them(dtype):
    x = RNG.integers(0, 5, (4, 9)).astype(dtype)  # ties: indices may differ
    a, t = both(x)
    for dim in (0, 1):
        for largest in (True, False):
            for k in (0, 1, 3):
                got = af.topk(a, k, dim=dim, largest=largest)
                want = torch.topk(t, k, dim=dim, largest=largest)
                np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
                idx = got.indices.numpy()
                np.testing.assert_array_equal(
                    np.take_along_axis(x, idx, axis=dim), got.values.numpy()
                )
                rows = np.moveaxis(idx, dim, -1).reshape(-1, k) if k else []
                assert all(len(set(row)) == k for row in rows)  # k distinct positions
    distinct = RNG.permutation(36).reshape(4, 9).astype(dtype)
    a, t = both(distinct)
    got, want = a.topk(4), t.topk(4)
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    assert type(got).__name__ == "topk"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pad_equals_pytorchs(dtype):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(dtype)
    a, t = both(x)
    tf = torch.nn.functional
    for pad in [(1, 2), (0, 0, 2, 1), (1, 1, 1, 1, 1, 1, 1, 1), (-1, 2, 0, -2), (-2, -3)]:
        for value in (None, 0.5):
            np.testing.assert_array_equal(
                F.pad(a, pad, value=value).numpy(), tf.pad(t, pad, value=value).numpy()
            )
    for mode in ("reflect", "replicate", "circular"):
        for pad in [(1, 2, 0, 0), (2, 1, 0, 3), (3, 0, 1, 2), (1, 2, 1, 0, 2, 1)]:
            np.testing.assert_array_equal(
                F.pad(a, pad, mode=mode).numpy(), tf.pad(t, pad, mode=mode).numpy(), err_msg=mode
            )
        for pad in [(1, 3), (1, 1, 2, 0)]:  # an unbatched input
            np.testing.assert_array_equal(
                F.pad(a[0], pad, mode=mode).numpy(), tf.pad(t[0], pad, mode=mode).numpy()
            )


def _torch_pad(x, pad, mode):
    try:
        return torch.nn.functional.pad(x, pad, mode=mode)
    except RuntimeError:
        return None


def test_pad_modes_accept_refuse_values_and_gradients_as_pytorch():
    # larger than the dim (replicate), negative amounts (cropping) and mixed signs; circular
    # wraps the part cropping leaves (torch reads unset memory, or refuses, or gives an empty
    # result when that wraps more than once: refused here, so those cases are left out)
    g = RNG.standard_normal(64)
    for mode in ("reflect", "replicate", "circular"):
        for n, b, a in [
            (n, b, a) for n in (1, 2, 3, 4) for b in range(-5, 6) for a in (-4, -1, 0, 2, 5)
        ]:
            x = np.arange(1.0, n + 1).reshape(1, 1, n)
            t = torch.tensor(x, requires_grad=True)
            want = _torch_pad(t, (b, a), mode)
            kept = n - max(-b, 0) - max(-a, 0)
            if mode == "circular" and n + b + a >= 0 and max(b, a, 0) > kept:
                continue
            try:
                v = af.tensor(x, requires_grad=True)
                got = F.pad(v, (b, a), mode=mode)
            except ValueError as e:
                assert want is None, (mode, n, b, a, str(e))
                assert f"padding ({b}, {a}) of dim 2 (size {n})" in str(e)
                continue
            assert want is not None, (mode, n, b, a)
            np.testing.assert_array_equal(
                got.numpy(), want.detach().numpy(), err_msg=str((mode, b, a))
            )
            if want.numel():
                w = g[: want.numel()].reshape(want.shape)
                (got * af.tensor(w)).sum().backward()
                (want * torch.tensor(w)).sum().backward()
                np.testing.assert_allclose(v.grad.numpy(), t.grad.numpy(), rtol=1e-12)


# -- errors ----------------------------------------------------------------------------------


def test_an_index_out_of_range_is_refused_by_the_kernel_naming_value_and_size():
    x = af.zeros(3, 4)
    for bad in (4, -1):
        i = af.tensor(np.array([[0, bad], [1, 1]]))
        with pytest.raises(
            af.IndexOutOfBoundsError,
            match=rf"gather: index {bad} is out of bounds.*\[0, 4\).*dim 1",
        ):
            af.gather(x, 1, i).numpy()
        with pytest.raises(IndexError, match=rf"scatter_add: index {bad}.*\[0, 4\)"):
            af.scatter_add(x, 1, i, af.ones(2, 2)).numpy()
    # nothing written: an in-place scatter that failed leaves its target as it was
    y = af.ones(2, 3)
    with pytest.raises(IndexError, match="out of bounds"):
        y.scatter_add_(0, af.tensor(np.array([[0, 1, 2]])), af.ones(1, 3))
        af.synchronize()
    np.testing.assert_array_equal(y.numpy(), np.ones((2, 3), np.float32))


def test_wrong_index_dtype_shape_and_dim_are_refused_with_the_fix():
    x = af.zeros(3, 4)
    with pytest.raises(af.DTypeError, match=r"gather\(\): index must be an int64.*\.long\(\)"):
        af.gather(x, 0, af.tensor(np.zeros((1, 1), np.int32)))
    with pytest.raises(af.ShapeError, match=r"index has 1 dims but the input has 2"):
        af.gather(x, 0, af.tensor(np.zeros(2, np.int64)))
    with pytest.raises(af.ShapeError, match=r"larger than the input's \(3, 4\) in dim 1"):
        af.gather(x, 0, af.tensor(np.zeros((1, 5), np.int64)))
    with pytest.raises(af.ShapeError, match=r"no larger than src's \(1, 1\)"):
        af.scatter_add(x, 0, af.tensor(np.zeros((1, 2), np.int64)), af.ones(1, 1))
    with pytest.raises(af.DTypeError, match=r"src is actorflow.float64.*\.to\("):
        af.scatter_add(x, 0, af.tensor(np.zeros((1, 2), np.int64)), af.ones(1, 2, dtype=af.float64))
    for call in (
        lambda: af.gather(x, 2, af.zeros(1, 1, dtype=af.int64)),
        lambda: af.cumsum(x, -3),
        lambda: af.sort(x, 5),
        lambda: af.topk(x, 1, dim=2),
    ):
        with pytest.raises(IndexError, match=r"dimension out of range"):
            call()
    with pytest.raises(af.ShapeError, match=r"topk: k \(5\) is out of range for dim 1 of size 4"):
        af.topk(x, 5)
    with pytest.raises(ValueError, match="padding length must be even"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match=r"3 \(left, right\) pairs for an input of 2 dims"):
        F.pad(x, (1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="unknown mode 'edge'"):
        F.pad(x, (1, 1), mode="edge")
    with pytest.raises(
        ValueError,
        match=r"reflect padding \(4, 0\) of dim 2 \(size 4\) must be "
        r"less than the dim's size",
    ):
        F.pad(af.zeros(1, 3, 4), (4, 0), mode="reflect")
    with pytest.raises(
        ValueError,
        match=r"circular padding \(-2, 3\) of dim 2 \(size 4\) wraps "
        r"the 2 elements left after cropping more than once",
    ):
        F.pad(af.zeros(1, 3, 4), (-2, 3), mode="circular")
    with pytest.raises(ValueError, match=r"mode 'replicate' needs non-empty channel"):
        F.pad(af.zeros(1, 0, 4), (1, 1), mode="replicate")
    with pytest.raises(af.ShapeError, match=r"leaves -1 elements"):
        F.pad(x, (-3, -2))


# -- modes: no_grad, nn.Graph, cuda ------------------------------------------------------------


class Scatter(nn.Module):
    """A layer using every op of the family: its output depends on the parameter through
    each of them."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(af.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)))

    def forward(self, x, index):
        h = x * self.w
        g = af.gather(h, 1, index)
        s = af.scatter_add(af.zeros(3, 4, device=x.device), 1, index, g * 2.0)
        c = af.cumsum(s + h, dim=1)
        v = af.sort(c, dim=1, descending=True).values + af.topk(c, 4, dim=1).values
        return F.pad(v, (1, 1, 0, 1), value=0.25).sum()


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.integers(0, 4, (3, 2)).astype(np.int64),
    )


class Step(nn.Graph):
    def __init__(self, m):
        super().__init__()
        self.m = m
        self.add_optimizer(af.optim.SGD(m.parameters(), lr=0.1))

    def build(self, x, i):
        out = self.m(x, i)
        out.backward()
        return out


def test_the_ops_run_under_no_grad_and_in_a_graph_step_and_run():
    data = [_inputs(s) for s in range(3)]
    m = Scatter()
    opt = af.optim.SGD(m.parameters(), lr=0.1)
    eager = []
    for x, i in data:
        with af.no_grad():
            before = m(af.tensor(x), af.tensor(i)).item()
        opt.zero_grad()
        loss = m(af.tensor(x), af.tensor(i))
        assert loss.item() == before
        loss.backward()
        opt.step()
        eager.append(loss.item())
    g = Step(Scatter())
    got = [g.step(af.tensor(x), af.tensor(i)).item() for x, i in data]
    np.testing.assert_allclose(got, eager, rtol=1e-6)
    np.testing.assert_allclose(g.m.w.numpy(), m.w.numpy(), rtol=1e-6)
    for fused in (False, True):
        g = Step(Scatter())
        got = [float(np.asarray(o)) for o in g.run(data, fused=fused)]
        np.testing.assert_allclose(got, eager, rtol=1e-6)


def test_the_ops_run_on_the_cuda_device_on_the_emulator(emu):
    emu()
    x, i = _inputs()
    m = Scatter()
    with af.no_grad():
        want = m(af.tensor(x), af.tensor(i)).item()
        m.w = nn.Parameter(m.w.to("cuda:0"))
        got = m(af.tensor(x).to("cuda:0"), af.tensor(i).to("cuda:0"))
        assert got.device.type == "cuda"
        assert got.item() == pytest.approx(want, rel=1e-6)
        bad = af.tensor(np.array([[9]])).to("cuda:0")
        with pytest.raises(af.IndexOutOfBoundsError, match=r"gather: index 9"):
            af.gather(af.zeros(1, 3, device="cuda:0"), 1, bad).numpy()
