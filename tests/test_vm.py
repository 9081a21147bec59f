"""The VM: ordering by operand access and stream under random dispatch, release, errors,
dynamic shapes, the in-flight bound and use from asyncio."""

import asyncio
import gc
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af
from actorflow.eager.interpreter import access
from actorflow.lowlevel import OpDef, get_vm, register_op

pytestmark = pytest.mark.timeout(60)

N_SLOTS = 3
STREAMS = ("compute", "s1", "s2")
step = st.tuples(
    st.sampled_from(
        [
            "add",
            "mul",
            "add_",
            "mul_",
            "copy_",
            "fill_",
            "setitem",
            "snapshot",
            "relu_",
            "sub_view_",
        ]
    ),
    st.integers(0, N_SLOTS - 1),
    st.integers(0, N_SLOTS - 1),
    st.sampled_from(STREAMS),
    st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 2)),
)


def run_program(program, use_af: bool):
    """Runs the program on actorflow tensors (each op on its stream) or on numpy arrays one
    op at a time; returns the final slots and every snapshot taken along the way."""
    base = [np.arange(6, dtype=np.float64) * (i + 1) - 4 for i in range(N_SLOTS)]
    slots = [af.tensor(b) for b in base] if use_af else [b.copy() for b in base]
    snaps = []
    for op, i, j, stream_name, v in program:
        ctx = (
            af.lowlevel.use_stream(af.lowlevel.stream("cpu", stream_name)) if use_af else _nullctx()
        )
        with ctx:
            x, y = slots[i], slots[j]
            if op == "add":
                slots[i] = x + y
            elif op == "mul":
                slots[i] = x * v
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
            elif op == "copy_":
                if i != j:
                    if use_af:
                        x.copy_(y)
                    else:
                        x[...] = y
            elif op == "fill_":
                if use_af:
                    x.fill_(v)
                else:
                    x[...] = v
            elif op == "setitem":
                x[1:4] = v
            elif op == "relu_":
                if use_af:
                    af.relu(x, inplace=True)
                else:
                    np.maximum(x, 0, out=x)
            elif op == "sub_view_":
                # a write through a strided view of one slot, reading another
                if use_af:
                    x[::2].sub_(y[1::2])
                else:
                    x[::2] -= y[1::2].copy()
            elif op == "snapshot":
                snaps.append(slots[i].clone() if use_af else slots[i].copy())
    if use_af:
        return [s.numpy() for s in slots], [s.numpy() for s in snaps]
    return slots, snaps


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=st.lists(step, min_size=1, max_size=25), seed=st.integers(0, 2**16))
def test_random_programs_match_one_by_one(program, seed, random_dispatch):
    random_dispatch(seed, max_delay=0.001)
    got, got_snaps = run_program(program, use_af=True)
    want, want_snaps = run_program(program, use_af=False)
    for g, w in zip(got + got_snaps, want + want_snaps, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_random_programs_without_hooks_match_too():
    rng = np.random.default_rng(0)
    ops = [
        "add",
        "mul",
        "add_",
        "mul_",
        "copy_",
        "fill_",
        "setitem",
        "snapshot",
        "relu_",
        "sub_view_",
    ]
    program = [
        (
            ops[rng.integers(len(ops))],
            int(rng.integers(N_SLOTS)),
            int(rng.integers(N_SLOTS)),
            STREAMS[rng.integers(3)],
            float(np.round(rng.uniform(-2, 2), 2)),
        )
        for _ in range(300)
    ]
    got, gs = run_program(program, use_af=True)
    want, ws = run_program(program, use_af=False)
    for g, w in zip(got + gs, want + ws, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_read_before_write_keeps_old_value(random_dispatch):
    random_dispatch(7, max_delay=0.02)
    x = af.tensor([1.0, 2.0, 3.0])
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "s1")):
        y = x * 1  # reads x
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "s2")):
        x.fill_(0.0)  # must wait for the read on s1
    np.testing.assert_array_equal(y.numpy(), [1, 2, 3])
    np.testing.assert_array_equal(x.numpy(), [0, 0, 0])


_ORDER: list = []


_BARRIER = [None]


def _record_kernel(outs, ins, attrs):
    if attrs["sleep"] < 0:
        _BARRIER[0].wait()  # until the other kernel is running too
    else:
        time.sleep(attrs["sleep"])
    _ORDER.append(attrs["tag"])
    outs[0][...] = ins[0]


register_op(
    OpDef(
        "test_record",
        ("x",),
        lambda metas, attrs: [(metas[0].shape, metas[0].dtype)],
        {"cpu": _record_kernel},
        attrs=("tag", "sleep"),
    )
)


def _record(x, tag, sleep=0.0):
    from actorflow.eager.interpreter import apply
    from actorflow.tensor.tensor import wrap

    return wrap(
        apply(af.lowlevel.get_op("test_record"), [x._impl], {"tag": tag, "sleep": sleep})[0]
    )


def test_one_stream_keeps_issue_order(random_dispatch):
    random_dispatch(3, max_delay=0.005)
    _ORDER.clear()
    xs = [af.tensor([float(i)]) for i in range(20)]  # independent data: only the stream orders
    outs = [_record(x, i, sleep=0.001 * (i % 3)) for i, x in enumerate(xs)]
    af.synchronize()
    assert _ORDER == list(range(20))
    assert [o.item() for o in outs] == list(range(20))


def test_different_streams_run_concurrently(random_dispatch):
    """Each kernel waits at a barrier for the other: only kernels running at the same time
    can pass it (run one after the other, the barrier breaks and the kernels fail)."""
    random_dispatch(5, max_delay=0.0)
    _ORDER.clear()
    _BARRIER[0] = threading.Barrier(2, timeout=10)
    a, b = af.tensor([1.0]), af.tensor([2.0])
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "s1")):
        _record(a, "a", sleep=-1)
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "s2")):
        _record(b, "b", sleep=-1)
    af.synchronize()
    assert sorted(_ORDER) == ["a", "b"]


def test_release_frees_memory_after_last_use():
    # (the pending read is held by an event, not by a latency: a loaded machine cannot let
    # it finish before the first assertion)
    vm = get_vm()
    before = af.lowlevel.memory_stats("null").in_use
    x = af.zeros(1000, device="null")  # 4000 B
    af.synchronize()
    blob = x._impl.blob
    go = threading.Event()
    access(x._impl, lambda a: go.wait(30), write=False, name="held_read")  # reads x until go
    del x
    gc.collect()
    vm.collect_releases()
    assert blob.allocated and not blob.released  # the pending read still holds x
    assert af.lowlevel.memory_stats("null").in_use >= before + 4000
    go.set()
    af.synchronize()
    assert not blob.allocated and blob.released  # freed once the read completed
    assert af.lowlevel.memory_stats("null").in_use == before


def test_release_on_cpu_returns_bytes_and_reuses_large_blocks():
    before = af.lowlevel.memory_stats("cpu")
    x = af.ones(1 << 20)  # 4 MiB: cached when freed
    x.numpy()
    assert af.lowlevel.memory_stats("cpu").in_use == before.in_use + (4 << 20)
    del x
    af.synchronize()
    after = af.lowlevel.memory_stats("cpu")
    assert after.in_use == before.in_use
    assert after.cached >= 4 << 20
    y = af.zeros(1 << 20)  # takes the cached block
    np.testing.assert_array_equal(y.numpy()[:3], [0, 0, 0])
    assert af.lowlevel.memory_stats("cpu").cached == after.cached - (4 << 20)


def test_dynamic_shape_consumer_waits_for_compute(random_dispatch):
    random_dispatch(11, max_delay=0.01)
    x = af.tensor([0.0, 3.0, 0.0, 5.0, 1.0])
    x.mul_(2)
    idx = af.nonzero(x)  # shape known only after compute
    assert idx.dtype == af.int64
    picked = x[x > 1]  # boolean mask: dynamic too
    total = picked.sum() + idx.shape[0]
    assert idx.shape == (3, 1)
    np.testing.assert_array_equal(idx.numpy().ravel(), [1, 3, 4])
    assert total.item() == pytest.approx(6 + 10 + 2 + 3)


def test_in_flight_bound_blocks_the_caller():
    vm = get_vm()
    old = vm.max_in_flight
    vm.max_in_flight = 8
    af.lowlevel.set_null_latency(0.002)
    try:
        x = af.zeros(4, device="null")
        peak = 0
        for _ in range(60):
            x = x + 1
            peak = max(peak, vm.stats()["in_flight"])
        af.synchronize()
        assert peak <= 8
    finally:
        vm.max_in_flight = old


def _boom(outs, ins, attrs):
    raise ValueError("boom from a kernel")


register_op(
    OpDef(
        "test_boom", ("x",), lambda metas, attrs: [(metas[0].shape, metas[0].dtype)], {"cpu": _boom}
    )
)


def _boom_op(x):
    from actorflow.eager.interpreter import apply
    from actorflow.tensor.tensor import wrap

    return wrap(apply(af.lowlevel.get_op("test_boom"), [x._impl], {})[0])


@pytest.mark.parametrize("hooks", [False, True])
def test_kernel_error_surfaces_at_sync_and_poisons_dependents(hooks, random_dispatch):
    if hooks:
        random_dispatch(2, max_delay=0.002)
    x = af.tensor([1.0, 2.0])
    bad = _boom_op(x)
    dep = af.relu(bad) + 1
    fine = x * 3
    np.testing.assert_array_equal(fine.numpy(), [3.0, 6.0])  # independent work goes on
    with pytest.raises(af.KernelError, match=r"op 'test_boom' failed on cpu: ValueError: boom"):
        dep.numpy()
    with pytest.raises(af.KernelError) as info:
        bad.numpy()
    assert isinstance(info.value.original, ValueError)
    af.synchronize()  # already reported: nothing more to raise
    bad2 = _boom_op(x)
    del bad2
    with pytest.raises(af.KernelError, match="test_boom"):
        af.synchronize()
    af.synchronize()  # reported once
    np.testing.assert_array_equal((x + 1).numpy(), [2.0, 3.0])


def test_unreported_errors_are_kept_up_to_a_bound_and_counted():
    from actorflow.vm.sync import MAX_KEPT_ERRORS as bound

    vm = af.lowlevel.get_vm()
    x = af.zeros(4)
    n = 3 * bound + 7
    for i in range(n):
        x[af.tensor([100 + i])]  # fails in the kernel; nobody reads it
    assert af.lowlevel.vm_stats()["unreported_errors"] == n
    assert len(vm.errors.kept) <= bound  # the rest are counted, not kept
    with pytest.raises(af.KernelError, match="index 100 is out of bounds") as info:
        af.synchronize()  # the first one
    err = info.value
    assert err.more_errors == n - 1 and err.dropped_errors == n - bound
    assert f"{n - 1} more kernel errors" in str(err)
    assert f"{n - bound} of them were dropped unreported" in str(err)
    assert af.lowlevel.vm_stats()["unreported_errors"] == 0 and len(vm.errors.kept) == 0
    af.synchronize()  # all reported
    bad = x[af.tensor([7])]
    for _ in range(2 * bound):
        x[af.tensor([9])]
    with pytest.raises(af.KernelError, match="index 7 is out of bounds"):
        bad.numpy()  # reported on its own...
    assert af.lowlevel.vm_stats()["unreported_errors"] == 2 * bound
    late = x[af.tensor([11])]  # counted, not kept
    with pytest.raises(af.KernelError, match="index 11 is out of bounds"):
        late.numpy()  # reported on its own: counted off
    assert af.lowlevel.vm_stats()["unreported_errors"] == 2 * bound
    with pytest.raises(af.KernelError, match="index 9 is out of bounds") as info:
        af.synchronize()  # ...so not again
    assert info.value.more_errors == 2 * bound - 1
    held = [x[af.tensor([20])] for _ in range(bound)]
    for i in range(3):
        x[af.tensor([30 + i])]  # not kept
    for t in held:
        with pytest.raises(af.KernelError):
            t.numpy()
    with pytest.raises(af.KernelError, match="index 32 is out of bounds") as info:
        af.synchronize()  # only dropped ones left: the latest
    assert info.value.more_errors == 2 and info.value.dropped_errors == 2
    np.testing.assert_array_equal((x + 1).numpy(), np.ones(4))


def test_an_op_cut_into_slices_that_fail_records_one_error():
    vm = af.lowlevel.get_vm()
    saved = vm.inline_max_cost, vm.parallel_min_cost
    vm.inline_max_cost, vm.parallel_min_cost = -1, 0  # every op split across workers
    try:
        for _ in range(50):
            x = af.tensor(np.arange(128).reshape(8, 16)) // af.tensor(np.zeros((8, 16), int))
            with pytest.raises(af.KernelError, match="floor_divide"):
                x.numpy()  # every slice fails; reported here...
            af.synchronize()  # ...so nothing is left to raise
    finally:
        vm.inline_max_cost, vm.parallel_min_cost = saved


def test_out_of_memory_names_bytes_and_budget():
    af.lowlevel.set_memory_budget("cpu", af.lowlevel.memory_stats("cpu").in_use + 1024)
    small = af.zeros(16)  # fits
    big = af.zeros(1024)  # 4 KiB: does not
    with pytest.raises(af.KernelError) as info:
        big.numpy()
    err = info.value.original
    assert isinstance(err, af.OutOfMemoryError)
    assert err.requested == 4096 and err.budget is not None
    assert "asked for 4.0 KiB" in str(err) and "budget" in str(err)
    af.lowlevel.set_memory_budget("cpu", None)
    np.testing.assert_array_equal(small.numpy(), np.zeros(16))
    assert af.ones(1024).sum().item() == 1024


def test_dead_tensors_do_not_cause_out_of_memory():
    base = af.lowlevel.memory_stats("cpu").in_use
    af.lowlevel.set_memory_budget("cpu", base + 40_000)
    x = af.zeros(1000)
    for _ in range(50):  # each step frees the previous 4 KB
        x = x + 1
    assert x.sum().item() == 50_000


async def test_numpy_async_does_not_block_the_loop(random_dispatch):
    random_dispatch(1, max_delay=0.0)
    x = af.tensor([1.0, 2.0])
    slow = _record(x, "slow", sleep=0.3)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    got = await slow.numpy_async()
    task.cancel()
    np.testing.assert_array_equal(got, [1.0, 2.0])
    assert ticks >= 10  # the loop kept running while we waited


async def test_numpy_inside_a_coroutine_works():
    x = af.tensor([[1.0, -1.0], [1.0, -1.0]])
    w = af.relu(x) * 2
    np.testing.assert_array_equal(w.numpy(), [[2, 0], [2, 0]])
    np.testing.assert_array_equal(await w.numpy_async(), [[2, 0], [2, 0]])
    await af.synchronize_async()


def test_threads_submitting_concurrently():
    results = {}

    def worker(k):
        x = af.full((100,), float(k))
        for _ in range(200):
            x = x + 1
        results[k] = x.numpy()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for k in range(4):
        np.testing.assert_array_equal(results[k], np.full(100, k + 200.0))


def test_large_elementwise_split_across_workers_matches_numpy():
    a = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(1024).astype(np.float32)
    x, y = af.from_numpy(a), af.from_numpy(b)
    z = af.relu(x * 2 + y) - x  # broadcasting across the split axis
    np.testing.assert_allclose(z.numpy(), np.maximum(a * 2 + b, 0) - a, rtol=1e-6)
    w = x.T + 1  # a strided view as input
    np.testing.assert_allclose(w.numpy(), a.T + 1)
    v = af.from_numpy(a.copy())
    v[:, 1:].add_(v[:, :-1])  # overlapping in-place views: not split
    ref = a.copy()
    ref[:, 1:] += ref[:, :-1].copy()
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-6)


def test_vm_stats_counts_instructions():
    vm_before = af.lowlevel.vm_stats()
    x = af.ones(10)
    (x + 1).numpy()
    after = af.lowlevel.vm_stats()
    assert after["issued"] >= vm_before["issued"] + 3
    assert after["in_flight"] == 0
    assert after["devices"]["cpu"]["peak"] >= 40


def test_uvloop_is_used_when_installed():
    uvloop = pytest.importorskip("uvloop")
    af.lowlevel.get_vm().set_test_hooks(seed=0)  # forces the loop to start
    (af.ones(2) + 1).numpy()
    assert isinstance(af.lowlevel.get_vm()._loop, uvloop.Loop)


def test_the_vm_and_the_graph_loop_run_on_threads_from_the_one_loop_start_up(monkeypatch):
    """eventloop.start_loop_thread starts every loop thread: a daemon thread whose loop runs
    by the time it returns; the VM's loop thread and the graph loop thread are its."""
    from actorflow import eventloop
    from actorflow.runtime.sched import loop as graph_loop_module

    loop, thread = eventloop.start_loop_thread("actorflow-test-loop")
    try:
        assert loop.is_running() and thread.daemon and thread.name == "actorflow-test-loop"
        assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "ran"), loop).result(5) == "ran"
    finally:
        eventloop.stop_loop_thread(loop, thread, timeout=5)
    assert not thread.is_alive()
    started, start_loop_thread = [], eventloop.start_loop_thread

    def start(name):
        started.append(name)
        return start_loop_thread(name)

    vm = af.lowlevel.VM(workers=1)  # a VM of its own, and a graph loop of its own
    monkeypatch.setattr(graph_loop_module, "_GRAPH_LOOP", [])
    monkeypatch.setattr(graph_loop_module, "_GRAPH_THREAD", [])
    monkeypatch.setattr("actorflow.vm.scheduler.start_loop_thread", start)
    monkeypatch.setattr(graph_loop_module, "start_loop_thread", start)
    try:
        vm._start_loop()
        g_loop = graph_loop_module.graph_loop()
        assert started == ["actorflow-vm", "actorflow-graphs"]
        assert vm._loop.is_running() and g_loop.is_running()
        assert graph_loop_module.on_graph_loop() is False
    finally:
        vm.shutdown()
        graph_loop_module._stop_graph_loop()
    assert not graph_loop_module._GRAPH_THREAD and not g_loop.is_running()


@pytest.mark.timeout(60)
def test_no_loop_thread_is_left_running_when_the_interpreter_finalizes(tmp_path):
    """A uvloop loop still running in a daemon thread while the interpreter finalizes can
    crash the process at exit (a digits example run in CI ended with SIGSEGV after printing
    all its output): the VM's and the graph loop's threads are stopped by their atexit
    handlers, so by the last handler (registered before actorflow is imported) no
    actorflow loop thread is alive."""
    import subprocess
    import sys

    script = tmp_path / "exits.py"
    script.write_text(
        "import atexit, threading\n"
        "atexit.register(lambda: print('alive at exit:', sorted(t.name for t in "
        "threading.enumerate() if t.name in ('actorflow-vm', 'actorflow-graphs'))))\n"
        "import actorflow as af\n"
        "g = af.ActorGraph()\n"
        "src = g.source([af.tensor([float(i)]) for i in range(3)], name='src')\n"
        "g.sink(g.actor(lambda t: t * 2, src, name='double'))\n"
        "print('outs:', [float(o[0]) for o in g.run()])\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "outs: [0.0, 2.0, 4.0]" in r.stdout, r.stdout + r.stderr
    assert "alive at exit: []" in r.stdout, r.stdout + r.stderr


@pytest.mark.timeout(120)
def test_exit_with_a_run_paused_or_a_run_after_the_loop_stopped_ends_the_process(tmp_path):
    """A run's generator still paused when the script ends (closed as the interpreter
    finalizes, after the graph loop was stopped) does not wait forever for a loop nobody
    runs; a graph run from an atexit handler that runs after actorflow's is refused with
    an error naming the fix, not left on a new loop thread."""
    import subprocess
    import sys

    graph = (
        "import time\n"
        "import actorflow as af\n"
        "def graph(n=4):\n"
        "    g = af.ActorGraph()\n"
        "    src = g.source([af.tensor([float(i)]) for i in range(n)], name='src')\n"
        "    g.sink(g.actor(lambda t: (time.sleep(0.02), t * 2)[1], src, name='double'))\n"
        "    return g\n"
    )
    (tmp_path / "graphs.py").write_text(graph)  # (its stage a function of another module)
    paused = tmp_path / "paused.py"
    paused.write_text(
        "from graphs import graph\ng = graph(50)\nit = g.run()\n"
        "print('first:', float(next(it)[0]))\n"
    )
    late = tmp_path / "late.py"
    late.write_text(
        "import atexit\n"
        "def late():\n"
        "    try:\n"
        "        list(graph().run())\n"
        "    except RuntimeError as e:\n"
        "        print('refused:', e)\n"
        "atexit.register(late)  # (before actorflow's: runs after it)\n"
        + graph
        + "print('outs:', [float(o[0]) for o in graph().run()])\n"
    )
    for script, want in ((paused, "first: 0.0"), (late, "outs: [0.0, 2.0, 4.0, 6.0]")):
        r = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert want in r.stdout, r.stdout + r.stderr
    assert "refused: an actor graph was run after actorflow stopped its graph loop" in r.stdout


@pytest.mark.timeout(20)
def test_queued_release_waits_for_pending_use_and_reclaim_does_not_deadlock():
    # Instructions hold their tensors, so through the public API a blob is released only
    # after its uses. Queue one by hand while a slow read of it is pending (as an owner that
    # dies early would). An allocation over budget made under the VM lock (as inline kernels
    # allocate) reclaims memory: it must neither deadlock nor free the blob early. The
    # release itself must wait for the read (a RELEASE instruction).
    from actorflow.tensor.blob import RELEASED

    vm = get_vm()
    big = af.ones(1 << 20)  # 4 MiB
    big.numpy()
    blob = big._impl.blob
    with af.lowlevel.use_stream(af.lowlevel.stream("cpu", "slow")):
        slow = _record(big, "slow", sleep=0.5)  # 4 MiB more; reads big on a worker
    gc.collect()
    vm.collect_releases()
    allocator = af.lowlevel.allocator("cpu")
    af.lowlevel.set_memory_budget("cpu", allocator.stats().in_use + (4 << 20) + 2000)
    RELEASED.append(blob)
    with vm._lock:
        with pytest.raises(af.OutOfMemoryError):
            allocator.empty((1 << 21,), np.dtype(np.float32), 8 << 20, "test")
    assert blob.allocated and not slow._impl.blob.error
    af.lowlevel.set_memory_budget("cpu", None)
    vm.collect_releases()  # issues the RELEASE instruction
    assert blob.allocated  # ...which waits for the slow read
    assert slow.sum().item() == float(1 << 20)
    af.synchronize()
    assert not blob.allocated and blob.released
    assert af.ones(1000).sum().item() == 1000
    del big


def test_long_chain_queued_behind_a_slow_op_runs_without_recursion():
    y = _record(af.ones(1 << 17), "slow", sleep=0.2)  # large: runs on a worker for 0.2 s
    x = y[:8] + 0  # tiny, but waits for the slow op
    for _ in range(3000):  # tiny ops the loop then runs one by one
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), np.full(8, 3001.0))


def test_an_op_call_names_its_operands_access(random_dispatch):
    """The instruction model is the one the VM runs: an op call reads its inputs (CONST) and
    writes its outputs (MUT), or MUT2 when their shape is known only after compute."""
    from actorflow.lowlevel import Access

    random_dispatch(7, max_delay=0.05)  # queued, so the instruction is still there
    x = af.tensor([0.0, 1.0, 0.0, 2.0])
    y = af.nonzero(x)
    instr = y._impl.blob.last_write
    assert instr is not None and instr.name == "nonzero"
    access = {id(op.blob): op.access for op in instr.operands}
    assert access[id(x._impl.blob)] is Access.CONST
    assert access[id(y._impl.blob)] is Access.MUT2
    z = x + 1
    instr = z._impl.blob.last_write
    assert {op.access for op in instr.operands} == {Access.CONST, Access.MUT}
    np.testing.assert_array_equal(y.numpy().reshape(-1), [1, 3])
