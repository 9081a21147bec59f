#!/usr/bin/env python
"""Per-op cost of a dependent chain on cuda:0, on the CUDA emulator (no GPU needed).

The workload: a chain of dependent elementwise ops (2,000 by default) on a 1,000-element
float32 tensor on ``cuda:0`` (each op reads the one before), ending in ``numpy()``, checked
against numpy. It measures what the VM costs per op when the device's driver runs the work:
how the eager VM issues work on a driver stream and learns of its completion, in wall time
and in CPU time of all the process's threads (steadier on a loaded machine). The emulator
runs each kernel's numpy reference on its stream's thread, so the figure is the host's cost
and the overlap of issuing with running, not a GPU's kernel time (``bench_gpu.py`` on a GPU
machine gives those).

Two ways to run it:

- alone: the chain with the actorflow this Python imports, best of ``--repeat`` rounds after
  one untimed warm-up;
- ``--against PATH``: the same chain in child processes, alternately with the actorflow at
  ``PATH`` (e.g. a checkout of main: the baseline) and this repository's, ``--runs`` times
  each, interleaved; prints each run, the best and median of each side and their ratios
  (baseline / this), and writes them to the JSON.

Usage::

    python benchmarks/bench_cuda_emu.py
    python benchmarks/bench_cuda_emu.py --against /path/to/main --runs 3
    python benchmarks/bench_cuda_emu.py --quick --out /tmp/cuda_emu.json

Exit status: 0 when every run matched numpy, 1 otherwise (the JSON is written either way).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

FACTOR = np.float32(1.0001)
SIZE = 1000


def chain_per_op(n: int, repeat: int) -> dict:
    """Best and median us per op of ``repeat`` timed chains of ``n`` ops (after one untimed
    warm-up), and whether every result matched numpy."""
    import actorflow as af
    from actorflow.backends.cuda.emu import EmuDriver
    from actorflow.backends.cuda.selection import use_driver

    use_driver(lambda dev: EmuDriver(dev))
    expected = np.ones(SIZE, np.float32)
    for _ in range(n):
        expected = expected * FACTOR
    times, cpu, ok = [], [], True
    for r in range(repeat + 1):
        x = af.ones(SIZE, device="cuda:0")
        af.synchronize(60)
        c0, t0 = time.process_time(), time.perf_counter()
        y = x
        for _ in range(n):
            y = y * FACTOR
        got = y.numpy()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        ok = ok and np.allclose(got, expected, rtol=1e-4)
        del x, y
        if r:
            times.append(t / n * 1e6)
            cpu.append(c / n * 1e6)
    af.synchronize(60)
    return {
        "us_per_op_best": min(times),
        "us_per_op_median": statistics.median(times),
        "us_per_op_runs": times,
        "cpu_us_per_op_best": min(cpu),
        "cpu_us_per_op_runs": cpu,
        "ok": ok,
        "actorflow": str(Path(af.__file__).parent),
    }


def compare(against: str, runs: int, n: int, repeat: int) -> dict:
    """``runs`` child runs with the actorflow at ``against`` and as many with this
    repository's, interleaved; each child times the chain ``repeat`` times."""
    sides = {"baseline": against, "this": str(harness.REPO)}
    results: dict = {k: [] for k in sides}
    for i in range(runs):
        order = list(sides) if i % 2 == 0 else list(sides)[::-1]
        for side in order:
            env = dict(os.environ, PYTHONPATH=sides[side])
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--n", str(n), "--repeat", str(repeat)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode:
                raise RuntimeError(f"the {side} run failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[side].append(r)
            print(
                f"run {i + 1} {side:8s} {r['us_per_op_best']:8.2f} us/op best, "
                f"{r['cpu_us_per_op_best']:6.2f} us CPU/op (all threads) "
                f"({r['actorflow']}) {'ok' if r['ok'] else 'WRONG'}"
            )
    summary = {}
    for side, rs in results.items():
        bests = [r["us_per_op_best"] for r in rs]
        cpus = [r["cpu_us_per_op_best"] for r in rs]
        summary[side] = {
            "path": sides[side],
            "us_per_op_best": min(bests),
            "us_per_op_median": statistics.median(bests),
            "cpu_us_per_op_best": min(cpus),
            "runs": rs,
            "ok": all(r["ok"] for r in rs),
        }
    b, t = summary["baseline"], summary["this"]
    summary["ratio_best"] = b["us_per_op_best"] / t["us_per_op_best"]
    summary["ratio_median"] = b["us_per_op_median"] / t["us_per_op_median"]
    summary["ratio_cpu"] = b["cpu_us_per_op_best"] / t["cpu_us_per_op_best"]
    print(
        f"baseline {b['us_per_op_best']:.2f} us/op, this {t['us_per_op_best']:.2f} us/op: "
        f"{summary['ratio_best']:.2f}x (best), {summary['ratio_median']:.2f}x (median); "
        f"CPU per op {summary['ratio_cpu']:.2f}x"
    )
    return summary


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "a shorter chain and fewer rounds")
    p.add_sized("--n", 2000, 300, "ops in the chain; default {full}, quick {quick}")
    p.add_repeat(5, 2)
    p.add_sized("--runs", 3, 1, "child runs per side with --against; default {full}, quick {quick}")
    p.add_argument("--against", help="the actorflow checkout to compare with (its root)")
    p.add_argument("--child", action="store_true", help=argparse_suppress())
    p.add_out("bench_cuda_emu")
    args = p.parse_args(argv)
    if args.child:  # (PYTHONPATH says which actorflow)
        print(json.dumps(chain_per_op(args.n, args.repeat)))
        return 0
    if not os.environ.get("PYTHONPATH"):
        sys.path.insert(1, str(harness.REPO))  # this repository's, alone
    t_start = time.perf_counter()
    result = harness.document(
        "bench_cuda_emu",
        argv,
        args.quick,
        "each chain's numpy() against numpy (rtol 1e-4)",
        n=args.n,
        size=SIZE,
        repeat=args.repeat,
        runs=args.runs,
    )
    if args.against:
        out = compare(args.against, args.runs, args.n, args.repeat)
        ok = out["baseline"]["ok"] and out["this"]["ok"]
    else:
        out = chain_per_op(args.n, args.repeat)
        ok = out["ok"]
        print(
            f"chain of {args.n} on cuda:0 (emulator): {out['us_per_op_best']:.2f} us/op "
            f"best, {out['us_per_op_median']:.2f} median"
        )
    result.update(
        chain=out,
        all_checks_ok=ok,
        wall_time_s=time.perf_counter() - t_start,
        environment=harness.environment(),
    )
    harness.write(args.out, result, result["wall_time_s"])
    return 0 if ok else 1


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
