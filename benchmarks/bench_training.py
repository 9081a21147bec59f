#!/usr/bin/env python
"""Training an MLP: actorflow eager and graph mode (nn.Graph) against PyTorch eager, and an
epoch whose loader costs about as much as a step, looped against pipelined.

The model is an MLP 784-256-10 (``Linear(784, 256), ReLU, Linear(256, 10)``) trained with
``CrossEntropyLoss`` and SGD (lr 0.01, momentum 0.9) on float32 batches of 128, all on the
CPU (the machine this was written for has 2 cores).

Part 1, time per training step (zero_grad, forward, loss, backward, step), the same batch
for every contender; each timed run is K steps (50 by default) started from the same
weights and a fresh optimizer state (reset before the clock starts):

- ``pytorch eager``: ``torch.nn`` equivalents holding actorflow's initial weights (copied),
  ``torch.set_num_threads`` left at its default;
- ``actorflow eager``: ``af.nn.Sequential`` and ``af.optim.SGD``; ops are asynchronous, so
  the K steps end with ``af.synchronize()`` and ``loss.item()`` (inside the clock: the time
  includes finishing the last optimizer update, not just queueing it);
- ``actorflow graph``: ``class TrainStep(af.nn.Graph)`` (``build(x, y)``: loss, backward,
  return the loss; the optimizer added with ``add_optimizer``); K calls of the synchronous
  ``step(x, y)``. It is compiled (traced) by its first call, outside the clock.

The loss module is built once per contender (as ``TrainStep`` holds ``self.loss``), not per
step. Checks, once and outside the clock: every contender's first step from the shared
initial weights gives PyTorch's loss within 1e-4 relative. Every run: the last loss is
finite and equal (1e-5 relative) to the contender's warm-up run from the same start (every
run did the same work). Goal (printed as MET / NOT MET): actorflow graph <= 1.5x PyTorch
eager per step; actorflow eager's ratio is reported too.

Part 2, an epoch of N batches (40 by default) from a loader (a generator function, fresh
per epoch) whose every batch costs about one step: the loader ``time.sleep``\\ s for the
median of actorflow graph's per-step time in part 1 (the stand-in for I/O: a read that
leaves both cores free), then yields the batch (precomputed arrays, x float32 [128, 784],
y int64 [128]). Contenders:

- ``plain loop``: ``for x, y in loader(): step(x, y)``: load, then step, one after the other;
- ``pipelined graph``: ``for loss in step.run(loader, buffers=2)``: the loader a source
  actor, every op of the step an actor (and one per state written back), so batch i+1
  loads while batch i computes;
- ``pipelined graph, fused``: ``step.run(loader, buffers=2, fused=True)``: the same with the
  whole step as one op actor (one act per batch instead of one per op);
- ``pipelined graph, DataLoader``: the same batches from an ``af.data.DataLoader`` over a
  map-style dataset whose item i is batch i after the same sleep: the loader's sampler and
  loading stage are actors of the step's graph, the batch copied once into the register;
- diagnostics (``--no-diagnostics`` drops them): the same two with a loader doing numpy work
  of the same cost instead of sleeping (``np.tanh`` passes over the batch, releasing the
  GIL): on 2 cores this loader competes with the step's BLAS threads for the CPU, so the
  ideal bound below does not hold for them; no goal applies.

Part 2 also times loaders whose work is in Python or numpy, each a map-style dataset whose
item i is batch i (the same x and y): ``gil``: a GIL-bound Python transform per sample
(a pure-Python loop per sample, 128 per batch, calibrated to one step per batch); ``nogil``:
``np.tanh`` passes over the batch (the GIL released). For each, in the same rounds:
``af DataLoader(workers=2)`` on threads and with ``processes=True`` (kept worker processes
writing shared-memory registers) feeding ``step.run(loader, fused=True)``, and PyTorch's
``torch.utils.data.DataLoader`` with ``num_workers`` 0 and 2 (``persistent_workers=True``)
feeding a PyTorch training step of the same model. The bound of a row is
``max(load, step) x N + min(load, step)``, with ``load`` the median of ``dataset[i]`` and
``step`` the median of its framework's step, both alone in this process (half before and
half after the rounds). Goal (MET / NOT MET): the GIL-bound epoch with processes <= 1.15x
its bound, and ahead of PyTorch's DataLoader with 2 workers.

The ideal bound is ``max(load, step) x N + min(load, step)`` and the serial sum
``(load + step) x N``, with ``load`` and ``step`` the medians of the loader's ``next()`` and
of ``step()`` as timed inside the plain loop's timed runs (three ``perf_counter`` reads
per batch): ``step()``'s cost is taken where it is paid; the same costs
measured alone (half before, half after the rounds) are recorded too. The step the op
actors run inside ``run()`` can cost less than ``step()`` (their workspace is planned once
for the run); the JSON records the op actors' compute per batch from ``stats()``, and the
report prints the bound recomputed with it. Every timed epoch starts from the same weights
(``load_state_dict`` of a saved copy) and a zeroed momentum buffer, which, graph mode
being deterministic, makes every epoch of every contender compute the same losses bit for
bit. Every run is checked: N finite losses equal bit for bit to a reference epoch of
``step()`` calls, and the same final parameters (a digest of their bytes). Goal (printed
as MET / NOT MET): the pipelined epoch within 1.25x of the ideal bound.

Every contender is timed as best of N interleaved rounds (round-robin, order rotated every
round) after one untimed warm-up, the median recorded too (benchmarks/harness.py).

Usage::

    python benchmarks/bench_training.py            # full run (~40 s on 2 cores)
    python benchmarks/bench_training.py --quick    # smoke run (~15 s)
    python benchmarks/bench_training.py --steps 100 --batches 80 --out /tmp/train.json

Exit status: 0 when every run of every contender was correct, 1 when a check failed or a
contender raised (the JSON is written either way).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file
from trainers import AfTrainer, LossChecks, TorchTrainer, rel  # noqa: E402 - next to this file

IN, HIDDEN, CLASSES = 784, 256, 10
BATCH = 128
LR, MOMENTUM = 0.01, 0.9
SEED = 0

# Goals stated by the project.
GRAPH_VS_TORCH = 1.5  # actorflow graph per step <= 1.5x PyTorch eager
PIPE_VS_BOUND = 1.25  # pipelined epoch <= 1.25x max(load, step) x N + min(load, step)
PROCS_VS_BOUND = 1.15  # the GIL-bound epoch with loader processes <= 1.15x its bound
LOADER_WORKERS = 2  # workers of the loader rows, actorflow's and PyTorch's

FIRST_LOSS_RTOL = 1e-4  # first step's loss of every contender vs PyTorch's
REPEAT_RTOL = 1e-5  # a contender's K-step loss vs its own warm-up run


# -- models --------------------------------------------------------------------------------


def mlp(lib):
    """The model, in actorflow or torch (``lib``)."""
    nn = lib.nn
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


MLP = dict(make=mlp, optim="SGD", options=dict(lr=LR, momentum=MOMENTUM))


# -- part 1: time per step -----------------------------------------------------------------


def part_steps(args, af, torch, saved, X, Y) -> tuple[dict, list]:
    k, repeat = args.steps, args.repeat
    x, y = af.tensor(X), af.tensor(Y)
    eager = AfTrainer(af, MLP, saved, graph=False)
    graph = AfTrainer(af, MLP, saved, graph=True)
    tt = TorchTrainer(torch, MLP, saved) if torch is not None else None

    # The check, once, outside the clock: the first step from the shared weights.
    first = {}
    if tt is not None:
        first["pytorch eager"] = tt.steps(torch.from_numpy(X), torch.from_numpy(Y), 1)
    first["actorflow eager"] = eager.eager_steps(x, y, 1)
    t0 = time.perf_counter()
    first["actorflow graph"] = graph.graph_steps(x, y, 1)  # compiles (traces) the step
    compile_s = time.perf_counter() - t0
    ref_name = "pytorch eager" if tt is not None else "actorflow eager"
    first_rel = {n: rel(v, first[ref_name]) for n, v in first.items()}
    for t in (eager, graph) + ((tt,) if tt else ()):
        t.reset()

    checks = LossChecks(k, REPEAT_RTOL)
    check_for, last_loss = checks.check_for, checks.last_loss

    contenders = []
    if tt is not None:
        tx, ty = torch.from_numpy(X), torch.from_numpy(Y)
        contenders.append(
            harness.Contender(
                "pytorch eager",
                lambda: tt.steps(tx, ty, k),
                check_for("pytorch eager"),
                setup=tt.reset,
                steps=k,
                note=f"torch.nn + torch.optim.SGD, {torch.get_num_threads()} threads "
                f"({'default' if args.threads is None else 'pinned'})",
            )
        )
    contenders.append(
        harness.Contender(
            "actorflow eager",
            lambda: eager.eager_steps(x, y, k),
            check_for("actorflow eager"),
            setup=eager.reset,
            steps=k,
            note="af.nn + af.optim.SGD on the VM; ends with af.synchronize() + loss.item()",
        )
    )
    contenders.append(
        harness.Contender(
            "actorflow graph",
            lambda: graph.graph_steps(x, y, k),
            check_for("actorflow graph"),
            setup=graph.reset,
            steps=k,
            note="nn.Graph TrainStep.step(x, y), compiled by an earlier call",
        )
    )
    checks.first_steps(contenders, first, ref_name, FIRST_LOSS_RTOL)

    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"steps x{k}")
    contention = cc.result()

    rows = {}
    for c in contenders:
        s = c.summary(per=k, unit="step")
        s["first_step_loss"] = first[c.name]
        s["first_step_rel_diff_vs_" + ref_name.replace(" ", "_")] = first_rel[c.name]
        s["loss_after_k_steps"] = last_loss.get(c.name)
        rows[c.name] = s
    base = rows.get("pytorch eager", {})
    for s in rows.values():
        if base.get("best_s") and s.get("best_s"):
            s["ratio_vs_pytorch"] = s["best_s"] / base["best_s"]
            s["median_ratio_vs_pytorch"] = s["median_s"] / base["median_s"]
    r_graph = rows["actorflow graph"].get("ratio_vs_pytorch")
    r_eager = rows["actorflow eager"].get("ratio_vs_pytorch")
    goals = {
        "graph_vs_pytorch_at_most": GRAPH_VS_TORCH,
        "graph_vs_pytorch": r_graph,
        "graph_met": None if r_graph is None else r_graph <= GRAPH_VS_TORCH,
        "eager_vs_pytorch": r_eager,
    }
    le, lg = last_loss.get("actorflow eager"), last_loss.get("actorflow graph")
    lt = last_loss.get("pytorch eager")
    after_k = {
        "graph_equals_eager_bit_for_bit": None if le is None or lg is None else le == lg,
        "graph_rel_diff_vs_pytorch": None if lg is None or lt is None else rel(lg, lt),
        "eager_rel_diff_vs_pytorch": None if le is None or lt is None else rel(le, lt),
    }
    result = {
        "steps_per_run": k,
        "repeat": repeat,
        "compile_s": compile_s,
        "loss_after_k_steps": after_k,
        "first_step_reference": ref_name,
        "first_step_rtol": FIRST_LOSS_RTOL,
        "contenders": rows,
        "goals": goals,
        "cpu_contention": contention,
    }
    return result, contenders


# -- part 2: an epoch with a loader --------------------------------------------------------


def make_loaders(n: int, xs, ys, raw, load_s: float, reps: int):
    """Generator functions (a fresh generator per epoch) yielding the same n batches:
    ``sleep`` waits ``load_s`` per batch (I/O), ``numpy`` computes x = tanh(raw) ``reps``
    times (GIL-free CPU work of about the same cost)."""
    sleep, tanh, empty, f32 = time.sleep, np.tanh, np.empty, np.float32

    def loader_sleep():
        for i in range(n):
            sleep(load_s)
            yield xs[i], ys[i]

    def loader_numpy():
        for i in range(n):
            x = empty((BATCH, IN), f32)
            for _ in range(reps):
                tanh(raw[i], out=x)
            yield x, ys[i]

    return {"sleep": loader_sleep, "numpy": loader_numpy}


def per_item(loader, calls: int) -> list:
    """Seconds each ``next()`` of the loader takes, over ``calls`` items."""
    out = []
    while len(out) < calls:
        it = iter(loader())
        while len(out) < calls:
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            out.append(time.perf_counter() - t0)
    return out


def per_step(trainer: AfTrainer, xs, ys, calls: int) -> list:
    trainer.reset()
    out = []
    for i in range(calls):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        t0 = time.perf_counter()
        trainer.step(x, y)
        out.append(time.perf_counter() - t0)
    trainer.reset()
    return out


def calibrate_tanh(raw0, target_s: float) -> tuple[int, float]:
    """How many ``np.tanh`` passes over a batch cost about ``target_s``."""
    x = np.empty_like(raw0)
    for _ in range(5):
        np.tanh(raw0, out=x)
    t = []
    for _ in range(30):
        t0 = time.perf_counter()
        np.tanh(raw0, out=x)
        t.append(time.perf_counter() - t0)
    one = statistics.median(t)
    return max(1, round(target_s / one)), one


def bound_of(load: float, step: float, n: int) -> float:
    return max(load, step) * n + min(load, step)


def in_run_costs(st: dict, n: int, load_s: float) -> dict:
    """From a run's ``stats()``: the op actors' compute per batch, summed (the step is one
    op actor or an actor per op, depending on the version), the source actors' busy
    fraction, the busiest op actor, and the bound recomputed with that step cost."""
    acts = st.get("actors", {})
    ops = {a: r for a, r in acts.items() if r.get("kind") == "op"}
    srcs = [r for r in acts.values() if r.get("kind") == "source"]
    pieces = st.get("pieces") or n
    if not ops:
        return {}
    step = sum(r.get("compute_s", 0.0) for r in ops.values()) / pieces
    busiest = max(ops, key=lambda a: ops[a].get("busy", 0.0))
    return {
        "op_actors": len(ops),
        "step_compute_per_batch_s": step,
        "loader_busy": max((r.get("busy", 0.0) for r in srcs), default=None),
        "busiest_op_actor": busiest,
        "busiest_op_actor_busy": ops[busiest].get("busy"),
        "bound_with_in_run_step_s": bound_of(load_s, step, n),
    }


def part_epoch(args, af, saved, load_target_s: float) -> tuple[dict, list]:
    n, repeat, calls = args.batches, args.repeat, args.calls
    rng = np.random.default_rng(SEED + 1)
    raw = rng.standard_normal((n, BATCH, IN), dtype=np.float32)
    xs = np.tanh(raw)  # what both loaders yield for x
    ys = rng.integers(0, CLASSES, (n, BATCH)).astype(np.int64)
    reps, tanh_pass_s = calibrate_tanh(raw[0], load_target_s)
    loaders = make_loaders(n, xs, ys, raw, load_target_s, reps)

    plain = AfTrainer(af, MLP, saved, graph=True)
    piped = AfTrainer(af, MLP, saved, graph=True)
    fused = AfTrainer(af, MLP, saved, graph=True)

    # The reference epoch: N step() calls straight from the arrays (compiles plain's step).
    plain.reset()
    ref_losses = [plain.step(xs[i], ys[i]).item() for i in range(n)]
    ref = {"losses": ref_losses, "digest": plain.digest()}
    plain.reset()

    def check(out, ref):
        losses, digest = out
        if len(losses) != n:
            return f"{len(losses)} losses, expected {n}"
        bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
        if bad:
            return f"loss {bad[0]} is {losses[bad[0]]!r}, not finite"
        for i, (a, b) in enumerate(zip(losses, ref["losses"], strict=True)):
            if a != b:
                return (
                    f"loss {i} is {a!r}, the reference epoch's is {b!r} (not bit for bit: "
                    f"not the same math or not the same start)"
                )
        if digest != ref["digest"]:
            return (
                f"final parameters differ from the reference epoch's ({digest} != {ref['digest']})"
            )
        return None

    def plain_loop(loader, times: list):
        """``for x, y in loader(): step(x, y)``, written out to time each ``next()`` and
        each ``step()`` (three perf_counter reads per batch): the costs the bound uses are
        the ones paid in this very loop."""
        step, clock = plain.step, time.perf_counter
        losses, t_load, t_step = [], [], []
        it = iter(loader())
        while True:
            t0 = clock()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = clock()
            losses.append(step(x, y).item())
            t_load.append(t1 - t0)
            t_step.append(clock() - t1)
        times[:] = [t_load, t_step]
        return losses

    def pipelined(loader, _times):
        return [float(v) for v in piped.step.run(loader, buffers=2)]

    def pipelined_fused(loader, _times):
        return [float(v) for v in fused.step.run(loader, buffers=2, fused=True)]

    class SleepyBatches(af.data.Dataset):
        """The sleep loader's batches as a map-style dataset: item i is batch i, after
        ``load_s`` of I/O; ``af.data.DataLoader(batch_size=1, collate_fn=first)`` hands it
        on as it is."""

        def __len__(self):
            return n

        def __getitem__(self, i):
            time.sleep(load_target_s)
            return xs[i], ys[i]

    data_loader = af.data.DataLoader(
        SleepyBatches(), batch_size=1, collate_fn=lambda samples: samples[0]
    )
    loaded = AfTrainer(af, MLP, saved, graph=True)

    def pipelined_data_loader(_loader, _times):
        return [float(v) for v in loaded.step.run(data_loader, buffers=2)]

    def contender(name, fn, trainer, loader_kind, note, after=None, diagnostic=False):
        loader, times = loaders[loader_kind], []
        if after is None:
            after = lambda: list(times)  # noqa: E731 - the plain loop's own timings
        return harness.Contender(
            name,
            lambda: fn(loader, times),
            check,
            ref=ref,
            setup=trainer.reset,
            fetch=lambda losses: (losses, trainer.digest()),
            after=after,
            loader=loader_kind,
            note=note,
            diagnostic=diagnostic,
        )

    def stats():
        return piped.step.stats().as_dict()

    contenders = [
        contender("plain loop", plain_loop, plain, "sleep", "for x, y in loader(): step(x, y)"),
        contender(
            "pipelined graph",
            pipelined,
            piped,
            "sleep",
            "for loss in step.run(loader, buffers=2): an actor per op",
            after=stats,
        ),
        contender(
            "pipelined graph, fused",
            pipelined_fused,
            fused,
            "sleep",
            "step.run(loader, buffers=2, fused=True): the step as one op actor",
            after=lambda: fused.step.stats().as_dict(),
        ),
        contender(
            "pipelined graph, DataLoader",
            pipelined_data_loader,
            loaded,
            "sleep",
            "step.run(DataLoader(...), buffers=2): the loader's sampler and loading "
            "stage in the step's graph, one copy per batch",
            after=lambda: loaded.step.stats().as_dict(),
        ),
    ]
    if not args.no_diagnostics:
        contenders += [
            contender(
                "plain loop (numpy loader)",
                plain_loop,
                plain,
                "numpy",
                f"diagnostic: loader does {reps} np.tanh passes per batch",
                diagnostic=True,
            ),
            contender(
                "pipelined (numpy loader)",
                pipelined,
                piped,
                "numpy",
                f"diagnostic: loader does {reps} np.tanh passes per batch",
                after=stats,
                diagnostic=True,
            ),
        ]
    kinds = ["sleep"] + ([] if args.no_diagnostics else ["numpy"])

    half = max(1, calls // 2)
    print(
        f"[epoch] measuring the loader's and step()'s cost alone ({half} calls each) ...",
        flush=True,
    )
    before = {
        "step": per_step(plain, xs, ys, half),
        **{k: per_item(loaders[k], half) for k in kinds},
    }
    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"epoch x{n}")
    contention = cc.result()
    print(
        f"[epoch] measuring the loader's and step()'s cost alone again ({calls - half} "
        f"calls each) ...",
        flush=True,
    )
    after = {
        "step": per_step(plain, xs, ys, calls - half),
        **{k: per_item(loaders[k], calls - half) for k in kinds},
    }
    alone = {
        k: {
            "median_s": statistics.median(before[k] + after[k]),
            "median_before_s": statistics.median(before[k]),
            "median_after_s": statistics.median(after[k]),
            "min_s": min(before[k] + after[k]),
        }
        for k in before
    }

    # The costs the bound uses: per batch, as paid in the plain loop's timed runs.
    by_name = {c.name: c for c in contenders}
    costs = {}
    for kind, name in (("sleep", "plain loop"), ("numpy", "plain loop (numpy loader)")):
        c = by_name.get(name)
        runs = [v for v in (c.after_values if c else []) if v and v[0]]
        if not runs:  # the plain loop failed: fall back on "alone"
            if kind in alone:
                costs[kind] = {
                    "load_s": alone[kind]["median_s"],
                    "step_s": alone["step"]["median_s"],
                    "from": "alone",
                }
            continue
        loads = [t for r in runs for t in r[0]]
        steps = [t for r in runs for t in r[1]]
        costs[kind] = {
            "load_s": statistics.median(loads),
            "step_s": statistics.median(steps),
            "load_min_s": min(loads),
            "step_min_s": min(steps),
            "step_p90_s": float(np.percentile(steps, 90)),
            "calls": len(steps),
            "from": f"{name!r}, timed runs",
        }

    rows = {}
    for c in contenders:
        s = c.summary(per=n, unit="batch")
        cost = costs.get(c.fields["loader"])
        if cost:
            load_s, step_s = cost["load_s"], cost["step_s"]
            s["bound_s"] = bound_of(load_s, step_s, n)
            s["serial_s"] = (load_s + step_s) * n
            if c.times:
                s["ratio_vs_bound"] = s["best_s"] / s["bound_s"]
                s["median_ratio_vs_bound"] = s["median_s"] / s["bound_s"]
                s["ratio_vs_serial"] = s["best_s"] / s["serial_s"]
            st = c.best_after()
            if isinstance(st, dict):
                s["stats_of_best_run"] = st
                s.update(in_run_costs(st, n, load_s))
        rows[c.name] = s
    for pipe_name, plain_name in (
        ("pipelined graph", "plain loop"),
        ("pipelined graph, fused", "plain loop"),
        ("pipelined graph, DataLoader", "plain loop"),
        ("pipelined (numpy loader)", "plain loop (numpy loader)"),
    ):
        p, q = rows.get(pipe_name), rows.get(plain_name)
        if p and q and p.get("best_s") and q.get("best_s"):
            p["ratio_vs_plain"] = p["best_s"] / q["best_s"]
            p["median_ratio_vs_plain"] = p["median_s"] / q["median_s"]
    pg = rows["pipelined graph"]
    r = pg.get("ratio_vs_bound")
    r_in = (
        pg["best_s"] / pg["bound_with_in_run_step_s"]
        if pg.get("best_s") and pg.get("bound_with_in_run_step_s")
        else None
    )
    goals = {
        "pipelined_vs_bound_at_most": PIPE_VS_BOUND,
        "pipelined_vs_bound": r,
        "met": None if r is None else r <= PIPE_VS_BOUND,
        "pipelined_vs_plain": pg.get("ratio_vs_plain"),
        "pipelined_vs_bound_with_in_run_step": r_in,
        "met_with_in_run_step": None if r_in is None else r_in <= PIPE_VS_BOUND,
    }
    result = {
        "batches": n,
        "repeat": repeat,
        "calls_per_cost": calls,
        "loader": {
            "goal_loader": "sleep",
            "sleep": f"time.sleep({load_target_s:.6f}) per batch (I/O stand-in), "
            f"then yields precomputed arrays",
            "numpy": f"{reps} x np.tanh(raw, out=x) per batch "
            f"(one pass {tanh_pass_s * 1e3:.3f} ms)",
            "target_s": load_target_s,
            "tanh_reps": reps,
            "tanh_pass_s": tanh_pass_s,
        },
        "costs": costs,
        "costs_alone": alone,
        "bound_formula": "max(load, step) x N + min(load, step): medians of the "
        "loader's next() and of nn.Graph.step() as timed inside the "
        "plain loop's timed runs",
        "reference": {
            "losses_first_last": [ref_losses[0], ref_losses[-1]],
            "params_digest": ref["digest"],
        },
        "contenders": rows,
        "goals": goals,
        "cpu_contention": contention,
    }
    return result, contenders


# -- part 2, loaders with work: threads, processes, PyTorch's DataLoader ------------------


def spin(loops: int) -> int:
    """Pure-Python work (holds the GIL): the stand-in for a per-sample transform."""
    s = 0
    for k in range(loops):
        s += k * k
    return s


class GilBoundBatches:
    """Item i is batch i (xs[i], ys[i]) after a pure-Python transform of each of its
    samples (``spin(loops)`` per sample). Map-style for both frameworks' DataLoaders."""

    def __init__(self, xs, ys, loops: int):
        self.xs, self.ys, self.loops = xs, ys, loops

    def __len__(self):
        return len(self.xs)

    def __getitem__(self, i):
        for _ in range(BATCH):
            spin(self.loops)
        return self.xs[i], self.ys[i]


class GilFreeBatches:
    """Item i is batch i, x = tanh(raw[i]) computed ``reps`` times (numpy, the GIL
    released), y = ys[i]."""

    def __init__(self, raw, ys, reps: int):
        self.raw, self.ys, self.reps = raw, ys, reps

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        x = np.empty((BATCH, IN), np.float32)
        for _ in range(self.reps):
            np.tanh(self.raw[i], out=x)
        return x, self.ys[i]


def first_item(samples):
    return samples[0]


def calibrate_spin(target_s: float) -> int:
    """Loops of ``spin`` per sample so that a batch (BATCH samples) costs ``target_s``."""
    loops = 1000
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(BATCH):
            spin(loops)
        loops = max(10, int(loops * target_s / (time.perf_counter() - t0)))
    return loops


def per_get(dataset, calls: int) -> list:
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        dataset[i % len(dataset)]
        out.append(time.perf_counter() - t0)
    return out


def torch_per_step(tt, xs, ys, calls: int) -> list:
    torch = tt.torch
    tt.reset()
    out = []
    for i in range(calls):
        x, y = torch.from_numpy(xs[i % len(xs)]), torch.from_numpy(ys[i % len(ys)])
        t0 = time.perf_counter()
        tt.opt.zero_grad()
        tt.lossf(tt.model(x), y).backward()
        tt.opt.step()
        out.append(time.perf_counter() - t0)
    tt.reset()
    return out


def part_loaders(args, af, torch, saved, load_target_s: float) -> tuple[dict, list]:
    """The loader rows of part 2 (see the module's docstring)."""
    n, repeat, calls, k = args.batches, args.repeat, args.calls, LOADER_WORKERS
    rng = np.random.default_rng(SEED + 1)  # (part 2's batches: the same reference)
    raw = rng.standard_normal((n, BATCH, IN), dtype=np.float32)
    xs = np.tanh(raw)
    ys = rng.integers(0, CLASSES, (n, BATCH)).astype(np.int64)
    reps, _ = calibrate_tanh(raw[0], load_target_s)
    datasets = {
        "gil": GilBoundBatches(xs, ys, calibrate_spin(load_target_s)),
        "nogil": GilFreeBatches(raw, ys, reps),
    }

    ref_t = AfTrainer(af, MLP, saved, graph=True)
    ref_t.reset()
    ref = {
        "af": {
            "losses": [ref_t.step(xs[i], ys[i]).item() for i in range(n)],
            "digest": ref_t.digest(),
        }
    }
    tt = TorchTrainer(torch, MLP, saved) if torch is not None else None
    if tt is not None:
        tt.reset()
        ref["torch"] = {
            "losses": torch_epoch(
                tt, ((torch.from_numpy(xs[i]), torch.from_numpy(ys[i])) for i in range(n))
            )
        }

    def check(losses, want):
        if len(losses) != n:
            return f"{len(losses)} losses, expected {n}"
        if "digest" in want:  # graph mode: bit for bit
            if losses != want["losses"]:
                i = next(
                    i for i, (a, b) in enumerate(zip(losses, want["losses"], strict=True)) if a != b
                )
                return f"loss {i} is {losses[i]!r}, the reference epoch's {want['losses'][i]!r}"
            return None
        bad = [
            i
            for i, (a, b) in enumerate(zip(losses, want["losses"], strict=True))
            if not math.isfinite(a) or rel(a, b) > REPEAT_RTOL
        ]
        return (
            None
            if not bad
            else (
                f"loss {bad[0]} is {losses[bad[0]]!r}, the reference "
                f"epoch's {want['losses'][bad[0]]!r}"
            )
        )

    contenders, keep = [], []
    for kind, ds in datasets.items():
        for procs in (False, True):
            trainer = AfTrainer(af, MLP, saved, graph=True)
            dl = af.data.DataLoader(
                ds, batch_size=1, collate_fn=first_item, workers=k, processes=procs
            )
            keep.append(dl)

            def run_af(trainer=trainer, dl=dl):
                return [float(v) for v in trainer.step.run(dl, buffers=2, fused=True)]

            what = "processes=True" if procs else "threads"
            run_af, cpu = with_cpu(run_af)
            contenders.append(
                harness.Contender(
                    f"{kind}: af workers={k} {what}",
                    run_af,
                    check,
                    ref=ref["af"],
                    setup=trainer.reset,
                    after=cpu,
                    loader=kind,
                    framework="af",
                    note=f"step.run(DataLoader(workers={k}{', processes=True' if procs else ''}),"
                    f" fused=True)",
                )
            )
        if tt is None:
            continue
        for w in (0, k):
            tdl = torch.utils.data.DataLoader(
                ds, batch_size=None, num_workers=w, persistent_workers=w > 0
            )
            keep.append(tdl)

            def run_torch(tdl=tdl):
                return torch_epoch(tt, tdl)

            run_torch, cpu = with_cpu(run_torch)
            contenders.append(
                harness.Contender(
                    f"{kind}: torch workers={w}",
                    run_torch,
                    check,
                    ref=ref["torch"],
                    setup=tt.reset,
                    after=cpu,
                    loader=kind,
                    framework="torch",
                    note=f"torch.utils.data.DataLoader(num_workers={w}"
                    f"{', persistent_workers=True' if w else ''}) + a torch step",
                )
            )

    half = max(1, calls // 2)
    print(
        f"[loaders] measuring the datasets' items and the steps alone ({half} calls each) ...",
        flush=True,
    )
    before = {
        "af": per_step(ref_t, xs, ys, half),
        **({"torch": torch_per_step(tt, xs, ys, half)} if tt else {}),
        **{kind: per_get(ds, half) for kind, ds in datasets.items()},
    }
    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, f"loaders x{n}")
    contention = cc.result()
    after = {
        "af": per_step(ref_t, xs, ys, calls - half),
        **({"torch": torch_per_step(tt, xs, ys, calls - half)} if tt else {}),
        **{kind: per_get(ds, calls - half) for kind, ds in datasets.items()},
    }
    for obj in keep:
        if hasattr(obj, "close"):
            obj.close()
    keep.clear()
    costs = {key: statistics.median(before[key] + after[key]) for key in before}

    rows = {}
    for c in contenders:
        s = c.summary(per=n, unit="batch")
        load_s, step_s = costs[c.fields["loader"]], costs[c.fields["framework"]]
        s["load_s"], s["step_s"] = load_s, step_s
        s["bound_s"] = bound_of(load_s, step_s, n)
        if c.times:
            s["ratio_vs_bound"] = s["best_s"] / s["bound_s"]
            s["median_ratio_vs_bound"] = s["median_s"] / s["bound_s"]
            cpus = [v for v in c.after_values if v is not None]
            s["main_process_cpu_s_median"] = statistics.median(cpus) if cpus else None
        rows[c.name] = s
    for kind in datasets:
        torch_k = rows.get(f"{kind}: torch workers={k}", {})
        for name in (f"{kind}: af workers={k} threads", f"{kind}: af workers={k} processes=True"):
            r = rows.get(name, {})
            if r.get("best_s") and torch_k.get("best_s"):
                r["ratio_vs_torch_same_workers"] = r["best_s"] / torch_k["best_s"]
                r["median_ratio_vs_torch_same_workers"] = r["median_s"] / torch_k["median_s"]
    g = rows.get(f"gil: af workers={k} processes=True", {})
    rb, rt = g.get("ratio_vs_bound"), g.get("ratio_vs_torch_same_workers")
    goals = {
        "gil_processes_vs_bound_at_most": PROCS_VS_BOUND,
        "gil_processes_vs_bound": rb,
        "met_bound": None if rb is None else rb <= PROCS_VS_BOUND,
        "gil_processes_vs_torch_workers": rt,
        "met_torch": None if rt is None else rt < 1.0,
    }
    return {
        "batches": n,
        "workers": k,
        "costs_alone_median_s": costs,
        "gil_spin_loops_per_sample": datasets["gil"].loops,
        "nogil_tanh_reps": reps,
        "contenders": rows,
        "goals": goals,
        "cpu_contention": contention,
    }, contenders


def with_cpu(fn):
    """``fn`` timed in CPU seconds of this process (every thread of it, not the loader's
    worker processes), and what reads that of the last call (a Contender's ``after``)."""
    box = [None]

    def run():
        c0 = time.process_time()
        try:
            return fn()
        finally:
            box[0] = time.process_time() - c0

    return run, lambda: box[0]


def torch_epoch(tt, batches) -> list:
    """An epoch of PyTorch steps over ``batches`` (x, y tensors): the losses."""
    losses = []
    for x, y in batches:
        tt.opt.zero_grad()
        loss = tt.lossf(tt.model(x), y)
        loss.backward()
        tt.opt.step()
        losses.append(loss.item())
    return losses


# -- main ----------------------------------------------------------------------------------


def environment(af, torch, pinned: dict) -> dict:
    return harness.environment(
        libraries={
            "torch": getattr(torch, "__version__", None) if torch else None,
            "torch_num_threads": torch.get_num_threads() if torch else None,
            "torch_num_threads_note": (
                "PyTorch default (not changed by this benchmark)"
                if pinned["threads"] is None
                else pinned["threads_note"]
            ),
            **pinned,
        },
        runtime={"graph_event_loop": harness.graph_event_loop()},
    )


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "10 steps per run, 12 batches, best of 3 (~15 s)")
    p.add_sized(
        "--steps", 50, 10, "training steps per timed run, part 1 (default {full}, quick {quick})"
    )
    p.add_sized("--batches", 40, 12, "batches per epoch, part 2 (default {full}, quick {quick})")
    p.add_repeat(7, 3)
    p.add_sized(
        "--calls",
        20,
        10,
        "calls to measure the loader's and step()'s cost, part 2 (default {full}, quick {quick})",
    )
    p.add_out("bench_training")
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip part 2's diagnostic rows (the numpy-work loader)",
    )
    p.add_threads()
    args = p.parse_args(argv)
    pinned = harness.pin_threads(args.threads, argv)
    if args.steps < 1 or args.batches < 1 or args.repeat < 1 or args.calls < 2:
        p.error("--steps, --batches and --repeat must be >= 1, --calls >= 2")

    t_start = time.perf_counter()
    import actorflow as af

    torch = harness.try_import("torch")
    if torch is None:
        print(
            "[training] torch is not installed: no 'pytorch eager' row, no ratios to it", flush=True
        )
    harness.pin_torch(torch, args.threads)
    print(f"[training] threads: {pinned['threads_note']}", flush=True)

    af.manual_seed(SEED)
    saved = {k: v.numpy().copy() for k, v in mlp(af).state_dict().items()}
    rng = np.random.default_rng(SEED)
    X = rng.standard_normal((BATCH, IN), dtype=np.float32)
    Y = rng.integers(0, CLASSES, BATCH).astype(np.int64)

    steps, steps_c = part_steps(args, af, torch, saved, X, Y)
    g_row = steps["contenders"]["actorflow graph"]
    load_target = (g_row.get("median_us_per_step") or 5000.0) / 1e6
    epoch, epoch_c = part_epoch(args, af, saved, load_target)
    loaders, loaders_c = part_loaders(args, af, torch, saved, load_target)

    # -- report ----------------------------------------------------------------------------
    env = environment(af, torch, pinned)
    k, n = args.steps, args.batches
    Col = harness.Column
    print()
    print(
        f"Part 1: training step of MLP {IN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD momentum "
        f"{MOMENTUM} ({k} steps per run, best of {args.repeat}; compile "
        f"{steps['compile_s'] * 1e3:.1f} ms, not timed)"
    )
    harness.print_table(
        steps["contenders"],
        [
            Col("best ms/step", 14, "best_us_per_step", ".3f", 1e-3),
            Col("median ms/step", 16, "median_us_per_step", ".3f", 1e-3),
            Col("vs pytorch", 12, "ratio_vs_pytorch", ".2f", suffix="x"),
            Col("first loss", 12, "first_step_loss", ".6f"),
        ],
        18,
        notes=True,
    )
    ref_name = steps["first_step_reference"]
    print(
        f"  first step's loss vs {ref_name}: "
        + ", ".join(
            f"{nm} {s['first_step_rel_diff_vs_' + ref_name.replace(' ', '_')]:.1e}"
            for nm, s in steps["contenders"].items()
        )
        + f" (relative; limit {FIRST_LOSS_RTOL:g})"
    )
    ak = steps["loss_after_k_steps"]
    print(
        f"  loss after {k} steps: graph == eager bit for bit: "
        f"{ak['graph_equals_eager_bit_for_bit']}; vs pytorch (relative): graph "
        f"{harness.fmt(ak['graph_rel_diff_vs_pytorch'], '.1e')}, eager "
        f"{harness.fmt(ak['eager_rel_diff_vs_pytorch'], '.1e')} (information, not checked)"
    )
    sg = steps["goals"]
    print(
        f"  goal: actorflow graph <= {GRAPH_VS_TORCH}x pytorch eager per step -> "
        f"{harness.fmt(sg['graph_vs_pytorch'], '.2f')}x "
        f"({ {True: 'MET', False: 'NOT MET'}.get(sg['graph_met'], 'not measured') }); "
        f"actorflow eager "
        f"{harness.fmt(sg['eager_vs_pytorch'], '.2f')}x"
    )
    harness.print_contention(steps["cpu_contention"])

    c, a = epoch["costs"], epoch["costs_alone"]
    print()
    print(f"Part 2: an epoch of {n} batches, loader ~ one step per batch (best of {args.repeat})")
    print(f"  loader: {epoch['loader']['sleep']}")
    if "numpy" in a:
        print(f"  diagnostic loader: {epoch['loader']['numpy']}")
    for kind, label in (("sleep", "sleep loader"), ("numpy", "numpy loader")):
        if kind in c:
            k_ = c[kind]
            print(
                f"  costs in the plain loop ({label}, median of {k_.get('calls', '-')}): "
                f"load {k_['load_s'] * 1e3:.3f} ms, step() {k_['step_s'] * 1e3:.3f} ms"
                + (
                    f" (min {k_['step_min_s'] * 1e3:.3f}, p90 {k_['step_p90_s'] * 1e3:.3f})"
                    if "step_min_s" in k_
                    else ""
                )
            )
    print(
        f"  alone (median of {args.calls}, half before and half after the rounds): step() "
        f"{a['step']['median_s'] * 1e3:.3f} ms ({a['step']['median_before_s'] * 1e3:.3f} -> "
        f"{a['step']['median_after_s'] * 1e3:.3f}), sleep loader "
        f"{a['sleep']['median_s'] * 1e3:.3f} ms"
        + (f", numpy loader {a['numpy']['median_s'] * 1e3:.3f} ms" if "numpy" in a else "")
    )
    rows = epoch["contenders"]
    pg = rows["pipelined graph"]
    print(
        f"  ideal bound max(load, step) x N + min(load, step) = "
        f"{harness.fmt(pg.get('bound_s') and pg['bound_s'] * 1e3, '.1f')} ms; serial "
        f"(load + step) x N = {harness.fmt(pg.get('serial_s') and pg['serial_s'] * 1e3, '.1f')}"
        f" ms (sleep loader)"
    )
    harness.print_table(
        rows,
        [
            Col("best ms", 10, "best_s", ".1f", 1e3),
            Col("median ms", 11, "median_s", ".1f", 1e3),
            Col("bound ms", 10, "bound_s", ".1f", 1e3),
            Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x"),
            Col("vs plain", 10, "ratio_vs_plain", ".3f", suffix="x"),
        ],
        27,
    )
    for name in (
        "pipelined graph",
        "pipelined graph, fused",
        "pipelined graph, DataLoader",
        "pipelined (numpy loader)",
    ):
        s = rows.get(name, {})
        if s.get("step_compute_per_batch_s") is not None:
            print(
                f"  {name} (best run): {s['op_actors']} op actor(s) compute "
                f"{s['step_compute_per_batch_s'] * 1e3:.3f} ms/batch in all; bound with it "
                f"{s['bound_with_in_run_step_s'] * 1e3:.1f} ms; loader busy "
                f"{harness.fmt(s['loader_busy'] and s['loader_busy'] * 100, '.0f')}%, "
                f"busiest op actor {s['busiest_op_actor']!r} "
                f"{s['busiest_op_actor_busy']:.0%}"
            )
    eg = epoch["goals"]
    print(
        f"  goal: pipelined within {PIPE_VS_BOUND}x of the ideal bound -> "
        f"{harness.fmt(eg['pipelined_vs_bound'], '.3f')}x "
        f"({ {True: 'MET', False: 'NOT MET'}.get(eg['met'], 'not measured') }); "
        f"pipelined / plain "
        f"{harness.fmt(eg['pipelined_vs_plain'], '.3f')}x"
    )
    print(
        f"        against the bound with the op actors' own cost in the run: "
        f"{harness.fmt(eg['pipelined_vs_bound_with_in_run_step'], '.3f')}x "
        f"({ {True: 'MET', False: 'NOT MET'}.get(eg['met_with_in_run_step'], 'n/a') }; "
        f"information)"
    )
    harness.print_contention(epoch["cpu_contention"])
    lo = loaders["costs_alone_median_s"]
    print(
        f"  loaders with work ({loaders['workers']} workers), costs alone (median): "
        f"gil item {lo['gil'] * 1e3:.3f} ms, nogil item {lo['nogil'] * 1e3:.3f} ms, af "
        f"step {lo['af'] * 1e3:.3f} ms"
        + (f", torch step {lo['torch'] * 1e3:.3f} ms" if "torch" in lo else "")
    )
    harness.print_table(
        loaders["contenders"],
        [
            Col("best ms", 10, "best_s", ".1f", 1e3),
            Col("median ms", 11, "median_s", ".1f", 1e3),
            Col("bound ms", 10, "bound_s", ".1f", 1e3),
            Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x"),
            Col("med/bound", 11, "median_ratio_vs_bound", ".3f", suffix="x"),
            Col("vs torch", 10, "ratio_vs_torch_same_workers", ".3f", suffix="x"),
            Col("cpu-s here", 12, "main_process_cpu_s_median", ".3f"),
        ],
        34,
    )
    lg = loaders["goals"]
    print(
        f"  goal: GIL-bound epoch with loader processes <= {PROCS_VS_BOUND}x its bound -> "
        f"{harness.fmt(lg['gil_processes_vs_bound'], '.3f')}x "
        f"({ {True: 'MET', False: 'NOT MET'}.get(lg['met_bound'], 'not measured') }); "
        f"vs torch with {loaders['workers']} workers "
        f"{harness.fmt(lg['gil_processes_vs_torch_workers'], '.3f')}x "
        f"({ {True: 'MET', False: 'NOT MET'}.get(lg['met_torch'], 'not measured') })"
    )
    harness.print_contention(loaders["cpu_contention"])
    print(
        f"env: {env['cpu_count']} CPUs, python {env['python']}, numpy {env['numpy']}, torch "
        f"{env['torch']} ({env['torch_num_threads']} threads), uvloop installed "
        f"{env['uvloop_installed']}, graph loop {env['graph_event_loop']}"
    )

    result = harness.document(
        "bench_training",
        argv,
        args.quick,
        "part 1: every contender's first step's loss equals PyTorch's within 1e-4 relative "
        "(once, outside the clock); every run's last loss finite and equal (1e-5 relative) to "
        "the contender's warm-up run; part 2: N finite losses and final parameters equal bit "
        "for bit to a reference epoch of step() calls",
        steps=k,
        batches=n,
        repeat=args.repeat,
        calls=args.calls,
        model=f"Linear({IN},{HIDDEN}) ReLU Linear({HIDDEN},{CLASSES}), CrossEntropyLoss, "
        f"SGD(lr={LR}, momentum={MOMENTUM}), batch {BATCH}, float32",
    )
    result.update(
        {
            "part1_steps": steps,
            "part2_epoch": epoch,
            "part2_loaders": loaders,
            "goals": {
                "graph_vs_pytorch": steps["goals"],
                "pipelined_vs_bound": eg,
                "loader_processes": lg,
            },
        }
    )
    return harness.finish(
        args.out, result, steps_c + epoch_c + loaders_c, t_start, env, "computed wrong losses"
    )


if __name__ == "__main__":
    sys.exit(main())
