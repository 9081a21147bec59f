#!/usr/bin/env python
"""Training real models: a CNN with batch norm and pooling, and a small causal transformer,
actorflow eager, ``nn.Graph.step`` and ``nn.Graph.run`` against PyTorch eager on the CPU,
on the same weights and batches; and the CNN's epoch fed by a loader that decodes PNG
files, pipelined, against the bound max(load, step) x batches.

The models are the examples' (``examples/train_digits_cnn.py``,
``examples/train_tiny_transformer.py``), built here in both frameworks with the same
architecture, so one ``state_dict`` (numpy arrays) loads into either:

- ``cnn``: ``Conv2d(1, 16, 3, padding=1), BatchNorm2d(16), ReLU, MaxPool2d(2),
  Conv2d(16, 32, 3, padding=1), BatchNorm2d(32), ReLU, MaxPool2d(2), Flatten,
  Linear(128, 10)`` on 8x8 one-channel images, batch 128, ``CrossEntropyLoss``, SGD
  (lr 0.05, momentum 0.9);
- ``transformer``: a character-level language model: token and position ``Embedding``
  (vocabulary 96, width 128, context 64), two ``TransformerEncoderLayer(128, 4, 512,
  dropout=0, batch_first=True, norm_first=True)`` under a causal mask, ``Linear(128, 96)``;
  batch 32 sequences, ``CrossEntropyLoss`` over every position, AdamW (lr 1e-3).

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

Part 2 (``cnn`` only), an epoch of N batches read from PNG files written once to a temp
folder (the digits, 8x8, as the example does; random digits-like images when
scikit-learn is missing): a map-style ``af.data.DataLoader`` whose items open and decode a
file with Pillow and shift it by a random pixel, batched, on ``--workers`` threads, fed to
``step.run`` (the loader's actors in the step's graph). Its costs, the load of a batch
(the loader alone) and ``step()`` on a batch, are measured alone around the rounds; the
bound is ``max(load, step) x N``. Goal: the pipelined epoch within 1.15x of it. Without
Pillow, part 2 is skipped (said in the output and the JSON).

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
GRAPH_VS_TORCH = 1.0         # graph mode per step <= 1.0x PyTorch eager
PIPE_VS_BOUND = 1.15         # pipelined epoch <= 1.15x max(load, step) x N
FIRST_LOSS_RTOL = 1e-4
REPEAT_RTOL = 1e-5

CNN_BATCH, CNN_CLASSES = 128, 10
VOCAB, WIDTH, HEADS, FF, CONTEXT, LAYERS, LM_BATCH = 96, 128, 4, 512, 64, 2, 32


# -- the models, in either framework (``lib`` is actorflow or torch) ------------------------

def cnn(lib):
    nn = lib.nn
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, CNN_CLASSES))


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
            self.layers = nn.ModuleList([
                nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.0, batch_first=True,
                                           norm_first=True) for _ in range(LAYERS)])
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
    "cnn": dict(make=cnn, optim="SGD", options=dict(lr=0.05, momentum=0.9),
                describe="conv(1,16,3)-bn-relu-pool-conv(16,32,3)-bn-relu-pool-linear(128,10), "
                         f"8x8 images, batch {CNN_BATCH}, SGD(lr=0.05, momentum=0.9), float32"),
    "transformer": dict(make=transformer, optim="AdamW", options=dict(lr=1e-3),
                        describe=f"char LM: embedding {VOCAB}x{WIDTH} + positions {CONTEXT}, "
                                 f"{LAYERS} x TransformerEncoderLayer({WIDTH}, {HEADS}, {FF}, "
                                 f"norm_first), causal, batch {LM_BATCH}x{CONTEXT}, "
                                 f"AdamW(lr=1e-3), float32"),
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
    first["actorflow graph"] = graph.graph_steps(x, y, 1)        # compiles the step
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
        contenders.append(C("pytorch eager", lambda: tt.steps(tx, ty, k),
                            check_for("pytorch eager"), setup=tt.reset, steps=k,
                            note=f"torch.nn + torch.optim, {torch.get_num_threads()} threads"))
    contenders += [
        C("actorflow eager", lambda: eager.eager_steps(x, y, k), check_for("actorflow eager"),
          setup=eager.reset, steps=k, note="af.nn + af.optim on the VM; ends with loss.item()"),
        C("actorflow graph", lambda: graph.graph_steps(x, y, k), check_for("actorflow graph"),
          setup=graph.reset, steps=k, note="nn.Graph step(x, y), compiled by an earlier call"),
        C("actorflow graph run", lambda: run.graph_run(batches, False),
          check_for("actorflow graph run"), setup=run.reset, steps=k,
          note="step.run(batches): an actor per op"),
        C("actorflow graph run, fused", lambda: fused.graph_run(batches, True),
          check_for("actorflow graph run, fused"), setup=fused.reset, steps=k,
          note="step.run(batches, fused=True): the step as one op actor"),
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
    graph_rows = {n: rows[n].get("ratio_vs_pytorch") for n in rows if n.startswith("actorflow graph")}
    best_graph = min((v for v in graph_rows.values() if v is not None), default=None)
    goals = {"graph_vs_pytorch_at_most": GRAPH_VS_TORCH, "graph_vs_pytorch": graph_rows,
             "best_graph_vs_pytorch": best_graph,
             "met": None if best_graph is None else best_graph <= GRAPH_VS_TORCH,
             "eager_vs_pytorch": rows["actorflow eager"].get("ratio_vs_pytorch")}
    return {"model": spec["describe"], "steps_per_run": k, "repeat": repeat,
            "compile_s": compile_s, "first_step_reference": ref_name, "contenders": rows,
            "goals": goals, "cpu_contention": contention}, contenders


# -- part 2: the CNN's epoch from PNG files ------------------------------------------------

def digits_images(n: int):
    """``n`` 8x8 digit images as uint8 (0..255) and their labels: scikit-learn's bundled
    digits (repeated to ``n``), or seeded random images when scikit-learn is missing."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(SEED)
        return (rng.integers(0, 256, (n, 8, 8)).astype(np.uint8),
                rng.integers(0, 10, n).astype(np.int64), "random images (no scikit-learn)")
    d = load_digits()
    idx = np.arange(n) % len(d.target)
    imgs = (d.images[idx] * (255.0 / 16.0)).round().astype(np.uint8)
    return imgs, d.target[idx].astype(np.int64), "scikit-learn digits"


def part_epoch(args, af, Image) -> tuple[dict, list]:
    spec = MODELS["cnn"]
    n, repeat, workers = args.batches, args.repeat, args.workers
    af.manual_seed(SEED)
    saved = {key: v.numpy().copy() for key, v in spec["make"](af).state_dict().items()}
    count = n * CNN_BATCH
    imgs, labels, source = digits_images(count)
    folder = Path(tempfile.mkdtemp(prefix="af_bench_digits_"))
    files = []
    for i, im in enumerate(imgs):
        f = folder / f"{i:06d}.png"
        Image.fromarray(im).save(f)
        files.append(f)

    class PngDigits(af.data.Dataset):
        """Item i: file i opened and decoded (Pillow), scaled to [0, 1], shifted by a
        random pixel (seeded per item, so every epoch reads the same batches)."""

        def __len__(self):
            return count

        def __getitem__(self, i):
            with Image.open(files[i]) as im:
                a = np.asarray(im, dtype=np.float32) * (1.0 / 255.0)
            r = np.random.default_rng(i)
            a = np.roll(a, (int(r.integers(-1, 2)), int(r.integers(-1, 2))), axis=(0, 1))
            return a[None], labels[i]

    loader = af.data.DataLoader(PngDigits(), batch_size=CNN_BATCH, workers=workers)
    piped = AfTrainer(af, spec, saved, graph=True)
    fused = AfTrainer(af, spec, saved, graph=True)
    reference = AfTrainer(af, spec, saved, graph=True)
    batches = [(np.asarray(bx), np.asarray(by)) for bx, by in
               ((b[0].numpy() if hasattr(b[0], "numpy") else b[0],
                 b[1].numpy() if hasattr(b[1], "numpy") else b[1]) for b in loader)]
    ref_losses = [reference.step(bx, by).item() for bx, by in batches]

    def check(losses, ref):
        if len(losses) != n:
            return f"{len(losses)} losses, expected {n}"
        for i, (a, b) in enumerate(zip(losses, ref)):
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
        harness.Contender("pipelined graph", lambda: [float(v) for v in piped.step.run(loader)],
                          check, ref=ref_losses, setup=piped.reset,
                          note=f"step.run(DataLoader(workers={workers})): an actor per op"),
        harness.Contender("pipelined graph, fused",
                          lambda: [float(v) for v in fused.step.run(loader, fused=True)],
                          check, ref=ref_losses, setup=fused.reset,
                          note=f"step.run(DataLoader(workers={workers}), fused=True)"),
    ]
    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"cnn epoch of {n} batches")
    contention = cc.result()
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
    best = min((s["ratio_vs_bound"] for s in rows.values() if "ratio_vs_bound" in s),
               default=None)
    return {"batches": n, "workers": workers, "images": source, "folder": str(folder),
            "load_per_batch_s": load_s, "step_per_batch_s": step_s, "bound_s": bound,
            "serial_s": (load_s + step_s) * n, "contenders": rows,
            "goals": {"pipelined_vs_bound_at_most": PIPE_VS_BOUND, "pipelined_vs_bound": best,
                      "met": None if best is None else best <= PIPE_VS_BOUND},
            "cpu_contention": contention}, contenders


# -- main ----------------------------------------------------------------------------------

def verdict(met) -> str:
    return {True: "MET", False: "NOT MET"}.get(met, "not measured")


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "5 steps per run, 6 batches, best of 2")
    p.add_argument("--model", choices=("cnn", "transformer", "both"), default="both")
    p.add_sized("--steps", 20, 5, "training steps per timed run (default {full}, quick {quick})")
    p.add_sized("--batches", 24, 6, "batches per epoch, part 2 (default {full}, quick {quick})")
    p.add_sized("--workers", 2, 2, "loader worker threads, part 2 (default {full})")
    p.add_repeat(5, 2)
    p.add_out("bench_models")
    args = p.parse_args(argv)
    if min(args.steps, args.batches, args.repeat, args.workers) < 1:
        p.error("--steps, --batches, --workers and --repeat must be >= 1")

    t_start = time.perf_counter()
    import actorflow as af
    torch = harness.try_import("torch")
    if torch is None:
        print("[models] torch is not installed: no 'pytorch eager' rows, no ratios", flush=True)
    names = ("cnn", "transformer") if args.model == "both" else (args.model,)
    parts, everyone = {}, []
    for name in names:
        parts[name], cs = part_steps(args, af, torch, name)
        everyone += cs
    epoch = None
    Image = harness.try_import("PIL.Image")
    if "cnn" in names and Image is not None:
        epoch, cs = part_epoch(args, af, Image)
        everyone += cs
    elif "cnn" in names:
        print("[models] Pillow is not installed: no part 2 (the PNG-decoding epoch)", flush=True)

    Col = harness.Column
    for name, r in parts.items():
        print()
        print(f"Part 1, {name}: {r['model']} ({r['steps_per_run']} steps per run, best of "
              f"{r['repeat']}; compile {r['compile_s'] * 1e3:.0f} ms, not timed)")
        harness.print_table(
            r["contenders"],
            [Col("best ms/step", 14, "best_us_per_step", ".2f", 1e-3),
             Col("median ms/step", 16, "median_us_per_step", ".2f", 1e-3),
             Col("vs pytorch", 12, "ratio_vs_pytorch", ".2f", suffix="x"),
             Col("first loss", 12, "first_step_loss", ".5f")], 28, notes=True)
        g = r["goals"]
        print(f"  goal: graph mode <= {GRAPH_VS_TORCH}x pytorch eager -> best "
              f"{harness.fmt(g['best_graph_vs_pytorch'], '.2f')}x ({verdict(g['met'])}); "
              f"eager {harness.fmt(g['eager_vs_pytorch'], '.2f')}x")
        harness.print_contention(r["cpu_contention"])
    if epoch is not None:
        print()
        print(f"Part 2, cnn epoch of {epoch['batches']} batches from PNG files "
              f"({epoch['images']}), DataLoader(workers={epoch['workers']})")
        print(f"  alone: load {epoch['load_per_batch_s'] * 1e3:.2f} ms/batch, step() "
              f"{epoch['step_per_batch_s'] * 1e3:.2f} ms/batch; bound max(load, step) x N = "
              f"{epoch['bound_s'] * 1e3:.0f} ms; serial {epoch['serial_s'] * 1e3:.0f} ms")
        harness.print_table(epoch["contenders"],
                            [Col("best ms", 10, "best_s", ".0f", 1e3),
                             Col("median ms", 11, "median_s", ".0f", 1e3),
                             Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x")], 24)
        g = epoch["goals"]
        print(f"  goal: pipelined within {PIPE_VS_BOUND}x of the bound -> "
              f"{harness.fmt(g['pipelined_vs_bound'], '.3f')}x ({verdict(g['met'])})")
        harness.print_contention(epoch["cpu_contention"])
    env = harness.environment(libraries={
        "torch": getattr(torch, "__version__", None) if torch else None,
        "torch_num_threads": torch.get_num_threads() if torch else None},
        runtime={"graph_event_loop": harness.graph_event_loop()})
    result = harness.document(
        "bench_models", argv, args.quick,
        "part 1: first step's loss equals PyTorch's within 1e-4 relative; every run's last "
        "loss equal (1e-5 relative) to the warm-up run's; part 2: every epoch's losses equal "
        "(1e-5 relative) to a reference epoch of step() calls on the same batches",
        steps=args.steps, batches=args.batches, repeat=args.repeat, workers=args.workers)
    result.update({"part1_steps": parts, "part2_epoch": epoch})
    return harness.finish(args.out, result, everyone, t_start, env, "computed wrong losses")


if __name__ == "__main__":
    sys.exit(main())
