#!/usr/bin/env python
"""I/O-bound loading: an ``async def`` stage with several fetches in flight.

Each of N pieces (300 by default) is fetched by awaiting ``asyncio.sleep(FETCH_MS)`` (the
stand-in for a network or disk read) and becomes a float32 array of 1,024 values equal to
the piece's index. At most K fetches (8 by default) may be in flight: the budget of a real
loader (connections, file handles, memory).

Contenders, in the same process, interleaved (round-robin, the order rotated every round),
best of N after one untimed warm-up:

- ``asyncio semaphore + gather``: what one writes by hand: ``asyncio.Semaphore(K)`` around
  each fetch, ``asyncio.gather`` of them all on a fresh event loop (``asyncio.run``);
- ``actorflow async stage``: ``g.actor(fetch, g.source(indices), buffers=K)`` iterated with
  ``run()``: an ``async def`` stage, K registers, so K acts in flight, pieces in order;
- ``actorflow thread stage``: the same fetch as a plain function that ``time.sleep``\\ s, on
  the stage's thread (one act at a time): what a user without async stages gets.

The bound is ``N / K x FETCH_MS`` (K fetches always in flight, nothing else costing time).
Every run is checked: N pieces, in order, piece i all equal to i.

Goal (printed as MET / NOT MET): the actorflow async stage within 1.15x of semaphore +
gather.

Usage::

    python benchmarks/bench_async_stages.py            # full run (~20 s)
    python benchmarks/bench_async_stages.py --quick    # smoke run (~5 s)
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

FETCH_MS = 5.0
SIZE = 1024
VS_GATHER = 1.15


def check_pieces(items, n) -> str | None:
    if len(items) != n:
        return f"{len(items)} pieces, expected {n}"
    for i, x in enumerate(items):
        x = np.asarray(x)
        if x.shape != (SIZE,) or x.dtype != np.float32 or not (x == i).all():
            return f"piece {i}: {x.dtype}{list(x.shape)} {x.ravel()[:3]} (out of order or wrong)"
    return None


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "100 pieces, best of 3 (~5 s)")
    p.add_sized("--pieces", 300, 100, "pieces (default {full}, quick {quick})")
    p.add_sized("--in-flight", 8, 8, "fetches in flight (default {full})")
    p.add_repeat(5, 3)
    p.add_out("bench_async_stages")
    args = p.parse_args(argv)
    n, k, repeat = args.pieces, args.in_flight, args.repeat
    if n < 1 or k < 1 or repeat < 1:
        p.error("--pieces, --in-flight and --repeat must be >= 1")

    t_start = time.perf_counter()
    import actorflow as af

    delay = FETCH_MS / 1e3

    async def fetch(i):
        await asyncio.sleep(delay)
        return np.full(SIZE, int(i), np.float32)

    def fetch_blocking(i):
        time.sleep(delay)
        return np.full(SIZE, int(i), np.float32)

    def indices():
        for i in range(n):
            yield np.array(i)

    def gather():
        async def main():
            sem = asyncio.Semaphore(k)

            async def one(i):
                async with sem:
                    return await fetch(i)

            return await asyncio.gather(*(one(i) for i in range(n)))

        return asyncio.run(main())

    g_async = af.ActorGraph()
    g_async.sink(g_async.actor(fetch, g_async.source(indices, buffers=k), buffers=k, name="fetch"))
    g_thread = af.ActorGraph()
    g_thread.sink(
        g_thread.actor(fetch_blocking, g_thread.source(indices, buffers=k), buffers=k, name="fetch")
    )

    def contender(name, fn, note, after=None):
        return harness.Contender(name, fn, check_pieces, ref=n, after=after, note=note)

    contenders = [
        contender(
            "asyncio semaphore + gather", gather, f"asyncio.Semaphore({k}) + gather on asyncio.run"
        ),
        contender(
            "actorflow async stage",
            lambda: list(g_async.run()),
            f"async def stage, buffers={k}",
            after=lambda: g_async.stats().as_dict(),
        ),
        contender(
            "actorflow thread stage",
            lambda: list(g_thread.run()),
            "plain function on the stage's thread (time.sleep), one act at a time",
        ),
    ]
    cc = harness.CpuContention()
    harness.run_rounds(contenders, repeat, "async stages")
    contention = cc.result()

    bound = n / k * delay
    rows = {}
    base = contenders[0].summary().get("best_s")
    for c in contenders:
        s = c.summary()
        if c.times:
            s["ratio_vs_bound"] = s["best_s"] / bound
            if base:
                s["ratio_vs_gather"] = s["best_s"] / base
        rows[c.name] = s
    r = rows["actorflow async stage"].get("ratio_vs_gather")
    goals = {
        "async_stage_vs_gather_at_most": VS_GATHER,
        "async_stage_vs_gather": r,
        "met": None if r is None else r <= VS_GATHER,
    }

    env = harness.environment(runtime={"graph_event_loop": harness.graph_event_loop()})
    print()
    print(f"{n} fetches of {FETCH_MS:g} ms, {k} in flight (best of {repeat})")
    Col = harness.Column
    harness.print_table(
        rows,
        [
            Col("best ms", 10, "best_s", ".1f", 1e3),
            Col("median ms", 11, "median_s", ".1f", 1e3),
            Col("vs bound", 10, "ratio_vs_bound", ".3f", suffix="x"),
            Col("vs gather", 11, "ratio_vs_gather", ".3f", suffix="x"),
        ],
        28,
        lead=[f"  {'bound (N / K x fetch)':<28}{bound * 1e3:>10.1f}"],
    )
    print(
        f"  goal: the async stage within {VS_GATHER}x of semaphore + gather -> "
        f"{harness.fmt(r, '.3f')}x ({'MET' if goals['met'] else 'NOT MET'})"
    )
    harness.print_contention(contention)
    result = harness.document(
        "bench_async_stages",
        argv,
        args.quick,
        f"{n} pieces in order, piece i == i (float32[{SIZE}])",
        pieces=n,
        in_flight=k,
        fetch_ms=FETCH_MS,
        repeat=repeat,
    )
    result.update(
        {"bound_s": bound, "contenders": rows, "goals": goals, "cpu_contention": contention}
    )
    return harness.finish(args.out, result, contenders, t_start, env, "produced wrong pieces")


if __name__ == "__main__":
    sys.exit(main())
