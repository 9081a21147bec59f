"""What a fault is raised as: a kernel's or an actor's error is also its kind of fault (out
of memory, an index out of bounds, a division by zero), however the op ran; an interrupt
(Ctrl-C) is raised once, where it happened, and leaves nothing for a later synchronize."""

import pickle
import signal
import threading

import numpy as np
import pytest

import actorflow as af
from actorflow.backends import get_backend
from actorflow.eager.interpreter import apply
from actorflow.lowlevel import OpDef, register_op
from actorflow.tensor.tensor import wrap


# -- out of memory -------------------------------------------------------------------------
@pytest.fixture
def cpu_budget():
    alloc = get_backend(af.device("cpu")).allocator
    old = alloc.budget
    yield lambda b: alloc.set_budget(None if b is None else af.errors.parse_bytes(b))
    alloc.set_budget(old)


def test_an_eager_tensor_over_a_budget_raises_out_of_memory(cpu_budget):
    cpu_budget("64KiB")
    x = af.zeros(1 << 20)  # 4 MiB: queued, fails when it runs
    with pytest.raises(af.OutOfMemoryError) as info:
        x.numpy()
    err = info.value
    assert isinstance(err, af.KernelError) and err.op == "full"
    assert err.requested == 4 << 20 and err.budget == 64 << 10 and err.device == "cpu"
    assert "set_memory_budget" in str(err)
    cpu_budget(None)
    np.testing.assert_array_equal((af.ones(3) * 2).numpy(), [2, 2, 2])  # still working


def test_the_plugin_budget_fixture_catches_eager_tensors(af_memory_budget):
    af_memory_budget("64KiB")
    with pytest.raises(af.OutOfMemoryError):
        af.ones(1 << 20).sum().item()


def test_synchronize_raises_the_out_of_memory_error_too(cpu_budget):
    cpu_budget("64KiB")
    y = af.zeros(1 << 20)
    del y
    with pytest.raises(af.OutOfMemoryError, match="asked for 4.0 MiB"):
        af.synchronize()


def test_an_actor_that_runs_out_of_memory_is_an_out_of_memory_error(cpu_budget):
    def big(x):
        return (af.zeros(1 << 20) + x).sum()  # an eager tensor inside the stage

    g = af.Pipeline([lambda: iter(range(3)), big])
    cpu_budget("64KiB")
    with pytest.raises(af.OutOfMemoryError) as info:
        list(g.run())
    assert isinstance(info.value, af.ActorError) and info.value.piece == 0
    assert info.value.requested == 4 << 20


# -- indices and division ------------------------------------------------------------------
def test_a_kernel_error_is_also_an_index_or_division_error():
    x = af.tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError) as info:
        x[af.tensor([5])].numpy()
    assert isinstance(info.value, af.IndexOutOfBoundsError)
    assert isinstance(info.value, af.KernelError) and info.value.op == "index"
    a, b = af.tensor([4, 2]), af.tensor([0, 1])
    with pytest.raises(ZeroDivisionError) as info:
        (a // b).numpy()
    assert isinstance(info.value, af.DivisionByZeroError) and isinstance(info.value, af.KernelError)
    with pytest.raises(af.KernelError) as info:  # any other fault: a plain KernelError
        _boom(x).numpy()
    assert not isinstance(info.value, (MemoryError, IndexError, ZeroDivisionError))


def test_an_actor_error_is_also_its_kind_of_fault():
    def stage(i):
        return af.tensor([1.0, 2.0])[af.tensor([i])] if i == 2 else af.tensor([1.0])

    with pytest.raises(af.IndexOutOfBoundsError) as info:
        list(af.Pipeline([lambda: iter(range(4)), stage]).run())
    assert isinstance(info.value, af.ActorError) and info.value.piece == 2


def _k_boom(outs, ins, attrs):
    raise ValueError("boom")


register_op(
    OpDef(
        "test_kind_boom",
        ("x",),
        lambda metas, attrs: [(metas[0].shape, metas[0].dtype)],
        {"cpu": _k_boom},
    )
)


def _boom(x):
    return wrap(apply(af.lowlevel.get_op("test_kind_boom"), [x._impl], {})[0])


def test_errors_of_a_kind_pickle_as_that_kind():
    err = af.KernelError("full", "cpu", af.OutOfMemoryError("cpu", 10, 0, 5, "full"))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and isinstance(back, af.OutOfMemoryError)
    assert (back.op, back.requested, back.budget) == ("full", 10, 5)
    a = af.ActorError("st", 3, af.IndexOutOfBoundsError("index: 7 out of bounds"), "tb")
    back = pickle.loads(pickle.dumps(a))
    assert isinstance(back, af.IndexOutOfBoundsError) and back.piece == 3
    plain = af.ActorError("st", 1, ValueError("x"))
    assert type(pickle.loads(pickle.dumps(plain))) is af.ActorError


# -- interrupts ----------------------------------------------------------------------------
class _Interrupt:
    """A kernel that raises KeyboardInterrupt the n-th time it runs, as Ctrl-C would land
    in a kernel running on the caller's thread."""

    n = 0

    def __call__(self, outs, ins, attrs):
        _Interrupt.n -= 1
        if _Interrupt.n == 0:
            raise KeyboardInterrupt
        outs[0][...] = ins[0] + 1


register_op(
    OpDef(
        "test_interrupted",
        ("x",),
        lambda metas, attrs: [(metas[0].shape, metas[0].dtype)],
        {"cpu": _Interrupt()},
    )
)


def _interrupted(x):
    return wrap(apply(af.lowlevel.get_op("test_interrupted"), [x._impl], {})[0])


def test_an_interrupted_kernel_raises_once_and_leaves_nothing_stale():
    af.synchronize()
    _Interrupt.n = 3
    x = af.ones(4)
    with pytest.raises(KeyboardInterrupt):
        y = x
        for _ in range(5):
            y = _interrupted(y)
    af.synchronize()  # the interrupt is not raised a second time
    np.testing.assert_array_equal(y.numpy(), [3, 3, 3, 3])  # what ran before it is kept
    np.testing.assert_array_equal((x * 2).numpy(), [2, 2, 2, 2])
    af.synchronize()


def test_a_real_ctrl_c_during_a_chain_of_eager_ops_is_raised_once():
    af.synchronize()
    x = af.ones(1000)
    timer = threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            y = x
            while True:  # until the interrupt lands, wherever it does
                y = y + 1
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    af.synchronize()
    np.testing.assert_array_equal((af.ones(3) * 2).numpy(), [2, 2, 2])
    af.synchronize()
