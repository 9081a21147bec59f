#!/usr/bin/env python
"""Per-act overhead of actorflow's actor runtime on a chain of trivial actors.

An 8-actor chain over 10,000 pieces (by default), each piece a float32 array of 4
elements, so the kernels cost next to nothing and the time is the runtime's own:

    source (inline=True, out=af.Spec((4,))) -> 7 x neg -> sink

The reported figure is ``us per act = end-to-end time / (pieces x 8)``: one act per actor
per piece (the output copy to the caller is not counted as an act, but its time is in the
total). Rows, measured in the same process, interleaved (round-robin, the order rotated
every round), best of N after one untimed warm-up on a shorter stream (this class of
machine shows +-20 % run-to-run noise; the median is recorded too):

- ``actorflow ops``: ``g.op(af.neg, prev)`` x 7, ``for _ in g.run()`` (the op actors are
  tiny, so they act inline on the scheduler's event loop; uvloop when installed);
- ``actorflow ops, run_async``: the same graph through ``async for ... in g.run_async()``
  inside ``uvloop.run`` (``asyncio.run`` when uvloop is missing); the time includes
  creating and closing that loop;
- ``actorflow ops, run_async (asyncio)``: diagnostic, the same on the stock asyncio loop
  (only when uvloop is installed; ``--no-diagnostics`` drops it);
- ``actorflow inline stages``: ``g.actor(lambda a: -a, prev, inline=True)`` x 7;
- ``actorflow thread stages``: ``g.actor(lambda a: -a, prev)`` x 7 (each on its own thread);
- baselines: ``threads + queue``, 8 hand-written threads (a source thread and 7 neg
  threads) joined by ``queue.Queue(maxsize=2)``, the consumer on the main thread; and
  ``numpy sequential``, one loop doing the same 8 ops per piece (a copy, then 7 negations),
  for reference.

Every run is checked: all pieces, in order, piece ``i`` equal to ``-items[i]`` (negated 7
times). Goal (printed as MET / NOT MET): ``actorflow ops`` at most 10 us per act, with
uvloop.

Usage::

    python benchmarks/bench_actors.py               # full run (~45 s on 2 cores)
    python benchmarks/bench_actors.py --quick       # smoke run (~8 s: 2,000 pieces, best of 3)
    python benchmarks/bench_actors.py --pieces 20000 --repeat 7 --out /tmp/actors.json

Exit status: 0 when every run of every contender was correct, 1 when a check failed or a
contender raised (the JSON is written either way).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

CHAIN = 7  # neg actors after the source
ACTS_PER_PIECE = CHAIN + 1
SIZE = 4  # float32 elements per piece
QUEUE_SIZE = 2

# Goal stated by the project.
US_PER_ACT_GOAL = 10.0  # actorflow ops row, with uvloop


# -- the workload --------------------------------------------------------------------------


def make_items(n: int) -> list:
    rng = np.random.default_rng(0)
    return list(rng.standard_normal((n, SIZE)).astype(np.float32))


def build_graph(af, feed: dict, kind: str):
    """The 8-actor chain. ``feed["items"]`` is read at the start of every run, so one graph
    runs the warm-up stream and the timed stream alike."""
    g = af.ActorGraph()
    prev = g.source(
        lambda: iter(feed["items"]), out=af.Spec((SIZE,), af.float32), inline=True, name="source"
    )
    for i in range(CHAIN):
        if kind == "op":
            prev = g.op(af.neg, prev, name=f"neg{i}")
        elif kind == "inline":
            prev = g.actor(lambda a: -a, prev, inline=True, name=f"neg{i}")
        elif kind == "thread":
            prev = g.actor(lambda a: -a, prev, name=f"neg{i}")
        else:
            raise ValueError(kind)
    g.sink(prev, name="out")
    return g


def run_graph(g) -> list:
    return [x for x in g.run()]


def run_graph_async(g, runner) -> list:
    async def consume():
        out = []
        async for x in g.run_async():
            out.append(x)
        return out

    return runner(consume())


def run_numpy(items) -> list:
    neg, out = np.negative, []
    for x in items:
        y = x.copy()  # the source's act: the piece copied into its register
        y = neg(y)
        y = neg(y)
        y = neg(y)
        y = neg(y)
        y = neg(y)
        y = neg(y)
        y = neg(y)
        out.append(y)
    return out


def run_threads(items) -> list:
    """A source thread and 7 neg threads, queue.Queue(maxsize=2) between them and to the
    consumer (this thread), a sentinel for the end."""
    return harness.threads_queue(
        lambda: map(np.ndarray.copy, items), [np.negative] * CHAIN, QUEUE_SIZE
    )


# -- harness (benchmarks/harness.py) -------------------------------------------------------


def check_pieces(out, ref) -> str | None:
    """What is wrong with ``out`` (the pieces of a run) against ``ref`` (stacked), or None."""
    if len(out) != len(ref):
        return f"{len(out)} pieces, expected {len(ref)}"
    got = np.stack([np.asarray(x) for x in out])
    if got.dtype != ref.dtype or got.shape != ref.shape:
        return f"{got.dtype}{list(got.shape)} != {ref.dtype}{list(ref.shape)}"
    if not np.array_equal(got, ref):
        bad = np.flatnonzero(~np.all(got == ref, axis=1))
        i = int(bad[0])
        return f"{bad.size} pieces differ, e.g. piece {i}: {got[i]} != {ref[i]}"
    return None


class Contender(harness.Contender):
    """``fn(items)`` runs the timed work and returns the outputs; ``after()`` runs after the
    clock stops (e.g. reads ``stats()``) and its value is kept per timed run."""

    def __init__(self, name, fn, note="", after=None, baseline=False, diagnostic=False):
        super().__init__(
            name, fn, check_pieces, after=after, note=note, baseline=baseline, diagnostic=diagnostic
        )

    def summary(self, pieces: int) -> dict:
        return super().summary(per=pieces * ACTS_PER_PIECE, unit="act")


def environment() -> dict:
    loop = harness.graph_event_loop()
    return harness.environment(
        runtime={
            "graph_event_loop": loop,
            "uvloop_used_by_run": loop.startswith("uvloop"),
            "switch_interval_s": sys.getswitchinterval(),
        }
    )


# -- main ----------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "2,000 pieces, best of 3 (~8 s)")
    p.add_sized("--pieces", 10_000, 2000, "default {full}, quick {quick}")
    p.add_repeat(5, 3)
    p.add_argument(
        "--warmup-pieces",
        type=int,
        default=1000,
        help="pieces of the untimed warm-up run (default 1000)",
    )
    p.add_out("bench_actors")
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the diagnostic run_async row on the stock asyncio loop",
    )
    args = p.parse_args(argv)
    q, n, repeat = args.quick, args.pieces, args.repeat
    if n < 1 or repeat < 1 or args.warmup_pieces < 1:
        p.error("--pieces, --repeat and --warmup-pieces must be >= 1")

    t_start = time.perf_counter()
    import actorflow as af

    uvloop = harness.try_import("uvloop")

    items = make_items(n)
    ref = -np.stack(items)
    warm_items = items[: min(args.warmup_pieces, n)]
    warm_ref = ref[: len(warm_items)]
    feed = {"items": items}

    def fed(fn):
        """fn(items): points the graphs' sources at ``items``, then runs."""

        def run(its):
            feed["items"] = its
            return fn()

        return run

    g_op = build_graph(af, feed, "op")
    g_async = build_graph(af, feed, "op")
    g_async2 = build_graph(af, feed, "op")
    g_inline = build_graph(af, feed, "inline")
    g_thread = build_graph(af, feed, "thread")
    g_traced = build_graph(af, feed, "op")
    g_kept = build_graph(af, feed, "op")
    trace_dir = tempfile.mkdtemp(prefix="actorflow-trace-")
    uv_runner = uvloop.run if uvloop is not None and hasattr(uvloop, "run") else None
    if uv_runner is None and uvloop is not None:  # older uvloop: set the policy instead

        def uv_runner(coro):
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            try:
                return asyncio.run(coro)
            finally:
                asyncio.set_event_loop_policy(None)

    async_runner = uv_runner or asyncio.run

    def stats_of(g):
        return lambda: g.stats().as_dict()

    def last_acts_kept(fn, keep=50):
        """``fn`` as under the pytest plugin: each run keeps its last acts in memory."""
        from actorflow.runtime.observe import hooks as observe

        def run():
            old, observe.SCHEDULE.keep_acts = observe.SCHEDULE.keep_acts, keep
            try:
                return fn()
            finally:
                observe.SCHEDULE.keep_acts = old

        return run

    contenders = [
        Contender(
            "actorflow ops",
            fed(lambda: run_graph(g_op)),
            after=stats_of(g_op),
            note="source inline + 7 x g.op(af.neg); for _ in g.run()",
        ),
        Contender(
            "actorflow ops, run_async",
            fed(lambda: run_graph_async(g_async, async_runner)),
            after=stats_of(g_async),
            note=(
                "async for in g.run_async() inside "
                + ("uvloop.run" if uv_runner else "asyncio.run (uvloop missing)")
            ),
        ),
        Contender(
            "actorflow ops, traced",
            fed(lambda: list(g_traced.run(trace=f"{trace_dir}/run.json"))),
            after=stats_of(g_traced),
            note="the ops chain with run(trace=...): every act, wait and register "
            "recorded and the JSON written (in the time)",
        ),
        Contender(
            "actorflow ops, last acts kept",
            fed(last_acts_kept(lambda: run_graph(g_kept))),
            after=stats_of(g_kept),
            note="the ops chain as a test under the pytest plugin runs it: its last "
            "50 acts kept in memory to print if the test fails",
        ),
    ]
    if uvloop is not None and not args.no_diagnostics:
        contenders.append(
            Contender(
                "actorflow ops, run_async (asyncio)",
                fed(lambda: run_graph_async(g_async2, asyncio.run)),
                after=stats_of(g_async2),
                diagnostic=True,
                note="diagnostic: the same inside asyncio.run (stock loop)",
            )
        )
    contenders += [
        Contender(
            "actorflow inline stages",
            fed(lambda: run_graph(g_inline)),
            after=stats_of(g_inline),
            note="7 x g.actor(lambda a: -a, inline=True): Python on the loop",
        ),
        Contender(
            "actorflow thread stages",
            fed(lambda: run_graph(g_thread)),
            after=stats_of(g_thread),
            note="7 x g.actor(lambda a: -a): each stage on its own thread",
        ),
        Contender(
            "threads + queue",
            run_threads,
            baseline=True,
            note=f"8 threads, queue.Queue(maxsize={QUEUE_SIZE}) between them",
        ),
        Contender(
            "numpy sequential",
            run_numpy,
            baseline=True,
            note="one loop: copy + 7 np.negative per piece (reference)",
        ),
    ]

    cc = harness.CpuContention()
    harness.run_rounds(
        contenders,
        repeat,
        "actors",
        inputs=(items,),
        ref=ref,
        warmup=((warm_items,), warm_ref),
        warmup_note=f" ({len(warm_items)} pieces)",
        ms_digits=0,
    )
    contention = cc.result()

    by_name = {c.name: c for c in contenders}
    base_tq = by_name["threads + queue"].summary(n).get("best_s")
    base_np = by_name["numpy sequential"].summary(n).get("best_s")
    rows = {}
    for c in contenders:
        s = c.summary(n)
        if c.times:
            if base_tq:
                s["ratio_vs_threads_queue"] = s["best_s"] / base_tq
            if base_np:
                s["ratio_vs_numpy"] = s["best_s"] / base_np
        st = c.best_after()
        if st is not None:
            s["stats_of_best_run"] = st
            s["modes"] = {a: r["mode"] for a, r in st["actors"].items()}
        rows[c.name] = s

    env = environment()
    us = rows["actorflow ops"].get("best_us_per_act")
    goal = {
        "us_per_act_at_most": US_PER_ACT_GOAL,
        "actorflow_ops_us_per_act": us,
        "event_loop": env["graph_event_loop"],
        "uvloop_used": env["uvloop_used_by_run"],
        "met": None if us is None else us <= US_PER_ACT_GOAL,
    }
    us_async = rows["actorflow ops, run_async"].get("best_us_per_act")

    # -- report ----------------------------------------------------------------------------
    print()
    print(
        f"Chain of {ACTS_PER_PIECE} actors (source + {CHAIN} x neg) over {n:,} float32[{SIZE}] "
        f"pieces (best of {repeat}; us/act = time / ({n:,} x {ACTS_PER_PIECE}))"
    )
    Col = harness.Column
    harness.print_table(
        rows,
        [
            Col("best ms", 9, "best_s", ".1f", 1e3),
            Col("median ms", 11, "median_s", ".1f", 1e3),
            Col("us/act", 9, "best_us_per_act", ".2f"),
            Col("vs thr+queue", 14, "ratio_vs_threads_queue", ".2f", suffix="x"),
            Col("vs numpy", 10, "ratio_vs_numpy", ".1f", suffix="x"),
        ],
        36,
    )
    print(
        f"  goal: actorflow ops <= {US_PER_ACT_GOAL:g} us/act with uvloop -> "
        f"{harness.fmt(us, '.2f')} us/act on {env['graph_event_loop']} "
        f"({'MET' if goal['met'] and goal['uvloop_used'] else 'NOT MET'}"
        f"{'' if goal['uvloop_used'] else ': uvloop not in use'}); "
        f"run_async: {harness.fmt(us_async, '.2f')} us/act"
    )
    traced = rows.get("actorflow ops, traced", {})
    t_us = traced.get("best_us_per_act")
    if t_us is not None and us is not None:
        write = (traced.get("stats_of_best_run") or {}).get("trace") or {}
        w_us = write.get("write_s", 0.0) / (n * ACTS_PER_PIECE) * 1e6
        print(
            f"  tracing: {t_us:.2f} us/act with run(trace=...) against {us:.2f} without: "
            f"{t_us - us - w_us:+.2f} us per act to record, {w_us:.2f} to write the JSON"
        )
    kept = rows.get("actorflow ops, last acts kept", {}).get("best_us_per_act")
    if kept is not None and us is not None:
        print(
            f"  pytest plugin's record of the last acts: {kept:.2f} us/act against "
            f"{us:.2f}: {kept - us:+.2f} us per act"
        )
    harness.print_contention(contention)
    print(
        f"env: {env['cpu_count']} CPUs, python {env['python']}, numpy {env['numpy']}, "
        f"uvloop installed {env['uvloop_installed']} ({env['uvloop_version']}), graph loop "
        f"{env['graph_event_loop']}"
    )

    result = harness.document(
        "bench_actors",
        argv,
        q,
        "every piece in order equals -items[i] (7 negations) on every run",
        warmup=" on a shorter stream",
        pieces=n,
        acts_per_piece=ACTS_PER_PIECE,
        piece=f"float32[{SIZE}]",
        repeat=repeat,
        warmup_pieces=len(warm_items),
    )
    result.update(contenders=rows, goal=goal, cpu_contention=contention)
    return harness.finish(args.out, result, contenders, t_start, env, "produced wrong pieces")


if __name__ == "__main__":
    sys.exit(main())
