"""Tensors: creation, properties, repr, views that share storage, indexing, DLPack, the null
device, and error messages (and that the runtime keeps working after each error)."""

from __future__ import annotations

import sys

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import actorflow as af

pytestmark = pytest.mark.timeout(60)

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

DTYPES = ["bool", "int32", "int64", "float16", "float32", "float64"]
AF = {
    "bool": af.bool,
    "int32": af.int32,
    "int64": af.int64,
    "float16": af.float16,
    "float32": af.float32,
    "float64": af.float64,
}
NP = {d: np.dtype(np.bool_ if d == "bool" else d) for d in DTYPES}


def check(t, expected, dtype: str | None = None):
    """``t`` is an af tensor equal to ``expected`` in shape, dtype and values."""
    assert isinstance(t, af.Tensor), type(t)
    expected = np.asarray(expected)
    if dtype is not None:
        assert t.dtype is AF[dtype], f"dtype {t.dtype}, expected {dtype}"
        expected = expected.astype(NP[dtype])
    else:
        assert t.dtype.np == expected.dtype, f"dtype {t.dtype}, expected {expected.dtype}"
    got = t.numpy()
    assert got.shape == expected.shape == t.shape, (got.shape, expected.shape, t.shape)
    np.testing.assert_array_equal(got, expected)


def still_works():
    """A normal op after an error gives the right answer."""
    r = (af.tensor([[1.0, 2.0]]) @ af.tensor([[3.0], [4.0]])) + 1
    assert r.numpy().tolist() == [[12.0]]
    assert af.relu(af.tensor([-1, 2])).tolist() == [0, 2]


# == creation ============================================================================


@pytest.mark.parametrize(
    "data,dtype,shape",
    [
        ([1.0, 2.0], "float32", (2,)),
        ([[1, 2], [3, 4]], "int64", (2, 2)),
        ([True, False], "bool", (2,)),
        ([1, 2.5], "float32", (2,)),
        ([[True, 2]], "int64", (1, 2)),
        (3, "int64", ()),
        (2.5, "float32", ()),
        (True, "bool", ()),
        ([], "float32", (0,)),
        ([[[1.5]]], "float32", (1, 1, 1)),
    ],
)
def test_tensor_infers_dtype_from_python_data(data, dtype, shape):
    t = af.tensor(data)
    assert t.dtype is AF[dtype]
    assert t.shape == shape
    check(t, np.array(data, dtype=NP[dtype]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_from_numpy_keeps_dtype_and_copies(dtype):
    a = (np.arange(6).reshape(2, 3) % 3).astype(NP[dtype])
    t = af.tensor(a)
    assert t.dtype is AF[dtype]
    check(t, a.copy())
    a[...] = 0  # af.tensor copies: the tensor is unaffected
    check(t, (np.arange(6).reshape(2, 3) % 3).astype(NP[dtype]))
    nc = np.arange(12).reshape(3, 4).astype(NP[dtype]).T[::2]  # non-contiguous
    check(af.tensor(nc), nc)


@pytest.mark.parametrize(
    "value,dtype",
    [
        (np.float64(1.5), "float64"),
        (np.int32(3), "int32"),
        (np.float16(0.5), "float16"),
        (np.bool_(True), "bool"),
    ],
)
def test_tensor_from_numpy_scalar_keeps_its_dtype(value, dtype):
    """As in PyTorch, torch.tensor(np.float64(1.5)).dtype is float64."""
    t = af.tensor(value)
    assert t.shape == ()
    assert t.dtype is AF[dtype]
    assert t.item() == value.item()


def test_tensor_with_dtype_and_from_tensor():
    check(af.tensor([1, 2], dtype=af.float64), np.array([1.0, 2.0]))
    check(af.tensor([1.7, -1.7], dtype="int32"), np.array([1, -1], np.int32))
    check(af.tensor([0, 2], dtype=af.bool), np.array([False, True]))
    src = af.tensor([[1, 2], [3, 4]], dtype=af.int32)
    cp = af.tensor(src)
    check(cp, np.array([[1, 2], [3, 4]], np.int32))
    cp.fill_(0)  # a copy: src is unchanged
    check(src, np.array([[1, 2], [3, 4]], np.int32))
    check(af.tensor(src.T), np.array([[1, 3], [2, 4]], np.int32))
    check(af.tensor(src, dtype=af.float16), np.array([[1, 2], [3, 4]], np.float16))


def test_tensor_bad_data():
    with pytest.raises(TypeError, match="numbers"):
        af.tensor("abc")
    with pytest.raises(TypeError):
        af.tensor([[1, 2], [3]])
    with pytest.raises(TypeError):
        af.tensor([1 + 2j])
    with pytest.raises(af.DTypeError, match="uint8"):
        af.tensor(np.zeros(3, np.uint8))
    with pytest.raises(af.DTypeError, match="supports"):
        af.tensor([1.0], dtype="complex64")
    with pytest.raises(TypeError, match="actorflow.tensor"):
        af.Tensor([1.0])
    still_works()


def test_from_numpy_is_zero_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = af.from_numpy(a)
    assert t.dtype is af.float32 and t.shape == (2, 3)
    a[0, 0] = 100.0  # the array's change shows in the tensor
    check(t, np.array([[100, 1, 2], [3, 4, 5]], np.float32))
    t.add_(1)  # and the tensor's in the array
    af.synchronize()
    assert a[0, 0] == 101.0 and a[1, 2] == 6.0
    check(t * 2, np.array([[202, 4, 6], [8, 10, 12]], np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_numpy_dtypes(dtype):
    a = np.array([[0, 1], [1, 0]]).astype(NP[dtype])
    t = af.from_numpy(a)
    assert t.dtype is AF[dtype]
    a[0, 0] = 1
    check(t, np.array([[1, 1], [1, 0]]).astype(NP[dtype]))


def test_from_numpy_non_contiguous_and_errors():
    a = np.arange(12, dtype=np.int64).reshape(3, 4).T
    t = af.from_numpy(a)
    check(t, np.arange(12).reshape(3, 4).T)
    with pytest.raises(af.DTypeError, match="uint16"):
        af.from_numpy(np.zeros(2, np.uint16))
    with pytest.raises(TypeError, match="ndarray"):
        af.from_numpy([1, 2])
    still_works()


@pytest.mark.parametrize("fn,value", [(af.zeros, 0), (af.ones, 1)])
def test_zeros_ones(fn, value):
    for args in [(2, 3), ((2, 3),), ([2, 3],)]:
        t = fn(*args)
        check(t, np.full((2, 3), value, np.float32))
    check(fn(4, dtype=af.int32), np.full(4, value, np.int32))
    check(fn((), dtype="float64"), np.full((), value, np.float64))
    check(fn(0, 2), np.zeros((0, 2), np.float32))
    check(fn(2, dtype=af.bool), np.full(2, bool(value)))
    check(fn(1, 2, 1, 2), np.full((1, 2, 1, 2), value, np.float32))


def test_empty_and_full():
    e = af.empty(2, 3)
    assert e.shape == (2, 3) and e.dtype is af.float32 and e.numpy().shape == (2, 3)
    e2 = af.empty((4,), dtype=af.int64)
    assert e2.shape == (4,) and e2.dtype is af.int64
    check(af.full((2, 2), 7), np.full((2, 2), 7, np.int64))
    check(af.full((2,), 1.5), np.full(2, 1.5, np.float32))
    check(af.full((2,), True), np.full(2, True))
    check(af.full(3, 2, dtype=af.float16), np.full(3, 2, np.float16))
    check(af.full([1, 2], np.float64(2.5)), np.full((1, 2), 2.5, np.float32))
    with pytest.raises(af.ShapeError, match="negative"):
        af.zeros(-1, 2)
    with pytest.raises(TypeError):
        af.zeros(2.5)
    still_works()


@pytest.mark.parametrize(
    "args,kwargs,expected",
    [
        ((5,), {}, np.arange(5)),
        ((1, 10, 3), {}, np.arange(1, 10, 3)),
        ((5, 0, -2), {}, np.arange(5, 0, -2)),
        ((0, 1, 0.25), {}, np.arange(0, 1, 0.25, dtype=np.float32)),
        ((2.0,), {}, np.arange(2.0, dtype=np.float32)),
        ((3,), {"dtype": af.float64}, np.arange(3, dtype=np.float64)),
        ((4,), {"dtype": af.int32}, np.arange(4, dtype=np.int32)),
        ((0,), {}, np.arange(0)),
        ((-3, 3), {}, np.arange(-3, 3)),
    ],
)
def test_arange(args, kwargs, expected):
    check(af.arange(*args, **kwargs), expected)


def test_arange_errors():
    with pytest.raises(ValueError, match="step"):
        af.arange(0, 5, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        af.arange(0, 5, -1)
    still_works()


@pytest.mark.parametrize("fn", [af.rand, af.randn])
def test_random_shapes_dtypes_and_seed(fn):
    t = fn(2, 3)
    assert t.shape == (2, 3) and t.dtype is af.float32
    assert fn((4,), dtype=af.float64).dtype is af.float64
    h = fn(3, dtype=af.float16)
    assert h.dtype is af.float16 and h.numpy().dtype == np.float16
    af.manual_seed(1234)
    a, b = fn(50).numpy(), fn(50).numpy()
    af.manual_seed(1234)
    a2, b2 = fn(50).numpy(), fn(50).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)  # successive draws differ
    af.manual_seed(4321)
    assert not np.array_equal(fn(50).numpy(), a)
    with pytest.raises(af.DTypeError, match="floating"):
        fn(3, dtype=af.int32)


def test_random_distributions():
    af.manual_seed(0)
    u = af.rand(20000).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.02
    n = af.randn(20000, dtype=af.float64).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1.0) < 0.05
    h = af.rand(1000, dtype=af.float16).numpy()
    assert h.min() >= 0.0 and h.max() <= 1.0 and 0.4 < h.mean() < 0.6


def test_like_factories():
    src = af.tensor([[1, 2, 3]], dtype=af.int32)
    check(af.zeros_like(src), np.zeros((1, 3), np.int32))
    check(af.ones_like(src), np.ones((1, 3), np.int32))
    check(af.full_like(src, 7), np.full((1, 3), 7, np.int32))
    check(af.ones_like(src, dtype=af.float64), np.ones((1, 3)))
    e = af.empty_like(src)
    assert e.shape == (1, 3) and e.dtype is af.int32
    f = af.tensor([[0.0, 0.0]], dtype=af.float64)
    r = af.rand_like(f)
    assert r.shape == (1, 2) and r.dtype is af.float64
    rn = af.randn_like(f, dtype=af.float16)
    assert rn.dtype is af.float16 and rn.shape == (1, 2)
    z = af.zeros_like(f, device="null")
    assert z.device == "null" and z.shape == (1, 2)
    af.manual_seed(5)
    a = af.rand_like(f).numpy()
    af.manual_seed(5)
    np.testing.assert_array_equal(af.rand_like(f).numpy(), a)


# == properties ==========================================================================


def test_basic_properties():
    t = af.arange(24, dtype=af.float32).reshape(2, 3, 4)
    assert t.shape == (2, 3, 4) and isinstance(t.shape, tuple)
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.ndim == 3 and t.dim() == 3
    assert t.numel() == 24
    assert len(t) == 2
    assert t.dtype is af.float32 and t.dtype == af.float
    assert t.device == af.device("cpu") and t.device == "cpu" and str(t.device) == "cpu"
    assert t.device.type == "cpu"
    assert t.stride() == (12, 4, 1) and t.stride(1) == 4
    assert t.is_contiguous()
    assert t.is_floating_point() and not af.tensor([1]).is_floating_point()
    assert af.is_floating_point(t)
    s = af.tensor(2.5)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1
    with pytest.raises(TypeError, match="0-d"):
        len(s)


def test_item_tolist_and_conversions():
    assert af.tensor([[2.5]]).item() == 2.5
    v = af.tensor([1, 2])[1].item()
    assert v == 2 and type(v) is int
    assert type(af.tensor([1.5])[0].item()) is float
    assert af.tensor([True]).item() is True
    assert af.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert af.tensor(3.5).tolist() == 3.5
    lst = af.tensor([0.5, 1.5], dtype=af.float64).tolist()
    assert lst == [0.5, 1.5] and all(type(x) is float for x in lst)
    assert float(af.tensor([2.5])) == 2.5 and int(af.tensor(7)) == 7
    assert bool(af.tensor([1])) is True and bool(af.tensor(0.0)) is False
    assert [10, 20, 30][af.tensor(1)] == 20
    with pytest.raises(ValueError, match="2 elements"):
        af.tensor([1, 2]).item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(af.tensor([1, 2]))
    with pytest.raises(TypeError):
        [1, 2][af.tensor(1.0)]
    still_works()


def test_numpy_returns_a_copy():
    t = af.tensor([1.0, 2.0])
    a = t.numpy()
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    a[0] = 100
    check(t, np.array([1.0, 2.0], np.float32))
    assert np.asarray(t).tolist() == [1.0, 2.0]
    assert np.array(t, dtype=np.float64).dtype == np.float64


def test_to_clone_detach_contiguous():
    t = af.tensor([[1.5, -2.5], [3.0, 4.0]])
    check(t.to(af.int64), np.array([[1, -2], [3, 4]]))
    check(t.to("float64"), t.numpy().astype(np.float64))
    check(t.to("cpu", af.float16), t.numpy().astype(np.float16))
    check(t.to(af.tensor([1], dtype=af.int32)), np.array([[1, -2], [3, 4]], np.int32))
    assert t.to("cpu") is t and t.cpu() is t
    c = t.clone()
    c[0, 0] = 0.0
    assert t[0, 0].item() == 1.5
    d = t.detach()
    assert d.shape == t.shape and d.dtype is t.dtype
    d[1, 1] = -7.0  # detach shares storage
    assert t[1, 1].item() == -7.0
    tt = t.T
    assert not tt.is_contiguous() and tt.stride() == (1, 2)
    cc = tt.contiguous()
    assert cc.is_contiguous() and cc.stride() == (2, 1)
    check(cc, t.numpy().T)
    assert t.contiguous() is t


# == repr ================================================================================


@pytest.mark.parametrize(
    "make,expected",
    [
        (
            lambda: af.relu(af.tensor([[1.0, -1.0], [1.0, -1.0]])),
            "tensor([[1., 0.],\n        [1., 0.]], dtype=actorflow.float32)",
        ),
        (lambda: af.tensor([1, 2]), "tensor([1, 2], dtype=actorflow.int64)"),
        (
            lambda: af.tensor([[1, 2], [3, 4]], dtype=af.int32),
            "tensor([[1, 2],\n        [3, 4]], dtype=actorflow.int32)",
        ),
        (lambda: af.tensor(1.5), "tensor(1.5, dtype=actorflow.float32)"),
        (lambda: af.tensor([True, False]), "tensor([True, False], dtype=actorflow.bool)"),
        (lambda: af.zeros(2, dtype=af.float16), "tensor([0., 0.], dtype=actorflow.float16)"),
        (lambda: af.zeros(0), "tensor([], dtype=actorflow.float32)"),
        (
            lambda: af.zeros(2, 3, device="null"),
            "tensor(<no data>, shape=(2, 3), device='null', dtype=actorflow.float32)",
        ),
    ],
)
def test_repr(make, expected):
    t = make()
    assert repr(t) == expected
    assert str(t) == expected


def test_repr_of_dtype_and_device():
    assert repr(af.float32) == "actorflow.float32"
    assert repr(af.device("cpu")) == "device(type='cpu', index=0)"
    assert str(af.device("cuda:1")) == "cuda:1" and af.device("cuda:1").index == 1


def test_a_cuda_tensor_without_cupy_is_refused_naming_the_install_and_the_emulator(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # CuPy missing
    monkeypatch.delenv("AF_CUDA", raising=False)
    for _ in range(2):  # the refusal is not cached as a backend
        with pytest.raises(af.DeviceError, match="CuPy") as e:
            af.zeros(2, device="cuda")
        assert "pip install 'actorflow[cuda]'" in str(e.value)
        assert "AF_CUDA=emu" in str(e.value)
        assert "'cpu'" in str(e.value) and "'null'" in str(e.value)


# == views share storage ==================================================================


def test_views_share_storage_and_writes_show_in_base():
    base = af.arange(24).reshape(2, 3, 4)
    ref = np.arange(24).reshape(2, 3, 4)
    views = {
        "reshape": (lambda t: t.reshape(6, 4), lambda a: a.reshape(6, 4)),
        "view": (lambda t: t.view(4, -1), lambda a: a.reshape(4, -1)),
        "transpose": (lambda t: t.transpose(0, 2), lambda a: a.transpose(2, 1, 0)),
        "permute": (lambda t: t.permute(1, 2, 0), lambda a: a.transpose(1, 2, 0)),
        "unsqueeze": (lambda t: t.unsqueeze(1), lambda a: a[:, None]),
        "squeeze": (lambda t: t[:1].squeeze(0), lambda a: a[0]),
        "flatten": (lambda t: t.flatten(), lambda a: a.reshape(-1)),
        "T": (lambda t: t.T, lambda a: a.T),
        "mT": (lambda t: t.mT, lambda a: np.swapaxes(a, -1, -2)),
        "getitem": (lambda t: t[1, :, 1:3], lambda a: a[1, :, 1:3]),
        "ellipsis": (lambda t: t[..., 2], lambda a: a[..., 2]),
        "none": (lambda t: t[None, 0, None], lambda a: a[None, 0, None]),
        "step": (lambda t: t[:, ::2, 1::2], lambda a: a[:, ::2, 1::2]),
    }
    for name, (fv, fa) in views.items():
        t = af.tensor(ref)
        v = fv(t)
        expected = fa(ref.copy())
        check(v, expected)
        # write through the view: the base sees it
        v.fill_(-1) if name != "getitem" else v.mul_(0)
        exp_base = ref.copy()
        fa(exp_base)[...] = -1 if name != "getitem" else 0
        check(t, exp_base)
        # write to the base: the view sees it
        t.add_(100)
        check(v, fa(exp_base + 100))
    assert base.shape == (2, 3, 4)


def test_view_strides_match_numpy():
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = af.tensor(a)
    for fv, fa in [
        (lambda x: x.transpose(0, 1), lambda x: x.transpose(1, 0, 2)),
        (lambda x: x[:, 1:, ::2], lambda x: x[:, 1:, ::2]),
        (lambda x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
        (lambda x: x[1], lambda x: x[1]),
    ]:
        v, e = fv(t), fa(a)
        assert v.stride() == tuple(s // a.itemsize for s in e.strides)
        assert v.is_contiguous() == e.flags.c_contiguous
        check(v, e)


def test_expand_shares_and_broadcasts():
    t = af.tensor([[1], [2]])
    e = t.expand(2, 3)
    check(e, np.array([[1, 1, 1], [2, 2, 2]]))
    assert e.stride() == (1, 0)
    check(t.expand(-1, 2), np.array([[1, 1], [2, 2]]))
    check(t.expand(4, 2, 3), np.broadcast_to(np.array([[1], [2]]), (4, 2, 3)))
    check(t.expand_as(af.zeros(2, 5)), np.array([[1] * 5, [2] * 5]))
    t.mul_(10)
    check(e, np.array([[10, 10, 10], [20, 20, 20]]))
    check(e + af.ones(2, 3, dtype=af.int64), np.array([[11] * 3, [21] * 3]))
    with pytest.raises(af.ShapeError, match="expand"):
        t.expand(3, 3)
    with pytest.raises(af.ShapeError):
        t.expand(3)
    still_works()


def test_reshape_of_non_contiguous_copies():
    t = af.arange(6).reshape(2, 3)
    r = t.T.reshape(6)
    check(r, np.arange(6).reshape(2, 3).T.reshape(6))
    r[0] = 99  # a copy: t unchanged
    check(t, np.arange(6).reshape(2, 3))
    check(t.reshape(-1, 2), np.arange(6).reshape(3, 2))
    check(t.reshape((3, 2)), np.arange(6).reshape(3, 2))


def test_squeeze_unsqueeze_variants():
    t = af.zeros(1, 2, 1, 3)
    assert t.squeeze().shape == (2, 3)
    assert t.squeeze(0).shape == (2, 1, 3)
    assert t.squeeze(-2).shape == (1, 2, 3)
    assert t.squeeze(1).shape == (1, 2, 1, 3)  # not size 1: unchanged
    assert t.squeeze((0, 2)).shape == (2, 3)
    assert t.unsqueeze(0).shape == (1, 1, 2, 1, 3)
    assert t.unsqueeze(-1).shape == (1, 2, 1, 3, 1)
    assert af.tensor(1.0).unsqueeze(0).shape == (1,)
    with pytest.raises(IndexError):
        t.unsqueeze(6)


@st.composite
def basic_index_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    key = draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    items = key if isinstance(key, tuple) else (key,)
    assume(all(not isinstance(k, slice) or k.step is None or k.step > 0 for k in items))
    return shape, key


@SETTINGS
@given(case=basic_index_case())
def test_basic_indexing_matches_numpy_and_is_a_view(case):
    shape, key = case
    a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    t = af.tensor(a)
    v = t[key]
    expected = a[key]
    check(v, np.asarray(expected))
    if isinstance(expected, np.ndarray) and expected.size:
        v.fill_(-1)  # a view: the write shows in t
        b = a.copy()
        b[key] = -1
        check(t, b)


def test_getitem_integer_arrays():
    a = np.arange(20).reshape(4, 5)
    t = af.tensor(a)
    cases = [
        ([2, 0, 2], [2, 0, 2]),
        (af.tensor([3, 1]), [3, 1]),
        (af.tensor([3, 1], dtype=af.int32), [3, 1]),
        (np.array([[0, 1], [2, 3]]), np.array([[0, 1], [2, 3]])),
        ((slice(None), [4, 0]), (slice(None), [4, 0])),
        (([0, 3], [1, 4]), ([0, 3], [1, 4])),
        ((af.tensor([0, 3]), af.tensor([1, 4])), ([0, 3], [1, 4])),
        (([-1, -4],), ([-1, -4],)),
        ((1, [0, 2]), (1, [0, 2])),
        ((af.tensor([[1], [2]]), af.tensor([0, 4])), (np.array([[1], [2]]), [0, 4])),
    ]
    for key, npkey in cases:
        r = t[key]
        check(r, a[npkey])
    r = t[[0, 1]]
    r.fill_(-5)  # a gather is a copy
    check(t, a)
    with pytest.raises(IndexError):
        t[[7]].numpy()
    with pytest.raises(IndexError, match="long, int or bool"):
        t[[1.5]]
    still_works()


def test_getitem_matches_torch():
    torch = pytest.importorskip("torch")
    a = np.arange(60).reshape(3, 4, 5)
    t, tt = af.tensor(a), torch.from_numpy(a.copy())
    keys = [
        (1,),
        (slice(None), 2),
        (Ellipsis, 1),
        (None, 0),
        (slice(1, None), slice(None, 2), 3),
        ([0, 2],),
        (slice(None), [3, 0], slice(1, 3)),
    ]
    for key in keys:
        np.testing.assert_array_equal(t[key].numpy(), tt[key].numpy())
        assert t[key].shape == tuple(tt[key].shape)
    mask = a % 4 == 0
    np.testing.assert_array_equal(t[af.tensor(mask)].numpy(), tt[torch.from_numpy(mask)].numpy())


# == __setitem__ ==========================================================================

SETITEM_CASES = [
    ("int, scalar", 0, 7),
    ("slice, scalar", (slice(None), 1), -3),
    ("slice, tensor", (1, slice(1, 3)), af.tensor([-1, -2])),
    ("slice, list", (1, slice(1, 3)), [-1, -2]),
    ("ellipsis, broadcast tensor", (Ellipsis,), af.tensor([9, 8, 7, 6])),
    ("None and int", (None, 2), 5),
    ("float into int", 0, 2.7),
    ("int list, scalar", [0, 2], 50),
    ("int lists, scalar", ([2, 2], [0, 3]), 50),
    ("int list, tensor", [0, 2], af.tensor([1, 1, 1, 1])),
    ("int tensor, scalar", af.tensor([0, 2]), 50),
    ("int tensor, tensor", af.tensor([0, 2]), af.tensor([[1, 1, 1, 1], [2, 2, 2, 2]])),
    ("int tensors, scalar", (af.tensor([0, 2]), af.tensor([1, 3])), 50),
    ("int array and slice", (slice(None), [0, 3]), af.tensor([[1, 2]])),
    ("bool mask, scalar", "mask>5", 0),
    ("bool mask, tensor", "mask>9", af.tensor([-1, -2])),
    ("numpy bool mask", "npmask>9", -1),
    ("row mask", af.tensor([True, False, True]), -1),
]


def _np_key(key, a):
    if isinstance(key, str):
        return a > int(key.split(">")[1])
    if isinstance(key, af.Tensor):
        return key.numpy()
    if isinstance(key, tuple):
        return tuple(k.numpy() if isinstance(k, af.Tensor) else k for k in key)
    return key


@pytest.mark.parametrize("desc,key,value", SETITEM_CASES, ids=[c[0] for c in SETITEM_CASES])
def test_setitem(desc, key, value):
    a = np.arange(12).reshape(3, 4)
    t = af.tensor(a)
    npkey = _np_key(key, a)
    if isinstance(key, str):
        key = af.tensor(npkey) if key.startswith("mask") else npkey
    expected = a.copy()
    expected[npkey] = value.numpy() if isinstance(value, af.Tensor) else value
    t[key] = value
    check(t, expected)
    check(t + 1, expected + 1)  # the runtime goes on using t


def test_setitem_float_tensor_and_views():
    t = af.zeros(3, 4)
    t[1] = af.tensor([1.0, 2.0, 3.0, 4.0])
    t[:, 0] = 9.5
    t.T[3] = af.tensor([7, 7, 7])  # an int tensor into a float view
    v = t[2]
    v[1:3] = -1.0  # through a view of t
    e = np.zeros((3, 4), np.float32)
    e[1] = [1, 2, 3, 4]
    e[:, 0] = 9.5
    e[:, 3] = 7
    e[2, 1:3] = -1
    check(t, e)
    with pytest.raises(af.ShapeError):
        t[0] = af.tensor([1.0, 2.0])
    with pytest.raises(IndexError):
        t[5] = 1.0
    still_works()


def test_setitem_advanced_on_float_tensor():
    t = af.zeros(4)
    t[af.tensor([1, 3])] = af.tensor([1.5, 2.5])
    t[af.tensor([True, False, False, False])] = -1.0
    check(t, np.array([-1.0, 1.5, 0.0, 2.5], np.float32))


@pytest.mark.parametrize("queued", [False, True])
def test_a_failed_setitem_leaves_its_target_as_it_was(queued, random_dispatch):
    if queued:
        random_dispatch(4, max_delay=0.002)  # through the loop and the workers
    x = af.tensor([1.0, 2.0, 3.0, 4.0])
    x[af.tensor([0, 100])] = af.tensor([7.0, 8.0])  # index 100: only the kernel can tell
    y = x + 1  # issued after the failed write
    with pytest.raises(
        af.KernelError, match=r"'index_put'.*index 100 is out of bounds for axis 0 with size 4"
    ):
        x.numpy()  # reported once, at the next read
    check(x, np.array([1, 2, 3, 4], np.float32))  # nothing was written, not even x[0]
    check(y, np.array([2, 3, 4, 5], np.float32))
    check(x.clone(), np.array([1, 2, 3, 4], np.float32))
    x[af.tensor([100])] = 5.0
    x.fill_(1.0)
    check(x, np.ones(4, np.float32))
    with pytest.raises(af.KernelError, match="index 100"):
        af.synchronize()  # the second one was never read
    x[af.tensor([1, 3])] = af.tensor([5.0, 6.0])
    check(x, np.array([1, 5, 1, 6], np.float32))
    still_works()


def test_a_failed_setitem_never_read_is_reported_by_synchronize():
    x = af.arange(6).reshape(2, 3)
    x[af.tensor([1]), af.tensor([3])] = 5
    with pytest.raises(af.KernelError, match="index 3 is out of bounds for axis 1 with size 3"):
        af.synchronize()
    check(x, np.arange(6).reshape(2, 3))
    af.synchronize()
    x[af.tensor([0, -3])] = af.tensor([[9, 9, 9]])  # rows 0 and -3 of 2
    with pytest.raises(af.KernelError, match="index -3 is out of bounds for axis 0 with size 2"):
        x.numpy()
    check(x, np.arange(6).reshape(2, 3))  # row 0 was not written either


OVERWRITES = {
    "fill_": lambda x: x.fill_(7),
    "zero_": lambda x: x.zero_(),
    "copy_": lambda x: x.copy_(af.tensor([7, 7])),
    "setitem ...": lambda x: x.__setitem__(Ellipsis, 7),
    "setitem [:]": lambda x: x.__setitem__(slice(None), af.tensor([7, 7])),
}


@pytest.mark.parametrize("how", list(OVERWRITES))
def test_a_whole_overwrite_makes_a_poisoned_tensor_usable_again(how):
    x = af.tensor([2, 3]) // af.tensor([0, 1])  # the kernel fails: x has no value
    x[0:1].fill_(5)  # a partial write leaves it poisoned
    with pytest.raises(af.KernelError, match="floor_divide"):
        x.numpy()
    with pytest.raises(af.KernelError, match="floor_divide"):
        (x + 1).numpy()
    OVERWRITES[how](x)
    expected = np.array([0, 0] if how == "zero_" else [7, 7], np.int64)
    check(x, expected)
    check(x.clone() + 1, expected + 1)
    af.synchronize()  # the error was reported at the read
    still_works()


# == DLPack ==============================================================================


def test_dlpack_to_numpy_round_trip():
    t = af.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, [[1.0, 2.0], [3.0, 4.0]])
    assert a.dtype == np.float32
    assert t.__dlpack_device__() == (1, 0)
    t.mul_(2)  # the export shares storage
    af.synchronize()
    np.testing.assert_array_equal(a, [[2.0, 4.0], [6.0, 8.0]])
    back = af.from_dlpack(a)
    check(back, np.array([[2.0, 4.0], [6.0, 8.0]], np.float32))
    assert af.from_dlpack(t) is t


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_dlpack_numpy_is_zero_copy(dtype):
    a = np.array([0, 1, 1]).astype(NP[dtype])
    t = af.from_dlpack(a)
    assert t.dtype is AF[dtype]
    a[0] = 1
    check(t, np.array([1, 1, 1]).astype(NP[dtype]))
    back = np.from_dlpack(t)
    np.testing.assert_array_equal(back, a)


def test_dlpack_of_views():
    t = af.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(np.from_dlpack(t.T), np.arange(6).reshape(2, 3).T)
    np.testing.assert_array_equal(np.from_dlpack(t[1]), [3, 4, 5])
    np.testing.assert_array_equal(np.from_dlpack(t[:, 1:]), [[1, 2], [4, 5]])


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    t = af.arange(6).reshape(2, 3)
    tt = torch.from_dlpack(t)
    assert tt.tolist() == [[0, 1, 2], [3, 4, 5]] and tt.dtype == torch.int64
    back = af.from_dlpack(torch.arange(4, dtype=torch.float32))
    check(back, np.arange(4, dtype=np.float32))


def test_dlpack_null_device_raises():
    n = af.zeros(2, device="null")
    with pytest.raises(af.DeviceError):
        np.from_dlpack(n)
    still_works()


# == the null device ======================================================================


def test_null_device_has_metadata_but_no_data():
    n = af.zeros(2, 3, device="null")
    assert n.shape == (2, 3) and n.dtype is af.float32 and n.device == "null"
    assert n.device.type == "null" and n.numel() == 6 and n.stride() == (3, 1)
    with pytest.raises(af.DeviceError, match="null"):
        n.numpy()
    with pytest.raises(af.DeviceError):
        af.zeros(1, device="null").item()
    with pytest.raises(af.DeviceError):
        n.tolist()
    with pytest.raises(af.DeviceError):
        n.to("cpu")
    with pytest.raises(af.DeviceError):
        af.zeros(2).copy_(af.zeros(2, device="null"))
    still_works()


def test_null_device_ops_infer_shapes_and_dtypes():
    a = af.zeros(4, 3, device="null")
    b = af.ones(3, 5, dtype=af.int32, device="null")
    assert (a @ b.float()).shape == (4, 5)
    assert (a @ b).dtype is af.float32
    s = (a + af.zeros(3, device="null")).sum(dim=1, keepdim=True)
    assert s.shape == (4, 1) and s.dtype is af.float32
    assert af.relu(a).shape == (4, 3)
    assert af.softmax(a, dim=0).shape == (4, 3)
    assert af.cat([a, a], dim=1).shape == (4, 6)
    assert af.stack([a, a]).shape == (2, 4, 3)
    assert (b / 2).dtype is af.float32
    assert (b > 0).dtype is af.bool
    assert b.sum().dtype is af.int64
    v, i = a.max(dim=0)
    assert v.shape == (3,) and i.dtype is af.int64
    assert a.T.shape == (3, 4) and a.reshape(12).shape == (12,) and a[1:, None].shape == (3, 1, 3)
    assert af.rand(2, 2, device="null").shape == (2, 2)
    assert af.tensor([1.0, 2.0], device="null").shape == (2,)
    assert af.zeros(2).to("null").device == "null"
    a.add_(1)
    a[0] = 1.0
    with pytest.raises(af.ShapeError, match="cannot be multiplied"):
        a @ a
    with pytest.raises(af.DeviceError, match="null"):
        af.nonzero(a)
    af.synchronize()
    still_works()


# == errors (and the runtime keeps working) ===============================================


def test_device_mismatch_error():
    msg = (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "cpu (positional 0) and null (positional 1)!"
    )
    with pytest.raises(af.DeviceError) as e:
        af.zeros(2, 3) + af.zeros(2, 3, device="null")
    assert msg in str(e.value)
    with pytest.raises(af.DeviceError) as e:
        af.matmul(af.zeros(2, 3), af.zeros(3, 2, device="null"))
    assert msg in str(e.value)
    with pytest.raises(af.DeviceError, match="null .positional 0. and cpu .positional 1."):
        af.where(af.zeros(2, dtype=af.bool, device="null"), af.zeros(2), 0.0)
    still_works()


def test_unknown_device():
    with pytest.raises(af.DeviceError, match="unknown device"):
        af.zeros(2, device="tpu")
    with pytest.raises(af.DeviceError):
        af.device("cpu:1")
    still_works()


def test_matmul_shape_error_message():
    with pytest.raises(af.ShapeError) as e:
        af.zeros(2, 3) @ af.zeros(4, 5)
    assert "matmul: shapes (2, 3) and (4, 5) cannot be multiplied (3 != 4)" in str(e.value)
    still_works()


@pytest.mark.parametrize("a,b", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 1, 3), (4, 2))])
def test_broadcast_error_names_both_shapes(a, b):
    for fn in (af.add, af.mul, af.maximum, af.eq, af.logical_and):
        with pytest.raises(af.ShapeError) as e:
            fn(af.zeros(*a), af.zeros(*b))
        msg = str(e.value)
        assert str(a) in msg and str(b) in msg and fn.__name__ in msg
    still_works()


def test_bad_dtype_errors():
    for bad in ("complex64", "uint8", np.complex128, object, 3):
        with pytest.raises(af.DTypeError) as e:
            af.zeros(2, dtype=bad)
        assert "bool, int32, int64, float16, float32, float64" in str(e.value)
    with pytest.raises(af.DTypeError):
        af.ones(2).to(dtype="int8")
    with pytest.raises(af.DTypeError, match="floating"):
        af.mean(af.tensor([1, 2]))
    with pytest.raises(af.DTypeError):
        af.softmax(af.tensor([1, 2]), dim=0)
    with pytest.raises(af.DTypeError):
        -af.tensor([True])
    still_works()


def test_view_on_non_contiguous_hints_reshape():
    t = af.zeros(2, 3).T
    with pytest.raises(af.ShapeError) as e:
        t.view(6)
    assert "reshape" in str(e.value)
    check(t.reshape(6), np.zeros(6, np.float32))
    with pytest.raises(af.ShapeError, match="invalid for input of size 6"):
        af.zeros(2, 3).view(4, 2)
    with pytest.raises(af.ShapeError, match="only one dimension"):
        af.zeros(2, 3).reshape(-1, -1)
    with pytest.raises(af.ShapeError, match="permutation"):
        af.zeros(2, 3, 4).permute(2, 0)
    still_works()


def test_index_errors():
    t = af.arange(10).reshape(2, 5)
    with pytest.raises(IndexError, match="out of bounds"):
        t[2]
    with pytest.raises(IndexError, match="out of bounds"):
        t[0, -6]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[1.5]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(ValueError, match="step must be greater than zero"):
        t[:, ::-1]
    with pytest.raises(IndexError, match="dimension out of range"):
        t.sum(5)
    with pytest.raises(IndexError):
        t.transpose(0, 2)
    check(t[1, -1], np.int64(9))
    still_works()


def test_inplace_dtype_errors_leave_the_tensor_intact():
    t = af.tensor([1, 2], dtype=af.int32)
    with pytest.raises(af.DTypeError) as e:
        t.add_(1.5)
    assert "add_" in str(e.value) and "int32" in str(e.value)
    with pytest.raises(af.DTypeError):
        t.div_(2)
    with pytest.raises(af.DTypeError):
        t.mul_(af.tensor([0.5, 0.5]))
    with pytest.raises(af.ShapeError):
        t.add_(af.zeros(3, 2, dtype=af.int32))
    check(t, np.array([1, 2], np.int32))
    t.add_(1)
    check(t, np.array([2, 3], np.int32))
    still_works()


def test_errors_in_a_row_then_a_long_program():
    for _ in range(3):
        with pytest.raises(af.ShapeError):
            af.zeros(2, 3) @ af.zeros(4, 5)
        with pytest.raises(af.DeviceError):
            af.zeros(1) + af.zeros(1, device="null")
        with pytest.raises(af.DTypeError):
            af.tensor([1]).add_(0.5)
    x = af.ones(8, 8)
    for _ in range(20):
        x = af.relu(x @ af.ones(8, 8) / 8.0 - 0.5) + 0.5
    np.testing.assert_allclose(x.numpy(), np.ones((8, 8)), rtol=1e-6)
    af.synchronize()


def test_kernel_error_surfaces_on_read_and_runtime_recovers():
    bad = af.tensor([2, 3]) // af.tensor([0, 1])  # an integer division by zero fails (data-
    #                                               dependent: only the kernel can tell)
    with pytest.raises(af.KernelError, match="floor_divide"):
        bad.numpy()
    with pytest.raises(af.KernelError):
        (bad + 1).numpy()  # and so does whatever uses the result
    still_works()
    af.synchronize()  # nothing left unreported


def test_flatten_takes_start_and_end_dims_as_pytorch():
    torch = pytest.importorskip("torch")
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for start, end in [(0, -1), (1, -1), (1, 2), (-2, -1), (2, 2), (0, 0), (-4, 1)]:
        want = torch.from_numpy(a).flatten(start, end)
        got = af.tensor(a).flatten(start, end)
        assert got.shape == tuple(want.shape), (start, end)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    t = af.tensor(a).permute(0, 2, 1, 3)  # not contiguous: a copy
    np.testing.assert_array_equal(
        t.flatten(1).numpy(), torch.from_numpy(a).permute(0, 2, 1, 3).flatten(1).numpy()
    )
    assert af.tensor(3.0).flatten().shape == (1,)
    with pytest.raises(IndexError, match=r"flatten: dimension out of range .* got 4"):
        af.tensor(a).flatten(4)
    with pytest.raises(ValueError, match="start_dim 2 comes after end_dim 1"):
        af.tensor(a).flatten(2, 1)
    x = af.tensor(a, requires_grad=True)  # a view in autograd
    (x.flatten(1, 2) * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(a.shape, 2.0, np.float32))
