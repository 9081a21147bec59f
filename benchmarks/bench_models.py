#!/usr/bin/env python
"""Training real models: a CNN with batch norm and pooling, and a small causal transformer,
actorflow eager, ``nn.Graph.step`` and ``nn.Graph.run`` against PyTorch eager on the CPU,
on the same weights and batches; and the CNN's epoch fed by a loader that decodes PNG
files, pipelined, against the bound max(load, step) x batches.

The models are the examples' (``examples/train_digits_cnn.py``,
``examples/train_tiny_transformer.py``), built here in both frameworks with the same
architecture, so one ``state_dict`` (numpy arrays) loads into either:

- ``cnn``: ``Conv2d(1, 32, 3, padding=1), BatchNorm2d(32), ReLU, MaxPool2d(2),
  Conv2d(32, 64, 3, padding=1), BatchNorm2d(64), ReLU, MaxPool2d(2), Flatten,
  Linear(256, 10)`` on 8x8 one-channel images, batch 64, ``CrossEntropyLoss``, Adam
  (lr 3e-3);
- ``transformer``: a character-level language model: token and position ``Embedding``
  (vocabulary 97, width 64, context 64), two ``TransformerEncoderLayer(64, 4, 256,
  dropout=0, batch_first=True, norm_first=True)`` under a causal mask, ``LayerNorm``,
  ``Linear(64, 97)``; batch 32 sequences, ``CrossEntropyLoss`` over every position, AdamW
  (lr 1e-2, weight decay 0.01).

Part 1, time per training step (zero_grad, forward, loss, backward, step), the same batch
for every contender, each timed run K steps from the same weights and a fresh optimizer
state (reset outside the clock):

- ``pytorch eager``: ``torch.nn`` with the same initial weights, default threads;
- ``actorflow eager``: ``af.nn`` + ``af.optim``, ending with ``loss.item()`` (the last
  update done, not just queued);
- ``actorflow graph``: an ``nn.Graph`` step (loss, backward; the optimizer added), K calls
  of ``step(x, y)``, compiled by an earlier call;
- ``actorflow graph run``: ``step.run(batches)`` over the K batches: an actor per op;
- ``actorflow graph run, fused``: the same with ``fused=True``: the step one op actor.

Checks: every contender's first step's loss equals PyTorch's within 1e-4 relative (once,
outside the clock); every run's last loss is finite and equal (1e-5 relative) to the
contender's warm-up run. Goal (MET / NOT MET): graph mode <= 1.0x PyTorch eager.

Part 2 (``cnn`` only, with the ``examples`` extra: scikit-learn and Pillow), an epoch of
N batches read from the PNG files the example writes once (its ``digits_as_pngs``) by the
example's dataset (``DigitFiles``: each item a file opened and decoded by Pillow, shifted
by a seeded random pixel), batched by an ``af.data.DataLoader`` on ``--workers`` threads
(or, the last row, on as many kept worker processes: ``processes=True``, the batches
written into shared-memory registers) and fed to ``step.run`` (the loader's actors in the
step's graph). Its costs, the load of a batch (the threads loader alone) and ``step()`` on
a batch, are measured alone around the rounds; the bound is ``max(load, step) x N`` (the
processes row can land under it: its load alone is not the threads loader's). Goal: the
pipelined epoch within 1.15x of it. Without the extra, part 2 is skipped (said in the
output).

Usage::

    python benchmarks/bench_models.py                # both models and the epoch
    python benchmarks/bench_models.py --quick        # a smoke run
    python benchmarks/bench_models.py --model cnn --steps 20 --out /tmp/m.json

Exit status: 0 when every run of every contender was correct, 1 otherwise (the JSON is
written either way).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file
from trainers import AfTrainer, LossChecks, TorchTrainer, rel  # noqa: E402 - next to this file

SEED = 0
GRAPH_VS_TORCH = 1.0  # graph mode per step <= 1.0x PyTorch eager
PIPE_VS_BOUND = 1.15  # pipelined epoch <= 1.15x max(load, step) x N
FIRST_LOSS_RTOL = 1e-4
REPEAT_RTOL = 1e-5

CNN_BATCH, CNN_CLASSES = 64, 10
VOCAB, WIDTH, HEADS, FF, CONTEXT, LAYERS, LM_BATCH = 97, 64, 4, 256, 64, 2, 32


# -- the models, in either framework (``lib`` is actorflow or torch) ------------------------


def cnn(lib):
    nn = lib.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, CNN_CLASSES),
    )


def causal_mask(lib, n: int):
    """The float mask a causal model adds to its scores: -inf above the diagonal."""
    m = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    return lib.tensor(m)


def transformer(lib):
    nn = lib.nn

    class CharLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, WIDTH)
            self.pos = nn.Embedding(CONTEXT, WIDTH)
            self.layers = nn.ModuleList(
                [
                    nn.TransformerEncoderLayer(
                        WIDTH, HEADS, FF, dropout=0.0, batch_first=True, norm_first=True
                    )
                    for _ in range(LAYERS)
                ]
            )
            self.norm = nn.LayerNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB)
            self.mask = causal_mask(lib, CONTEXT)
            self.positions = lib.arange(CONTEXT)

        def forward(self, x):
            h = self.tok(x) + self.pos(self.positions)
            for layer in self.layers:
                h = layer(h, src_mask=self.mask, is_causal=True)
            return self.head(self.norm(h)).reshape(-1, VOCAB)

    return CharLM()


MODELS = {
    "cnn": dict(
        make=cnn,
        optim="Adam",
        options=dict(lr=3e-3),
        describe="conv(1,32,3)-bn-relu-pool-conv(32,64,3)-bn-relu-pool-linear(256,10), "
        f"8x8 images, batch {CNN_BATCH}, Adam(lr=3e-3), float32",
    ),
    "transformer": dict(
        make=transformer,
        optim="AdamW",
        options=dict(lr=1e-2, weight_decay=0.01),
        describe=f"char LM: embedding {VOCAB}x{WIDTH} + positions {CONTEXT}, "
        f"{LAYERS} x TransformerEncoderLayer({WIDTH}, {HEADS}, {FF}, "
        f"norm_first), causal, batch {LM_BATCH}x{CONTEXT}, "
        f"AdamW(lr=1e-2, weight_decay=0.01), float32",
    ),
}


def batch_for(model: str, seed: int = SEED):
    rng = np.random.default_rng(seed)
    if model == "cnn":
        x = rng.random((CNN_BATCH, 1, 8, 8), dtype=np.float32)
        y = rng.integers(0, CNN_CLASSES, CNN_BATCH).astype(np.int64)
    else:
        seq = rng.integers(0, VOCAB, (LM_BATCH, CONTEXT + 1)).astype(np.int64)
        x, y = seq[:, :-1].copy(), seq[:, 1:].reshape(-1).copy()
    return x, y


# -- part 1 --------------------------------------------------------------------------------


def part_steps(args, af, torch, name: str) -> tuple[dict, list]:
    spec = MODELS[name]
    k, repeat = args.steps, args.repeat
    af.manual_seed(SEED)
    saved = {key: v.numpy().copy() for key, v in spec["make"](af).state_dict().items()}
    X, Y = batch_for(name)
    x, y = af.tensor(X), af.tensor(Y)
    eager = AfTrainer(af, spec, saved, graph=False)
    graph = AfTrainer(af, spec, saved, graph=True)
    run = AfTrainer(af, spec, saved, graph=True)
    fused = AfTrainer(af, spec, saved, graph=True)
    tt = TorchTrainer(torch, spec, saved) if torch is not None else None
    batches = [(X, Y)] * k

    first = {}
    if tt is not None:
        first["pytorch eager"] = tt.steps(torch.from_numpy(X), torch.from_numpy(Y), 1)
    first["actorflow eager"] = eager.eager_steps(x, y, 1)
    t0 = time.perf_counter()
    first["actorflow graph"] = graph.graph_steps(x, y, 1)  # compiles the step
    compile_s = time.perf_counter() - t0
    first["actorflow graph run"] = run.graph_run(batches[:1], fused=False)
    first["actorflow graph run, fused"] = fused.graph_run(batches[:1], fused=True)
    ref_name = "pytorch eager" if tt is not None else "actorflow eager"
    for t in (eager, graph, run, fused) + ((tt,) if tt else ()):
        t.reset()

    checks = LossChecks(k, REPEAT_RTOL)
    check_for, last_loss = checks.check_for, checks.last_loss

    C = harness.Contender
    contenders = []
    if tt is not None:
        tx, ty = torch.from_numpy(X), torch.from_numpy(Y)
        contenders.append(
            C(
                "pytorch eager",
                lambda: tt.steps(tx, ty, k),
                check_for("pytorch eager"),
                setup=tt.reset,
                steps=k,
                note=f"torch.nn + torch.optim, {torch.get_num_threads()} threads",
            )
        )
    contenders += [
        C(
            "actorflow eager",
            lambda: eager.eager_steps(x, y, k),
            check_for("actorflow eager"),
            setup=eager.reset,
            steps=k,
            note="af.nn + af.optim on the VM; ends with loss.item()",
        ),
        C(
            "actorflow graph",
            lambda: graph.graph_steps(x, y, k),
            check_for("actorflow graph"),
            setup=graph.reset,
            steps=k,
            note="nn.Graph step(x, y), compiled by an earlier call",
        ),
        C(
            "actorflow graph run",
            lambda: run.graph_run(batches, False),
            check_for("actorflow graph run"),
            setup=run.reset,
            steps=k,
            note="step.run(batches): an actor per op",
        ),
        C(
            "actorflow graph run, fused",
            lambda: fused.graph_run(batches, True),
            check_for("actorflow graph run, fused"),
            setup=fused.reset,
            steps=k,
            note="step.run(batches, fused=True): the step as one op actor",
        ),
    ]
    checks.first_steps(contenders, first, ref_name, FIRST_LOSS_RTOL)

    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"{name} steps x{k}")
    contention = cc.result()
    rows = {}
    for c in contenders:
        s = c.summary(per=k, unit="step")
        s["first_step_loss"] = first[c.name]
        s["loss_after_k_steps"] = last_loss.get(c.name)
        rows[c.name] = s
    base = rows.get("pytorch eager", {})
    for s in rows.values():
        if base.get("best_s") and s.get("best_s"):
            s["ratio_vs_pytorch"] = s["best_s"] / base["best_s"]
    graph_rows = {
        n: rows[n].get("ratio_vs_pytorch") for n in rows if n.startswith("actorflow graph")
    }
    best_graph = min((v for v in graph_rows.values() if v is not None), default=None)
    goals = {
        "graph_vs_pytorch_at_most": GRAPH_VS_TORCH,
        "graph_vs_pytorch": graph_rows,
        "best_graph_vs_pytorch": best_graph,
        "met": None if best_graph is None else best_graph <= GRAPH_VS_TORCH,
        "eager_vs_pytorch": rows["actorflow eager"].get("ratio_vs_pytorch"),
    }
    return {
        "model": spec["describe"],
        "steps_per_run": k,
        "repeat": repeat,
        "compile_s": compile_s,
        "first_step_reference": ref_name,
        "contenders": rows,
        "goals": goals,
        "cpu_contention": contention,
    }, contenders


# -- part 2: the CNN's epoch from PNG files ------------------------------------------------


def part_epoch(args, af, example) -> tuple[dict, list]:
    spec = MODELS["cnn"]
    n, repeat, workers = args.batches, args.repeat, args.workers
    af.manual_seed(SEED)
    saved = {key: v.numpy().copy() for key, v in spec["make"](af).state_dict().items()}
    count = n * CNN_BATCH
    paths, labels = example.digits_as_pngs(Path(tempfile.gettempdir()) / "actorflow-digits")
    if count > len(paths):
        raise SystemExit(f"--batches {n} needs {count} digits; there are {len(paths)}")
    dataset = example.DigitFiles(paths[:count], labels[:count], augment=True, seed=SEED)
    loader = af.data.DataLoader(dataset, batch_size=CNN_BATCH, workers=workers)
    # the same batches loaded in kept worker processes, written into shared-memory registers
    # (Pillow's decoding of 8x8 files is Python holding the interpreter lock)
    in_procs = af.data.DataLoader(
        dataset, batch_size=CNN_BATCH, workers=workers, seed=loader.seed, processes=True
    )
    piped = AfTrainer(af, spec, saved, graph=True)
    fused = AfTrainer(af, spec, saved, graph=True)
    procs = AfTrainer(af, spec, saved, graph=True)
    reference = AfTrainer(af, spec, saved, graph=True)
    batches = [
        (np.asarray(bx), np.asarray(by))
        for bx, by in (
            (
                b[0].numpy() if hasattr(b[0], "numpy") else b[0],
                b[1].numpy() if hasattr(b[1], "numpy") else b[1],
            )
            for b in loader
        )
    ]
    ref_losses = [reference.step(bx, by).item() for bx, by in batches]

    def check(losses, ref):
        if len(losses) != n:
            return f"{len(losses)} losses, expected {n}"
        for i, (a, b) in enumerate(zip(losses, ref, strict=True)):
            if not math.isfinite(a) or rel(a, b) > REPEAT_RTOL:
                return f"loss {i} is {a!r}, the reference epoch's {b!r}"
        return None

    def load_alone():
        t0 = time.perf_counter()
        for _ in loader:
            pass
        return (time.perf_counter() - t0) / n

    def step_alone():
        reference.reset()
        t0 = time.perf_counter()
        for bx, by in batches:
            reference.step(bx, by).item()
        return (time.perf_counter() - t0) / n

    before = [(load_alone(), step_alone()) for _ in range(2)]
    contenders = [
        harness.Contender(
            "pipelined graph",
            lambda: [float(v) for v in piped.step.run(loader)],
            check,
            ref=ref_losses,
            setup=piped.reset,
            note=f"step.run(DataLoader(workers={workers})): an actor per op",
        ),
        harness.Contender(
            "pipelined graph, fused",
            lambda: [float(v) for v in fused.step.run(loader, fused=True)],
            check,
            ref=ref_losses,
            setup=fused.reset,
            note=f"step.run(DataLoader(workers={workers}), fused=True)",
        ),
        harness.Contender(
            "pipelined graph, fused, processes",
            lambda: [float(v) for v in procs.step.run(in_procs, fused=True)],
            check,
            ref=ref_losses,
            setup=procs.reset,
            note=f"step.run(DataLoader(workers={workers}, processes=True), fused=True)",
        ),
    ]
    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"cnn epoch of {n} batches")
    contention = cc.result()
    in_procs.close()
    after = [(load_alone(), step_alone()) for _ in range(2)]
    load_s = statistics.median(v[0] for v in before + after)
    step_s = statistics.median(v[1] for v in before + after)
    bound = max(load_s, step_s) * n
    rows = {}
    for c in contenders:
        s = c.summary()
        s["bound_s"] = bound
        if s.get("best_s"):
            s["ratio_vs_bound"] = s["best_s"] / bound
        rows[c.name] = s
    best = min((s["ratio_vs_bound"] for s in rows.values() if "ratio_vs_bound" in s), default=None)
    return {
        "batches": n,
        "workers": workers,
        "images": f"scikit-learn digits, {count} PNG files",
        "load_per_batch_s": load_s,
        "step_per_batch_s": step_s,
        "bound_s": bound,
        "serial_s": (load_s + step_s) * n,
        "contenders": rows,
        "goals": {
            "pipelined_vs_bound_at_most": PIPE_VS_BOUND,
            "pipelined_vs_bound": best,
            "met": None if best is None else best <= PIPE_VS_BOUND,
        },
        "cpu_contention": contention,
    }, contenders


# -- main ----------------------------------------------------------------------------------


def verdict(met) -> str:
    return {True: "MET", False: "NOT MET"}.get(met, "not measured")


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "5 steps per run, 6 batches, best of 2")
    p.add_argument("--model", choices=("cnn", "transformer", "both"), default="both")
    p.add_sized("--steps", 20, 5, "training steps per timed run (default {full}, quick {quick})")
    p.add_sized("--batches", 22, 6, "batches per epoch, part 2 (default {full}, quick {quick})")
    p.add_sized("--workers", 2, 2, "loader worker threads, part 2 (default {full})")
    p.add_repeat(5, 2)
    p.add_out("bench_models")
    p.add_threads()
    args = p.parse_args(argv)
    pinned = harness.pin_threads(args.threads, argv)
    if min(args.steps, args.batches, args.repeat, args.workers) < 1:
        p.error("--steps, --batches, --workers and --repeat must be >= 1")

    t_start = time.perf_counter()
    import actorflow as af

    torch = harness.try_import("torch")
    if torch is None:
        print("[models] torch is not installed: no 'pytorch eager' rows, no ratios", flush=True)
    harness.pin_torch(torch, args.threads)
    print(f"[models] threads: {pinned['threads_note']}", flush=True)
    names = ("cnn", "transformer") if args.model == "both" else (args.model,)
    parts, everyone = {}, []
    for name in names:
        parts[name], cs = part_steps(args, af, torch, name)
        everyone += cs
    epoch = None
    example = None
    if harness.try_import("PIL.Image") and harness.try_import("sklearn.datasets"):
        sys.path.insert(0, str(harness.REPO / "examples"))
        import train_digits_cnn as example
    if "cnn" in names and example is not None:
        epoch, cs = part_epoch(args, af, example)
        everyone += cs
    elif "cnn" in names:
        print(
            "[models] scikit-learn or Pillow is missing (pip install -e '.[examples]'): no "
            "part 2, the PNG-decoding epoch",
            flush=True,
        )

    Col = harness.Column
    for name, r in parts.items():
        print()
        print(
            f"Part 1, {name}: {r['model']} ({r['steps_per_run']} steps per run, best of "
            f"{r['repeat']}; compile {r['compile_s'] * 1e3:.0f} ms, not timed)"
        )
        harness.print_table(
            r["contenders"],
            [
                Col("best ms/step", 14, "best_us_per_step", ".2f", 1e-3),
                Col("median ms/step", 16, "median_us_per_step", ".2f", 1e-3),
                Col("vs pytorch", 12, "ratio_vs_pytorch", ".2f", suffix="x"),
                Col("first loss", 12, "first_step_loss", ".5f"),
            ],
            28,
            notes=True,
        )
        g = r["goals"]
        print(
            f"  goal: graph mode <= {GRAPH_VS_TORCH}x pytorch eager -> best "
            f"{harness.fmt(g['best_graph_vs_pytorch'], '.2f')}x ({verdict(g['met'])}); "
            f"eager {harness.fmt(g['eager_vs_pytorch'], '.2f')}x"
        )
        harness.print_contention(r["cpu_contention"])
    if epoch is not None:
        print()
        print(
            f"Part 2, cnn epoch of {epoch['batches']} batches from PNG files "
            f"({epoch['images']}), DataLoader(workers={epoch['workers']})"
        )
        print(
            f"  alone: load {epoch['load_per_batch_s'] * 1e3:.2f} ms/batch, step() "
            f"{epoch['step_per_batch_s'] * 1e3:.2f} ms/batch; bound max(load, step) x N = "
            f"{epoch['bound_s'] * 1e3:.0f} ms; serial {epoch['serial_s'] * 1e3:.0f} ms"
        )
        harness.print_table(
            epoch["contenders"],
            [
                Col("best ms", 10, "best_s", ".0f", 1e3),
                Col("median ms", 11, "median_s", ".0f", 1e3),
                Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x"),
            ],
            36,
        )
        g = epoch["goals"]
        print(
            f"  goal: pipelined within {PIPE_VS_BOUND}x of the bound -> "
            f"{harness.fmt(g['pipelined_vs_bound'], '.3f')}x ({verdict(g['met'])})"
        )
        harness.print_contention(epoch["cpu_contention"])
    env = harness.environment(
        libraries={
            "torch": getattr(torch, "__version__", None) if torch else None,
            "torch_num_threads": torch.get_num_threads() if torch else None,
            **pinned,
        },
        runtime={"graph_event_loop": harness.graph_event_loop()},
    )
    result = harness.document(
        "bench_models",
        argv,
        args.quick,
        "part 1: first step's loss equals PyTorch's within 1e-4 relative; every run's last "
        "loss equal (1e-5 relative) to the warm-up run's; part 2: every epoch's losses equal "
        "(1e-5 relative) to a reference epoch of step() calls on the same batches",
        steps=args.steps,
        batches=args.batches,
        repeat=args.repeat,
        workers=args.workers,
    )
    result.update({"part1_steps": parts, "part2_epoch": epoch})
    return harness.finish(args.out, result, everyone, t_start, env, "computed wrong losses")


if __name__ == "__main__":
    sys.exit(main())
