"""Launch-ahead on cuda:0 (the emulator): a dependent instruction is issued on the device as
soon as its predecessors are issued there, never after a host round trip. Checked with
counts and the emulator's queues, never timings: a stream held by a closed gate (a host
callback that waits) shows how much work the VM issued behind it. Also: a dependency across
streams is a wait on the device, values equal cpu under random delays, a fault in a chain
issued ahead fails what was issued after it with the first error, memory released and
reused under random delays keeps every value, and ``max_in_flight`` still bounds. Each op
call is its own launch here (runs of them: ``test_cuda_eager_runs.py``)."""

import threading
import time

import numpy as np
import pytest

import actorflow as af
from actorflow.backends import get_backend
from actorflow.backends.cuda.driver import Kernel
from actorflow.backends.cuda.selection import driver_for
from actorflow.eager.interpreter import use_stream
from actorflow.errors import KernelError
from cuda_fixtures import CUDA, assert_same

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_launch_per_op")]

VM = af.lowlevel.get_vm()


def _backend():
    return get_backend(af.device(CUDA))


def _settled_compute():
    """cuda:0's backend and its compute stream (the driver's), once every command issued
    before has completed."""
    af.synchronize(30)
    b = _backend()
    return b, b.driver_stream(b.compute)


class Gate:
    """Holds a driver stream until ``open()`` (or 60 s): on the emulator a host callback
    that waits; on a GPU a kernel spinning on a flag in pinned host memory, since a host
    function must not block there (CUDA runs a context's host functions on one thread of
    its own, and the first GPU run saw this file's launch-ahead test stall behind one)."""

    def __init__(self, dstream):
        self.event = threading.Event()
        self.flag = None
        if type(dstream).__name__ == "CupyStream":
            self.flag = dstream._driver.pinned((1,), np.int32)
            self.flag[0] = 0
            _spin(dstream, self.flag)
        else:
            dstream.add_callback(lambda: self.event.wait(60))

    def open(self):
        self.event.set()
        if self.flag is not None:
            self.flag[0] = 1


SPIN = r"""extern "C" __global__ void af_test_gate(volatile int* flag, long long limit) {
    long long start = clock64();
    while (*flag == 0 && clock64() - start < limit) { __nanosleep(1000); }
}"""


def _spin(dstream, flag):
    """Launches on ``dstream`` a one-thread kernel that returns once ``flag[0]`` (pinned,
    so mapped into the device's address space) is set, or after about a minute."""
    import cupy

    kernel = cupy.RawKernel(SPIN, "af_test_gate")
    with dstream._driver._dev, dstream._s:
        kernel((1,), (1,), (np.uintp(flag.ctypes.data), np.int64(120_000_000_000)))


def _until(cond, what: str, limit: float = 30.0) -> None:
    """Waits (polling, at most ``limit`` s) for ``cond()``: a condition, not a timing."""
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.001)


def _queued(dstream) -> int:
    """Commands issued on an emulator stream that it has not run yet."""
    return dstream._issued - dstream._done


def test_a_chain_of_200_dependent_ops_is_issued_before_the_first_completes(emu):
    emu()
    x = af.ones(1000, device=CUDA)
    b, compute = _settled_compute()
    completed = VM.stats()["completed"]
    gate = Gate(compute)
    base = compute._issued
    y = x
    for _ in range(200):
        y = y * 1.01  # each reads the one before
    try:
        # each op: its kernel and the event after it, all on the held stream
        _until(lambda: compute._issued - base >= 400, "the chain issued behind the gate")
        assert VM.stats()["completed"] == completed  # none completed, all issued
        assert _queued(compute) >= 401
    finally:
        gate.open()
    np.testing.assert_allclose(y.numpy(), np.full(1000, 1.01**200, np.float32), rtol=1e-4)


def test_a_chain_issued_ahead_reuses_its_temporaries_memory_as_it_goes(emu):
    """A dead temporary's block is freed once its uses are issued, not completed: 100 ops
    issued behind a held stream need a few blocks, not 100."""
    emu()
    x = af.ones(1 << 14, device=CUDA)
    b, compute = _settled_compute()
    before = b.caching().stats()
    gate = Gate(compute)
    base = compute._issued
    y = x
    try:
        for _ in range(100):
            y = y + 1
        _until(lambda: compute._issued - base >= 200, "the chain issued")
        _until(lambda: b.caching().stats().frees - before.frees >= 98, "temporaries freed")
        s = b.caching().stats()
        assert s.mallocs - before.mallocs <= 3 and s.hits - before.hits >= 97
        assert s.in_use - before.in_use <= 2 * (1 << 16)
    finally:
        gate.open()
    assert_same(y.numpy(), np.full(1 << 14, 101, np.float32))


def test_a_dependency_across_streams_is_a_wait_on_the_device(emu):
    emu()
    x = af.tensor(np.arange(8, dtype=np.float32), device=CUDA)
    side = af.lowlevel.stream(CUDA, "side")
    af.synchronize(30)
    b = _backend()
    compute, other = b.driver_stream(b.compute), b.driver_stream(side)
    waits = VM.device_waits
    gate = Gate(compute)
    try:
        a = x * 2  # on the held compute stream
        with use_stream(side):
            c = a + 1  # reads it on another stream
            d = c * 3  # same stream: stream order, no wait
        _until(lambda: other._issued >= 5, "the side stream's wait and work issued")
        assert VM.device_waits == waits + 1  # one wait, on the device
        assert not c._impl.blob.last_write.done  # issued while `a` could not complete
        assert _queued(other) >= 1  # the side stream waits on the device
    finally:
        gate.open()
    assert_same(d.numpy(), (np.arange(8, dtype=np.float32) * 2 + 1) * 3)


def test_a_copy_from_the_host_waits_for_the_copy_to_the_host_it_reads(cuda):
    """``h = a.to("cpu")`` is an instruction of the device whose host blob is written by a
    host function on the d2h stream, after it was issued: ``h.to(cuda)`` reads that host
    memory when it is issued, so it waits for ``h``'s completion, not its issue."""
    a = af.tensor(np.full(8, 7, np.float32), device=CUDA)
    af.synchronize(30)
    b = _backend()
    d2h = b.driver_stream(b.stream("d2h"))
    gate = Gate(d2h)
    try:
        h = a.to("cpu")  # its data lands behind the gate
        d = h.to(CUDA)  # reads h on the host
        e = d + 1  # and on: a device-memory link to d
        _until(
            lambda: (
                h._impl.blob.last_write is not None and h._impl.blob.last_write.issued is not None
            ),
            "the copy to the host issued",
        )
        w = d._impl.blob.last_write
        assert w is not None and w.issued is None and not w.done  # held for h's completion
        assert w.after is not None and h._impl.blob.last_write not in w.after
    finally:
        gate.open()
    assert_same(d.numpy(), np.full(8, 7, np.float32))
    assert_same(e.numpy(), np.full(8, 8, np.float32))
    assert_same(h.numpy(), np.full(8, 7, np.float32))


def test_a_host_round_trip_issued_ahead_keeps_its_values_under_random_delays(emu):
    emu(delay=0.001, seed=3)
    for v in range(1, 6):
        a = af.tensor(np.full(8, v, np.float32), device=CUDA)
        junk = af.tensor(np.full(8, -1, np.float32), device=CUDA)  # memory h may reuse
        h = (a * 1).to("cpu")
        d = h.to(CUDA) + 0
        del junk
        assert_same(d.numpy(), np.full(8, v, np.float32))


def _mixed(dev, data):
    """A chain mixing streams, in-place ops and views; on cpu the side stream is cpu's."""
    x = af.tensor(data, device=dev)
    side = af.lowlevel.stream(dev, "side")
    for i in range(8):
        y = (x * 1.5 - i).relu()
        with use_stream(side):
            z = y + x.T.contiguous().T * 0.5
            z.mul_(0.25)
        x = x + z
        x[0].add_(1)
        x = x.tanh()
    return x


@pytest.mark.parametrize("seed", range(10))
def test_values_equal_cpu_under_random_delays(emu, seed):
    driver = emu(delay=5e-4, seed=seed)
    data = np.random.default_rng(seed).standard_normal((5, 5)).astype(np.float32)
    expected = _mixed("cpu", data).numpy()
    VM.set_test_hooks(seed, 2e-4)
    got = _mixed(CUDA, data).numpy()
    assert_same(expected, got)
    assert sum(len(s.delays) for s in driver._streams) > 100


def test_a_fault_in_a_chain_issued_ahead_fails_the_rest_with_the_first_error(emu):
    cuda = emu()
    x = af.tensor(np.arange(4, dtype=np.float32), device=CUDA)
    other = af.tensor(np.ones(4, np.float32), device=CUDA)
    af.synchronize(30)
    side = af.lowlevel.stream(CUDA, "side")
    b = _backend()
    compute, side_ds = b.driver_stream(b.compute), b.driver_stream(side)
    gate = Gate(compute)
    try:
        chain = [x]
        for _ in range(30):
            chain.append(chain[-1] + 1)
        cuda.fail_kernel("mul_scalar")
        chain.append(chain[-1] * 2)  # faults on the device
        for _ in range(30):
            chain.append(chain[-1] + 1)  # computed from it
        after = other + 5  # independent, issued after it on its stream
        with use_stream(side):
            before = other + 2  # on another stream: runs behind no gate
            assert_same(before.numpy(), np.full(4, 3, np.float32))
            across = chain[40] - 1  # waits there on an event after the fault
            later = other - 1  # independent, after that wait on that stream
        _until(
            lambda: compute._issued >= 2 * 62 + 1 and _queued(side_ds) >= 5,
            "the chain issued behind the gate",
        )
    finally:
        gate.open()
    with pytest.raises(KernelError) as e:
        af.synchronize(30)
    assert e.value.op == "mul_scalar" and e.value.more_errors == 0  # raised once
    af.synchronize(30)
    first = chain[31]._impl.blob.error
    assert first is not None and first.op == "mul_scalar"
    for t in chain[31:] + [after, across, later]:
        assert t._impl.blob.error is first  # the one first error, everywhere after it
        with pytest.raises(KernelError, match="'mul_scalar'"):
            t.numpy()
    for i, t in enumerate(chain[:31]):  # issued before it: values
        assert_same(t.numpy(), np.arange(4, dtype=np.float32) + i)
    assert_same((other * 2 + 1).numpy(), np.full(4, 3, np.float32))  # later work runs
    assert_same((chain[30] * 2).numpy(), (np.arange(4, dtype=np.float32) + 30) * 2)


def test_an_error_known_at_completion_fails_what_was_issued_ahead_reading_it(cuda, monkeypatch):
    """An op whose error is known only when it completes (as an integer division's zero
    flag read back) fails the work issued ahead of it that computed from its outputs, on its
    stream and across streams, with that error, though their own work succeeded; work that
    does not read them (issued after it on its stream) gets its values."""
    x = af.tensor(np.arange(4, dtype=np.float32), device=CUDA)
    side = af.lowlevel.stream(CUDA, "side")
    # each kernel once before the gate: on a GPU, loading a kernel's module (CUDA's lazy
    # loading) may wait for the kernels running, and the gate runs until it is opened
    warm = x * 2 + 1
    with use_stream(side):
        warm = warm - 1
    (x + 5).numpy(), warm.numpy()
    af.synchronize(30)
    b = _backend()
    gate = Gate(b.driver_stream(b.compute))
    finish = VM._finish_device

    def failing_at_completion(instr, ev):
        if instr.name == "mul_scalar" and instr.error is None:
            VM._fail(instr, VM._kernel_error(instr, RuntimeError("found at completion")))
        finish(instr, ev)

    monkeypatch.setattr(VM, "_finish_device", failing_at_completion)
    try:
        y = x * 2  # fails when it completes
        z = y + 1  # issued ahead, same stream
        with use_stream(side):
            w = z - 1  # issued ahead, another stream
        v = x + 5  # reads no output of it
        _until(lambda: w._impl.blob.last_write.issued is not None, "w issued")
    finally:
        gate.open()
    for t in (y, z, w):
        with pytest.raises(KernelError, match="found at completion"):
            t.numpy()
    assert z._impl.blob.error is y._impl.blob.error is w._impl.blob.error is not None
    assert_same(v.numpy(), np.arange(4, dtype=np.float32) + 5)


def test_a_compiled_step_issued_ahead_of_a_failing_division_keeps_its_error_on_the_state(cuda):
    """A step issued ahead of an eager division whose zero flag fails it at completion ran
    whole on the failed values and wrote its state back: the state keeps the error (it is
    not cleared as for a step whose commands the device skipped), so no later step silently
    trains on those values."""
    from actorflow import nn, optim

    class Step(nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    af.manual_seed(0)
    model = nn.Linear(4, 1, device=CUDA)
    g = Step(model, optim.SGD(model.parameters(), lr=0.1))
    ones = af.tensor(np.ones((2, 4), np.float32), device=CUDA)
    g(ones).numpy()
    a = af.tensor(np.full((2, 4), 4), device=CUDA)
    z = af.tensor(np.array([[1, 0, 1, 1], [1, 1, 1, 1]]), device=CUDA)
    af.synchronize(30)
    b = _backend()
    gate = Gate(b.driver_stream(b.compute))
    try:
        loss = g((a // z).float())  # the step reads the division's output
    finally:
        gate.open()
    for t in (loss, model.weight):
        with pytest.raises(KernelError, match="floor_divide: integer division by zero"):
            t.numpy()
    af.synchronize(30)


def test_a_block_freed_while_its_reads_are_queued_is_reused_on_another_stream_after_them(emu):
    """A dead tensor's block is freed once its uses are issued (stream-ordered): reused at
    once for a write on another stream, that write waits on the device for the reads still
    queued (the allocator's event). Without it (``_skip_reuse_events``) the write lands
    first and the queued read sees it."""
    emu()
    x = af.tensor(np.arange(256, dtype=np.float32), device=CUDA)
    ones = af.ones(256, device=CUDA)
    side = af.lowlevel.stream(CUDA, "side")
    b, compute = _settled_compute()
    waits, frees = b.caching().stats().reuse_waits, b.caching().stats().frees
    gate = Gate(compute)
    try:
        t = x + 1  # held behind the gate, in a fresh block
        u = t * 2  # reads it, held too
        del t  # freed now: its uses are issued
        _until(lambda: b.caching().stats().frees > frees, "t's block freed")
        with use_stream(side):
            w = ones + 100  # a write on another stream: t's block again
            _until(lambda: other_issued(b, side) >= 2, "w issued on the side stream")
    finally:
        gate.open()
    assert_same(u.numpy(), (np.arange(256, dtype=np.float32) + 1) * 2)
    assert_same(w.numpy(), np.full(256, 101, np.float32))
    assert b.caching().stats().reuse_waits == waits + 1  # one wait, on the device


def other_issued(backend, stream) -> int:
    return backend.driver_stream(stream)._issued


@pytest.mark.parametrize("seed", range(4))
def test_released_memory_is_reused_safely_under_random_delays(emu, seed):
    emu(delay=3e-4, seed=seed)
    VM.set_test_hooks(seed, 1e-4)
    rng = np.random.default_rng(seed)
    side = af.lowlevel.stream(CUDA, "side")
    live: dict = {}  # name -> (tensor, expected values)
    for step in range(120):
        k = int(rng.integers(0, 6))
        if k in live and rng.random() < 0.3:
            del live[k]  # its memory goes back for reuse
            continue
        if k in live and rng.random() < 0.15:
            t, v = live[k]  # a read: what was released before is freed
            np.testing.assert_allclose(t.numpy(), v, rtol=1e-6)
            continue
        src = live.get(int(rng.integers(0, 6)))
        n = int(rng.choice([64, 256]))
        if src is None or src[1].size != n:
            val = rng.standard_normal(n).astype(np.float32)
            live[k] = (af.tensor(val, device=CUDA), val)
            continue
        t, v = src
        if rng.random() < 0.5:
            with use_stream(side):
                live[k] = (t * 0.5 + step, v * np.float32(0.5) + np.float32(step))
        else:
            live[k] = (t - 1, v - np.float32(1))
    for t, v in live.values():
        np.testing.assert_allclose(t.numpy(), v, rtol=1e-6)
    assert _backend().caching().stats().hits > 0  # blocks were reused


def test_max_in_flight_bounds_what_is_issued_ahead(emu):
    emu()
    x = af.ones(16, device=CUDA)
    b, compute = _settled_compute()
    limit, VM.max_in_flight = VM.max_in_flight, 40
    gate = Gate(compute)
    out = []

    def chain():
        y = x
        for _ in range(200):
            y = y + 1
        out.append(y)

    th = threading.Thread(target=chain, daemon=True)
    try:
        th.start()
        _until(lambda: VM._blocked == 1, "the issuing thread blocked on max_in_flight")
        s = VM.stats()
        assert s["in_flight"] <= 2 * 40 + 1  # the ops, and a RELEASE of each dead one
        #                                      (issued by the loop, which never blocks)
        # each op: its kernel, the event after it, the event recorded when its input's
        # block was freed; and the gate
        assert _queued(compute) <= 3 * 40 + 1
    finally:
        gate.open()
        th.join(60)
        VM.max_in_flight = limit
    assert_same(out[0].numpy(), np.full(16, 201, np.float32))


def test_the_emulator_runs_no_work_after_a_wait_on_a_faulted_streams_event(emu):
    """What launch-ahead relies on, at the driver seam: a stream that waits on an event
    recorded after a fault inherits the fault, so the work issued after the wait is skipped
    (as on CUDA, where the fault is sticky), while its events and host callbacks still
    complete (nobody waits forever)."""
    d = emu()
    s, other = d.stream("s"), d.stream("other")
    a = d.malloc(8).array(2, np.float32)
    b = d.malloc(8).array(2, np.float32)
    set_to = Kernel("set_to", reference=lambda x, v: x.fill(v))
    other.launch(set_to, (b, 1.0))
    other.synchronize(10)  # (ran before the fault is armed)
    d.fail_kernel("set_to")
    s.launch(set_to, (a, 2.0))  # faults
    other.wait(s.record())
    other.launch(set_to, (b, 5.0))  # after the wait: skipped
    out = np.zeros(2, np.float32)
    other.copy_d2h(out, b)  # skipped too
    called = []
    other.add_callback(lambda: called.append(1))
    done = other.record()
    fired = threading.Event()
    done.then(fired.set)
    assert fired.wait(30) and called == [1]
    with pytest.raises(KernelError, match="set_to"):
        done.synchronize(10)
    assert out.tolist() == [0, 0]
    assert d._view(b).tolist() == [1, 1]  # the value before the fault, never garbage


@pytest.mark.parametrize("seed", range(6))
def test_after_a_fault_under_random_delays_synchronize_raises_once_and_work_goes_on(emu, seed):
    """Blocks used on a stream that faulted are reused at once (its later work is skipped):
    a reuse that waited on its events would hand the fault to the new work."""
    emu(delay=3e-4, seed=seed)
    VM.set_test_hooks(seed, 1e-4)
    rng = np.random.default_rng(seed)
    side = af.lowlevel.stream(CUDA, "side")
    x = af.ones(16, device=CUDA)
    for i in range(150):
        if i == 70:
            driver_for(CUDA).fail_kernel("mul_scalar")
        if rng.random() < 0.5:
            with use_stream(side):
                x = x * 1.01
        else:
            x = x + 1
    with pytest.raises(KernelError) as e:
        af.synchronize(30)
    assert e.value.op == "mul_scalar" and e.value.more_errors == 0
    with pytest.raises(KernelError, match="'mul_scalar'"):
        x.numpy()
    af.synchronize(30)
    for _ in range(3):
        assert_same((af.ones(4, device=CUDA) * 3).numpy(), np.full(4, 3, np.float32))
