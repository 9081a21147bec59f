"""af.profile(): the eager VM's timeline as Chrome trace events, checked against the format
(every event has ph/ts/pid/tid, complete events a duration, flows pair up in time order,
every track is named, slices on a track nest) and against what the VM did (a kernel per op
with its name, stream and thread, simulated time on the null device, flows from writer to
reader, memory counters), and for its edges: nothing recorded after the block, errors in
the block, a path that cannot be written, nesting."""

import gc
import json
import threading
from collections import Counter

import numpy as np
import pytest

import actorflow as af
from actorflow.eager.interpreter import access
from actorflow.lowlevel import get_vm

pytestmark = pytest.mark.timeout(60)


def load(path):
    doc = json.loads(path.read_text())
    assert set(doc) == {"traceEvents", "displayTimeUnit"}
    return doc["traceEvents"]


def check_format(evs):
    """The trace-event format as ui.perfetto.dev and chrome://tracing read it; returns the
    track names by tid."""
    for e in evs:
        assert {"ph", "ts", "pid", "tid"} <= set(e), e
        assert e["ph"] in ("X", "s", "f", "C", "M"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["name"] and e["cat"] in ("op", "wait"), e
    starts, ends = {}, {}
    for e in evs:
        if e["ph"] in ("s", "f"):
            side = starts if e["ph"] == "s" else ends
            assert e["id"] not in side, f"flow id {e['id']} used twice"
            side[e["id"]] = e
    assert set(starts) == set(ends), "every flow that starts ends, and only those"
    for i, s in starts.items():
        assert ends[i]["ts"] >= s["ts"], (s, ends[i])  # read after it was written
        assert ends[i]["bp"] == "e"
    named = {
        e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert all(e["tid"] in named for e in evs), "a tid without a thread_name"
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in evs)
    tracks: dict = {}
    for e in evs:
        if e["ph"] == "X":
            tracks.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for tid, spans in tracks.items():  # slices on one track nest
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ = []
        for a, b in spans:
            while open_ and open_[-1] <= a + 1e-6:
                open_.pop()
            assert not open_ or b <= open_[-1] + 1e-6, (named[tid], a, b, open_[-1])
            open_.append(b)
    return named


def ops(evs):
    return [e for e in evs if e["ph"] == "X" and e["cat"] == "op"]


def program(device="cpu"):
    x = af.randn(8, 8, device=device)
    w = af.randn(8, 8, device=device)
    y = af.relu(x @ w) + 1
    if device == "cpu":
        y.numpy()
    return y


PROGRAM_OPS = {"randn": 2, "matmul": 1, "relu": 1, "add_scalar": 1, "numpy": 1}


def test_the_file_is_a_valid_trace_holding_the_profiles_events(tmp_path):
    with af.profile(tmp_path / "eager.json") as prof:
        program()
    assert prof.path == tmp_path / "eager.json"
    evs = load(tmp_path / "eager.json")
    named = check_format(evs)
    assert evs == json.loads(json.dumps(prof.events()))
    assert "cpu:compute" in named.values()
    assert Counter(e["name"] for e in ops(evs)) == PROGRAM_OPS


@pytest.mark.parametrize("inline", [True, False])
def test_every_kernel_is_there_with_its_name_stream_thread_and_bytes(inline):
    vm = get_vm()
    saved = vm.inline_max_cost
    if not inline:
        vm.inline_max_cost = -1  # every op through the loop, kernels on workers
    try:
        with af.profile() as prof:
            program()
    finally:
        vm.inline_max_cost = saved
    evs = prof.events()
    named = check_format(evs)
    kernels = ops(evs)
    assert Counter(e["name"] for e in kernels) == PROGRAM_OPS
    assert {named[e["tid"]] for e in kernels} == {"cpu:compute"}
    assert sorted(e["args"]["id"] for e in kernels) == list(range(6))
    for e in kernels:
        assert e["args"]["op"] == e["name"]
        assert e["args"]["bytes"] == (0 if e["name"] == "numpy" else 8 * 8 * 4)
    threads = {e["args"]["thread"] for e in kernels if e["name"] != "numpy"}
    if inline:
        assert threads == {threading.current_thread().name}
    else:
        assert threads and all(t.startswith("actorflow-cpu") for t in threads), threads


def test_null_kernels_last_at_least_the_simulated_latency_and_waits_show_why():
    af.lowlevel.set_null_latency(0.001)
    with af.profile() as prof:
        program("null")
    evs = prof.events()
    named = check_format(evs)
    kernels = ops(evs)
    assert Counter(e["name"] for e in kernels) == {
        "randn": 2,
        "matmul": 1,
        "relu": 1,
        "add_scalar": 1,
    }
    assert {named[e["tid"]] for e in kernels} == {"null:compute"}
    assert all(e["dur"] >= 1000.0 for e in kernels), [e["dur"] for e in kernels]
    # matmul, relu and add were each issued while the kernel before them (whose output
    # they read) was still running: they waited for their inputs
    waits = [e for e in evs if e["ph"] == "X" and e["cat"] == "wait"]
    for_inputs = [e for e in waits if e["args"]["for"] == "inputs" and e["dur"] >= 500.0]
    assert for_inputs, waits
    assert {e["args"]["op"] for e in for_inputs} <= {"matmul", "relu", "add_scalar"}
    assert all(named[e["tid"]].startswith("null:compute waits") for e in waits)


def _enclosing(kernels, tid, ts):
    hits = [e for e in kernels if e["tid"] == tid and e["ts"] <= ts <= e["ts"] + e["dur"]]
    assert len(hits) == 1, (tid, ts, hits)
    return hits[0]["name"]


@pytest.mark.parametrize("device", ["cpu", "null"])
def test_flows_go_from_the_writer_of_a_blob_to_its_readers(device):
    if device == "null":
        af.lowlevel.set_null_latency(0.0005)
    with af.profile() as prof:
        program(device)
    evs = prof.events()
    check_format(evs)
    kernels = ops(evs)
    starts = {e["id"]: e for e in evs if e["ph"] == "s"}
    edges = Counter()
    for f in (e for e in evs if e["ph"] == "f"):
        s = starts[f["id"]]
        edges[(_enclosing(kernels, s["tid"], s["ts"]), _enclosing(kernels, f["tid"], f["ts"]))] += 1
    expected = {("randn", "matmul"): 2, ("matmul", "relu"): 1, ("relu", "add_scalar"): 1}
    if device == "cpu":
        expected[("add_scalar", "numpy")] = 1
    assert edges == expected


def test_memory_counters_follow_the_allocator():
    program()  # (what the program's ops make once, the random generator's state, made:
    #            run first in a fresh process, the block freed its first state's bytes)
    gc.collect()  # no older tensor is freed in the block
    keep = []
    with af.profile() as prof:
        keep.append(af.zeros(1 << 16))  # 256 KiB held past the block
        program()
    evs = prof.events()
    check_format(evs)
    counters = [e for e in evs if e["ph"] == "C" and e["name"] == "memory cpu"]
    assert len(counters) >= 3  # the block's start, kernels, its end
    values = [e["args"]["bytes in use"] for e in counters]
    assert all(v >= 0 for v in values)
    assert values[-1] - values[0] >= (1 << 16) * 4
    assert max(values) >= values[0] + (1 << 16) * 4 + 8 * 8 * 4
    assert all(e["ts"] >= 0 for e in counters)


def test_nothing_is_recorded_after_the_block_and_its_work_is_waited_for():
    af.lowlevel.set_null_latency(0.005)
    x = af.randn(4, device="null")
    with af.profile() as prof:
        y = af.relu(x)  # still running when the block ends
    assert get_vm().profiler is None
    before = json.dumps(prof.events())
    [k] = ops(prof.events())
    assert k["name"] == "relu" and k["dur"] >= 5000.0
    af.relu(y)
    af.neg(af.randn(3)).numpy()
    af.synchronize()
    assert json.dumps(prof.events()) == before
    assert Counter(e["name"] for e in ops(prof.events())) == {"relu": 1}


def test_an_error_in_the_block_still_writes_the_trace_and_propagates(tmp_path):
    path = tmp_path / "sub" / "err.json"
    with pytest.raises(KeyError, match="inside"):
        with af.profile(path):
            program()
            raise KeyError("inside")
    evs = load(path)
    check_format(evs)
    assert Counter(e["name"] for e in ops(evs)) == PROGRAM_OPS
    assert get_vm().profiler is None


def test_a_path_that_cannot_be_written_is_an_oserror_after_the_work(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    path = blocker / "p.json"
    with pytest.raises(OSError, match="could not be written") as info:
        with af.profile(path) as prof:
            y = af.relu(af.tensor([-1.0, 2.0]))
    assert str(path) in str(info.value)
    assert y.numpy().tolist() == [0.0, 2.0]  # the block's work was done
    assert Counter(e["name"] for e in ops(prof.events()))["relu"] == 1
    assert "relu" in str(prof)
    # with an error in the block, that error goes on and says where the trace did not go
    with pytest.raises(ValueError, match="mine") as info:
        with af.profile(path):
            raise ValueError("mine")
    assert any(str(path) in n for n in info.value.__notes__)


def test_kernel_errors_are_left_for_the_next_sync_point():
    with af.profile() as prof:
        q = af.tensor([1, 2]) // af.tensor([0, 1])
        r = q + 1
    with pytest.raises(af.KernelError):
        af.synchronize()
    by_name = {e["name"]: e["args"] for e in ops(prof.events())}
    assert "failed" in by_name["floor_divide"]
    assert "skipped" in by_name["add_scalar"]
    del r


def test_profiles_nest_and_one_profile_records_one_block():
    x = af.randn(16)
    with af.profile() as outer:
        af.relu(x)
        with af.profile() as inner:
            af.exp(x)
        assert get_vm().profiler is not None  # the outer one still records
        af.neg(x)
    assert get_vm().profiler is None
    assert [e["name"] for e in ops(outer.events())] == ["relu", "exp", "neg"]
    assert [e["name"] for e in ops(inner.events())] == ["exp"]
    with pytest.raises(RuntimeError, match="entered already"):
        with inner:
            pass


def test_the_summary_is_a_table_per_op(capsys):
    with af.profile() as prof:
        program()
    print(prof)
    out = capsys.readouterr().out
    assert out.strip() == prof.summary()
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert {name: int(r[1]) for name, r in rows.items()} == PROGRAM_OPS
    shares = [float(r[4].rstrip("%")) for r in rows.values()]
    assert abs(sum(shares) - 100.0) < 0.5
    assert "6 kernels on 1 stream" in out.splitlines()[0]


class Gate:
    """Holds cpu's compute stream (an access instruction waiting on an event) so the ops
    issued behind it queue up (as in test_fusion)."""

    def __init__(self):
        self.event = threading.Event()
        t = af.zeros(1 << 18)
        access(t._impl, lambda a: self.event.wait(10), write=False, name="gate")


@pytest.fixture
def queued():
    vm = get_vm()
    vm.synchronize()
    saved = (vm.inline_max_cost, vm.parallel_min_cost, vm.fuse_max)
    vm.inline_max_cost, vm.parallel_min_cost = -1, 0
    yield vm
    vm.synchronize()
    vm.inline_max_cost, vm.parallel_min_cost, vm.fuse_max = saved


def test_a_run_of_elementwise_ops_is_one_slice_naming_its_members(queued):
    x = af.from_numpy(np.arange(4096, dtype=np.float32))
    runs = queued.runs.count
    with af.profile() as prof:
        gate = Gate()
        y = af.relu(x * 0.5 - 3.0)
        gate.event.set()
        out = y.numpy()
    assert queued.runs.count > runs
    assert np.allclose(out, np.maximum(np.arange(4096) * 0.5 - 3.0, 0))
    evs = prof.events()
    check_format(evs)
    [run] = [e for e in ops(evs) if e["name"].startswith("run of")]
    assert run["args"]["ops"] == ["mul_scalar", "sub_scalar", "relu"]
    assert run["name"] == "run of 3 ops"
    assert "relu" in prof.summary() and "runs of elementwise ops" in prof.summary()


def test_a_kernel_cut_into_slices_spans_the_threads_that_ran_them(queued):
    if queued.workers < 2:
        pytest.skip("one worker: kernels are not cut")
    queued.fuse_max = 0
    x = af.from_numpy(np.ones((64, 64), dtype=np.float32))
    with af.profile() as prof:
        af.exp(x).numpy()
    [k] = [e for e in ops(prof.events()) if e["name"] == "exp"]
    threads = k["args"]["thread"].split(", ")
    assert "actorflow-vm" in threads and any(t.startswith("actorflow-cpu") for t in threads)
