"""The driver seam's conformance (actorflow/backends/cuda/driver.py), one set of tests for
every driver: the emulator always, the CuPy driver where CuPy sees a GPU (marked ``gpu``:
``pytest -m gpu`` runs them; skipped with the reason elsewhere). Ordering on a stream, event
waits across streams, copies both ways and on the device, the pool's limit refusing with
OutOfMemoryError, sticky faults (a kernel raising, a host function raising), capture and
replay, ``Event.then``. Then the CuPy driver's refusal where CuPy is missing (runs here),
and GPU-only checks: every generated kernel against the numpy kernels on the GPU, pinned
host buffers for the copies."""

import sys
import threading

import numpy as np
import pytest

import actorflow as af
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda.driver import Kernel
from actorflow.backends.cuda.emu import EmuDriver
from actorflow.backends.cuda.selection import use_driver
from actorflow.errors import DeviceError, KernelError, OutOfMemoryError
from actorflow.testing import gpu_missing
from cuda_fixtures import ON_GPU

pytestmark = pytest.mark.timeout(120)

GPU = [pytest.mark.gpu, pytest.mark.af_gpu]


def _make(kind, **kw):
    if kind == "emu":
        return EmuDriver("cuda:0", **kw)
    from actorflow.backends.cuda.cupy_driver import CupyDriver

    return CupyDriver("cuda:0", limit=kw.get("limit"))


@pytest.fixture(params=["emu", pytest.param("cupy", marks=GPU)])
def make(request):
    """``make(**kw)``: a new driver of the parametrized kind (``delay``/``seed`` only reach
    the emulator); each is closed after the test."""
    made = []

    def start(**kw):
        d = _make(request.param, **kw)
        made.append(d)
        return d

    yield start
    for d in made:
        try:
            d.synchronize(30)
        except KernelError:
            pass
        d.close()


def _add_scalar():
    """``out = x + s`` in float32: the generated source and its numpy reference."""
    src = K.elementwise("add_scalar", "float32", ("float32",), scalars=(("scalar", "float"),))

    def reference(out, x, s, n):
        np.add(x, s, out=out)

    return Kernel(
        "add_scalar", reference=reference, source=src.source, params=src.params, entry=src.name
    )


ADD = _add_scalar()


def _buffer(d, n, dtype=np.float32):
    return d.malloc(n * np.dtype(dtype).itemsize).array((n,), dtype)


def _put(d, s, a, values):
    host = d.pinned(a.shape, a.dtype)
    host[:] = values
    s.copy_h2d(a, host)
    return host  # keep it alive until the stream got there


def _get(d, s, a):
    host = d.pinned(a.shape, a.dtype)
    s.copy_d2h(host, a)
    s.synchronize(30)
    return host.copy()


def test_a_stream_runs_its_commands_in_order(make):
    d = make(delay=1e-3, seed=1)
    s = d.stream()
    a = _buffer(d, 1000)
    keep = _put(d, s, a, np.arange(1000))
    for k in range(10):
        s.launch(ADD, (a, a, np.float32(k), np.int64(1000)))
    np.testing.assert_array_equal(_get(d, s, a), np.arange(1000) + 45)
    del keep


def test_an_event_wait_orders_another_stream_and_not_the_host(make):
    d = make(delay=2e-3, seed=2)
    s1, s2 = d.stream("a"), d.stream("b")
    a, b = _buffer(d, 256), _buffer(d, 256)
    keep = _put(d, s1, a, np.ones(256))
    for _ in range(5):
        s1.launch(ADD, (a, a, np.float32(1), np.int64(256)))
    ev = s1.record()
    s2.wait(ev)
    s2.copy_d2d(b, a)
    s2.launch(ADD, (b, b, np.float32(100), np.int64(256)))
    np.testing.assert_array_equal(_get(d, s2, b), np.full(256, 106, np.float32))
    assert ev.query()
    del keep


def test_copies_both_ways_and_on_the_device(make):
    d = make()
    s = d.stream("copies")
    for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_):
        data = (np.arange(77) % 5).astype(dtype)
        a, b = _buffer(d, 77, dtype), _buffer(d, 77, dtype)
        keep = _put(d, s, a, data)
        s.copy_d2d(b, a)
        np.testing.assert_array_equal(_get(d, s, b), data)
        del keep
    with pytest.raises(ValueError, match="must match"):
        s.copy_h2d(_buffer(d, 4), np.zeros(5, np.float32))


def test_the_pool_limit_refuses_with_out_of_memory(make):
    d = make(limit=1 << 20)
    first = d.malloc(600_000)
    with pytest.raises(OutOfMemoryError) as e:
        d.malloc(600_000)
    msg = str(e.value)
    assert "600,000 bytes asked" in msg and "600,000 in use" in msg and "1,048,576" in msg
    d.free(first)
    d.free(d.malloc(600_000))  # room again once freed
    assert d.memory().in_use == 0 and d.memory().limit == 1 << 20
    with pytest.raises(DeviceError, match="not allocated"):
        d.free(first)


def test_a_kernel_that_raises_is_the_streams_sticky_error(make):
    d = make()
    s = d.stream()
    a = _buffer(d, 8)
    keep = _put(d, s, a, np.zeros(8))

    def bad(out, n):
        raise RuntimeError("bad kernel")

    s.launch(Kernel("bad", reference=bad), (a, np.int64(8)))
    s.launch(ADD, (a, a, np.float32(1), np.int64(8)))  # skipped: the stream faulted
    ev = s.record()
    with pytest.raises(KernelError, match="bad") as e:
        s.synchronize(30)
    assert isinstance(e.value.original, RuntimeError)
    with pytest.raises(KernelError):
        ev.synchronize(30)
    fresh = d.stream()  # other streams go on
    np.testing.assert_array_equal(_get(d, fresh, a), np.zeros(8, np.float32))
    del keep


def test_a_host_function_that_raises_is_the_streams_sticky_error(make):
    d = make()
    s = d.stream()
    ran = []
    s.add_callback(lambda: ran.append(1))
    s.add_callback(lambda: 1 / 0)
    ev = s.record()
    with pytest.raises(KernelError) as e:
        ev.synchronize(30)
    assert isinstance(e.value.original, ZeroDivisionError) and ran == [1]


def test_a_wait_passes_a_fault_on_unless_it_orders_only(make):
    d = make()
    bad, inherits, orders = d.stream("bad"), d.stream("inherits"), d.stream("orders")
    bad.add_callback(lambda: 1 / 0)
    ev = bad.record()
    inherits.wait(ev)
    orders.wait(ev, errors=False)
    ran = []
    orders.add_callback(lambda: ran.append(1))
    with pytest.raises(KernelError):
        inherits.synchronize(30)
    orders.synchronize(30)  # ordered, not faulted
    assert ran == [1]


def test_capture_and_replay(make):
    d = make()
    s = d.stream("capture")
    a = _buffer(d, 64)
    keep = _put(d, s, a, np.zeros(64))
    s.synchronize(30)
    s.begin_capture()
    s.launch(ADD, (a, a, np.float32(1), np.int64(64)))
    s.launch(ADD, (a, a, np.float32(2), np.int64(64)))
    g = s.end_capture()
    for _ in range(3):
        g.launch(s)
    np.testing.assert_array_equal(_get(d, s, a), np.full(64, 9, np.float32))
    with pytest.raises(DeviceError, match="not capturing"):
        s.end_capture()
    del keep


def test_a_captured_reference_launchs_temporaries_are_the_graphs_own(make):
    """A reference launch allocates a temporary (``x * 2``) inside the capture; once the
    capture ended, other calls allocate same-sized arrays and keep them: every replay writes
    its temporary, and none of theirs may change (on CuPy's shared pool the freed temporary
    would have been handed to the first of them)."""
    d = make()
    s = d.stream("capture")
    n = 1024
    x, out = _buffer(d, n), _buffer(d, n)
    keep = _put(d, s, x, np.arange(n) % 7)
    s.synchronize(30)

    def twice_plus_one(out, x):
        np.add(np.multiply(x, 2), 1, out=out)

    kept: list = []

    def kept_triple(x):
        kept.append(np.multiply(x, 3))  # same size: the pool's same bin

    s.begin_capture()
    s.launch(Kernel("twice_plus_one", reference=twice_plus_one), (out, x))
    g = s.end_capture()
    for _ in range(4):
        s.launch(Kernel("kept_triple", reference=kept_triple), (x,))
    for _ in range(3):
        g.launch(s)
    host = (np.arange(n) % 7).astype(np.float32)
    np.testing.assert_array_equal(_get(d, s, out), host * 2 + 1)
    seen = _buffer(d, n)
    for k in kept:
        s.launch(Kernel("read", reference=lambda dst, k=k: dst.__setitem__(..., k)), (seen,))
        np.testing.assert_array_equal(_get(d, s, seen), host * 3)
    del keep


def test_a_command_that_cannot_be_captured_fails_the_capture_not_the_stream(make):
    """A reference that synchronizes (reads a value back) cannot be captured on a GPU:
    ``end_capture`` raises DeviceError naming it, and the stream is not faulted (the same
    commands run uncaptured after). The emulator records references and runs them at each
    replay, so there the capture holds it."""
    d = make()
    s = d.stream("capture")
    a = _buffer(d, 8)
    keep = _put(d, s, a, np.arange(8))
    s.synchronize(30)
    read: list = []

    def reads_back(x):
        read.append(float(x.sum()))

    s.begin_capture()
    s.launch(Kernel("reads_back", reference=reads_back), (a,))
    if isinstance(d, EmuDriver):
        s.end_capture().launch(s)
        s.synchronize(30)
        assert read == [28.0]
    else:
        with pytest.raises(DeviceError, match="capture failed.*reads_back"):
            s.end_capture()
        assert read == []
    s.launch(Kernel("reads_back", reference=reads_back), (a,))  # uncaptured: it runs
    s.launch(ADD, (a, a, np.float32(1), np.int64(8)))
    np.testing.assert_array_equal(_get(d, s, a), np.arange(8, dtype=np.float32) + 1)
    assert read[-1] == 28.0
    del keep


def test_then_is_called_once_the_record_completed(make):
    d = make(delay=2e-3, seed=3)
    s = d.stream()
    a = _buffer(d, 16)
    keep = _put(d, s, a, np.zeros(16))
    s.launch(ADD, (a, a, np.float32(1), np.int64(16)))
    ev = s.record()
    called = threading.Event()
    seen = []
    ev.then(lambda: (seen.append(ev.query()), called.set()))
    assert called.wait(30) and seen == [True]
    now = []
    d.event().then(lambda: now.append(1))  # never recorded: at once
    assert now == [1]
    del keep


# -- the CuPy driver without CuPy ---------------------------------------------------------------
def test_the_cupy_driver_refuses_without_cupy_naming_the_install_and_the_emulator(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    from actorflow.backends.cuda.cupy_driver import CupyDriver

    with pytest.raises(DeviceError) as e:
        CupyDriver("cuda:0")
    msg = str(e.value)
    assert "pip install 'actorflow[cuda]'" in msg and "AF_CUDA=emu" in msg and "cuda:0" in msg


def test_without_cupy_a_cuda_tensor_is_refused_with_the_ways_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.delenv("AF_CUDA", raising=False)
    af.synchronize(30)
    use_driver(None)
    try:
        with pytest.raises(DeviceError) as e:
            af.zeros(2, device="cuda:0")
        msg = str(e.value)
        assert "actorflow[cuda]" in msg and "AF_CUDA=emu" in msg and "'cpu'" in msg
    finally:
        use_driver(None)


def test_with_cupy_but_no_device_the_driver_refuses():
    pytest.importorskip("cupy", reason="CuPy is not installed (the cuda extra)")
    if gpu_missing() is None:
        pytest.skip("CuPy sees a GPU here")
    from actorflow.backends.cuda.cupy_driver import CupyDriver

    with pytest.raises(DeviceError, match="AF_CUDA=emu"):
        CupyDriver("cuda:0")


# -- GPU only ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.af_gpu
@pytest.mark.timeout(600)  # (hundreds of kernels compiled: 120 s was not enough on a GPU
@ON_GPU  # machine running 8 test workers)
def test_generated_kernels_on_the_gpu_equal_the_numpy_kernels(cuda):
    import test_cuda_generated as G
    from actorflow.ops.registry import all_ops

    ran = 0
    for name in G.COVERED:
        op = all_ops()[name]
        for arrays, dtypes, attrs in G._cases(name):
            cpu = G._run(op, arrays, dtypes, attrs, "cpu")
            gpu = G._run(op, arrays, dtypes, attrs, "cuda:0")
            if isinstance(cpu, tuple) or isinstance(gpu, tuple):
                assert cpu == gpu, (name, dtypes, attrs)
                continue
            for x, y in zip(cpu, gpu, strict=True):
                assert x.dtype == y.dtype and x.shape == y.shape
                if x.dtype.kind == "f":  # libm and CUDA's functions: a few ulp
                    tol = 2e-3 if x.dtype == np.float16 else 1e-5
                    np.testing.assert_allclose(
                        y, x, rtol=tol, atol=tol, err_msg=f"{name} {dtypes} {attrs}"
                    )
                else:
                    np.testing.assert_array_equal(y, x, err_msg=f"{name} {dtypes}")
            ran += 1
    assert ran > 300


@pytest.mark.gpu
@pytest.mark.af_gpu
def test_pinned_buffers_are_page_locked_and_a_large_copy_round_trips():
    import time

    import cupy

    from actorflow.backends.cuda.cupy_driver import CupyDriver

    d = CupyDriver("cuda:0")
    try:
        n = 64 << 20
        host = d.pinned((n,), np.uint8)
        attrs = cupy.cuda.runtime.pointerGetAttributes(host.ctypes.data)
        assert attrs.type == cupy.cuda.runtime.memoryTypeHost  # pinned, not pageable
        host[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
        a = d.malloc(n).array((n,), np.uint8)
        s = d.stream("h2d")
        t0 = time.perf_counter()
        s.copy_h2d(a, host)
        s.synchronize(30)
        dt = time.perf_counter() - t0
        print(f"h2d pinned: {n / dt / 1e9:.1f} GB/s")  # reported, not asserted
        back = d.pinned((n,), np.uint8)
        s.copy_d2h(back, a)
        s.synchronize(30)
        np.testing.assert_array_equal(back, host)
    finally:
        d.close()


def test_cupy_compiles_every_generated_source_with_its_launch_options(launches):
    """CuPy's own NVRTC path, with the options RawKernel adds (an explicit architecture:
    no device is needed), on every source the op calls launch (CuPy installed only)."""
    pytest.importorskip("cupy", reason="CuPy is not installed (the cuda extra)")
    from cupy.cuda import compiler  # (_NVRTCProgram: CuPy's compile without a device)

    import test_cuda_generated as G
    from actorflow.ops.registry import all_ops

    for name in G.COVERED:
        for arrays, dtypes, attrs in G._cases(name):
            G._run(all_ops()[name], arrays, dtypes, attrs, "cuda:0")
    bodies = {k.source[len(K.PRELUDE) :] for k in launches if k.source}
    assert len(bodies) > 300
    prog = compiler._NVRTCProgram(
        K.PRELUDE + "".join(sorted(bodies)), "", (), (), name_expressions=None, method="ptx"
    )
    ptx, _ = prog.compile(
        ("-arch=compute_90", "--device-as-default-execution-space", "--std=c++17"), None
    )
    assert ptx


# -- DLPack on cuda --------------------------------------------------------------------------
class _CudaProducer:
    """A DLPack producer that says its memory is CUDA device 0's (what a CuPy or torch
    CUDA tensor says); only its device is read before the refusal."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kwargs):
        raise AssertionError("not read: the emulator refuses first")


def test_dlpack_on_the_emulator_is_refused_naming_the_way_through_the_host(emu):
    emu()
    t = af.arange(6, dtype=af.float32, device="cuda:0")
    for fn in (
        t.__dlpack__,
        t.__dlpack_device__,
        lambda: np.from_dlpack(t),
        lambda: af.from_dlpack(_CudaProducer()),
    ):
        with pytest.raises(DeviceError) as e:
            fn()
        assert "emu" in str(e.value) and ".to('cpu')" in str(e.value)
    np.testing.assert_array_equal(np.from_dlpack(t.to("cpu")), np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32))  # untouched


@pytest.mark.gpu
@pytest.mark.af_gpu
@ON_GPU
def test_dlpack_to_and_from_cupy_on_the_gpu_shares_memory(cuda):
    import cupy

    t = af.arange(12, dtype=af.float32, device="cuda:0").reshape(3, 4) * 2
    assert t.__dlpack_device__() == (2, 0)
    c = cupy.from_dlpack(t)
    cupy.testing.assert_array_equal(c, cupy.arange(12, dtype=cupy.float32).reshape(3, 4) * 2)
    c += 1  # the same memory
    cupy.cuda.Device(0).synchronize()
    np.testing.assert_array_equal(t.numpy(), np.arange(12).reshape(3, 4) * 2 + 1)
    v = cupy.from_dlpack(t.T)  # a view: a contiguous copy
    cupy.testing.assert_array_equal(v, c.T)
    x = cupy.arange(10, dtype=cupy.float64)
    a = af.from_dlpack(x)
    assert str(a.device) == "cuda:0" and a.dtype is af.float64
    np.testing.assert_array_equal((a + 1).numpy(), np.arange(10) + 1.0)
    x[0] = 100
    cupy.cuda.Device(0).synchronize()
    assert a.numpy()[0] == 100  # no copy was taken
    with pytest.raises(DeviceError, match="contiguous"):
        af.from_dlpack(cupy.arange(12).reshape(3, 4).T)


@pytest.mark.gpu
@pytest.mark.af_gpu
@ON_GPU
def test_dlpack_to_and_from_torch_cuda_on_the_gpu(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA")
    x = torch.arange(8, dtype=torch.float32, device="cuda:0")
    a = af.from_dlpack(x)
    np.testing.assert_array_equal((a * 3).numpy(), np.arange(8) * 3.0)
    back = torch.from_dlpack(a * 3)
    assert back.is_cuda and torch.equal(back.cpu(), torch.arange(8.0) * 3)
