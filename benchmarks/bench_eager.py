#!/usr/bin/env python
"""Eager-mode overhead and throughput of actorflow against numpy, PyTorch CPU and Dask.

Two workloads, measured in the same process with the contenders interleaved (round-robin,
the order rotated every round) and best-of-N timing (this class of machine shows +-20 %
noise between runs, so the best of several rounds is the figure compared; the median is
recorded too):

1. ``chain``: a dependent chain of small ops (10,000 by default) on 1,000-element float32
   tensors ending in ``numpy()``. This measures per-op dispatch overhead. Contenders:
   bare numpy calls (baseline), actorflow (default settings: the inline fast path),
   actorflow with the inline fast path disabled (``vm.inline_max_cost = -1``: every op
   goes through the asyncio loop and the CPU worker threads), PyTorch CPU, and Dask's
   threaded scheduler (a shorter chain, since building a Dask graph is slow and its cost
   grows faster than linearly; the comparable figure for every row is us/op).
2. ``large``: a sequence of elementwise ops (100 by default) on 1,000,000-element float32
   tensors, each producing a fresh output, ending in ``af.synchronize()``. Baselines:
   numpy single-threaded with fresh outputs, and numpy writing into preallocated ``out=``
   buffers (the fairest single-thread comparison). Contenders: actorflow (default: the
   queued ops form runs that every worker executes on its own slice, and intermediates
   nobody holds never get memory) and PyTorch CPU. Diagnostic rows: what the hardware gives
   two threads with no runtime at all (numpy, each thread the whole chain on half of the
   array), actorflow op by op (runs off: each kernel split across the workers, which meet
   after every op), and actorflow with no splitting at all.

Every contender runs the same op sequence (``CYCLE`` repeated) and every timed result is
checked with ``np.allclose`` against the numpy result, so a run that computed nothing (or
the wrong thing) fails loudly instead of producing a fast number.

Usage::

    python benchmarks/bench_eager.py                 # full run (~40 s on 2 cores)
    python benchmarks/bench_eager.py --quick         # smoke run (~13 s)
    python benchmarks/bench_eager.py --repeat 9 --out /tmp/bench.json

Exit status: 0 when every result matched numpy, 1 when a check failed or a contender
raised (the JSON is written either way).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

# Goals stated by the project.
CHAIN_GOAL = 6.0  # actorflow chain us/op <= 6x numpy's
LARGE_GOAL = 0.6  # actorflow large time <= 0.6x numpy's (fresh outputs)

RTOL, ATOL = 1e-4, 1e-5

# The op sequence every contender runs, repeated. A realistic mix of tensor*scalar,
# tensor+tensor, relu, tensor-scalar and the occasional tanh/exp. It keeps values bounded
# (relu >= 0, *0.5 contracts, tanh then exp lands in (0.37, 2.72)), so a chain of any length
# stays finite and non-trivial, and float32 rounding differences between libraries don't
# grow along it. Its length is even, which the ``out=`` variant relies on (ping-pong buffers).
CYCLE = (
    ("mul_s", 0.5),
    ("add_t", None),
    ("relu", None),
    ("sub_s", 0.25),
    ("mul_s", 1.5),
    ("add_t", None),
    ("tanh", None),
    ("exp", None),
    ("sub_s", 0.5),
    ("relu", None),
)

# Statement templates per flavour. ``z`` is the running value, ``y`` the second operand.
_FUNCTIONAL = {  # actorflow / torch: relu, tanh, exp are the library's functions
    "mul_s": "z = z * {c!r}",
    "add_t": "z = z + y",
    "relu": "z = relu(z)",
    "sub_s": "z = z - {c!r}",
    "tanh": "z = tanh(z)",
    "exp": "z = exp(z)",
}
_NUMPY = {  # numpy / dask: relu is maximum(z, 0), exactly what actorflow's kernel runs
    "mul_s": "z = z * {c!r}",
    "add_t": "z = z + y",
    "relu": "z = maximum(z, 0)",
    "sub_s": "z = z - {c!r}",
    "tanh": "z = tanh(z)",
    "exp": "z = exp(z)",
}
_NUMPY_OUT = {  # numpy into preallocated buffers; {o} alternates between A and B
    "mul_s": "z = multiply(z, {c!r}, out={o})",
    "add_t": "z = add(z, y, out={o})",
    "relu": "z = maximum(z, 0, out={o})",
    "sub_s": "z = subtract(z, {c!r}, out={o})",
    "tanh": "z = tanh(z, out={o})",
    "exp": "z = exp(z, out={o})",
}


def make_runner(templates: dict, namespace: dict, n_ops: int, out_buffers: bool = False):
    """Compiles ``run(x, y[, A, B]) -> z`` applying the first ``n_ops`` ops of the repeated
    CYCLE. Straight-line code in a loop keeps the harness's own per-op cost to what a user's
    hand-written code would have (one statement per op), the same for every contender."""
    if n_ops <= 0:
        raise ValueError("n_ops must be positive")
    full, rest = divmod(n_ops, len(CYCLE))

    def stmts(ops):
        lines = []
        for i, (name, c) in enumerate(ops):
            lines.append(templates[name].format(c=c, o="AB"[i % 2]))
        return lines

    args = "x, y, A, B" if out_buffers else "x, y"
    src = [f"def run({args}):", "    z = x"]
    if full:
        src.append(f"    for _ in range({full}):")
        src += ["        " + s for s in stmts(CYCLE)]
    if rest:
        # ops after the loop continue the A/B alternation correctly: len(CYCLE) is even
        src += ["    " + s for s in stmts(CYCLE[:rest])]
    src.append("    return z")
    ns = dict(namespace)
    exec(compile("\n".join(src), f"<bench_eager run {n_ops} ops>", "exec"), ns)  # noqa: S102
    return ns["run"]


def numpy_reference(a: np.ndarray, b: np.ndarray, n_ops: int) -> np.ndarray:
    run = make_runner(_NUMPY, {"maximum": np.maximum, "tanh": np.tanh, "exp": np.exp}, n_ops)
    ref = np.array(run(a, b), copy=True)
    if ref.dtype != np.float32 or not np.all(np.isfinite(ref)) or float(np.std(ref)) == 0.0:
        raise RuntimeError(
            f"the reference result is degenerate (dtype {ref.dtype}, finite "
            f"{np.all(np.isfinite(ref))}, std {np.std(ref)}); fix the op mix"
        )
    return ref


# -- environment ---------------------------------------------------------------------------


def environment(torch, dask, vm) -> dict:
    loop_type = harness.loop_type(getattr(vm, "_loop", None))  # read only: the VM's loop
    return harness.environment(
        libraries={
            "torch": getattr(torch, "__version__", None) if torch else None,
            "torch_num_threads": torch.get_num_threads() if torch else None,
            "torch_num_threads_note": (
                "PyTorch default (not changed by this benchmark)" if torch else None
            ),
            "torch_cpu_capability": (
                torch.backends.cpu.get_cpu_capability()
                if torch and hasattr(torch.backends, "cpu")
                else None
            ),
            "dask": getattr(dask, "__version__", None) if dask else None,
        },
        runtime={
            "vm_event_loop": loop_type,
            "uvloop_used": None if loop_type is None else loop_type.startswith("uvloop"),
            "vm_workers": vm.workers,
            "vm_inline_max_cost": vm.inline_max_cost,
            "vm_parallel_min_cost": vm.parallel_min_cost,
            "vm_fuse_max": vm.fuse_max,
            "vm_fusion_tile_bytes": vm.fusion_tile_bytes,
            "vm_max_in_flight": getattr(vm, "max_in_flight", None),
        },
    )


# -- the timing harness --------------------------------------------------------------------


def vm_setting(vm, attr: str, value):
    """(setup, teardown) that set ``vm.<attr>`` to ``value`` for one contender's rounds and
    restore it, synchronizing the VM on both sides."""
    saved = {}

    def setup():
        vm.synchronize()
        saved[attr] = getattr(vm, attr)
        setattr(vm, attr, value)

    def teardown():
        try:
            vm.synchronize()
        finally:
            setattr(vm, attr, saved.pop(attr))

    return setup, teardown


def check_close(result, ref) -> str | None:
    """What is wrong with ``result`` against numpy's ``ref``, or None."""
    res = np.asarray(result)
    if res.shape != ref.shape or res.dtype != ref.dtype:
        return f"shape/dtype {res.shape} {res.dtype} != {ref.shape} {ref.dtype}"
    if not np.allclose(res, ref, rtol=RTOL, atol=ATOL):
        bad = ~np.isclose(res, ref, rtol=RTOL, atol=ATOL)
        i = int(np.argmax(bad))
        return (
            f"{int(bad.sum())} of {res.size} elements differ, "
            f"e.g. [{i}] {res.flat[i]!r} vs {ref.flat[i]!r}"
        )
    return None


class Contender(harness.Contender):
    """``fn()`` runs the timed work and returns whatever ``fetch`` turns into the numpy result
    (fetching happens after the clock stops). ``setup``/``teardown`` run outside the clock."""

    def __init__(
        self,
        name,
        fn,
        fetch=None,
        n_ops=None,
        ref=None,
        setup=None,
        teardown=None,
        note="",
        baseline=False,
        pause=0.0,
    ):
        super().__init__(
            name,
            fn,
            check_close,
            ref=ref,
            fetch=fetch,
            setup=setup,
            teardown=teardown,
            pause=pause,
            n_ops=n_ops,
            note=note,
            baseline=baseline,
        )
        self.n_ops = n_ops

    def summary(self) -> dict:
        return super().summary(per=self.n_ops, unit="op")


def dispatch_delta(vm, fn) -> dict | None:
    """The eager dispatch cache over one call of ``fn``: VM calls (ops inline or issued, and
    the read at the end), signatures decided (the cache's misses; every other call of a
    signature is a hit) and calls the cache did not take. None where this actorflow has no
    dispatch cache."""
    import importlib

    stats = getattr(importlib.import_module("actorflow.eager.interpreter"), "STATS", None)
    if stats is None:
        return None
    vm.synchronize()
    s0, d0 = vm.stats(), dict(stats)
    fn()
    vm.synchronize()
    s1 = vm.stats()
    return {
        "op_calls": s1["issued"] - s0["issued"],  # (inline calls count as issued)
        **{k: stats[k] - d0[k] for k in d0},
    }


def vm_delta(vm, fn) -> dict:
    """Instruction counts of one call of ``fn``: issued, run inline, run as members of runs
    (and how many runs), intermediates of runs that never got memory."""
    vm.synchronize()
    s0 = vm.stats()
    fn()
    vm.synchronize()
    s1 = vm.stats()
    return {k: s1[k] - s0[k] for k in ("issued", "inlined", "fused", "fused_runs", "elided")}


# -- workload 1: the dependent chain -------------------------------------------------------


def bench_chain(args, af, torch, dask_array) -> tuple[dict, list]:
    n, size = args.chain_ops, args.chain_size
    rng = np.random.default_rng(0)
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.random(size).astype(np.float32)
    ref = numpy_reference(a, b, n)
    vm = af.lowlevel.get_vm()
    contenders = []

    run_np = make_runner(_NUMPY, {"maximum": np.maximum, "tanh": np.tanh, "exp": np.exp}, n)
    contenders.append(
        Contender(
            "numpy",
            lambda: run_np(a, b),
            n_ops=n,
            ref=ref,
            baseline=True,
            note="bare numpy calls, fresh outputs",
        )
    )

    x, y = af.from_numpy(a), af.from_numpy(b)
    run_af = make_runner(_FUNCTIONAL, {"relu": af.relu, "tanh": af.tanh, "exp": af.exp}, n)
    af_default = Contender(
        "actorflow",
        lambda: run_af(x, y).numpy(),
        n_ops=n,
        ref=ref,
        note=f"default (inline fast path, inline_max_cost={vm.inline_max_cost})",
    )
    contenders.append(af_default)

    no_inline, restore = vm_setting(vm, "inline_max_cost", -1)

    af_loop = Contender(
        "actorflow (no inline)",
        lambda: run_af(x, y).numpy(),
        n_ops=n,
        ref=ref,
        setup=no_inline,
        teardown=restore,
        note="inline_max_cost=-1: every op through the asyncio loop + worker threads",
    )
    contenders.append(af_loop)

    def profiled():
        with af.profile():
            return run_af(x, y).numpy()

    af_prof = Contender(
        "actorflow (profiled)",
        profiled,
        n_ops=n,
        ref=ref,
        note="the default row inside af.profile(): every kernel recorded (no file written)",
    )
    contenders.append(af_prof)

    if torch is not None:
        tx, ty = torch.from_numpy(a), torch.from_numpy(b)
        run_t = make_runner(
            _FUNCTIONAL, {"relu": torch.relu, "tanh": torch.tanh, "exp": torch.exp}, n
        )
        contenders.append(
            Contender(
                "torch",
                lambda: run_t(tx, ty).numpy(),
                n_ops=n,
                ref=ref,
                note=f"CPU, {torch.get_num_threads()} threads (default)",
            )
        )

    if dask_array is not None:
        da = dask_array
        nd = min(args.dask_ops, n)
        ref_d = numpy_reference(a, b, nd)
        dx = da.from_array(a, chunks=a.shape)
        dy = da.from_array(b, chunks=b.shape)
        run_d = make_runner(_NUMPY, {"maximum": da.maximum, "tanh": da.tanh, "exp": da.exp}, nd)
        phases = {"build": [], "compute": []}

        def dask_fn():
            t0 = time.perf_counter()
            z = run_d(dx, dy)
            t1 = time.perf_counter()
            r = z.compute(scheduler="threads")
            t2 = time.perf_counter()
            phases["build"].append(t1 - t0)
            phases["compute"].append(t2 - t1)
            return r

        dc = Contender(
            "dask (threads)",
            dask_fn,
            n_ops=nd,
            ref=ref_d,
            note=f"{nd}-op chain (graph build + compute); chunks = whole array",
        )
        dc.extra["phases"] = phases
        contenders.append(dc)

    harness.run_rounds(contenders, args.repeat, "chain")

    # Instruction counts of one run each, so the JSON shows the inline path was (not) taken.
    af_default.extra["vm_counts_one_run"] = vm_delta(vm, af_default.fn)
    af_default.extra["dispatch_one_run"] = dispatch_delta(vm, af_default.fn)
    no_inline()
    try:
        af_loop.extra["vm_counts_one_run"] = vm_delta(vm, af_loop.fn)
    finally:
        restore()
    af_prof.extra["trace"] = trace_cost(af, af_default.fn)
    if dask_array is not None:
        ph = dc.extra["phases"]
        dc.extra["best_build_us_per_op"] = min(ph["build"]) / dc.n_ops * 1e6
        dc.extra["best_compute_us_per_op"] = min(ph["compute"]) / dc.n_ops * 1e6

    base = contenders[0]
    rows = {}
    for c in contenders:
        s = c.summary()
        if c.times and base.times:
            s["ratio_vs_numpy"] = s["best_us_per_op"] / base.summary()["best_us_per_op"]
            s["median_ratio_vs_numpy"] = s["median_us_per_op"] / base.summary()["median_us_per_op"]
        rows[c.name] = s
    r = rows["actorflow"].get("ratio_vs_numpy")
    if "torch" in rows and rows["torch"].get("best_us_per_op"):
        rows["actorflow"]["ratio_vs_torch"] = (
            rows["actorflow"]["best_us_per_op"] / rows["torch"]["best_us_per_op"]
        )
        rows["actorflow"]["median_ratio_vs_torch"] = (
            rows["actorflow"]["median_us_per_op"] / rows["torch"]["median_us_per_op"]
        )
    rp = rows["actorflow (profiled)"]
    if af_prof.times and af_default.times:
        rp["ratio_vs_actorflow"] = rp["best_us_per_op"] / rows["actorflow"]["best_us_per_op"]
        rp["median_ratio_vs_actorflow"] = (
            rp["median_us_per_op"] / rows["actorflow"]["median_us_per_op"]
        )
    return {
        "description": f"dependent chain of {n} ops on {size}-element float32 tensors, "
        f"ending in numpy(); per-op time is the comparable figure",
        "chain_ops": n,
        "size": size,
        "dtype": "float32",
        "op_cycle": [list(o) for o in CYCLE],
        "contenders": rows,
        "goal": {
            "actorflow_ratio_vs_numpy_at_most": CHAIN_GOAL,
            "actorflow_ratio": r,
            "met": None if r is None else r <= CHAIN_GOAL,
        },
    }, contenders


def trace_cost(af, fn) -> dict:
    """One more profiled run of ``fn``, outside the clock: the events it recorded and what
    building them (``trace_events.TraceEvents``) and writing the file cost, per event."""
    import tempfile

    from actorflow.vm.profile_events import build_trace

    with af.profile() as prof:
        fn()
    t0 = time.perf_counter()
    trace = build_trace(prof._records, prof._samples, prof.t0, prof._threads)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = trace.write(Path(d) / "chain.json")
        size = path.stat().st_size
    t2 = time.perf_counter()
    n = len(trace)
    return {
        "events": n,
        "build_us_per_event": (t1 - t0) / max(n, 1) * 1e6,
        "write_us_per_event": (t2 - t1) / max(n, 1) * 1e6,
        "file_bytes": size,
    }


# -- workload 2: large elementwise ---------------------------------------------------------


def bench_large(args, af, torch) -> tuple[dict, list]:
    n, size = args.large_ops, args.large_size
    rng = np.random.default_rng(1)
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.random(size).astype(np.float32)
    ref = numpy_reference(a, b, n)
    vm = af.lowlevel.get_vm()
    contenders = []

    np_ns = {"maximum": np.maximum, "tanh": np.tanh, "exp": np.exp}
    run_np = make_runner(_NUMPY, np_ns, n)
    contenders.append(
        Contender(
            "numpy",
            lambda: run_np(a, b),
            n_ops=n,
            ref=ref,
            baseline=True,
            note="single thread, fresh output per op",
        )
    )

    A, B = np.empty_like(a), np.empty_like(a)
    run_out = make_runner(
        _NUMPY_OUT,
        {
            "multiply": np.multiply,
            "add": np.add,
            "subtract": np.subtract,
            "maximum": np.maximum,
            "tanh": np.tanh,
            "exp": np.exp,
        },
        n,
        out_buffers=True,
    )
    contenders.append(
        Contender(
            "numpy out=",
            lambda: run_out(a, b, A, B),
            fetch=np.copy,
            n_ops=n,
            ref=ref,
            baseline=True,
            note="single thread, two preallocated buffers (ping-pong)",
        )
    )

    x, y = af.from_numpy(a), af.from_numpy(b)
    run_af = make_runner(_FUNCTIONAL, {"relu": af.relu, "tanh": af.tanh, "exp": af.exp}, n)

    def af_fn():
        z = run_af(x, y)
        af.synchronize()
        return z

    af_c = Contender(
        "actorflow",
        af_fn,
        fetch=lambda z: z.numpy(),
        n_ops=n,
        ref=ref,
        note=f"{vm.workers} workers, runs of queued ops (ops of >= "
        f"{vm.parallel_min_cost} elements); ends in af.synchronize()",
    )
    contenders.append(af_c)

    if not args.no_diagnostics:
        half = size // 2

        def np_threads():
            out = [None]
            t = threading.Thread(target=lambda: out.__setitem__(0, run_np(a[:half], b[:half])))
            t.start()
            rest = run_np(a[half:], b[half:])
            t.join()
            return np.concatenate([out[0], rest])

        contenders.append(
            Contender(
                "numpy 2 threads",
                np_threads,
                n_ops=n,
                ref=ref,
                note="diagnostic: what two cores give with no runtime (each thread the whole "
                "chain on half of the array, no meeting between ops)",
            )
        )
        no_runs, restore_runs = vm_setting(vm, "fuse_max", 0)
        contenders.append(
            Contender(
                "actorflow (op by op)",
                af_fn,
                fetch=lambda z: z.numpy(),
                n_ops=n,
                ref=ref,
                setup=no_runs,
                teardown=restore_runs,
                note="diagnostic: fuse_max=0, each kernel split across the workers, which meet "
                "after every op",
            )
        )
        no_split, restore = vm_setting(vm, "parallel_min_cost", 1 << 62)
        contenders.append(
            Contender(
                "actorflow (no split)",
                af_fn,
                fetch=lambda z: z.numpy(),
                n_ops=n,
                ref=ref,
                setup=no_split,
                teardown=restore,
                note="diagnostic: parallel_min_cost=2**62, no runs, each kernel whole on one "
                "worker",
            )
        )

    if torch is not None:
        tx, ty = torch.from_numpy(a), torch.from_numpy(b)
        run_t = make_runner(
            _FUNCTIONAL, {"relu": torch.relu, "tanh": torch.tanh, "exp": torch.exp}, n
        )
        contenders.append(
            Contender(
                "torch",
                lambda: run_t(tx, ty),
                fetch=lambda z: z.numpy(),
                n_ops=n,
                ref=ref,
                pause=0.05,
                note=f"CPU, {torch.get_num_threads()} threads (default)",
            )
        )

    alloc0 = af.lowlevel.memory_stats("cpu")
    harness.run_rounds(contenders, args.repeat, "large")
    alloc1 = af.lowlevel.memory_stats("cpu")
    af_c.extra["vm_counts_one_run"] = vm_delta(vm, af_c.fn)
    af_c.extra["allocator"] = {
        "allocs_during_rounds": alloc1.allocs - alloc0.allocs,
        "cached_bytes_after": alloc1.cached,
        "peak_bytes": alloc1.peak,
    }

    rows = {}
    s_np = contenders[0].summary()
    s_out = contenders[1].summary()
    for c in contenders:
        s = c.summary()
        if c.times and contenders[0].times:
            s["ratio_vs_numpy"] = s["best_s"] / s_np["best_s"]
            s["median_ratio_vs_numpy"] = s["median_s"] / s_np["median_s"]
        if c.times and contenders[1].times:
            s["ratio_vs_numpy_out"] = s["best_s"] / s_out["best_s"]
            s["median_ratio_vs_numpy_out"] = s["median_s"] / s_out["median_s"]
        rows[c.name] = s
    r = rows["actorflow"].get("ratio_vs_numpy")
    r_out = rows["actorflow"].get("ratio_vs_numpy_out")
    return {
        "description": f"{n} elementwise ops on {size}-element float32 tensors, fresh output "
        f"per op",
        "ops": n,
        "size": size,
        "dtype": "float32",
        "op_cycle": [list(o) for o in CYCLE],
        "contenders": rows,
        "goal": {
            "actorflow_ratio_vs_numpy_at_most": LARGE_GOAL,
            "actorflow_ratio_vs_numpy": r,
            "met_vs_numpy": None if r is None else r <= LARGE_GOAL,
            "actorflow_ratio_vs_numpy_out": r_out,
            "met_vs_numpy_out": None if r_out is None else r_out <= LARGE_GOAL,
        },
    }, contenders


# -- reporting -----------------------------------------------------------------------------


def print_table(title, rows, ratio_keys, goal_line):
    print()
    print(title)
    Col = harness.Column
    harness.print_table(
        rows,
        [
            Col("ops", 7, "n_ops"),
            Col("best ms", 10, "best_s", ".2f", 1e3),
            Col("median ms", 11, "median_s", ".2f", 1e3),
            Col("us/op", 10, "best_us_per_op", ".2f"),
        ]
        + [Col(label, 13, key, ".2f", suffix="x") for label, key in ratio_keys],
        24,
        notes=True,
    )
    print("  " + goal_line)


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "small sizes for a smoke run")
    p.add_repeat(7, 3)
    p.add_out("bench_eager")
    p.add_sized("--chain-ops", 10_000, 2000, "default {full}, quick {quick}")
    p.add_argument("--chain-size", type=int, default=1000, help="elements (default 1000)")
    p.add_sized("--dask-ops", 500, 100, "chain length for dask (default {full}, quick {quick})")
    p.add_sized("--large-ops", 100, 20, "default {full}, quick {quick}")
    p.add_sized("--large-size", 1_000_000, 1_000_000, "elements (default {full}, quick {quick})")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-dask", action="store_true")
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the diagnostic 'actorflow (no split)' row of the large workload",
    )
    args = p.parse_args(argv)
    q = args.quick
    if args.repeat < 1:
        p.error("--repeat must be >= 1")

    t_start = time.perf_counter()
    torch = None if args.no_torch else harness.try_import("torch")
    dask = None if args.no_dask else harness.try_import("dask")
    dask_array = None
    if dask is not None:
        try:
            import dask.array as dask_array
        except Exception:  # noqa: BLE001
            dask, dask_array = None, None

    import actorflow as af

    vm = af.lowlevel.get_vm()

    load_before = harness.loadavg()
    cc = harness.CpuContention()
    chain, chain_c = bench_chain(args, af, torch, dask_array)
    chain["cpu_contention"] = cc.result()
    cc = harness.CpuContention()
    large, large_c = bench_large(args, af, torch)
    large["cpu_contention"] = cc.result()
    env = environment(torch, dask, vm)

    print_table(
        f"Dependent chain: {chain['chain_ops']} ops on {chain['size']}-element float32 "
        f"(best of {args.repeat}; ratio = us/op vs numpy)",
        chain["contenders"],
        [("vs numpy", "ratio_vs_numpy")],
        f"goal: actorflow <= {CHAIN_GOAL:g}x numpy -> "
        f"{harness.fmt(chain['goal']['actorflow_ratio'], '.2f')}x "
        f"({'MET' if chain['goal']['met'] else 'NOT MET'})",
    )
    ra = chain["contenders"]["actorflow"]
    if ra.get("ratio_vs_torch") is not None or ra.get("dispatch_one_run"):
        d = ra.get("dispatch_one_run")
        print(
            f"  dispatch: actorflow {harness.fmt(ra.get('ratio_vs_torch'), '.2f')}x torch per op "
            f"(median {harness.fmt(ra.get('median_ratio_vs_torch'), '.2f')}x)"
            + (
                f"; one run: {d['op_calls']} VM calls, {d['decided']} signatures decided "
                f"(the rest cache hits), {d['uncached']} calls uncached"
                if d
                else ""
            )
        )
    rp = chain["contenders"]["actorflow (profiled)"]
    if rp.get("ratio_vs_actorflow") is not None:
        tr = rp["trace"]
        print(
            f"  af.profile: {rp['ratio_vs_actorflow']:.2f}x the unprofiled actorflow row "
            f"(+{rp['best_us_per_op'] - chain['contenders']['actorflow']['best_us_per_op']:.2f}"
            f" us/op recording); its trace: {tr['events']} events, "
            f"{tr['build_us_per_event']:.1f} us/event to build, "
            f"{tr['write_us_per_event']:.1f} us/event to write"
        )
    g = large["goal"]
    print_table(
        f"Large elementwise: {large['ops']} ops on {large['size']:,}-element float32 "
        f"(best of {args.repeat}; ratio = total time)",
        large["contenders"],
        [("vs numpy", "ratio_vs_numpy"), ("vs np out=", "ratio_vs_numpy_out")],
        f"goal: actorflow <= {LARGE_GOAL:g}x numpy -> "
        f"{harness.fmt(g['actorflow_ratio_vs_numpy'], '.2f')}x vs numpy fresh "
        f"({'MET' if g['met_vs_numpy'] else 'NOT MET'}), "
        f"{harness.fmt(g['actorflow_ratio_vs_numpy_out'], '.2f')}x vs numpy out= "
        f"({'MET' if g['met_vs_numpy_out'] else 'NOT MET'})",
    )
    env["loadavg_1min_before"] = load_before
    for name, w in (("chain", chain), ("large", large)):
        harness.print_contention(w["cpu_contention"], f"[{name}] ")
    print()
    print(
        f"env: {env['cpu_count']} CPUs (affinity {env['cpu_affinity']}), python "
        f"{env['python']}, numpy {env['numpy']}, torch {env['torch']} "
        f"({env['torch_num_threads']} threads), dask {env['dask']}, uvloop installed "
        f"{env['uvloop_installed']}, VM loop {env['vm_event_loop']}"
    )

    result = harness.document(
        "bench_eager",
        argv,
        q,
        f"np.allclose(result, numpy_result, rtol={RTOL}, atol={ATOL}) on every run",
        repeat=args.repeat,
    )
    return harness.finish(
        args.out,
        result,
        chain_c + large_c,
        t_start,
        env,
        "computed a wrong result",
        rest={"chain": chain, "large": large},
    )


if __name__ == "__main__":
    sys.exit(main())
