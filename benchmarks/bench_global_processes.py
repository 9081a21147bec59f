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
  each) and read back from one.

Usage::

    python benchmarks/bench_global_processes.py [--n 2048] [--ops 2000] [--repeat 3]
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import time  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
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
