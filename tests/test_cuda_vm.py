"""The eager VM on cuda:0, on the CUDA emulator (and, for the tests taking the ``cuda``
fixture, on the GPU too: ``pytest -m gpu``; cuda_fixtures.py): tensors made on and copied to
and from the device, every registered elementwise op and the reduce and matmul families
equal to the same op on cpu, a chain under random delays of the driver's streams, a kernel
fault surfacing at synchronize with the runtime going on, out of memory under a device
budget, and mixed devices refused. Each op call is its own launch here (runs of them:
test_cuda_eager_runs.py)."""

import threading
import time

import numpy as np
import pytest

import actorflow as af
from actorflow import functional as F
from actorflow import nn
from actorflow.backends import get_backend
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda.emu import EmuDriver, EmuStream
from actorflow.backends.cuda.selection import driver_for, use_driver
from actorflow.eager.interpreter import apply
from actorflow.errors import DeviceError, DTypeError, KernelError, OutOfMemoryError
from actorflow.ops.registry import all_ops
from actorflow.tensor.tensor import wrap
from actorflow.testing import gpu_missing
from cuda_fixtures import CUDA, assert_same, on_emulator, settle

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("one_launch_per_op")]


def both(fn):
    """``fn(device)`` on cpu and on cuda:0, as numpy arrays (or the cpu error's type)."""
    return fn("cpu").numpy(), fn(CUDA).numpy()


# -- making tensors, copies both ways -------------------------------------------------------
@pytest.mark.parametrize("dtype", [af.float32, af.float64, af.int64, af.int32, af.bool])
def test_tensor_zeros_and_copies_both_ways(cuda, dtype):
    data = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype.np)
    c = af.tensor(data, dtype=dtype, device=CUDA)
    assert str(c.device) == CUDA and c.dtype is dtype
    assert_same(c.numpy(), data)
    back = c.to("cpu")
    assert str(back.device) == "cpu"
    assert_same(back.numpy(), data)
    assert_same(af.tensor(data).to(CUDA).numpy(), data)
    assert_same(af.zeros(2, 3, dtype=dtype, device=CUDA).numpy(), np.zeros((2, 3), dtype.np))
    assert_same(af.full((3,), 1, dtype=dtype, device=CUDA).numpy(), np.ones(3, dtype.np))


def test_views_copy_both_ways(cuda):
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    c = af.tensor(data, device=CUDA)
    assert_same(c.T.numpy(), data.T)  # a device view read
    assert_same(c[1:, ::2].to("cpu").numpy(), data[1:, ::2])  # a device view copied out
    assert_same(af.tensor(data).T.to(CUDA).numpy(), data.T)  # a host view copied in
    assert_same(c[2].numpy(), data[2])


def test_copy_and_setitem_across_the_host_boundary_go_through_the_transfer(emu):
    """``copy_`` and ``x[...] = v`` from a tensor on the other side of the host boundary, both
    ways, as PyTorch allows: the source goes through the transfer ``.to()`` makes first
    (broadcast and dtype conversion then happen on the destination's device)."""
    emu(delay=1e-3, seed=5)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = af.zeros(2, 3)
    h.copy_(af.tensor(data, device=CUDA))  # cuda into cpu
    assert_same(h.numpy(), data)
    d = af.zeros(2, 3, dtype=af.float64, device=CUDA)
    d.copy_(af.tensor(data[1].astype(np.int64)))  # cpu into cuda, broadcast, cast
    assert_same(d.numpy(), np.broadcast_to(data[1], (2, 3)).astype(np.float64))
    d = af.zeros(2, 3, device=CUDA)
    d[:] = af.tensor(data)  # setitem, basic key
    d[0, 1:] = af.tensor([7.0, 8.0])
    assert_same(d.numpy(), np.array([[0, 7, 8], [3, 4, 5]], np.float32))
    d[[1, 1], [0, 2]] = af.tensor([9.0, 9.5])  # setitem, advanced key
    assert_same(d.numpy(), np.array([[0, 7, 8], [9, 4, 9.5]], np.float32))
    h = af.zeros(2, 3)
    h[1] = af.tensor(data[0], device=CUDA)
    h[[0], [2]] = af.tensor([6.0], device=CUDA)
    assert_same(h.numpy(), np.array([[0, 0, 6], [0, 1, 2]], np.float32))
    a = af.tensor(data, device=CUDA)
    d.copy_(a.to("cpu"))  # a round trip issued ahead
    assert_same(d.numpy(), data)
    with pytest.raises(DeviceError, match=r"copy_\(\).*cuda:1 to cuda:0.*\.to\('cpu'\)"):
        d.copy_(af.zeros(2, 3, device="cuda:1"))


def test_copies_run_on_the_copy_streams(cuda):
    backend = get_backend(af.device(CUDA))
    af.tensor([1.0, 2.0], device=CUDA).to("cpu").numpy()
    assert {"compute", "h2d", "d2h"} <= set(backend._drv_streams)


def test_a_copy_in_is_taken_before_the_source_changes(emu):
    emu(delay=2e-3, seed=3)  # copies reach their streams late
    src = af.arange(1000, dtype=af.float32)
    c = src.to(CUDA)
    src.add_(1)  # issued right after the copy to the device
    data = np.arange(1000, dtype=np.float32)
    host = data.copy()
    d = af.tensor(host, device=CUDA)
    host[:] = -1  # the caller's buffer changes at once
    assert_same(c.numpy(), data)
    assert_same(src.numpy(), data + 1)
    assert_same(d.numpy(), data)


def test_numpy_after_in_place_ops(cuda):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    outs = {}
    for dev in ("cpu", CUDA):
        t = af.tensor(data, device=dev)
        t.add_(1)
        t.mul_(2)
        t[0] = 5
        t[:, 1] += 10
        t.clamp_(max=20)
        t.T[0].sub_(100)
        outs[dev] = t.numpy()
    assert_same(outs["cpu"], outs[CUDA])


def test_mixing_devices_in_one_op_is_refused_naming_both_and_the_fix(cuda):
    a, b = af.ones(2), af.ones(2, device=CUDA)
    for fn in (lambda: a + b, lambda: b * a, lambda: af.matmul(b, a)):
        with pytest.raises(DeviceError) as e:
            fn()
        msg = str(e.value)
        assert "cpu" in msg and CUDA in msg and ".to(" in msg


def cuda_device_count() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def test_a_copy_between_two_cuda_devices_is_refused_with_the_way_through_the_host(cuda):
    with pytest.raises(DeviceError) as e:
        af.ones(2, device=CUDA).to("cuda:1")
    if not on_emulator() and cuda_device_count() < 2:  # a GPU machine with one device
        assert "cuda:1" in str(e.value) and "CuPy sees 1 CUDA device(s)" in str(e.value)
        return
    assert "cuda:0 to cuda:1" in str(e.value) and ".to('cpu').to('cuda:1')" in str(e.value)
    if on_emulator():  # (a GPU machine may have no cuda:1)
        assert_same(af.ones(2, device=CUDA).to("cpu").to("cuda:1").numpy(), np.ones(2, np.float32))


def test_an_op_with_a_value_dependent_shape_is_refused_with_the_fix(cuda):
    x = af.tensor([0.0, 1.0, 2.0], device=CUDA)
    with pytest.raises(DeviceError, match="nonzero.*to\\('cpu'\\)"):
        af.nonzero(x)
    assert_same(af.nonzero(x.to("cpu")).numpy(), np.array([[1], [2]]))


def test_no_driver_refuses_naming_af_cuda_emu(monkeypatch):
    if gpu_missing() is None:
        pytest.skip("CuPy sees a CUDA device here: the CuPy driver is made, not refused")
    settle()
    use_driver(None)
    monkeypatch.delenv("AF_CUDA", raising=False)
    for _ in range(2):
        with pytest.raises(DeviceError, match="AF_CUDA=emu") as e:
            af.zeros(2, device=CUDA)
        assert "CuPy" in str(e.value) and "'cpu'" in str(e.value)


def test_af_cuda_emu_selects_the_emulator(monkeypatch):
    settle()
    use_driver(None)
    monkeypatch.setenv("AF_CUDA", "emu")
    try:
        assert_same((af.ones(3, device=CUDA) * 3).numpy(), np.full(3, 3, np.float32))
        assert isinstance(driver_for(CUDA), EmuDriver)
    finally:
        settle()
        use_driver(None)


# -- every op family on cuda:0 equals cpu -----------------------------------------------------
def test_assert_same_is_bit_for_bit_on_the_emulator_whatever_the_op():
    one = np.ones(3, np.float32)
    next_up = np.nextafter(one, np.float32(2))  # one ulp apart
    for exact in (True, False):
        with pytest.raises(AssertionError):
            assert_same(next_up, one, exact=exact)
        with pytest.raises(AssertionError):  # the dtype counts too
            assert_same(one.astype(np.float64), one, exact=exact)
    assert_same(one.copy(), one, exact=False)


def _inputs(op, dtype):
    rng = np.random.default_rng(0)
    vals = rng.uniform(0.5, 4.0, size=(3, 4))
    if dtype.is_floating_point:
        a, b = vals, vals[::-1].copy()
    elif dtype is af.bool:
        a, b = vals > 2, vals < 3
    else:
        a, b = np.ceil(vals), np.ceil(vals[::-1].copy()) + 1
    return [a.astype(dtype.np), b.astype(dtype.np)][: len(op.inputs)]


def _elementwise_ops():
    """Every registered elementwise op taking tensors only, or tensors and a scalar."""
    out = []
    for name, op in sorted(all_ops().items()):
        if not op.elementwise or any(i.endswith(("*", "?")) for i in op.inputs):
            continue
        if op.attrs in ((), ("scalar",)):
            out.append(name)
    return out


ELEMENTWISE = _elementwise_ops()
# Not exact on a GPU: CUDA's libm rounds these within a few ulp of numpy's
# (CUDA's sinf, cosf, erff and expf are within a few ulp of numpy's, not equal: seen on a GPU)
TRANSCENDENTAL = {
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "pow",
    "pow_scalar",
    "rpow_scalar",
    "sin",
    "cos",
    "erf",
    "silu",
    "gelu",
    "rsqrt",
    "log1p",
    "expm1",
    "softplus",
}


def test_the_registry_gives_the_elementwise_families():
    assert {"add", "mul_scalar", "rpow_scalar", "exp", "relu", "eq", "bitwise_xor", "copy"} <= set(
        ELEMENTWISE
    )


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_op_on_cuda_equals_cpu(cuda, name, monkeypatch):
    op = all_ops()[name]
    attrs = {"scalar": 2} if op.attrs else {}
    ran = 0
    generated = []  # launches of the op's generated CUDA C kernel
    launch = EmuStream.launch

    def counted(self, kernel, args, grid=None, block=None):
        if kernel.name == name and kernel.source:
            generated.append(kernel)
        return launch(self, kernel, args, grid, block)

    monkeypatch.setattr(EmuStream, "launch", counted)
    for dtype in (af.float32, af.int64, af.bool):
        arrays = _inputs(op, dtype)
        results = []
        for dev in ("cpu", CUDA):
            impls = [af.tensor(a, dtype=dtype, device=dev)._impl for a in arrays]
            try:
                out = apply(op, impls, dict(attrs))
            except (DTypeError, TypeError, ValueError):  # (a dtype the op refuses)
                break
            try:
                results.append([wrap(o).numpy() for o in out])
            except KernelError as e:
                results.append(type(e.original))
        if len(results) == 2:
            ran += 1
            if isinstance(results[0], list):
                for x, y in zip(*results, strict=True):
                    assert_same(y, x, exact=name not in TRANSCENDENTAL)
            else:
                assert results[0] is results[1]
    assert ran, f"{name}: no dtype ran"
    assert generated or name not in K.OPS or not on_emulator(), (  # (counted on EmuStream)
        f"{name}: the generated kernel was not launched"
    )


# exact on a GPU too: picking an element is IEEE-exact (sums, means and softmaxes are not)
EXACT_REDUCE = {"amax", "amin", "argmax", "argmin", "max_dim", "min_dim_idx", "max"}
REDUCE = {
    "sum": lambda t: t.sum(),
    "sum_dim": lambda t: t.sum(1, keepdim=True),
    "mean": lambda t: t.mean(0),
    "amax": lambda t: t.amax(1),
    "amin": lambda t: t.amin(),
    "argmax": lambda t: t.argmax(1),
    "argmin": lambda t: t.argmin(0),
    "max_dim": lambda t: t.max(1)[0],
    "min_dim_idx": lambda t: t.min(0)[1],
    "softmax": lambda t: F.softmax(t, 1),
    "log_softmax": lambda t: F.log_softmax(t, 0),
    "max": lambda t: t.max(),
    "mean_dims": lambda t: t.mean((0, 1), keepdim=True),
}


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_family_on_cuda_equals_cpu(cuda, name):
    data = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    a, b = both(lambda dev: REDUCE[name](af.tensor(data, device=dev)))
    assert_same(b, a, exact=name in EXACT_REDUCE)


@pytest.mark.parametrize(
    "shapes",
    [
        ((4, 5), (5, 3)),
        ((2, 4, 5), (2, 5, 3)),
        ((5,), (5, 3)),
        ((4, 5), (5,)),
        ((2, 1, 4, 5), (3, 5, 2)),
    ],
)
def test_matmul_family_on_cuda_equals_cpu(cuda, shapes):
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    a, b = both(lambda dev: af.tensor(x, device=dev) @ af.tensor(y, device=dev))
    assert_same(b, a, exact=False)
    a, b = both(
        lambda dev: af.matmul(af.tensor(x, device=dev).double(), af.tensor(y, device=dev).double())
    )
    assert_same(b, a, exact=False)
    if len(shapes[0]) == 2 and len(shapes[1]) == 2:
        a, b = both(lambda dev: af.tensor(y, device=dev).T @ af.tensor(x, device=dev).T)
        assert_same(b, a, exact=False)


OTHERS = {
    "where": lambda t: af.where(t > 0, t, t * 2),
    "clamp": lambda t: t.clamp(-0.5, 0.5),
    "clamp_tensor": lambda t: t.clamp(min=t * 0.5),
    "cast": lambda t: t.to(af.int32),
    "cat": lambda t: af.cat([t, t * 2], 1),
    "stack": lambda t: af.stack([t, -t]),
    "index": lambda t: t[af.tensor([0, 2], device=t.device)],
    "slice": lambda t: t[1:, ::2] + 1,
    "gelu": lambda t: F.gelu(t, approximate="tanh"),
    "reshape": lambda t: t.T.reshape(-1),
    "contiguous": lambda t: t.T.contiguous(),
    "rand": lambda t: (af.manual_seed(5), af.rand(3, 4, device=t.device))[1],
}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_ops_on_cuda_equal_cpu(cuda, name):
    data = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    a, b = both(lambda dev: OTHERS[name](af.tensor(data, device=dev)))
    assert_same(b, a, exact=name != "gelu")  # (gelu's tanh: CUDA's libm)


def _img(t):
    return t.reshape(1, 1, 3, 4)


def _idx(t, rows):
    return af.tensor(rows, device=t.device)


# Every op kind a model uses, forward and through autograd's backward ops, on cuda:0 against
# cpu. On the emulator each op's numpy kernel runs over CuPy-like arrays (cupylike.py), so
# a kernel a GPU could not run fails in CI; on a GPU (``pytest -m gpu``) it runs on CuPy.
# (name -> (function of a (3, 4) float32 tensor, exact on a GPU))
SWEEP = {
    "cumsum": (lambda t: t.cumsum(1), False),
    "sort": (lambda t: t.sort(1)[0], True),
    "sort_indices": (lambda t: t.sort(1)[1], True),
    "topk": (lambda t: t.topk(2, dim=1)[0], True),
    "tril": (lambda t: t.tril(), True),
    "triu": (lambda t: t.triu(1), True),
    "gather": (lambda t: t.gather(1, _idx(t, [[0, 1], [2, 3], [1, 1]])), True),
    "scatter_add": (
        lambda t: af.zeros(3, 4, device=t.device).scatter_add(
            1, _idx(t, [[0, 1], [2, 2], [1, 1]]), t[:, :2]
        ),
        False,
    ),
    "setitem": (lambda t: _setitem(t), True),
    "index_rows": (lambda t: t[_idx(t, [2, 0, 2])], True),
    "pad": (lambda t: F.pad(t, (1, 2)), True),
    "layer_norm": (lambda t: nn.functional.layer_norm(t, (4,)), False),
    "batch_norm": (lambda t: nn.functional.batch_norm(t, None, None, training=True), False),
    "softmax_rows": (lambda t: F.softmax(t.reshape(1, 12).expand(64, 12) * 1.0, 1), False),
    "cross_entropy": (lambda t: nn.functional.cross_entropy(t, _idx(t, [0, 1, 3])), False),
    "embedding": (lambda t: nn.functional.embedding(_idx(t, [2, 0, 2, 1]), t), True),
    "conv2d": (lambda t: nn.functional.conv2d(_img(t), _img(t)[:, :, :2, :2]), False),
    "max_pool2d": (lambda t: nn.functional.max_pool2d(_img(t), 2), True),
    "avg_pool2d": (lambda t: nn.functional.avg_pool2d(_img(t), 2), False),
    "adaptive_avg_pool2d": (lambda t: nn.functional.adaptive_avg_pool2d(_img(t), 1), False),
    "unfold": (lambda t: nn.functional.unfold(_img(t), 2), True),
    "amin_dim": (lambda t: t.amin(1), True),
    "argmin_all": (lambda t: t.argmin(), True),
    "arange": (lambda t: af.arange(5, device=t.device), True),
    "randn": (lambda t: (af.manual_seed(7), af.randn(3, 4, device=t.device))[1], True),
    "rand_0d": (lambda t: (af.manual_seed(8), af.rand((), device=t.device))[1], True),
    "erf64": (lambda t: af.erf(t.double()[:, ::2]), False),
    "where_scalar": (lambda t: af.where(t > 0, t, 0.0), True),
    "pow_bool": (lambda t: (t > 0) ** (t < 1), True),
}


def _setitem(t):
    x = t * 1
    x[_idx(t, [0, 2])] = 1.5
    return x


def _nchw(t):
    return t.reshape(8, 5, 16, 8)


# The same on a (64, 80) tensor: the kernels' fast paths for larger arrays (where by bits,
# softmax over many short rows, sums over leading dims, batch norm planes, scatter of many
# rows), each of which must run on a GPU too.
SWEEP_BIG = {
    "where_by_bits": (lambda t: af.where(t > 0, t, 0.0) + af.where(t < 0, 1.0, t), True),
    "softmax_rows": (lambda t: F.softmax(t, 1) + F.log_softmax(t, 1), False),
    "sum_leading": (lambda t: _nchw(t).sum((0, 2, 3)), False),
    "batch_norm_4d": (
        lambda t: nn.functional.batch_norm(_nchw(t), None, None, training=True),
        False,
    ),
    "batch_norm_channels_last": (
        lambda t: nn.functional.batch_norm(
            _nchw(t).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2), None, None, training=True
        ),
        False,
    ),
    "layer_norm": (lambda t: nn.functional.layer_norm(t, (80,)), False),
    "embedding_rows": (
        lambda t: nn.functional.embedding((t[:, :8].abs() * 7).long().reshape(-1) % 64, t),
        True,
    ),
    "cross_entropy": (
        lambda t: nn.functional.cross_entropy(t, (t[:, 0].abs() * 9).long() % 80),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(SWEEP_BIG))
def test_an_op_sweep_on_larger_tensors_on_cuda_equals_cpu(cuda, name):
    fn, exact = SWEEP_BIG[name]
    data = np.random.default_rng(6).standard_normal((64, 80)).astype(np.float32)
    a, b = both(lambda dev: fn(af.tensor(data, device=dev)))
    assert_same(b, a, exact=exact)


BIG_GRADS = {
    "softmax_rows": lambda t: (F.softmax(t, 1) * t).sum(),
    "batch_norm_4d": lambda t: (
        nn.functional.batch_norm(_nchw(t), None, None, training=True) * _nchw(t)
    ).sum(),
    "layer_norm": lambda t: (nn.functional.layer_norm(t, (80,)) * t).sum(),
    "embedding_rows": lambda t: nn.functional.embedding(
        af.tensor(np.arange(512) % 64, device=t.device), t
    ).sum(),
    "where": lambda t: af.where(t > 0, t, t * 0.5).sum(),
}


@pytest.mark.parametrize("name", sorted(BIG_GRADS))
def test_gradients_on_larger_tensors_on_cuda_equal_cpu(cuda, name):
    data = np.random.default_rng(7).standard_normal((64, 80)).astype(np.float32)

    def grad(dev):
        t = af.tensor(data, device=dev, requires_grad=True)
        BIG_GRADS[name](t).backward()
        return t.grad

    a, b = both(grad)
    assert_same(b, a, exact=False)


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_an_op_sweep_on_cuda_equals_cpu(cuda, name):
    fn, exact = SWEEP[name]
    data = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    a, b = both(lambda dev: fn(af.tensor(data, device=dev)))
    assert_same(b, a, exact=exact)


GRADS = {
    "index_and_gather": lambda t: (
        t[_idx(t, [2, 0, 2])].sum() + t.gather(1, _idx(t, [[0, 1], [2, 3], [1, 1]])).sum()
    ),
    "softmax_and_log_softmax": lambda t: (F.softmax(t, 1) * t).sum() + F.log_softmax(t, 0).sum(),
    "layer_norm": lambda t: (nn.functional.layer_norm(t, (4,)) * t).sum(),
    "batch_norm": lambda t: (nn.functional.batch_norm(t, None, None, training=True) * t).sum(),
    "cross_entropy": lambda t: nn.functional.cross_entropy(t, _idx(t, [0, 1, 3])),
    "conv_and_pools": lambda t: (
        nn.functional.conv2d(_img(t), _img(t)[:, :, :2, :2]).sum()
        + nn.functional.max_pool2d(_img(t), 2).sum()
        + nn.functional.avg_pool2d(_img(t), 2).sum()
        + nn.functional.adaptive_avg_pool2d(_img(t), 1).sum()
    ),
    "activations": lambda t: (F.gelu(t) + F.silu(t) + t.sigmoid() + t.tanh()).sum(),
    "pad_and_matmul": lambda t: (F.pad(t, (1, 1)) @ F.pad(t, (1, 1)).T).sum(),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients_on_cuda_equal_cpu(cuda, name):
    data = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)

    def grad(dev):
        t = af.tensor(data, device=dev, requires_grad=True)
        GRADS[name](t).backward()
        return t.grad

    a, b = both(grad)
    assert_same(b, a, exact=False)


# -- ordering under random delays, faults, memory ---------------------------------------------
def _chain(dev, data):
    x = af.tensor(data, device=dev)
    w = af.tensor(data.T.copy(), device=dev)
    for i in range(6):
        y = (x @ w).relu() * 0.25 + i
        x = (x + y.sum(1, keepdim=True) * 0.01).tanh()
        x.add_(0.5)
        w = w - x.T * 0.1
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chain_under_random_stream_delays_equals_cpu(emu, seed):
    driver = emu(delay=1e-3, seed=seed)
    data = np.random.default_rng(seed).standard_normal((6, 6)).astype(np.float32)
    expected = _chain("cpu", data).numpy()
    af.lowlevel.get_vm().set_test_hooks(seed, 5e-4)  # the VM's dispatch order shuffled too
    got = _chain(CUDA, data).to("cpu").numpy()
    assert_same(expected, got)
    assert sum(len(s.delays) for s in driver._streams) > 50  # the delays were drawn


def test_a_kernel_fault_surfaces_at_synchronize_and_the_runtime_goes_on(emu):
    cuda = emu()
    x = af.tensor([1.0, 2.0, 3.0], device=CUDA)
    ok = x + 1
    cuda.fail_kernel("mul_scalar")
    w = x - 1  # independent of it, issued before it
    y = x * 2  # faults on the device
    z = y + 1  # computed from it: poisoned
    with pytest.raises(KernelError) as e:
        af.synchronize(30)
    assert e.value.op == "mul_scalar" and e.value.device == CUDA
    with pytest.raises(KernelError, match="'mul_scalar'"):
        z.numpy()
    assert_same(ok.numpy(), np.array([2, 3, 4], np.float32))
    assert_same(w.numpy(), np.array([0, 1, 2], np.float32))
    assert_same((x * 2).numpy(), np.array([2, 4, 6], np.float32))  # new work runs
    af.synchronize(30)  # the error was reported once


def _emu_threads() -> int:
    return sum(t.name.startswith(f"af-emu-{CUDA}-") for t in threading.enumerate())


def test_faults_leave_no_driver_streams_or_threads_behind(emu):
    # the emulator only: it injects the faults (``fail_kernel``); on a GPU a real kernel
    # fault (an illegal address, a trap) is sticky for the whole CUDA context
    cuda = emu()
    a = af.tensor(np.arange(1, 9), device=CUDA)
    for _ in range(50):
        cuda.fail_kernel("add_scalar")
        with pytest.raises(KernelError):
            (a + 1).numpy()
        assert_same((a * 2).numpy(), np.arange(2, 18, 2))  # new work runs
    assert len(cuda._streams) <= 4  # compute, h2d, d2h (and one more at most)
    deadline = time.monotonic() + 20
    while _emu_threads() > 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _emu_threads() <= 4


def test_out_of_memory_under_a_small_device_budget(cuda):
    af.lowlevel.set_memory_budget(CUDA, 4096)
    try:
        small = af.ones(256, device=CUDA)  # 1 KiB fits
        big = af.zeros(2048, device=CUDA)  # 8 KiB does not
        with pytest.raises(OutOfMemoryError) as e:
            big.numpy()
        assert "4.0 KiB budget" in str(e.value) and CUDA in str(e.value)
        assert_same((small * 2).numpy(), np.full(256, 2, np.float32))
        assert af.lowlevel.memory_stats(CUDA).budget == 4096
    finally:
        af.lowlevel.set_memory_budget(CUDA, None)


def test_out_of_memory_when_the_device_refuses(emu):
    emu(limit=8192)
    with pytest.raises(OutOfMemoryError) as e:
        af.zeros(4096, device=CUDA).numpy()  # 16 KiB on an 8 KiB device
    assert CUDA in str(e.value)
    assert_same(af.ones(4, device=CUDA).numpy(), np.ones(4, np.float32))


def test_freed_device_memory_is_reused(cuda):
    backend = get_backend(af.device(CUDA))
    for _ in range(20):
        t = af.ones(1000, device=CUDA) * 3
        t.numpy()
        del t
    settle()
    stats = backend.caching().stats()
    assert stats.hits > 0 and stats.mallocs < 20
    assert af.lowlevel.memory_stats(CUDA).in_use == 0


# -- above the VM: autograd, nn and optim run on cuda:0 unchanged ----------------------------
def test_autograd_on_cuda_equals_cpu(cuda):
    rng = np.random.default_rng(4)
    x0, w0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2))
    grads = {}
    for dev in ("cpu", CUDA):
        x = af.tensor(x0, device=dev, requires_grad=True)
        w = af.tensor(w0, dtype=af.float32, device=dev, requires_grad=True)
        (x @ w).relu().sum().backward()
        grads[dev] = (x.grad.numpy(), w.grad.numpy())
    for a, b in zip(grads["cpu"], grads[CUDA], strict=True):
        assert_same(b, a, exact=False)  # (a matmul and a sum)


def test_a_training_loop_on_cuda_equals_cpu(cuda):
    from actorflow import nn

    def train(dev):
        af.manual_seed(0)
        m = nn.Linear(3, 2, device=dev)
        opt = af.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x = af.tensor(np.linspace(0, 1, 15, dtype=np.float32).reshape(5, 3), device=dev)
        for _ in range(5):
            opt.zero_grad()
            loss = ((m(x) - 1) ** 2).mean()
            loss.backward()
            opt.step()
        return loss.item(), m.weight.numpy(), m.bias.numpy()

    cpu, gpu = train("cpu"), train(CUDA)
    for a, b in zip(cpu, gpu, strict=True):  # (matmuls and means, 5 steps)
        assert_same(b, a, exact=False, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_an_empty_batch_loss_and_its_gradient_on_cuda_equal_cpu(cuda, reduction):
    """A loss over no rows: its backward expands a 0-dim gradient to shape (0,), a view of
    a 0-dim block (the kernels' views of an empty operand are made of any base)."""
    got = []
    for dev in ("cpu", CUDA):
        x = af.tensor(np.ones((0, 5), np.float32), device=dev).requires_grad_()
        t = af.tensor(np.zeros((0,), np.int64), device=dev)
        loss = nn.functional.cross_entropy(x, t, reduction=reduction)
        (loss.sum() if loss.ndim else loss).backward()
        got.append((loss.numpy(), x.grad.numpy()))
    (want_loss, want_grad), (loss, grad) = got
    np.testing.assert_array_equal(loss, want_loss)  # (nan for a mean over no rows)
    assert grad.shape == want_grad.shape == (0, 5)
