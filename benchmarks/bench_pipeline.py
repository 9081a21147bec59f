#!/usr/bin/env python
"""Pipeline overlap: actorflow's Pipeline against the hardware bound and hand-written threads.

A four-stage pipeline over 200 items (by default) where every stage's work releases the GIL
(``time.sleep`` stands in for I/O, a device kernel or a GIL-free library call):

    source (2 ms, yields a small float32 array) -> +1 (5 ms) -> +1 (3 ms) -> +1 (4 ms)

Perfect overlap finishes in ``items x slowest stage + one pass of the other stages``. That
bound is computed from the stages' *measured* cost in this very run (the median of 50
calls of each stage function, half taken before the timed rounds and half after; ``sleep``
overshoots its argument by a machine-dependent amount, so the nominal 5 ms is not used).
It is an estimate, not a hard floor: sleeps inside a busy pipeline can overshoot a little
less than alone, so a hand-written pipeline may land a fraction of a percent under it.

Contenders, in the same process, interleaved (round-robin, the order rotated every round),
best of N after one untimed warm-up (this class of machine shows +-20 % run-to-run noise;
the median is recorded too):

- ``sequential``: one loop calling the four stages (no overlap, the reference ceiling);
- ``threads + queue``: one thread per stage, ``queue.Queue(maxsize=2)`` between stages and
  to the consumer, a sentinel for the end (what one writes by hand);
- ``actorflow``: ``af.Pipeline([source, f1, f2, f3], buffers=2)`` iterated with ``run()``
  (the time includes planning: the run sizes each stage's registers from piece 0 as that
  piece flows through the pipeline);
- ``actorflow (out= declared)``: diagnostic, the same with ``out=af.Spec(...)`` per stage,
  so no stage is sized from piece 0 (``--no-diagnostics`` drops it).

Every run is checked: 200 items, in order, item ``i`` equal to ``i + 3`` (a wrong or short
run fails loudly instead of producing a fast number). The JSON records each actorflow
row's ``stats()`` of its best run (per actor busy fraction, waits, memory).

Goals (printed as MET / NOT MET): actorflow within 1 % of the bound, and actorflow no
slower than threads + queue.

**Tiny pieces** (a second part, ``--tiny-pieces``): 10,000 pieces of 4 float32 from a
source through 4 stages ``x + 1`` on threads, where handing a piece over costs more than
the work. Contenders, interleaved in the same rounds (best of N, medians recorded):
``af.Pipeline`` as a user writes it (the default ``buffers``), ``buffers=2``,
``buffers="auto"``, and threads + ``queue.Queue(maxsize=2)``; pieces/s and each row's
ratio to threads + queue (above 1: faster). Goal: the default ahead of threads + queue.
Every run is checked: the pieces in order, piece ``i`` equal to ``i + 4``.

Usage::

    python benchmarks/bench_pipeline.py              # full run (~50 s on 2 cores)
    python benchmarks/bench_pipeline.py --quick      # smoke run (~10 s: 60 items, best of 3)
    python benchmarks/bench_pipeline.py --items 400 --repeat 9 --out /tmp/pipe.json
    python benchmarks/bench_pipeline.py --items 0      # the tiny pieces only

Exit status: 0 when every run of every contender was correct, 1 when a check failed or a
contender raised (the JSON is written either way).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

STAGE_MS = (2.0, 5.0, 3.0, 4.0)  # source, f1, f2, f3: GIL-free work per item
PIECE = 16  # elements of the small float32 array each item carries
QUEUE_SIZE = 2  # threads + queue: Queue(maxsize=2), like buffers=2

# Goals stated by the project.
BOUND_SLACK = 0.01  # actorflow <= bound x 1.01
VS_THREADS = 1.0  # actorflow <= threads + queue x 1.0
TINY_STAGES = 4  # tiny pieces: stages x + 1 on threads after the source
TINY_PIECE = 4  # ...float32 elements per piece


# -- the workload --------------------------------------------------------------------------


def make_workload(n: int, stage_s: tuple):
    """``(source, f1, f2, f3)``: ``source()`` is a generator function (a fresh generator per
    run) yielding ``n`` arrays; ``f1..f3`` sleep then add one."""
    d0, d1, d2, d3 = stage_s
    sleep, full, f32 = time.sleep, np.full, np.float32

    def source():
        for i in range(n):
            sleep(d0)
            yield full(PIECE, i, f32)

    def add_a(x):
        sleep(d1)
        return x + 1

    def add_b(x):
        sleep(d2)
        return x + 1

    def add_c(x):
        sleep(d3)
        return x + 1

    return source, add_a, add_b, add_c


def expected(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32)[:, None] + np.float32(3) + np.zeros(PIECE, np.float32)


def measure_stages(stages, calls: int) -> list[list[float]]:
    """Per stage, ``calls`` timings of one call of the stage's work (the source: producing
    one item), the stages interleaved so drift hits them alike."""
    source, *fns = stages
    x = np.zeros(PIECE, np.float32)
    samples = [[] for _ in range(4)]
    gen = source()
    for _ in range(calls):
        t0 = time.perf_counter()
        try:
            next(gen)
        except StopIteration:
            gen = source()
            next(gen)
        samples[0].append(time.perf_counter() - t0)
        for k, f in enumerate(fns, start=1):
            t0 = time.perf_counter()
            f(x)
            samples[k].append(time.perf_counter() - t0)
    gen.close()
    return samples


def bound_of(per_stage: list[float], n: int) -> float:
    slow = max(range(len(per_stage)), key=lambda k: per_stage[k])
    return n * per_stage[slow] + sum(t for k, t in enumerate(per_stage) if k != slow)


# -- contenders ----------------------------------------------------------------------------


def run_sequential(stages):
    source, f1, f2, f3 = stages
    return [f3(f2(f1(x))) for x in source()]


def run_threads(stages):
    """One thread per stage, Queue(maxsize=2) between stages and to the consumer."""
    source, *fns = stages
    return harness.threads_queue(source, fns, QUEUE_SIZE)


# -- harness (benchmarks/harness.py) -------------------------------------------------------


def check_items(items, ref) -> str | None:
    """What is wrong with the items of a run against ``ref``, or None."""
    if len(items) != len(ref):
        return f"{len(items)} items, expected {len(ref)}"
    for i, (got, want) in enumerate(zip(items, ref, strict=True)):
        got = np.asarray(got)
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            return (
                f"item {i}: {got.dtype}{list(got.shape)} {got.ravel()[:4]} != "
                f"{want.ravel()[:4]} (out of order, or wrong value)"
            )
    return None


class Contender(harness.Contender):
    """``fn()`` runs the timed work and returns the items; ``after()`` runs after the clock
    stops (e.g. reads ``stats()``) and its value is kept per timed run."""

    def __init__(self, name, fn, ref, note="", after=None, diagnostic=False):
        super().__init__(
            name, fn, check_items, ref=ref, after=after, note=note, diagnostic=diagnostic
        )


def environment() -> dict:
    return harness.environment(runtime={"graph_event_loop": harness.graph_event_loop()})


# -- tiny pieces ---------------------------------------------------------------------------


def tiny_pieces(af, n: int, repeat: int) -> dict:
    """The tiny-pieces part: pieces/s of each contender, best and median, and the ratios
    to threads + queue (the pieces/s quotient: above 1 is faster)."""
    items = [np.full(TINY_PIECE, i, np.float32) for i in range(n)]
    ref = list(
        np.arange(n, dtype=np.float32)[:, None]
        + np.float32(TINY_STAGES)
        + np.zeros(TINY_PIECE, np.float32)
    )

    def inc(x):
        return x + 1

    def source():
        return iter(items)

    fns = [inc] * TINY_STAGES
    names = ["source"] + [f"inc{k}" for k in range(TINY_STAGES)]
    pipes = {
        "actorflow default": af.Pipeline([source] + fns, names=names),
        "actorflow buffers=2": af.Pipeline([source] + fns, buffers=2, names=names),
        "actorflow buffers=auto": af.Pipeline([source] + fns, buffers="auto", names=names),
    }
    contenders = [
        Contender(
            name, lambda p=p: list(p.run()), ref, note=f"af.Pipeline, {name.split(' ', 1)[1]}"
        )
        for name, p in pipes.items()
    ]
    contenders.append(
        Contender(
            "threads + queue",
            lambda: harness.threads_queue(source, fns, QUEUE_SIZE),
            ref,
            note=f"{TINY_STAGES + 1} threads, queue.Queue(maxsize={QUEUE_SIZE}) between them",
        )
    )
    harness.run_rounds(contenders, repeat, "tiny pieces")
    rows = {}
    base = contenders[-1]
    for c in contenders:
        s = c.summary(per=n, unit="piece")
        if c.times:
            s["pieces_per_s"] = n / s["best_s"]
            s["median_pieces_per_s"] = n / s["median_s"]
            if base.times:
                s["speed_vs_threads_queue"] = min(base.times) / s["best_s"]
                s["median_speed_vs_threads_queue"] = statistics.median(base.times) / s["median_s"]
        rows[c.name] = s
    for name, p in pipes.items():  # what each plan chose (the default: the plan's)
        rows[name]["buffers"] = {r["name"]: r["buffers"] for r in p.plan().rows}
    r = rows["actorflow default"].get("speed_vs_threads_queue")
    return {
        "pieces": n,
        "stages": TINY_STAGES,
        "piece": f"float32[{TINY_PIECE}]",
        "contenders": rows,
        "contender_objects": contenders,
        "goal": {
            "default_ahead_of_threads_queue": None if r is None else r > 1,
            "default_speed_vs_threads_queue": r,
        },
    }


def print_tiny(t: dict) -> None:
    print()
    print(
        f"Tiny pieces: {t['pieces']} x {t['piece']} through {t['stages']} stages x + 1 on "
        f"threads (best of N; pieces/s, median in brackets; speed vs threads + queue)"
    )
    for name, s in t["contenders"].items():
        if "pieces_per_s" not in s:
            print(f"  {name:<24} {harness.status(s)}")
            continue
        chose = s.get("buffers")
        print(
            f"  {name:<24} {s['pieces_per_s']:>9.0f}/s ({s['median_pieces_per_s']:.0f})  "
            f"{harness.fmt(s.get('speed_vs_threads_queue'), '.2f')}x "
            f"({harness.fmt(s.get('median_speed_vs_threads_queue'), '.2f')}x)"
            + (f"  buffers {sorted(set(chose.values()))}" if chose else "")
            + f"  {harness.status(s)}"
        )
    g = t["goal"]
    print(
        f"  goal: the default ahead of threads + queue -> "
        f"{harness.fmt(g['default_speed_vs_threads_queue'], '.2f')}x "
        f"({'MET' if g['default_ahead_of_threads_queue'] else 'NOT MET'})"
    )


# -- main ----------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "60 items, best of 3 (~10 s)")
    p.add_sized("--items", 200, 60, "items (default {full}, quick {quick})")
    p.add_repeat(7, 3)
    p.add_sized(
        "--calls", 50, 20, "calls per stage to measure its cost (default {full}, quick {quick})"
    )
    p.add_out("bench_pipeline")
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the diagnostic 'actorflow (out= declared)' row",
    )
    p.add_sized(
        "--tiny-pieces",
        10_000,
        2_000,
        "pieces of the tiny-pieces part (default {full}, quick {quick}; 0 skips it)",
    )
    args = p.parse_args(argv)
    q, n, repeat, calls = args.quick, args.items, args.repeat, args.calls
    if n < 0 or repeat < 1 or calls < 2 or args.tiny_pieces < 0 or not (n or args.tiny_pieces):
        p.error("--repeat must be >= 1, --calls >= 2, --items and --tiny-pieces >= 0 (not both 0)")

    t_start = time.perf_counter()
    import actorflow as af

    tiny = tiny_pieces(af, args.tiny_pieces, max(5, repeat)) if args.tiny_pieces else None
    if not n:
        print_tiny(tiny)
        env = environment()
        result = harness.document(
            "bench_pipeline",
            argv,
            q,
            "tiny pieces in order, piece i == i + 4",
            tiny_pieces=args.tiny_pieces,
            repeat=max(5, repeat),
        )
        objs = tiny.pop("contender_objects")
        result["tiny_pieces"] = tiny
        return harness.finish(args.out, result, objs, t_start, env, "produced wrong items")

    stage_s = tuple(ms / 1e3 for ms in STAGE_MS)
    stages = make_workload(n, stage_s)
    ref = list(expected(n))
    names = ["source", "add_5ms", "add_3ms", "add_4ms"]

    print(f"[pipeline] measuring each stage's cost ({calls // 2} calls each) ...", flush=True)
    before = measure_stages(stages, calls // 2)

    pipe = af.Pipeline(list(stages), buffers=2, names=names)
    pipe_out = af.Pipeline(
        list(stages), buffers=2, names=names, out=[af.Spec((PIECE,), af.float32)] * 4
    )
    contenders = [
        Contender(
            "sequential",
            lambda: run_sequential(stages),
            ref,
            note="one loop calling the four stages",
        ),
        Contender(
            "threads + queue",
            lambda: run_threads(stages),
            ref,
            note=f"4 threads, queue.Queue(maxsize={QUEUE_SIZE}) between stages",
        ),
        Contender(
            "actorflow",
            lambda: list(pipe.run()),
            ref,
            after=lambda: pipe.stats().as_dict(),
            note="af.Pipeline(buffers=2); includes planning (stages sized by piece 0 "
            "while it flows)",
        ),
    ]
    if not args.no_diagnostics:
        contenders.append(
            Contender(
                "actorflow (out= declared)",
                lambda: list(pipe_out.run()),
                ref,
                after=lambda: pipe_out.stats().as_dict(),
                diagnostic=True,
                note="diagnostic: out=af.Spec per stage, so nothing is sized from piece 0",
            )
        )

    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, "pipeline")
    contention = cc.result()

    print(
        f"[pipeline] measuring each stage's cost again ({calls - calls // 2} calls each) ...",
        flush=True,
    )
    after = measure_stages(stages, calls - calls // 2)
    pooled = [b + a for b, a in zip(before, after, strict=True)]
    med = [statistics.median(s) for s in pooled]
    mean = [statistics.fmean(s) for s in pooled]
    bound = bound_of(med, n)
    bound_mean = bound_of(mean, n)
    slow = max(range(4), key=lambda k: med[k])

    rows = {}
    threads_best = contenders[1].summary().get("best_s")
    for c in contenders:
        s = c.summary()
        if c.times:
            s["ratio_vs_bound"] = s["best_s"] / bound
            s["median_ratio_vs_bound"] = s["median_s"] / bound
            if threads_best:
                s["ratio_vs_threads_queue"] = s["best_s"] / threads_best
                s["median_ratio_vs_threads_queue"] = (
                    s["median_s"] / contenders[1].summary()["median_s"]
                )
        st = c.best_after()
        if st is not None:
            s["stats_of_best_run"] = st
            s["busy_of_best_run"] = {a: r["busy"] for a, r in st["actors"].items()}
        rows[c.name] = s

    af_row = rows["actorflow"]
    r_bound = af_row.get("ratio_vs_bound")
    r_thr = af_row.get("ratio_vs_threads_queue")
    goals = {
        "actorflow_within_bound_fraction": BOUND_SLACK,
        "actorflow_ratio_vs_bound": r_bound,
        "bound_met": None if r_bound is None else r_bound <= 1 + BOUND_SLACK,
        "actorflow_vs_threads_queue_at_most": VS_THREADS,
        "actorflow_ratio_vs_threads_queue": r_thr,
        "threads_met": None if r_thr is None else r_thr <= VS_THREADS,
    }

    # -- report ----------------------------------------------------------------------------
    env = environment()
    print()
    print(
        f"Pipeline of 4 GIL-free stages, {n} items (best of {repeat}; nominal stage ms "
        f"{'/'.join(f'{m:g}' for m in STAGE_MS)})"
    )
    print(f"  measured stage cost (median of {calls} calls; before -> after the rounds):")
    for k, name in enumerate(names):
        print(
            f"    {name:<10} {med[k] * 1e3:7.3f} ms   ({statistics.median(before[k]) * 1e3:.3f}"
            f" -> {statistics.median(after[k]) * 1e3:.3f}; mean {mean[k] * 1e3:.3f})"
            + ("   <- slowest" if k == slow else "")
        )
    print(
        f"  bound = {n} x {med[slow] * 1e3:.3f} ms + "
        f"{sum(m for k, m in enumerate(med) if k != slow) * 1e3:.3f} ms = "
        f"{bound * 1e3:.1f} ms  (from the means: {bound_mean * 1e3:.1f} ms)"
    )
    Col = harness.Column
    harness.print_table(
        rows,
        [
            Col("best ms", 10, "best_s", ".1f", 1e3),
            Col("median ms", 11, "median_s", ".1f", 1e3),
            Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x"),
            Col("vs threads", 12, "ratio_vs_threads_queue", ".3f", suffix="x"),
        ],
        27,
        lead=[
            f"  {'bound':<27}{bound * 1e3:>10.1f}{'':>11}{1.0:>9.3f}x"
            f"{harness.fmt(threads_best and bound / threads_best, '11.3f')}x"
        ],
    )
    for name in ("actorflow", "actorflow (out= declared)"):
        busy = rows.get(name, {}).get("busy_of_best_run")
        if busy:
            print(
                f"  {name} busy (best run): " + ", ".join(f"{a} {b:.0%}" for a, b in busy.items())
            )
    print(
        f"  goal: actorflow within {BOUND_SLACK:.0%} of the bound -> "
        f"{harness.fmt(r_bound and (r_bound - 1) * 100, '+.2f')}% "
        f"({'MET' if goals['bound_met'] else 'NOT MET'})"
    )
    print(
        f"  goal: actorflow no slower than threads + queue -> {harness.fmt(r_thr, '.3f')}x "
        f"({'MET' if goals['threads_met'] else 'NOT MET'})"
    )
    harness.print_contention(contention)
    if tiny is not None:
        print_tiny(tiny)
    print(
        f"env: {env['cpu_count']} CPUs, python {env['python']}, numpy {env['numpy']}, "
        f"uvloop installed {env['uvloop_installed']}, graph loop {env['graph_event_loop']}"
    )

    result = harness.document(
        "bench_pipeline",
        argv,
        q,
        f"{n} items in order, item i == i + 3 (float32[{PIECE}]) on every run",
        items=n,
        repeat=repeat,
        calls_per_stage=calls,
    )
    result.update(
        {
            "stages": [
                {
                    "name": nm,
                    "nominal_s": stage_s[k],
                    "median_s": med[k],
                    "mean_s": mean[k],
                    "median_before_s": statistics.median(before[k]),
                    "median_after_s": statistics.median(after[k]),
                    "min_s": min(pooled[k]),
                }
                for k, nm in enumerate(names)
            ],
            "bound_s": bound,
            "bound_from_means_s": bound_mean,
            "bound_formula": "items x median(slowest stage) + sum of the other stages' medians",
            "contenders": rows,
            "goals": goals,
            "cpu_contention": contention,
        }
    )
    objs = []
    if tiny is not None:
        objs = tiny.pop("contender_objects")
        result["tiny_pieces"] = tiny
    return harness.finish(args.out, result, contenders + objs, t_start, env, "produced wrong items")


if __name__ == "__main__":
    sys.exit(main())
