"""The eager fast paths. Runs of elementwise instructions (vm/runs.py, vm/run_cuts.py):
the same results as one by one, intermediates nobody can see never get memory, ones somebody
can see do, and errors and memory limits behave as they do without runs. Fresh kernels
(small outputs allocated by numpy on the inline path): bit-identical to the kernels."""

import gc
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af
from actorflow.eager.interpreter import access, apply
from actorflow.lowlevel import OpDef, get_vm, register_op
from actorflow.tensor.tensor import wrap

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def runs():
    """Every op call goes through the loop and leads or joins a run, with tiny tiles so a run
    has many tiles per slice. Yields the VM; restores the settings afterwards."""
    vm = get_vm()
    vm.synchronize()
    saved = (vm.inline_max_cost, vm.parallel_min_cost, vm.fusion_tile_bytes, vm.fuse_max)
    vm.inline_max_cost, vm.parallel_min_cost, vm.fusion_tile_bytes = -1, 0, 48
    yield vm
    vm.synchronize()
    vm.inline_max_cost, vm.parallel_min_cost, vm.fusion_tile_bytes, vm.fuse_max = saved


class Gate:
    """Holds the compute stream of cpu (an access instruction that waits on an event) so the
    ops issued behind it queue up and run as one run once it opens."""

    def __init__(self):
        self.event = threading.Event()
        # big enough that the VM hands it to a worker rather than running it inline
        t = af.zeros(1 << 18)
        self.nbytes = t.numel() * 4
        self.instr = access(t._impl, lambda a: self.event.wait(10), write=False, name="gate")

    def open(self):
        self.event.set()


def _counts(vm):
    s = vm.stats()
    return s["fused"], s["fused_runs"], s["elided"]


def _delta(vm, before):
    return tuple(a - b for a, b in zip(_counts(vm), before, strict=True))


# -- results ---------------------------------------------------------------------------

UNARY = ["relu", "tanh", "neg", "abs", "sigmoid"]
step = st.tuples(
    st.sampled_from(
        [
            "add",
            "mul_s",
            "sub_row",
            "unary",
            "add_",
            "mul_",
            "keep",
            "view_add",
            "cast",
            "add_t",
            "add_row_of",
        ]
    ),
    st.integers(0, 2),
    st.integers(0, 2),
    st.sampled_from(UNARY),
    st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 2)),
)


def _np_unary(name, a):
    if name == "relu":
        return np.maximum(a, 0)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-a))
    return {"tanh": np.tanh, "neg": np.negative, "abs": np.abs}[name](a)


def run_program(program, use_af: bool, before_reading=None):
    """Elementwise programs over three (6, 6) float64 slots and a (6,) row: out-of-place ops,
    in-place ops, broadcast reads, reads through views (of tensors the run writes too: a
    transpose, a row), casts, and intermediates kept in a list or dropped."""
    rng = np.random.default_rng(0)
    base = [rng.standard_normal((6, 6)) for _ in range(3)]
    row = rng.standard_normal(6)
    if use_af:
        slots, r = [af.tensor(b, dtype=af.float64) for b in base], af.tensor(row, dtype=af.float64)
    else:
        slots, r = [b.copy() for b in base], row
    kept = []
    for op, i, j, un, v in program:
        x, y = slots[i], slots[j]
        if op == "add":
            slots[i] = x + y
        elif op == "mul_s":
            slots[i] = x * v
        elif op == "sub_row":
            slots[i] = x - r  # broadcast input
        elif op == "unary":
            slots[i] = getattr(af, un)(x) if use_af else _np_unary(un, x)
        elif op == "add_":
            if use_af:
                x.add_(y)
            else:
                x += y
        elif op == "mul_":
            if use_af:
                x.mul_(v)
            else:
                x *= v
        elif op == "keep":
            kept.append(x)  # an intermediate somebody sees
        elif op == "view_add":
            slots[i] = x[1:] + y[:-1] if use_af else x[1:] + y[:-1]  # partial reads
            slots[i] = af.cat([slots[i], x[:1]]) if use_af else np.concatenate([slots[i], x[:1]])
        elif op == "add_t":
            slots[i] = x + y.T  # same shape, other strides
        elif op == "add_row_of":
            slots[i] = x + y[3]  # one row of y, broadcast
        elif op == "cast":
            slots[i] = (
                (x.to(af.float32) * 2).to(af.float64)
                if use_af
                else (x.astype(np.float32) * np.float32(2)).astype(np.float64)
            )
    if before_reading is not None:
        before_reading()
    if use_af:
        return [s.numpy() for s in slots + kept]
    return slots + kept


def _check(program, before_reading=None):
    got = run_program(program, use_af=True, before_reading=before_reading)
    want = run_program(program, use_af=False)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-12)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=st.lists(step, min_size=1, max_size=30))
def test_random_programs_in_runs_match_one_by_one(program, runs):
    gate = Gate()
    try:
        _check(program, before_reading=gate.open)
    finally:
        gate.open()


def test_programs_behind_a_gate_do_run_as_runs(runs):
    """The random programs above would pass without runs too; this shows they form."""
    before = _counts(runs)
    gate = Gate()
    x = af.tensor(np.linspace(-2, 2, 35).reshape(5, 7))
    y = af.tensor(np.ones(7))
    z = x
    for _ in range(10):
        z = af.tanh(z * 1.5 - y)
    gate.open()
    ref = np.linspace(-2, 2, 35).reshape(5, 7)
    for _ in range(10):
        ref = np.tanh(ref * 1.5 - 1)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-6)
    fused, n_runs, elided = _delta(runs, before)
    assert n_runs == 1 and fused == 30
    assert elided == 29  # every intermediate but the result


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=st.lists(step, min_size=1, max_size=20), seed=st.integers(0, 2**16))
def test_random_programs_in_runs_under_random_dispatch(program, seed, runs, random_dispatch):
    random_dispatch(seed, max_delay=0.001)
    _check(program)


def test_large_run_with_default_settings_matches_numpy():
    vm = get_vm()
    before = _counts(vm)
    a = np.random.default_rng(0).standard_normal((600, 1000)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    x, y = af.from_numpy(a), af.from_numpy(b)
    gate = Gate()
    z = x
    for _ in range(6):
        z = af.relu(z * 0.5 + y) - 0.25
    gate.open()
    ref = a
    for _ in range(6):
        ref = np.maximum(ref * np.float32(0.5) + b, 0) - np.float32(0.25)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-5, atol=1e-6)
    fused, n_runs, elided = _delta(vm, before)
    assert fused == 24 and n_runs == 1 and elided == 23


# -- memory ----------------------------------------------------------------------------


def test_dead_intermediates_get_no_memory(runs):
    af.lowlevel.allocator("cpu").empty_cache()
    x = af.tensor(np.arange(1 << 16, dtype=np.float32))
    af.synchronize()
    in_use = af.lowlevel.memory_stats("cpu").in_use
    af.lowlevel.allocator("cpu").reset_peak()
    gate = Gate()
    z = x
    for _ in range(20):
        z = z * 0.5 + 1.0
    gate.open()
    af.synchronize()
    stats = af.lowlevel.memory_stats("cpu")
    # 40 intermediates of 256 KiB each; only the result (and the gate's tensor) got memory
    assert stats.peak - in_use <= x.numel() * 4 + gate.nbytes
    ref = np.arange(1 << 16, dtype=np.float32)
    for _ in range(20):
        ref = ref * np.float32(0.5) + np.float32(1.0)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-6)


def test_intermediates_somebody_holds_are_materialized(runs):
    gate = Gate()
    x = af.tensor(np.linspace(-1, 1, 64))
    kept, views = [], []
    z = x
    for k in range(12):
        z = af.tanh(z * 2.0)
        if k % 3 == 0:
            kept.append(z)  # a tensor the user holds
        if k % 4 == 1:
            views.append(z[::2])  # only a view of it survives
    gate.open()
    ref, want_kept, want_views = np.linspace(-1, 1, 64), [], []
    for k in range(12):
        ref = np.tanh(ref * 2.0)
        if k % 3 == 0:
            want_kept.append(ref)
        if k % 4 == 1:
            want_views.append(ref[::2])
    for g, w in zip(kept + views + [z], want_kept + want_views + [ref], strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-12)


def test_intermediate_read_by_another_stream_is_materialized(runs):
    gate = Gate()
    x = af.tensor(np.linspace(-1, 1, 64))
    a = x * 3.0
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "side")):
        side = a + 1.0  # waits for a, on another stream
    b = af.relu(a) - 1.0
    del a
    gate.open()
    ref_a = np.linspace(-1, 1, 64) * 3.0
    np.testing.assert_allclose(side.numpy(), ref_a + 1.0)
    np.testing.assert_allclose(b.numpy(), np.maximum(ref_a, 0) - 1.0)


def test_an_op_waiting_on_another_stream_does_not_join_a_run(runs):
    x = af.tensor(np.linspace(-1, 1, 64))
    side = af.lowlevel.stream("cpu", "side")
    with af.lowlevel.use_stream(side):
        side_gate = Gate()
        w = x * 3.0  # held back on the side stream
    gate = Gate()
    a = x * 2.0
    b = a + w  # needs a (compute) and w (side)
    c = af.relu(b) - 1.0
    writer = a._impl.blob.last_write
    gate.open()  # a may start (and a run with it); b waits for w
    get_vm().wait(writer, timeout=5)
    side_gate.open()
    ref_b = np.linspace(-1, 1, 64) * 5.0
    np.testing.assert_allclose(b.numpy(), ref_b)
    np.testing.assert_allclose(c.numpy(), np.maximum(ref_b, 0) - 1.0)
    np.testing.assert_allclose(a.numpy(), np.linspace(-1, 1, 64) * 2.0)


def test_a_run_that_finds_no_memory_falls_back_to_one_by_one(runs):
    n = 1 << 14  # 64 KiB per float32 tensor
    x = af.tensor(np.ones(n, dtype=np.float32))
    af.synchronize()
    gc.collect()
    gate = Gate()
    af.lowlevel.set_memory_budget("cpu", af.lowlevel.memory_stats("cpu").in_use + 3 * n * 4)
    kept = [x * float(k) for k in range(5)]  # five results held: 5 x 64 KiB
    gate.open()
    with pytest.raises(af.KernelError, match="out of memory"):
        af.synchronize()
    # the runtime goes on: the first results that fitted are right, the rest raise
    assert np.array_equal(kept[1].numpy(), np.ones(n))
    with pytest.raises(af.KernelError, match="out of memory"):
        kept[4].numpy()
    af.lowlevel.set_memory_budget("cpu", None)
    del kept
    np.testing.assert_array_equal((x * 2.0).numpy(), np.full(n, 2.0))


# -- errors ----------------------------------------------------------------------------


def _boom(outs, ins, attrs):
    if (ins[0] > 100).any():
        raise ValueError("boom on a slice")
    np.copyto(outs[0], ins[0])


register_op(
    OpDef(
        "test_fused_boom",
        ("x",),
        lambda metas, attrs: [(metas[0].shape, metas[0].dtype)],
        {"cpu": _boom},
        elementwise=True,
    )
)


def _boom_op(x):
    return wrap(apply(af.lowlevel.get_op("test_fused_boom"), [x._impl], {})[0])


def test_kernel_error_in_a_run_poisons_its_dependents_only(runs):
    before = _counts(runs)
    gate = Gate()
    data = np.zeros((8, 16))
    data[6, 3] = 1000.0  # only one slice fails
    x = af.tensor(data)
    bad = _boom_op(x + 1.0)
    dep = af.relu(bad) * 2.0
    fine = af.tanh(x) + 1.0  # same run, independent of the failure
    gate.open()
    np.testing.assert_allclose(fine.numpy(), np.tanh(data) + 1.0)
    with pytest.raises(af.KernelError, match="boom on a slice") as info:
        dep.numpy()
    assert "test_fused_boom" in str(info.value)
    with pytest.raises(af.KernelError):
        bad.numpy()
    assert _delta(runs, before)[1] >= 1  # it did run as a run
    af.synchronize()
    np.testing.assert_allclose((x * 2.0).numpy(), data * 2.0)  # the runtime keeps working


def test_integer_division_by_zero_in_a_run_fails_the_op(runs):
    before = _counts(runs)
    gate = Gate()
    a = np.arange(1, 129, dtype=np.int64).reshape(8, 16)
    d = np.full((8, 16), 3, np.int64)
    d[6, 3] = 0  # only one slice meets the zero
    x, y = af.tensor(a), af.tensor(d)
    dep = ((x + 1) // y) * 2
    fine = (x + 1) % 5  # same run, valid
    z = x * 1
    z %= y  # in place, cut into slices
    gate.open()
    np.testing.assert_array_equal(fine.numpy(), (a + 1) % 5)
    with pytest.raises(af.KernelError, match=r"'floor_divide'.*ZeroDivisionError.*int64"):
        dep.numpy()
    for _ in range(2):  # other slices may have been written:
        with pytest.raises(af.KernelError, match="'remainder'"):
            z.numpy()  # z stays poisoned
    assert _delta(runs, before)[1] >= 1  # it did run as a run
    af.synchronize()
    d[6, 3] = 1
    gate = Gate()
    q = (x + 1) // af.tensor(d)
    r = (x + 1) % af.tensor(d)
    gate.open()
    np.testing.assert_array_equal(q.numpy(), (a + 1) // d)  # valid inputs: as numpy
    np.testing.assert_array_equal(r.numpy(), (a + 1) % d)


def test_a_whole_overwrite_of_a_poisoned_tensor_runs_alone_and_clears_it(runs):
    data = np.arange(128, dtype=np.int64).reshape(8, 16)
    z = af.tensor(data)
    x = z[af.tensor(np.full(8, 100))]  # out of bounds: x is poisoned
    gate = Gate()
    a = z + 1  # leads a run...
    y = x + 1  # ...that reads x (fails in it)
    x.copy_(z)  # writes all of x: ends the run
    w = x * 2
    gate.open()
    np.testing.assert_array_equal(a.numpy(), data + 1)
    with pytest.raises(af.KernelError, match="index 100 is out of bounds"):
        y.numpy()
    np.testing.assert_array_equal(x.numpy(), data)  # usable again
    np.testing.assert_array_equal(w.numpy(), data * 2)
    af.synchronize()


def test_runs_are_off_with_fuse_max_zero(runs):
    runs.fuse_max = 0
    before = _counts(runs)
    gate = Gate()
    z = af.tensor(np.ones(64))
    for _ in range(5):
        z = z + 1.0
    gate.open()
    np.testing.assert_array_equal(z.numpy(), np.full(64, 6.0))
    assert _delta(runs, before) == (0, 0, 0)


# -- fresh kernels ---------------------------------------------------------------------

FRESH_CASES = [
    ("neg", None),
    ("abs", None),
    ("exp", None),
    ("log", None),
    ("sqrt", None),
    ("tanh", None),
    ("relu", None),
    ("add", "t"),
    ("sub", "t"),
    ("mul", "t"),
    ("div", "t"),
    ("maximum", "t"),
    ("minimum", "t"),
    ("add", 1.5),
    ("sub", 2),
    ("mul", 0.5),
    ("div", 3),
    ("rsub", 2.5),
    ("rdiv", 1.5),
]


def _apply_case(name, other, x, y):
    if other is None:
        return getattr(af, name)(x)
    if other == "t":
        return getattr(af, name)(x, y)
    if name.startswith("r"):
        return {"rsub": lambda: other - x, "rdiv": lambda: other / x}[name]()
    return getattr(af, name)(x, other)


@pytest.mark.parametrize("name,other", FRESH_CASES)
@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["plain", "transposed", "zero-d"])
def test_fresh_kernels_compute_exactly_what_the_kernels_compute(name, other, dtype, layout):
    """The inline path (fresh kernels, numpy allocates the output) and the queued path (the
    op's kernel writes a preallocated output) give bit-identical results, dtypes and
    C-contiguous storage (a view of the result reads the right elements)."""
    rng = np.random.default_rng(0)
    shape = {"plain": (6, 5), "transposed": (5, 6), "zero-d": ()}[layout]
    a = (rng.uniform(0.5, 4, shape) * rng.choice([-1, 1], shape)).astype(dtype)
    b = rng.uniform(0.5, 4, shape).astype(dtype)
    vm = get_vm()
    results = []
    for inline in (True, False):
        x, y = af.tensor(a), af.tensor(b)
        if layout == "transposed":
            x, y = x.T, y.T  # F-ordered inputs: numpy's output would be too
        saved = vm.inline_max_cost
        vm.inline_max_cost = saved if inline else -1
        try:
            before = vm.stats()["inlined"]
            z = _apply_case(name, other, x, y)
            af.synchronize()
            assert (vm.stats()["inlined"] > before) == inline
        finally:
            vm.inline_max_cost = saved
        view = z[1] if layout != "zero-d" else z
        results.append((z.numpy(), view.numpy(), z.dtype))
    (got, got_view, got_dt), (want, want_view, want_dt) = results
    assert got_dt == want_dt
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_view, want_view)


def test_fresh_outputs_are_counted_by_the_allocator():
    stats = af.lowlevel.memory_stats
    x = af.tensor(np.ones(1000, dtype=np.float32))
    gc.collect()  # (an earlier test's garbage freed now, not
    af.synchronize()  # between the two counts)
    before = stats("cpu").in_use
    z = af.tanh(x * 2.0)  # two fresh outputs, one still held
    assert stats("cpu").in_use == before + 4000
    del z
    gc.collect()
    assert stats("cpu").in_use == before


def test_a_long_loop_of_small_ops_keeps_the_allocator_log_bounded():
    alloc = af.lowlevel.allocator("cpu")
    x = af.tensor(np.ones(100, dtype=np.float32))
    z = x
    for _ in range(3 * alloc.fold_at):
        z = z * 1.0  # fresh outputs only: no other allocation
    assert len(alloc.log) <= alloc.fold_at + 2
    np.testing.assert_array_equal(z.numpy(), np.ones(100))
