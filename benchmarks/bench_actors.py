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

import argparse
import asyncio
import datetime as _dt
import gc
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "bench_actors.json"

CHAIN = 7                  # neg actors after the source
ACTS_PER_PIECE = CHAIN + 1
SIZE = 4                   # float32 elements per piece
QUEUE_SIZE = 2

# Goal stated by the project.
US_PER_ACT_GOAL = 10.0     # actorflow ops row, with uvloop


# -- the workload --------------------------------------------------------------------------

def make_items(n: int) -> list:
    rng = np.random.default_rng(0)
    return list(rng.standard_normal((n, SIZE)).astype(np.float32))


def build_graph(af, feed: dict, kind: str):
    """The 8-actor chain. ``feed["items"]`` is read at the start of every run, so one graph
    runs the warm-up stream and the timed stream alike."""
    g = af.ActorGraph()
    prev = g.source(lambda: iter(feed["items"]), out=af.Spec((SIZE,), af.float32),
                    inline=True, name="source")
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
        y = x.copy()                 # the source's act: the piece copied into its register
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
    end = object()
    qs = [queue.Queue(maxsize=QUEUE_SIZE) for _ in range(CHAIN + 1)]
    errors = []

    def produce():
        try:
            put = qs[0].put
            for x in items:
                put(x.copy())
        except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
            errors.append(e)
        finally:
            qs[0].put(end)

    def work(qin, qout):
        get, put, neg = qin.get, qout.put, np.negative
        try:
            while True:
                x = get()
                if x is end:
                    break
                put(neg(x))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            while qin.get() is not end:
                pass
        finally:
            qout.put(end)

    threads = [threading.Thread(target=produce, daemon=True)]
    threads += [threading.Thread(target=work, args=(qs[i], qs[i + 1]), daemon=True)
                for i in range(CHAIN)]
    for t in threads:
        t.start()
    out, get = [], qs[-1].get
    while True:
        x = get()
        if x is end:
            break
        out.append(x)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# -- harness (the pattern of bench_eager.py) ------------------------------------------------

class Contender:
    """``fn(items)`` runs the timed work and returns the outputs; ``after()`` runs after the
    clock stops (e.g. reads ``stats()``) and its value is kept per timed run."""

    def __init__(self, name, fn, note="", after=None, baseline=False, diagnostic=False):
        self.name, self.fn, self.note = name, fn, note
        self.after, self.baseline, self.diagnostic = after, baseline, diagnostic
        self.times: list[float] = []
        self.after_values: list = []
        self.errors: list[str] = []
        self.check_failures: list[str] = []
        self.checks_passed = 0

    def run_once(self, items, ref, timed: bool) -> None:
        gc.collect()
        try:
            t0 = time.perf_counter()
            out = self.fn(items)
            t1 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - recorded, reported, exit status 1
            self.errors.append(f"{type(e).__name__}: {e}")
            traceback.print_exc()
            return
        extra = self.after() if self.after else None
        self._check(out, ref)
        del out
        if timed:
            self.times.append(t1 - t0)
            self.after_values.append(extra)

    def _check(self, out, ref) -> None:
        if len(out) != len(ref):
            self.check_failures.append(f"{len(out)} pieces, expected {len(ref)}")
            return
        got = np.stack([np.asarray(x) for x in out])
        if got.dtype != ref.dtype or got.shape != ref.shape:
            self.check_failures.append(f"{got.dtype}{list(got.shape)} != "
                                       f"{ref.dtype}{list(ref.shape)}")
        elif not np.array_equal(got, ref):
            bad = np.flatnonzero(~np.all(got == ref, axis=1))
            i = int(bad[0])
            self.check_failures.append(f"{bad.size} pieces differ, e.g. piece {i}: "
                                       f"{got[i]} != {ref[i]}")
        else:
            self.checks_passed += 1

    @property
    def ok(self) -> bool:
        return not self.errors and not self.check_failures and bool(self.times)

    def best_index(self):
        return min(range(len(self.times)), key=self.times.__getitem__) if self.times else None

    def summary(self, pieces: int) -> dict:
        d = {"note": self.note, "baseline": self.baseline, "diagnostic": self.diagnostic,
             "ok": self.ok, "checks_passed": self.checks_passed,
             "check_failures": self.check_failures, "errors": self.errors,
             "times_s": self.times}
        if self.times:
            best, med = min(self.times), statistics.median(self.times)
            acts = pieces * ACTS_PER_PIECE
            d.update(best_s=best, median_s=med, best_us_per_act=best / acts * 1e6,
                     median_us_per_act=med / acts * 1e6)
        return d


def run_rounds(contenders, items, ref, warm_items, warm_ref, repeat: int) -> None:
    print(f"[actors] warm-up ({len(warm_items)} pieces) ...", flush=True)
    for c in contenders:
        c.run_once(warm_items, warm_ref, timed=False)
    for r in range(repeat):
        k = r % len(contenders)
        for c in contenders[k:] + contenders[:k]:
            if not c.errors:
                c.run_once(items, ref, timed=True)
        print(f"[actors] round {r + 1}/{repeat}: " + ", ".join(
            f"{c.name}={c.times[-1] * 1e3:.0f}ms" for c in contenders if c.times), flush=True)


# -- environment ---------------------------------------------------------------------------

def _try_import(name):
    try:
        return __import__(name)
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None


def _git(*cmd):
    try:
        return subprocess.run(["git", *cmd], cwd=HERE.parent, text=True, capture_output=True,
                              timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def environment() -> dict:
    import actorflow as af
    from actorflow.runtime.graph import new_event_loop   # read only: the loop a run uses
    uvloop = _try_import("uvloop")
    loop = new_event_loop()
    loop_type = f"{type(loop).__module__}.{type(loop).__name__}"
    loop.close()
    dirty = _git("diff", "--name-only", "HEAD", "--", "actorflow")
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numpy": np.__version__,
        "actorflow": getattr(af, "__version__", None),
        "actorflow_git_head": _git("rev-parse", "HEAD") or None,
        "actorflow_uncommitted_files": dirty.split() if dirty else [],
        "uvloop_installed": uvloop is not None,
        "uvloop_version": getattr(uvloop, "__version__", None) if uvloop else None,
        "graph_event_loop": loop_type,
        "uvloop_used_by_run": loop_type.startswith("uvloop"),
        "switch_interval_s": sys.getswitchinterval(),
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


class CpuContention:
    """CPU other processes used while the rounds ran (/proc/stat minus this process)."""

    def __init__(self):
        self.t0 = self._sample()

    @staticmethod
    def _sample():
        try:
            import resource
            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:]]
            hz = os.sysconf("SC_CLK_TCK")
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            return sum(vals) / hz, (sum(vals) - idle) / hz, ru.ru_utime + ru.ru_stime
        except Exception:  # noqa: BLE001
            return None

    def result(self) -> dict | None:
        t1 = self._sample()
        if self.t0 is None or t1 is None:
            return None
        total, busy, own = (b - a for a, b in zip(self.t0, t1))
        other = max(busy - own, 0.0)
        return {"cpu_s_available": round(total, 2), "cpu_s_this_process": round(own, 2),
                "cpu_s_other_processes": round(other, 2),
                "other_processes_fraction": round(other / max(total, 1e-9), 3)}


# -- main ----------------------------------------------------------------------------------

def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2,000 pieces, best of 3 (~8 s)")
    p.add_argument("--pieces", type=int, default=None, help="default 10000, quick 2000")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed rounds per contender (best-of-N); default 5, quick 3")
    p.add_argument("--warmup-pieces", type=int, default=1000,
                   help="pieces of the untimed warm-up run (default 1000)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSON results path (default {DEFAULT_OUT.relative_to(HERE.parent)})")
    p.add_argument("--no-diagnostics", action="store_true",
                   help="skip the diagnostic run_async row on the stock asyncio loop")
    args = p.parse_args(argv)
    q = args.quick
    n = args.pieces if args.pieces is not None else (2000 if q else 10_000)
    repeat = args.repeat if args.repeat is not None else (3 if q else 5)
    if n < 1 or repeat < 1 or args.warmup_pieces < 1:
        p.error("--pieces, --repeat and --warmup-pieces must be >= 1")

    t_start = time.perf_counter()
    import actorflow as af
    uvloop = _try_import("uvloop")

    items = make_items(n)
    ref = -np.stack(items)
    warm_items = items[:min(args.warmup_pieces, n)]
    warm_ref = ref[:len(warm_items)]
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
    uv_runner = uvloop.run if uvloop is not None and hasattr(uvloop, "run") else None
    if uv_runner is None and uvloop is not None:      # older uvloop: set the policy instead
        def uv_runner(coro):
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            try:
                return asyncio.run(coro)
            finally:
                asyncio.set_event_loop_policy(None)
    async_runner = uv_runner or asyncio.run

    def stats_of(g):
        return lambda: g.stats().as_dict()

    contenders = [
        Contender("actorflow ops", fed(lambda: run_graph(g_op)), after=stats_of(g_op),
                  note="source inline + 7 x g.op(af.neg); for _ in g.run()"),
        Contender("actorflow ops, run_async",
                  fed(lambda: run_graph_async(g_async, async_runner)), after=stats_of(g_async),
                  note=("async for in g.run_async() inside "
                        + ("uvloop.run" if uv_runner else "asyncio.run (uvloop missing)"))),
    ]
    if uvloop is not None and not args.no_diagnostics:
        contenders.append(Contender(
            "actorflow ops, run_async (asyncio)",
            fed(lambda: run_graph_async(g_async2, asyncio.run)), after=stats_of(g_async2),
            diagnostic=True, note="diagnostic: the same inside asyncio.run (stock loop)"))
    contenders += [
        Contender("actorflow inline stages", fed(lambda: run_graph(g_inline)),
                  after=stats_of(g_inline),
                  note="7 x g.actor(lambda a: -a, inline=True): Python on the loop"),
        Contender("actorflow thread stages", fed(lambda: run_graph(g_thread)),
                  after=stats_of(g_thread),
                  note="7 x g.actor(lambda a: -a): each stage on its own thread"),
        Contender("threads + queue", run_threads, baseline=True,
                  note=f"8 threads, queue.Queue(maxsize={QUEUE_SIZE}) between them"),
        Contender("numpy sequential", run_numpy, baseline=True,
                  note="one loop: copy + 7 np.negative per piece (reference)"),
    ]

    cc = CpuContention()
    run_rounds(contenders, items, ref, warm_items, warm_ref, repeat)
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
        if c.after is not None and c.after_values:
            st = c.after_values[c.best_index()]
            s["stats_of_best_run"] = st
            s["modes"] = {a: r["mode"] for a, r in st["actors"].items()}
        rows[c.name] = s

    env = environment()
    us = rows["actorflow ops"].get("best_us_per_act")
    goal = {"us_per_act_at_most": US_PER_ACT_GOAL, "actorflow_ops_us_per_act": us,
            "event_loop": env["graph_event_loop"], "uvloop_used": env["uvloop_used_by_run"],
            "met": None if us is None else us <= US_PER_ACT_GOAL}
    us_async = rows["actorflow ops, run_async"].get("best_us_per_act")

    # -- report ----------------------------------------------------------------------------
    print()
    print(f"Chain of {ACTS_PER_PIECE} actors (source + {CHAIN} x neg) over {n:,} float32[{SIZE}] "
          f"pieces (best of {repeat}; us/act = time / ({n:,} x {ACTS_PER_PIECE}))")
    hdr = (f"  {'contender':<36}{'best ms':>9}{'median ms':>11}{'us/act':>9}"
           f"{'vs thr+queue':>14}{'vs numpy':>10}  check")
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for name, s in rows.items():
        best, med = s.get("best_s"), s.get("median_s")
        line = (f"  {name:<36}{_fmt(best and best * 1e3, '9.1f')}"
                f"{_fmt(med and med * 1e3, '11.1f')}{_fmt(s.get('best_us_per_act'), '9.2f')}")
        rt, rn = s.get("ratio_vs_threads_queue"), s.get("ratio_vs_numpy")
        line += f"{rt:13.2f}x" if rt is not None else f"{'-':>14}"
        line += f"{rn:9.1f}x" if rn is not None else f"{'-':>10}"
        line += "  ok" if s["ok"] else "  FAIL " + "; ".join(
            s["errors"] + s["check_failures"])[:80]
        print(line)
    print(f"  goal: actorflow ops <= {US_PER_ACT_GOAL:g} us/act with uvloop -> "
          f"{_fmt(us, '.2f')} us/act on {env['graph_event_loop']} "
          f"({'MET' if goal['met'] and goal['uvloop_used'] else 'NOT MET'}"
          f"{'' if goal['uvloop_used'] else ': uvloop not in use'}); "
          f"run_async: {_fmt(us_async, '.2f')} us/act")
    if contention:
        frac = contention["other_processes_fraction"]
        print(f"  other processes used {contention['cpu_s_other_processes']:.1f} of "
              f"{contention['cpu_s_available']:.1f} CPU-s available ({frac:.0%})"
              + ("  <- machine was shared; timings are noisy" if frac > 0.1 else ""))
    print(f"env: {env['cpu_count']} CPUs, python {env['python']}, numpy {env['numpy']}, "
          f"uvloop installed {env['uvloop_installed']} ({env['uvloop_version']}), graph loop "
          f"{env['graph_event_loop']}")

    ok = all(c.ok for c in contenders)
    wall = time.perf_counter() - t_start
    result = {
        "benchmark": "bench_actors",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": q, "pieces": n, "acts_per_piece": ACTS_PER_PIECE, "piece": f"float32[{SIZE}]",
        "repeat": repeat, "warmup_pieces": len(warm_items),
        "timing": "best of N interleaved rounds (order rotated each round) after one untimed "
                  "warm-up on a shorter stream; median recorded too",
        "check": "every piece in order equals -items[i] (7 negations) on every run",
        "contenders": rows,
        "goal": goal,
        "cpu_contention": contention,
        "all_checks_ok": ok,
        "wall_time_s": wall,
        "environment": env,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}  (wall time {wall:.1f} s)")
    if not ok:
        print("ERROR: some contender failed or produced wrong pieces:", file=sys.stderr)
        for c in contenders:
            if not c.ok:
                print(f"  {c.name}: {c.errors + c.check_failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
