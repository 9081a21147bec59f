"""Eager op calls on cuda:0 (the CUDA emulator): elementwise calls queued on one stream
faster than the VM dispatches them become runs, each ONE launch of a generated kernel
(opcall.run_launch, as a compiled step's chains): values equal cpu bit for bit, under
random delays of the driver's streams too; a chain takes far fewer launches, each carrying
its fused source; its dead intermediates never get device memory, and an intermediate a
tensor still holds is written as another output of the run; a fault in a run fails
every member with the one error and later work runs; every run source launched compiles
with NVRTC. The VM's loop is held while a chain is submitted (``held``), so the whole
chain is queued when it dispatches: the counts do not depend on timing."""

import threading
from contextlib import contextmanager

import numpy as np
import pytest

import actorflow as af
from actorflow.backends import get_backend
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda import nvrtc
from actorflow.errors import KernelError
from cuda_fixtures import CUDA, assert_same

pytestmark = pytest.mark.timeout(120)

VM = af.lowlevel.get_vm()


@contextmanager
def held():
    """Holds the VM's loop thread for the block: what is submitted meanwhile is queued,
    not dispatched (never read a value inside: that would wait for the loop)."""
    if VM._loop is None:
        af.tensor([0.0], device=CUDA).numpy()  # (starts the loop)
    entered, gate = threading.Event(), threading.Event()

    def hold():
        entered.set()
        gate.wait(30)

    VM._loop.call_soon_threadsafe(hold)
    assert entered.wait(30)
    try:
        yield
    finally:
        gate.set()


def chain(x, n: int, y=None):
    """``n`` rounds of mixed elementwise ops (scalars, a second operand, unary ops)."""
    for _ in range(n):
        x = (x * 0.5 + 1).relu()
        if y is not None:
            x = (x - y).abs().sqrt() * y
    return x


def runs_of(seen):
    """The launched kernels that are runs (their names join the ops by '+'), each with its
    fused source."""
    return [k for k in seen if "+" in k.name]


def _data(shape=(1000,), seed=0):
    return np.random.default_rng(seed).uniform(-3, 3, size=shape).astype(np.float32)


def test_a_chain_is_launched_as_runs_and_equals_cpu(launches):
    x0, y0 = _data(), _data(seed=1)
    want = chain(af.tensor(x0), 30, af.tensor(y0)).numpy()
    x, y = af.tensor(x0, device=CUDA), af.tensor(y0, device=CUDA)
    af.synchronize(30)
    del launches[:]
    before = VM.stats()
    with held():
        out = chain(x, 30, y)  # 210 op calls
    assert_same(out.numpy(), want)
    stats = VM.stats()
    runs = runs_of(launches)
    # the 210 calls in runs of 64 at most (VM.runs.device_max), every one a generated kernel
    assert len(launches) == len(runs) == 4
    assert all(k.source for k in runs)
    assert sorted(k.name.count("+") + 1 for k in runs) == [18, 64, 64, 64]
    assert stats["fused"] - before["fused"] == 210
    assert stats["fused_runs"] - before["fused_runs"] == 4
    assert stats["elided"] - before["elided"] == 206  # all but each run's output
    assert stats["in_flight"] == 0


def test_runs_off_launch_each_call(launches, monkeypatch):
    monkeypatch.setattr(VM.runs, "device_max", 0)
    x = af.tensor(_data(), device=CUDA)
    af.synchronize(30)
    del launches[:]
    with held():
        out = chain(x, 5)
    out.numpy()
    assert len(launches) == 15 and not runs_of(launches)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_equal_cpu_under_random_delays(emu, seed):
    emu(delay=0.002, seed=seed)
    x0, y0 = _data((37, 5), seed), _data((37, 5), seed + 10)
    want = [chain(af.tensor(x0), 12, af.tensor(y0)).numpy(), chain(af.tensor(x0), 40).numpy()]
    x, y = af.tensor(x0, device=CUDA), af.tensor(y0, device=CUDA)
    before = VM.stats()["fused_runs"]
    with held():
        a = chain(x, 12, y)
        b = chain(x, 40)
    got = [a.numpy(), b.numpy()]
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert VM.stats()["fused_runs"] > before
    # not held: runs form as the loop falls behind, or not; the values are the same
    got = [chain(x, 12, y).numpy(), chain(x, 40).numpy()]
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


def test_a_live_intermediate_is_written_as_another_output_of_the_run(launches):
    x0 = _data()
    x = af.tensor(x0, device=CUDA)
    af.synchronize(30)
    del launches[:]
    with held():
        a = (x * 2 + 1).relu()  # live: written by the run
        b = (a - 3).abs() * 0.25  # reads it in registers
        x.mul_(0.5)  # in place, after its reads: written too
    c = af.tensor(x0)
    ca = (c * 2 + 1).relu()
    assert_same(b.numpy(), ((ca - 3).abs() * 0.25).numpy())
    assert_same(a.numpy(), ca.numpy())
    assert_same(x.numpy(), (c * 0.5).numpy())
    (run,) = launches
    assert run.name == "mul_scalar+add_scalar+relu+sub_scalar+abs+mul_scalar+mul_scalar"
    assert [p for p, kind, _ in run.params if kind == "out"] == ["out0", "out1", "out2"]


@pytest.mark.parametrize("backward_queued", [True, False])
def test_saved_outputs_of_a_run_are_kept_for_backward(launches, backward_queued):
    """sigmoid and exp save their outputs for backward; their tensors die in the forward
    expression, but autograd's pin (before backward) and backward's own reads (once it is
    queued behind the run) keep them: the run writes them to memory."""
    x0 = np.linspace(-1, 1, 64).astype(np.float32)
    want_x = af.tensor(x0, requires_grad=True)
    (want_x.sigmoid() + want_x.exp()).sum().backward()
    x = af.tensor(x0, device=CUDA, requires_grad=True)
    af.synchronize(30)
    with held():
        y = (x.sigmoid() + x.exp()).sum()
        if backward_queued:
            y.backward()
    if not backward_queued:
        af.synchronize(30)  # the forward's run ran before backward
        y.backward()
    assert_same(x.grad.numpy(), want_x.grad.numpy())


def test_dead_intermediates_get_no_device_memory(emu):
    emu()
    alloc = get_backend(af.device(CUDA)).allocator
    x = af.tensor(_data((1 << 18,)), device=CUDA)  # 1 MiB
    af.synchronize(30)
    before = alloc.stats()
    with held():
        out = chain(x, 20)  # 60 op calls, one run
    out.numpy()
    del out
    af.synchronize(30)
    after = alloc.stats()
    # one allocation: the run's output (main's path: one per op call)
    assert after.allocs - before.allocs == 1
    assert after.peak <= before.in_use + 2 * x.numel() * 4


def test_a_fault_in_a_run_fails_every_member_with_one_error_and_work_goes_on(emu, monkeypatch):
    cuda = emu()
    x0 = _data()
    x = af.tensor(x0, device=CUDA)
    af.synchronize(30)
    failed = []
    complete = VM._complete

    def seen(instr):
        if instr.kind == "op_call":
            failed.append((instr.name, instr.error))
        complete(instr)

    monkeypatch.setattr(VM, "_complete", seen)
    with held():
        cuda.fail_kernel()  # the next launch faults: the run's
        out = chain(x, 4)  # 13 op calls, one run writing two
        later = out + 1  # tensors
    with pytest.raises(KernelError) as e:
        af.synchronize(30)
    monkeypatch.setattr(VM, "_complete", complete)
    assert e.value.more_errors == 0 and "injected fault" in str(e.value)
    assert len(failed) == 13  # the run's members
    err = failed[0][1]
    assert err is not None and err.original is e.value.original
    assert err.op == "+".join(["mul_scalar", "add_scalar", "relu"] * 4 + ["add_scalar"])
    assert all(er is err for _, er in failed)  # every member: the one error
    for t in (out, later):
        assert t._impl.blob.error is err
        with pytest.raises(KernelError, match="injected fault"):
            t.numpy()
    af.synchronize(30)  # raised once
    assert_same(chain(x, 4).numpy(), chain(af.tensor(x0), 4).numpy())  # later work runs


@pytest.mark.skipif(
    not nvrtc.available(),
    reason="NVRTC is not installed: pip install -e "
    "'.[nvrtc]' to compile the launched kernels without a GPU",
)
def test_every_run_source_launched_compiles_with_nvrtc(launches):
    x = af.tensor(_data(), device=CUDA)
    y = af.tensor(_data(seed=3), device=CUDA)
    h = af.tensor(np.arange(8, dtype=np.float16), device=CUDA)
    i = af.tensor(np.arange(8, dtype=np.int32), device=CUDA)
    for make in (
        lambda: [chain(x, 3, y)],
        lambda: [chain(x, 2)],
        lambda: [((h * 2 + 1).relu() - h).abs()],
        lambda: [(i * 3 + 1) - (i + 2)],
        lambda: [x * 2, (x * 2 + y).relu()],
    ):  # two outputs
        with held():
            outs = make()
        for o in outs:
            o.numpy()
    sources = {k.source: k for k in runs_of(launches)}
    assert len(sources) == 5
    assert any(k.entry.endswith("_v4") for k in sources.values())  # float4 form
    assert any(not k.entry.endswith("_v4") for k in sources.values())
    assert any(sum(kind == "out" for _, kind, _ in k.params) == 2 for k in sources.values())
    nvrtc.compile_together(K.KernelSource(k.entry, s, (), k.params) for s, k in sources.items())
