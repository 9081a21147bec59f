"""The CuPy driver's host-side bookkeeping (actorflow/backends/cuda/cupy_driver.py) over a
fake CUDA layer, so that it runs without a GPU or CuPy: every command "completes" at once,
and what is checked is which event raises which stream's sticky error, and what a stream
keeps running. The driver's CUDA calls themselves run only on a GPU (test_cuda_driver.py,
``pytest -m gpu``)."""

import contextlib
import threading

import numpy as np
import pytest

from actorflow.backends.cuda import cupy_driver as CD
from actorflow.errors import DeviceError, KernelError

pytestmark = pytest.mark.timeout(60)


class _Ev:
    done = True

    def record(self, s):
        pass

    def synchronize(self):
        pass


class _S:
    done = True
    ptr = 0

    def __init__(self):
        self.host_funcs = []  # launched host functions, run when a test says

    def wait_event(self, e):
        pass

    def launch_host_func(self, fn, arg):
        self.host_funcs.append((fn, arg))

    def run_host_funcs(self):
        funcs, self.host_funcs = self.host_funcs, []
        for fn, arg in funcs:
            fn(arg)


class _Drv:
    device = "cuda:0"
    _dev = contextlib.nullcontext()
    _late = CD.CupyDriver._late

    def event(self):
        e = object.__new__(CD.CupyEvent)
        e._driver, e._ev, e._stream, e._seq = self, _Ev(), None, 0
        return e


def _stream(name):
    s = object.__new__(CD.CupyStream)
    s.name, s._driver, s._s = name, _Drv(), _S()
    s._seq, s._errors, s._lock, s._queue, s._capturing = 0, [], threading.Lock(), None, False
    s._links = []
    s._closed = False
    return s


def _faulted_stream():
    side = _stream("side")
    side._next()
    side._fail("bad_kernel", RuntimeError("boom"))
    return side, side.record()


def test_an_event_recorded_before_a_wait_does_not_raise_the_waited_streams_fault():
    side, faulted = _faulted_stream()
    compute = _stream("compute")
    compute._next()  # an op's kernel
    before = compute.record()  # what the VM waits on for that op
    compute.wait(faulted)  # the next op depends on the faulted work
    after = compute.record()
    assert before.query() is True
    with pytest.raises(KernelError, match="bad_kernel"):
        after.query()


def test_a_host_functions_error_set_after_a_wait_reaches_the_waiters_later_events():
    """On a GPU a host function runs when its stream gets there, after the host issued
    the waits on the event recorded after it: the fault is looked up when asked, not
    copied at the wait (seen on the first GPU run: the waiter's synchronize did not raise)."""
    bad, inherits, orders = _stream("bad"), _stream("inherits"), _stream("orders")
    bad.add_callback(lambda: 1 / 0)
    ev = bad.record()
    inherits.wait(ev)
    orders.wait(ev, errors=False)
    before = bad.record()
    assert inherits._errors == []  # nothing known at the wait
    bad._s.run_host_funcs()  # the stream gets there
    with pytest.raises(KernelError) as e:
        inherits.record().query()
    assert isinstance(e.value.original, ZeroDivisionError)
    assert orders.record().query() is True  # ordered only
    with pytest.raises(KernelError):
        before.query()
    assert inherits._links == [] and len(inherits._errors) == 1  # settled: kept, unlinked


def test_a_wait_on_a_stream_faulted_already_skips_the_waiters_later_work():
    """A fault the waited stream has at the wait is the waiter's at once, so its later
    kernels and copies are skipped (as on the emulator), not run on the failed values."""
    side, faulted = _faulted_stream()
    compute = _stream("compute")
    compute.wait(faulted)
    assert compute._broken()
    with pytest.raises(KernelError, match="bad_kernel"):
        compute.record().query()


def test_streams_waiting_on_each_other_over_and_over_are_looked_up_once_each():
    """Two streams joined back and forth (every copy in and out does so) while nothing
    completed: a query looks each (stream, command) up once, not once per path to it."""
    a, b = _stream("compute"), _stream("h2d")
    a._s.done = b._s.done = False
    for _ in range(40):
        b.wait(a.record())
        a.wait(b.record())
    calls = []
    lookup = CD.CupyStream._error_before

    def counted(self, *args, **kw):
        calls.append(1)
        return lookup(self, *args, **kw)

    CD.CupyStream._error_before = counted
    try:
        assert a.query() is False
    finally:
        CD.CupyStream._error_before = lookup
    assert len(calls) <= 4 * 40 + 2


def test_a_host_function_runs_with_the_garbage_collector_paused():
    """A host function runs on CUDA's own thread, where freeing a cupy object (device
    memory, an event) is not permitted (seen on the first GPU run: cudaErrorNotPermitted
    from a collection there): collection is off while it runs, and back on after."""
    import gc

    s = _stream("compute")
    seen = []
    s.add_callback(lambda: seen.append(gc.isenabled()))
    s.add_callback(lambda: 1 / 0)  # an error still turns collection on
    assert gc.isenabled()
    s._s.run_host_funcs()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:  # off before: stays off
        s.add_callback(lambda: None)
        s._s.run_host_funcs()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_closed_stream_ends_its_waiter_thread_and_refuses_work():
    s = _stream("compute")
    s._driver = drv = _Drv()
    drv._streams, drv._retired = [s], []
    drv._lock, drv._late_q = threading.Lock(), None
    seen = threading.Event()
    s.record().then(seen.set)
    assert seen.wait(10)
    thread = next(t for t in threading.enumerate() if t.name == "af-cupy-cuda:0-compute")
    s.close()
    thread.join(10)
    assert not thread.is_alive() and drv._streams == [] and drv._retired == [s]
    with pytest.raises(DeviceError, match="closed"):
        s.add_callback(lambda: None)
    late = threading.Event()
    s.record().then(late.set)  # a record still marks the end of its work
    assert late.wait(10)
    drv._late_q.put(None)


def test_a_closed_streams_cuda_stream_is_kept_until_a_new_stream_reuses_it():
    """A closed stream stays referenced by its driver (blocks freed later record on it; a
    CUDA stream destroyed by the garbage collector under them crashed the process on a
    GPU) until a new stream takes its CUDA stream over, once its work is done."""
    drv = _Drv()
    drv._retired, drv._lock = [], threading.Lock()
    busy, done = _stream("busy"), _stream("done")
    busy._s.done = False
    drv._retired += [busy, done]
    assert CD.CupyDriver._reusable(drv) is done._s
    assert drv._retired == [busy]
    assert CD.CupyDriver._reusable(drv) is None  # its work is still running


def test_adopt_imports_with_the_consumer_stream_current():
    """CuPy hands its current stream to the producer's ``__dlpack__(stream=...)``: the
    import must run with the stream that reads the memory current."""
    current = []

    class _Current(_S):
        def __enter__(self):
            current.append(self)

        def __exit__(self, *a):
            current.pop()

    seen = []

    class _X:
        nbytes, shape, dtype, strides = 32, (8,), np.dtype(np.float32), (4,)

        class device:
            id = 0

        class flags:
            c_contiguous = True

        class data:
            ptr = 1 << 20

    class _Cp:
        @staticmethod
        def from_dlpack(obj):
            seen.append(current[-1] if current else None)
            return _X()

    d = object.__new__(CD.CupyDriver)
    d.device, d.index, d._dev, d._cp = "cuda:0", 0, contextlib.nullcontext(), _Cp()
    s = _stream("compute")
    s._s = _Current()
    a = d.adopt(object(), s)
    assert seen == [s._s] and a.shape == (8,) and a.ptr == 1 << 20


def test_the_limit_counts_blocks_in_use_not_cupys_cached_chunks():
    """CuPy's pool keeps freed chunks (a split one whole) and its own limit counts them:
    the driver's limit is its count of the blocks in use alone."""

    class _Pool:
        limit = total = 0

        def set_limit(self, size=0):
            self.limit = size

        def malloc(self, n):  # caches every chunk: nothing goes back
            if self.limit and self.total + n > self.limit:
                raise MemoryError(f"pool: {n} more past {self.limit}")
            self.total += n

            class _Ptr:
                ptr = (1 << 20) + self.total

            return _Ptr()

    class _Cuda:
        class memory:
            OutOfMemoryError = MemoryError

    class _Cp:
        cuda = _Cuda

    d = object.__new__(CD.CupyDriver)
    d.device, d._dev, d._cp, d._pool = "cuda:0", contextlib.nullcontext(), _Cp(), _Pool()
    d._count = CD.PoolCount(d.device)
    d.set_limit(1024)
    for _ in range(4):  # 4 x 512 bytes in turn, 512 in use at most
        d.free(d.malloc(512))
    assert d.memory().in_use == 0 and d.memory().peak == 512
    with pytest.raises(CD.OutOfMemoryError):
        d.malloc(2048)
