"""The eager dispatch cache: what an op call decides (device, output metas, kernel, fresh
kernel, cost) is kept per signature (op, input metas, attrs); a call whose signature differs
is decided again, what may change between two calls of one signature (the allocator's
budget, autograd) is read per call, attrs that are not plain values skip the cache, and
an op's cache is bounded."""

import gc

import numpy as np
import pytest

import actorflow as af
from actorflow.backends import get_backend
from actorflow.eager import interpreter
from actorflow.lowlevel import OpDef, apply, get_vm
from actorflow.tensor.tensor import wrap

pytestmark = pytest.mark.timeout(60)


def _counting_op(name="plus_k"):
    """An unregistered op ``x + k`` (``k`` a number or a list of numbers, summed) whose
    inference records every call; it has a fresh kernel, as the elementwise ops do."""
    calls = []

    def infer(metas, attrs):
        calls.append((metas[0].shape, metas[0].dtype))
        return [(metas[0].shape, metas[0].dtype)]

    def k(attrs):
        v = attrs["k"]
        return sum(v) if isinstance(v, list) else v

    def kernel(outs, ins, attrs):
        np.add(ins[0], k(attrs), out=outs[0], casting="unsafe")

    def fresh(ins, attrs, dtype):
        return np.add(ins[0], k(attrs)).astype(dtype, copy=False)

    return OpDef(name, ("x",), infer, {"cpu": kernel}, fresh={"cpu": fresh}, attrs=("k",)), calls


def _call(op, x, **attrs):
    return wrap(apply(op, [x._impl], attrs)[0])


def test_a_repeated_signature_is_decided_once():
    op, calls = _counting_op()
    x = af.tensor([1.0, 2.0])
    decided = interpreter.STATS["decided"]
    outs = [_call(op, x, k=1.0) for _ in range(5)]
    assert len(calls) == 1  # inferred once, four calls were hits
    assert interpreter.STATS["decided"] == decided + 1
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), [2.0, 3.0])
    # the functional layer's hot path (operators, unary functions) hits the same way
    y = af.ones(7)
    af.relu(y * 2.0 - 1.0)
    decided = interpreter.STATS["decided"]
    for _ in range(3):
        np.testing.assert_array_equal(af.relu(y * 2.0 - 1.0).numpy(), np.ones(7))
    assert interpreter.STATS["decided"] == decided


def test_a_changed_shape_dtype_attr_or_device_is_decided_again():
    op, calls = _counting_op()
    x = af.tensor([1.0, 2.0])
    _call(op, x, k=1.0)
    changed = [
        (af.tensor([1.0, 2.0, 3.0]), {"k": 1.0}, (3,), af.float32),  # shape
        (x.double(), {"k": 1.0}, (2,), af.float64),  # dtype
        (x, {"k": 2.0}, (2,), af.float32),  # attr value
        (x, {"k": 2}, (2,), af.float32),  # attr type (2 == 2.0)
        (af.zeros(2, device="null"), {"k": 1.0}, (2,), af.float32),  # device
    ]
    for n, (t, attrs, shape, dtype) in enumerate(changed, start=2):
        o = _call(op, t, **attrs)
        assert len(calls) == n, f"call {n} was not decided again"
        assert o.shape == shape and o.dtype is dtype and o.device == t.device
    for t, attrs, _, _ in changed:  # each is cached now
        _call(op, t, **attrs)
    assert len(calls) == 1 + len(changed)
    np.testing.assert_array_equal(_call(op, x, k=2).numpy(), [3.0, 4.0])
    # the operators' scalar signature is the scalar's type: 1 and 1.0 and True differ
    i = af.tensor([1, 2])
    assert (i * 2).dtype is af.int64 and (i * 2.0).dtype is af.float32
    assert (i * True).dtype is af.int64 and (af.tensor([True]) * True).dtype is af.bool_


def test_a_budget_set_after_a_signature_was_decided_is_honoured():
    vm = get_vm()
    alloc = get_backend(af.device("cpu")).allocator
    old = alloc.budget
    x = af.ones(1000)  # outputs of 4000 bytes: fresh kernels
    for _ in range(3):
        np.testing.assert_array_equal((x * 0.5).numpy(), np.full(1000, 0.5))
    vm.synchronize()
    gc.collect()
    vm.collect_releases()
    try:
        alloc.set_budget(alloc.stats().in_use + 1000)  # room for no such output
        with pytest.raises(af.OutOfMemoryError):
            (x * 0.5).numpy()
    finally:
        alloc.set_budget(old)
    np.testing.assert_array_equal((x * 0.5).numpy(), np.full(1000, 0.5))


@pytest.mark.parametrize("k", [[1.0, 1.0], np.float64(2.0)], ids=["list", "numpy-scalar"])
def test_attrs_that_are_not_plain_values_skip_the_cache(k):
    op, calls = _counting_op()
    x = af.tensor([1.0, 2.0])
    uncached = interpreter.STATS["uncached"]
    for _ in range(2):
        np.testing.assert_array_equal(_call(op, x, k=k).numpy(), [3.0, 4.0])
    assert interpreter.STATS["uncached"] == uncached + 2
    assert len(calls) == 2  # inferred on every call
    assert interpreter.attrs_key(op, {"k": k}) is None
    assert interpreter.attrs_key(op, {"k": (1.0, [1.0])}) is None
    assert interpreter.attrs_key(op, {"k": (1, 2)}) != interpreter.attrs_key(op, {"k": (1.0, 2)})


def test_an_ops_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(interpreter, "PLANS_MAX", 4)
    op, calls = _counting_op()
    for n in range(1, 11):
        np.testing.assert_array_equal(_call(op, af.zeros(n), k=1.0).numpy(), np.ones(n))
        assert len(op.plans[2]) <= 4
    assert len(calls) == 10


def test_autograd_records_a_call_whose_signature_is_cached():
    x = af.ones(3)
    for _ in range(2):
        x * 3.0  # cached: no input requires grad
    w = af.ones(3, requires_grad=True)
    y = w * 3.0
    assert y.grad_fn is not None
    y.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0, 3.0])
    assert (x * 3.0).grad_fn is None


def test_the_poison_checks_stop_once_no_poisoned_tensor_lives(monkeypatch):
    """After a kernel error, calls check their operands for poison only while a tensor the
    error poisoned is alive; then the fresh-kernel path runs them on the spot again."""
    vm = get_vm()
    op, _ = _counting_op("plus_bad")
    x = af.ones(4)
    bad = _call(op, x, k="bad")  # numpy refuses a string: its output is poisoned
    y = bad + 1  # and so is what is computed from it
    with pytest.raises(af.KernelError):
        af.synchronize()
    assert vm._any_error
    with pytest.raises(af.KernelError):
        (y * 2).numpy()  # still poisoned while alive
    del bad, y
    gc.collect()
    af.synchronize()
    assert not vm._any_error
    checked = []
    run_inline = type(vm).run_inline
    monkeypatch.setattr(
        type(vm), "run_inline", lambda self, *a: checked.append(a[4]) or run_inline(self, *a)
    )
    np.testing.assert_array_equal((x + 1).numpy(), [2.0] * 4)
    assert checked == []  # the fresh path, not the checked one


def test_a_poisoned_tensor_written_whole_again_stops_the_poison_checks_at_synchronize():
    vm = get_vm()
    op, _ = _counting_op("plus_bad2")
    bad = _call(op, af.ones(4), k="bad")
    with pytest.raises(af.KernelError):
        af.synchronize()
    bad.fill_(3.0)  # a whole write clears the poison
    af.synchronize()
    assert not vm._any_error
    np.testing.assert_array_equal((bad + 1).numpy(), [4.0] * 4)


def test_an_index_errors_tensors_die_with_it_and_the_poison_checks_stop():
    # the kernel raised its error while handling numpy's IndexError: the frames of that one
    # held the kernel's arguments, so the poisoned output lived as long as the error
    vm = get_vm()
    af.synchronize()
    x = af.tensor(np.arange(4.0, dtype=np.float32))
    y = x[af.tensor(np.array([7]))]
    with pytest.raises(af.IndexOutOfBoundsError):
        y.numpy()
    del y
    gc.collect()
    af.synchronize()
    assert not vm._any_error
