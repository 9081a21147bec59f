#!/usr/bin/env python
"""Pipeline parallelism: ``nn.Graph(stages=[s0, s1], micro_batches=M)`` against the same
model trained eagerly in one process, and the 1F1B timeline picture.

The model: four ``Linear(2048, 2048)`` layers with a ReLU between them, cut into two
stages of two layers, trained with SGD on an MSE loss, batch 512 (a compute-bound step:
each layer's forward is a 512x2048x2048 matmul, ~4.3 GFLOP). Contenders, per BLAS setting:

- ``eager``: one process, one eager step per batch on the whole batch (the reference);
- ``eager M=4``, ``M=8``: one process, the batch's micro-batches one after another, their
  gradients accumulated: the pipeline's work without its overlap (smaller matmuls, a
  gradient sum per micro-batch);
- ``pipeline M=4``, ``M=8``: the pipeline graph with 1F1B's registers (the default,
  ``stage_buffers=[2, 1]``), a batch cut into M micro-batches;
- ``gpipe M=8``: the same with every micro-batch held (``stage_buffers=[8, 8]``).

Each runs ``--batches`` timed batches after one untimed; the table shows seconds per batch
(the best of ``--repeat`` rounds, rounds interleaved) and the ratio to eager. BLAS is
pinned to one thread (``OPENBLAS_NUM_THREADS=1`` and friends, in a child process: they must
be set before numpy loads) and left unpinned (the machine's cores).

The bubble: from the trace of the last timed batch of each pipeline run, per stage, the
fraction of the batch's span (first act's start to last act's end) its forward and
backward actors were not acting, against GPipe's ``(p - 1) / (M + p - 1)`` for p stages
(the idle fraction of a stage when forward and backward times are equal and nothing
else costs). Stages here are threads sharing one interpreter lock: two stages overlap only
where their kernels release it (numpy's matmul does; actorflow's eager op dispatch,
autograd's bookkeeping and the copies between registers do not), so the bubble measured
counts the lock's waits as acting, and the speed-up is bounded by how much of a step is
in BLAS. Stages in worker processes (``stage_ranks=``) are in ``bench_parallel.py``.

``--picture PATH`` draws the 1F1B timeline of one batch (a 3-stage cut of a smaller model,
M = 8, so the warm-up, the alternation and the drain are visible) with
``af.plot_timeline`` into PATH (``docs/pipeline_1f1b.png``); with ``--stage-ranks
processes`` the same with each stage in a worker process of its own
(``docs/pipeline_1f1b_processes.png``), and with ``--in-workers`` too the graph given its
loss as ``loss=``, so the workers run each batch among themselves
(``docs/pipeline_1f1b_in_workers.png``).

Usage::

    python benchmarks/bench_pipeline_parallel.py                 # both BLAS settings
    python benchmarks/bench_pipeline_parallel.py --quick         # 1 batch, 1 round
    python benchmarks/bench_pipeline_parallel.py --picture docs/pipeline_1f1b.png --no-bench
    python benchmarks/bench_pipeline_parallel.py --picture docs/pipeline_1f1b_processes.png \
        --stage-ranks processes --no-bench
    python benchmarks/bench_pipeline_parallel.py --picture docs/pipeline_1f1b_in_workers.png \
        --stage-ranks processes --in-workers --no-bench

Writes ``benchmarks/results/pipeline_parallel.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pipeline_parallel.json"
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def model(width: int, layers: int, stages: int):
    """``layers`` Linear(width, width) with ReLU between, cut into ``stages`` equal parts."""
    from actorflow import nn

    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i < layers - 1:
            mods.append(nn.ReLU())
    per = len(mods) // stages + (1 if len(mods) % stages else 0)
    return [nn.Sequential(*mods[i : i + per]) for i in range(0, len(mods), per)]


def batches(n: int, rows: int, width: int, seed: int = 0) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((rows, width)).astype(np.float32),
            rng.standard_normal((rows, width)).astype(np.float32),
        )
        for _ in range(n)
    ]


def pipeline_graph(stages, m: int, buffers=None, ranks=None, in_workers=False):
    from actorflow import nn, optim

    class InWorkers(nn.Graph):
        def __init__(self):
            super().__init__(
                stages=stages,
                micro_batches=m,
                stage_buffers=buffers,
                stage_ranks=ranks,
                loss=nn.MSELoss(),
            )
            self.add_optimizer(optim.SGD([p for s in stages for p in s.parameters()], lr=1e-3))

    if in_workers:
        return InWorkers()

    class Pipe(nn.Graph):
        def __init__(self):
            super().__init__(
                stages=stages, micro_batches=m, stage_buffers=buffers, stage_ranks=ranks
            )
            self.loss = nn.MSELoss()
            self.add_optimizer(optim.SGD([p for s in stages for p in s.parameters()], lr=1e-3))

        def build(self, out, y):
            return self.loss(out, y)

    return Pipe()


def eager_seconds(stages, data, m: int = 1) -> float:
    """Seconds per eager step in one process; ``m`` > 1: the batch's micro-batches one
    after another, their gradients accumulated (the pipeline's work without its overlap)."""
    import numpy as np

    import actorflow as af
    from actorflow import nn, optim

    net = nn.Sequential(*stages)
    opt = optim.SGD(net.parameters(), lr=1e-3)
    lossf = nn.MSELoss()

    def step(x, y):
        opt.zero_grad()
        total = 0.0
        for part in np.array_split(np.arange(x.shape[0]), m):
            loss = lossf(net(af.tensor(x[part])), af.tensor(y[part]))
            (loss * (1.0 / m)).backward()
            total += loss.item()
        opt.step()
        return total / m

    step(*data[0])  # (untimed)
    t = time.perf_counter()
    for x, y in data[1:]:
        step(x, y)
    return (time.perf_counter() - t) / (len(data) - 1)


def bubble(trace_path: Path, n_stages: int) -> list:
    """Per stage: 1 - (its actors' acting time) / (the batch's span), from a run trace."""
    evs = json.loads(Path(trace_path).read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    acts = [
        (names[e["tid"]], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in evs
        if e.get("cat") == "act" and names.get(e["tid"], "").startswith("stage")
    ]
    start = min(a[1] for a in acts)
    end = max(a[2] for a in acts)
    out = []
    for i in range(n_stages):
        busy = sum(b - a for n, a, b in acts if n.startswith(f"stage{i}."))
        out.append(round(1 - busy / (end - start), 3))
    return out


def pipeline_seconds(stages, data, m: int, buffers, tmp: Path) -> tuple:
    g = pipeline_graph(stages, m, buffers)
    trace = tmp / f"m{m}_{buffers}.json"
    list(g.run(data[:1]))  # (untimed)
    t = time.perf_counter()
    for _ in g.run(data[1:], trace=trace):
        pass
    dt = (time.perf_counter() - t) / (len(data) - 1)
    k = len(data) - 2
    last = trace if k == 0 else trace.with_name(f"{trace.stem}.{k}{trace.suffix}")
    return dt, bubble(last, len(stages)), list(g.pipelined.peak_held)


def worker(args) -> dict:
    """One BLAS setting: every contender, rounds interleaved."""
    import actorflow as af

    af.manual_seed(0)
    stages = model(args.width, 4, 2)
    data = batches(args.batches + 1, args.rows, args.width)
    rows: dict = {}
    configs = [("eager", 1, "eager"), ("eager M=4", 4, "eager"), ("eager M=8", 8, "eager")]
    configs += [("pipeline M=4", 4, None), ("pipeline M=8", 8, None), ("gpipe M=8", 8, [8, 8])]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for name, m, buffers in configs:
                if buffers == "eager":
                    dt, extra = eager_seconds(stages, data, m), {}
                else:
                    dt, bub, held = pipeline_seconds(stages, data, m, buffers, Path(tmp))
                    p = len(stages)
                    extra = {
                        "bubble_per_stage": bub,
                        "gpipe_bubble": round((p - 1) / (m + p - 1), 3),
                        "peak_held": held,
                    }
                row = rows.setdefault(name, {"seconds": [], **extra})
                row["seconds"].append(round(dt, 4))
                if extra and dt <= min(row["seconds"]):
                    row.update(extra)
    base = min(rows["eager"]["seconds"])
    for row in rows.values():
        row["best_s"] = min(row["seconds"])
        row["speedup_vs_eager"] = round(base / row["best_s"], 3)
    return rows


def picture(path: Path, ranks: str | None = None, in_workers: bool = False) -> None:
    import actorflow as af

    af.manual_seed(0)
    stages = model(1024, 6, 3)
    g = pipeline_graph(stages, 8, ranks=ranks, in_workers=in_workers)
    data = batches(2, 256, 1024)
    where = f", each stage in a worker (stage_ranks={ranks!r})" if ranks else ""
    if in_workers:
        where += ", the workers running the batch among themselves (loss=)"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "run.json"
            list(g.run(data, trace=trace))  # (the second batch: warm)
            af.plot_timeline(
                trace.with_name("run.1.json"),
                path,
                title=f"1F1B: 3 stages, 8 micro-batches, stage i holds at most 3 - i{where}",
            )
        print(f"wrote {path}; per stage, the acts of the batch in order:")
        for i in range(len(stages)):
            acts = [f"{k}{j}" for s, k, j in g.pipelined.acts if s == i]
            print(f"  stage {i}:", " ".join(acts))
        print("  micro-batches held at most per stage:", g.pipelined.peak_held)
    finally:
        g.pipelined.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="1 timed batch, 1 round")
    ap.add_argument("--picture", type=Path, default=None)
    ap.add_argument(
        "--stage-ranks",
        default=None,
        choices=["processes", "ray"],
        help="the picture's stages each in a worker of that kind (stage_ranks=)",
    )
    ap.add_argument(
        "--in-workers",
        action="store_true",
        help="the picture's graph given loss= (with --stage-ranks processes: the workers "
        "run each batch among themselves)",
    )
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.batches, args.repeat = 1, 1
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.picture is not None:
        picture(args.picture, args.stage_ranks, args.in_workers)
    if args.no_bench:
        return 0
    results = {}
    for label, pinned in (("BLAS 1 thread", True), ("BLAS unpinned", False)):
        env = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
        if pinned:
            env.update({k: "1" for k in BLAS_VARS})
        cmd = [sys.executable, __file__, "--worker", "--batches", str(args.batches)]
        cmd += ["--repeat", str(args.repeat), "--rows", str(args.rows), "--width", str(args.width)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        results[label] = rows
        print(f"\n{label} ({os.cpu_count()} cores), batch {args.rows}, width {args.width}:")
        print(f"  {'':14s} {'s/batch':>8s} {'x eager':>8s}  bubble per stage (GPipe's)")
        for name, row in rows.items():
            bub = ""
            if "bubble_per_stage" in row:
                bub = f"  {row['bubble_per_stage']} ({row['gpipe_bubble']})"
            print(f"  {name:14s} {row['best_s']:8.3f} {row['speedup_vs_eager']:8.2f}{bub}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
