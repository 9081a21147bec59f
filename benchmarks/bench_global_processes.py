#!/usr/bin/env python
"""Global tensors on process ranks (each rank a worker process) against inline ranks.

Rows (best of ``--repeat`` after a warm-up; BLAS pinned to one thread in every process, set
before numpy loads, so the ranks' parallelism is the processes'):

- ``tiny op``: ``y = x + 1`` on a [2, 2] float32 tensor split over 2 ranks, issued
  ``--ops`` times with one read at the end: the time per op (the controller's cost; the
  workers compute behind it), and ``tiny op, read each``: each op read back (a round trip
  to both workers);
- ``matmul``: ``a @ b``, [N, N] @ [N, N] float32 (N = ``--n``, 2048), ``a`` split on dim 0
  and ``b`` broadcast over 2 ranks, waited for on the ranks (the result stays there), and
  the same with the result read back whole; against one local matmul;
- ``matmul local``: the same product, one eager tensor (the runtime cuts it into slices
  for its CPU threads), and numpy's on one thread;
- ``matmul halves in 2 bare numpy processes``: the limit the machine sets at the time;
- ``put`` / ``get``: a [N, N] float32 tensor (16 MiB) to broadcast on 2 ranks (one copy to
  each) and read back from one;
- ``all-reduce``: a [N, N] float32 partial sum made broadcast (P -> B) on 2 ranks;
- ``dp step`` (``--what dp``): data parallelism, the eager training step (forward, backward,
  SGD with momentum) of an MLP 1024-2048-2048-10 on a batch of 512, the model broadcast on
  2 process ranks and the batch split on dim 0 (the gradients' all-reduce is boxing's),
  against the same step in one process; with the CPU seconds each process spent per step
  (the controller's and each worker's, from ``/proc``): on a machine shared with other
  work the wall times vary, the CPU times much less.

Usage::

    python benchmarks/bench_global_processes.py [--what all|ops|dp] [--n 2048] [--ops 2000]
        [--repeat 3] [--steps 5]
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import actorflow as af  # noqa: E402
from actorflow.parallel import ranks_of, use_ranks  # noqa: E402


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _half(args: tuple) -> float:
    a, b = args
    a @ b  # (warm)
    t = time.perf_counter()
    a @ b
    return time.perf_counter() - t


def ceiling(A: np.ndarray, Bm: np.ndarray) -> float:
    """Seconds for two bare numpy processes each computing half of ``A @ Bm`` at once (the
    machine's own limit for two ranks, their start not counted)."""
    import multiprocessing as mp

    half = A.shape[0] // 2
    with mp.get_context("fork").Pool(2) as pool:
        return max(pool.map(_half, [(A[:half], Bm), (A[half:], Bm)]))


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has spent so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dp_kind(kind: str, x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tuple:
    """(best seconds per step, CPU seconds per step of each process, the last loss) of the
    step on one process (``local``) or on 2 process ranks."""
    from actorflow import nn

    af.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    loss_fn = nn.CrossEntropyLoss()
    p = af.placement("cpu", ranks=2)
    with use_ranks("processes"):
        xs, ys = af.tensor(x), af.tensor(y)
        if kind == "processes":
            model.to_global(p)
            xs, ys = xs.to_global(p, af.sbp.split(0)), ys.to_global(p, af.sbp.split(0))
        opt = af.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        first = model[0].weight

        def step() -> Any:
            opt.zero_grad()
            loss = loss_fn(model(xs), ys)
            loss.backward()
            opt.step()
            first.sum().item()  # (the step done everywhere: the update read)
            return loss

        loss = step()
        pids = [os.getpid()] + (ranks_of(p).pids if kind == "processes" else [])
        walls, cpus = [], []
        for _ in range(args.repeat):
            c0 = [cpu_seconds(q) for q in pids]
            t = time.perf_counter()
            for _ in range(args.steps):
                loss = step()
            walls.append((time.perf_counter() - t) / args.steps)
            cpus.append([(cpu_seconds(q) - c) / args.steps for q, c in zip(pids, c0, strict=True)])
        last = float(loss.item())
        if kind == "processes":
            ranks_of(p).close()
    return min(walls), cpus[walls.index(min(walls))], last


def dp_step(args: argparse.Namespace) -> None:
    """The data-parallel training step, one process against 2 process ranks."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 1024)).astype(np.float32)
    y = rng.integers(0, 10, 512)
    rows = [(kind, *_dp_kind(kind, x, y, args)) for kind in ("local", "processes")]
    for kind, wall, cpu, loss in rows:
        who = "this process"
        if len(cpu) > 1:
            who = "controller, " + ", ".join(f"rank {r}" for r in range(len(cpu) - 1))
        cpus = " + ".join(f"{1e3 * c:.0f}" for c in cpu)
        print(f"dp step, {kind:10s} {1e3 * wall:8.1f} ms/step  loss {loss:.6f}")
        print(f"    CPU ms/step ({who}): {cpus}")
    (_, local, _, l0), (_, procs, _, l1) = rows
    assert abs(l0 - l1) < 1e-3 * max(1.0, abs(l0)), (l0, l1)
    print(f"speedup of 2 process ranks over one process: {local / procs:.2f}x")
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", choices=("all", "ops", "dp"), default="all")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    if args.what in ("all", "dp"):
        dp_step(args)
        if args.what == "dp":
            return
    p = af.placement("cpu", ranks=2)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((args.n, args.n)).astype(np.float32)
    Bm = rng.standard_normal((args.n, args.n)).astype(np.float32)
    rows = []
    for kind in ("inline", "processes"):
        with use_ranks(kind):
            ranks = ranks_of(p)
            sync = ranks.synchronize if kind == "processes" else af.synchronize
            x = af.tensor(np.ones((2, 2), np.float32)).to_global(p, af.sbp.split(0))

            def tiny(x=x):
                for _ in range(args.ops):
                    y = x + 1
                y.numpy()

            def tiny_read(x=x):
                for _ in range(args.ops // 10):
                    (x + 1).numpy()

            rows.append((f"tiny op, {kind}", best(tiny, args.repeat) / args.ops * 1e6, "us/op"))
            rows.append(
                (
                    f"tiny op read each, {kind}",
                    best(tiny_read, args.repeat) / (args.ops // 10) * 1e6,
                    "us/op",
                )
            )
            a = af.tensor(A).to_global(p, af.sbp.split(0))
            b = af.tensor(Bm).to_global(p, af.sbp.broadcast)
            sync()
            out: list = []

            def mm(a=a, b=b, sync=sync, out=out):
                out[:] = [a @ b]
                sync()

            rows.append((f"matmul S(0)xB on 2 ranks, {kind}", best(mm, args.repeat) * 1e3, "ms"))
            rows.append(
                (
                    f"matmul S(0)xB + read whole, {kind}",
                    best(lambda a=a, b=b: (a @ b).numpy(), args.repeat) * 1e3,
                    "ms",
                )
            )
            assert np.allclose(out[0].numpy(), A @ Bm, rtol=1e-3, atol=1e-2)
            t = af.tensor(A)
            rows.append(
                (
                    f"put 16 MiB to B on 2 ranks, {kind}",
                    best(lambda t=t, sync=sync: (t.to_global(p, af.sbp.broadcast), sync()), 3)
                    * 1e3,
                    "ms",
                )
            )
            rows.append(
                (
                    f"get 16 MiB from a B tensor, {kind}",
                    best(lambda b=b: b.numpy(), 3) * 1e3,
                    "ms",
                )
            )
            part = af.tensor(A).to_global(p, af.sbp.partial_sum)
            sync()

            def all_reduce(part=part, sync=sync, out=out):
                out[:] = [part.to_global(sbp=af.sbp.broadcast)]
                sync()

            rows.append(
                (f"all-reduce 16 MiB P -> B, {kind}", best(all_reduce, args.repeat) * 1e3, "ms")
            )
    la, lb = af.tensor(A), af.tensor(Bm)
    keep: list = []

    def local_mm() -> None:
        keep[:] = [la @ lb]
        af.synchronize()

    rows.append(("matmul local, eager", best(local_mm, args.repeat) * 1e3, "ms"))
    rows.append(("matmul local, numpy (1 thread)", best(lambda: A @ Bm, args.repeat) * 1e3, "ms"))
    for name, v, unit in rows:
        print(f"{name:45s} {v:10.2f} {unit}")
    rows.append(("matmul halves in 2 bare numpy processes", ceiling(A, Bm) * 1e3, "ms"))
    for name, v, unit in rows[-1:]:
        print(f"{name:45s} {v:10.2f} {unit}")
    proc = [v for n, v, _ in rows if n == "matmul S(0)xB on 2 ranks, processes"][0]
    print(f"speedup of 2 process ranks over numpy's matmul: {rows[-2][1] / proc:.2f}x")
    print(f"speedup of 2 process ranks over eager's matmul: {rows[-3][1] / proc:.2f}x")
    print(f"speedup of 2 bare processes over numpy's matmul: {rows[-2][1] / rows[-1][1]:.2f}x")
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
    with use_ranks("processes"):
        ranks_of(p).close()


if __name__ == "__main__":
    main()
