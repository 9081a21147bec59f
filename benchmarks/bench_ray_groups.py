#!/usr/bin/env python
"""Groups of cheap stages on Ray: what sharing one Ray actor process (and one Ray call per
batch, fused) buys against a process per stage.

The workload: a source of ``--pieces`` float32 arrays of ``--size`` elements (64 KiB by
default), three cheap numpy stages in a chain (decode: ``x * 0.5 + 1``; crop: a roll;
normalize: ``(x - mean) / (std + 1e-6)``, each well under a millisecond), then a
pure-Python (GIL-bound) stage calibrated to ~5 ms per piece with ``replicas=2``, sunk.
Contenders, all on one local Ray cluster (2 CPUs, started once), interleaved round by
round after an untimed warm-up round, best of ``--repeat`` (the median is recorded too):

- ``local``: ``g.run()`` in this process (thread stages; the GIL serialises them);
- ``ray, a process per stage``: ``RayEngine(keep_workers=True)``, default placement: each
  cheap stage a Ray actor process of its own, the source read on the driver;
- ``ray, grouped, fuse=False``: ``groups={"light": [decode, crop, normalize]}``, one
  process for the three, a Ray call per stage and batch;
- ``ray, grouped, fused``: the same with ``fuse=True`` (the default): one call per batch
  for the chain;
- ``ray, grouped with the source``: ``groups={"io": [load, decode, crop, normalize]}``:
  the source is read in the group's process, not on the driver.

Every Ray engine keeps its processes (``keep_workers=True``, made before the rounds, warm
after round 0): this measures the steady state, not the processes' start. Each process
asks 1/8 CPU in placement= so that all four engines' kept processes fit the 2 CPUs. Every run's
outputs are checked equal (``np.array_equal``, every piece) to the local run's. Recorded per
contender: pieces/s, ratios against local and against a process per stage, the Ray actor
processes used (distinct pids of the stages, and of the source where a group hosts it)
and the sum of ``fused_acts``.

Usage::

    python benchmarks/bench_ray_groups.py              # ~1 min on 2 cores (Ray start included)
    python benchmarks/bench_ray_groups.py --quick      # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ray  # noqa: E402 - after the sys.path inserts
from bench_ray import calibrate, preprocess  # noqa: E402 - the calibrated Python stage
from harness import environment, write  # noqa: E402 - after the sys.path inserts

import actorflow as af  # noqa: E402 - after the sys.path inserts

CHEAP = ["decode", "crop", "normalize"]


def decode(x):
    return x * np.float32(0.5) + np.float32(1)


def crop(x):
    return np.roll(x, 64)


def normalize(x):
    return ((x - x.mean()) / (x.std() + 1e-6)).astype(np.float32)


def cheap_cost(size: int) -> dict:
    """Seconds per piece of each cheap stage, alone in this process."""
    x = np.arange(size, dtype=np.float32)
    out = {}
    for fn in (decode, crop, normalize):
        fn(x)
        t = time.perf_counter()
        for _ in range(200):
            fn(x)
        out[fn.__name__] = (time.perf_counter() - t) / 200
    return out


def graph(pieces: int, size: int):
    spec = af.Spec((size,), af.float32)

    def read():  # a zero-argument function: it pickles to a Ray process
        return (
            np.full(size, i % 97, np.float32) + np.arange(size, dtype=np.float32)
            for i in range(pieces)
        )

    g = af.ActorGraph()
    x = g.source(read, name="load", out=spec)
    for fn in (decode, crop, normalize):
        x = g.actor(fn, x, name=fn.__name__, out=spec)
    g.sink(g.actor(preprocess, x, name="preprocess", replicas=2, out=spec))
    return g


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--pieces", type=int, default=None)
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=None)
    p.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "bench_ray_groups.json")
    )
    args = p.parse_args(argv)
    pieces = args.pieces or (60 if args.quick else 240)
    repeat = args.repeat or (1 if args.quick else 3)
    import ray

    # bench_ray's functions go to the Ray processes by value, with the calibration made
    # here (by reference they would be imported there, uncalibrated)
    ray.cloudpickle.register_pickle_by_value(bench_ray)
    t_start = time.perf_counter()
    stage_s = calibrate()
    cheap_s = cheap_cost(args.size)
    ray.shutdown()
    af.distributed.RayEngine(init={"num_cpus": 2}).start()
    nbytes = args.size * 4

    reference = list(graph(pieces, args.size).run())

    def check(name, outs):
        assert len(outs) == len(reference), (name, len(outs))
        for i, (a, b) in enumerate(zip(outs, reference, strict=True)):
            assert np.array_equal(np.asarray(a), b), f"{name}: piece {i} differs from local"

    # the four engines' kept processes (14) live side by side: each asks 1/8 CPU (a
    # scheduling label, it does not slow anything), else the automatic equal share of
    # the first engine's run would hold the cluster's 2 CPUs and the others could not start
    def engine(units, **kw):
        return af.distributed.RayEngine(
            keep_workers=True,
            **kw,
            placement={u: {"num_cpus": 0.125} for u in units + ["preprocess"]},
        )

    engines = {
        "ray, a process per stage": engine(CHEAP),
        "ray, grouped, fuse=False": engine(["light"], groups={"light": CHEAP}, fuse=False),
        "ray, grouped, fused": engine(["light"], groups={"light": CHEAP}),
        "ray, grouped with the source": engine(["io"], groups={"io": ["load"] + CHEAP}),
    }
    graphs = {k: graph(pieces, args.size) for k in engines}  # kept processes: per graph
    graphs["local"] = graph(pieces, args.size)
    contenders = ["local"] + list(engines)
    times = {k: [] for k in contenders}
    procs, fused = {}, {}
    for r in range(repeat + 1):  # round 0: untimed warm-up
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for name in order:
            g = graphs[name]
            t = time.perf_counter()
            outs = list(g.run(engine=engines.get(name)))
            dt = time.perf_counter() - t
            check(name, outs)
            if name != "local":
                rows = g.stats().actors
                hosted = (
                    set(rows)
                    if "load" in engines[name].groups.get("io", [])
                    else set(rows) - {"load"}
                )
                procs[name] = len({pid for n in hosted for pid in rows[n]["processes"]})
                fused[name] = sum(rows[n]["fused_acts"] for n in rows)
            if r:
                times[name].append(dt)
        print(
            f"[ray groups] round {r}/{repeat}: "
            + ", ".join(f"{k}={times[k][-1] * 1e3:.0f}ms" for k in contenders if r and times[k]),
            flush=True,
        )
    for eng in engines.values():  # the kept processes end here
        eng.close()

    # smoke checks: the grouping and fusion did what they say
    assert procs["ray, a process per stage"] == 5, procs  # 3 cheap + 2 replicas
    assert procs["ray, grouped, fuse=False"] == 3, procs  # 1 group + 2 replicas
    assert procs["ray, grouped, fused"] == 3, procs
    assert procs["ray, grouped with the source"] == 3, procs  # the source in the group's
    assert fused["ray, a process per stage"] == 0 and fused["ray, grouped, fuse=False"] == 0
    assert fused["ray, grouped, fused"] > 0 and fused["ray, grouped with the source"] > 0

    best = {k: min(v) for k, v in times.items()}
    rate = {k: pieces / v for k, v in best.items()}
    apart = rate["ray, a process per stage"]
    alone = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in cheap_s.items())
    print(
        f"\n3 cheap numpy stages ({alone} per piece alone) then a pure-Python stage "
        f"({stage_s * 1e3:.2f} ms per piece, "
        f"replicas=2), {pieces} pieces of {nbytes // 1024} KiB, 2 CPUs, kept processes, "
        f"best of {repeat}"
    )
    print(
        f"  {'contender':<30} {'best ms':>8} {'median ms':>10} {'pieces/s':>9} "
        f"{'vs local':>9} {'vs apart':>9} {'Ray procs':>10} {'fused acts':>11}"
    )
    rows = {}
    for k in contenders:
        med = statistics.median(times[k])
        rows[k] = {
            "best_s": best[k],
            "median_s": med,
            "pieces_per_s": rate[k],
            "pieces_per_s_median": pieces / med,
            "vs_local": rate[k] / rate["local"],
            "vs_process_per_stage": rate[k] / apart,
            "ray_processes": procs.get(k, 0),
            "fused_acts": fused.get(k, 0),
        }
        print(
            f"  {k:<30} {best[k] * 1e3:>8.0f} {med * 1e3:>10.0f} {rate[k]:>9.1f} "
            f"{rows[k]['vs_local']:>8.2f}x {rows[k]['vs_process_per_stage']:>8.2f}x "
            f"{rows[k]['ray_processes']:>10} {rows[k]['fused_acts']:>11}"
        )
    result = {
        "benchmark": "bench_ray_groups",
        "argv": sys.argv[1:] if argv is None else argv,
        "pieces": pieces,
        "piece_bytes": nbytes,
        "stage_s": stage_s,
        "cheap_stage_s": cheap_s,
        "repeat": repeat,
        "contenders": rows,
        "env": environment({"ray": ray.__version__}),
        "wall_s": time.perf_counter() - t_start,
    }
    write(Path(args.out), result, result["wall_s"])
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
