"""Figure 2's pipeline (load -> preprocess -> copy h2d -> compute, compute the bottleneck):
the naive scheduler alone, the naive scheduler with figure 3's double-buffer allocator, and
actors with 1, 2 and 3 registers per stage: throughput, peak memory and stalls.

Memory and time are modelled (the null device: sizes, no data; durations with call_later),
so the numbers show scheduling, not kernels. The naive run issues every load first (its
inputs exist at once) on the one cpu stream, so loads fill the pool and the preprocess that
would free them waits behind a load: a deadlock, or an out-of-memory error. Figure 3's
per-op counter of two buffers with a waiting list fixes that by hand; actors get the same
from their registers, with the memory planned up front.
"""

from __future__ import annotations

from ..runtime.graph import ActorGraph
from ..runtime.naive import NaiveOp, NaiveScheduler
from ..runtime.spec import Spec
from .common import MiB, save_figure, table

STAGES = [  # name, output bytes, seconds, device, stream
    ("load", 4 * MiB, 0.001, "cpu", "cpu:0"),
    ("preprocess", 4 * MiB, 0.001, "cpu", "cpu:0"),
    ("copy", 4 * MiB, 0.002, "gpu", "gpu:copy"),
    ("compute", 1 * MiB, 0.003, "gpu", "gpu:0"),
]
CAPACITY = {"cpu": 24 * MiB, "gpu": 24 * MiB}


def naive_ops():
    ops, prev = [], []
    for name, nbytes, t, dev, stream in STAGES:
        ops.append(NaiveOp(name, prev, nbytes, t, dev, stream))
        prev = [name]
    return ops


def actors(buffers: int, pieces: int) -> ActorGraph:
    g = ActorGraph(buffers=buffers, memory={"null": sum(CAPACITY.values())})
    node = None
    for name, nbytes, t, _, _ in STAGES:
        spec = Spec((nbytes // 4,), "float32", "null")
        if node is None:
            node = g.source([None] * pieces, out=spec, name=name, time=t, inline=True)
        else:
            node = g.actor(lambda x: None, node, out=spec, name=name, time=t, inline=True)
    g.sink(node)
    return g


def run(seed: int = 0, pieces: int = 60) -> dict:
    headers = ["scheduler", "result", "pieces/s", "peak MiB", "stalls", "stall ms",
               "compute busy"]
    rows, series = [], {}
    bound = 1.0 / max(t for _, _, t, _, _ in STAGES)
    for label, mode in (("naive", "wait"), ("naive", "fail"),
                        ("naive + figure 3 allocator", "double-buffer")):
        r = NaiveScheduler(naive_ops(), CAPACITY, policy="fifo", mode=mode, seed=seed,
                           pieces=pieces).run()
        done = r.completed // len(STAGES)
        rate = done / r.elapsed_s if r.status == "ok" else 0.0
        rows.append([f"{label} ({mode})", r.status, rate, sum(r.peak.values()) / MiB,
                     r.stalls, r.stall_s * 1e3, ""])
        series[f"{label} ({mode})"] = r.timeline
    for b in (1, 2, 3):
        g = actors(b, pieces)
        n = sum(1 for _ in g.run())
        s = g.stats()
        busy = s.actors["compute"]["compute_s"] / s.wall_s
        stalls = sum(1 for a in s.actors.values() if a["wait_credit_s"] > 0)
        wait_ms = sum(a["wait_credit_s"] for a in s.actors.values()) * 1e3
        rows.append([f"actors, buffers={b}", "ok" if n == pieces else f"{n} pieces",
                     n / s.wall_s, s.memory["null"]["peak"] / MiB, stalls, wait_ms,
                     f"{busy:.0%}"])
    data = {"pieces": pieces, "stages": STAGES, "capacity": CAPACITY, "headers": headers,
            "rows": rows, "bound_pieces_per_s": bound, "timelines": series,
            "note": "actors: 'stalls' counts stages that ever waited for a credit and "
                    "'stall ms' sums that waiting; naive: ops set aside or blocked on memory"}
    data["table"] = table(headers, rows) + f"\n(compute alone bounds throughput at " \
                                           f"{bound:.0f} pieces/s)"
    return data


def plot(data: dict, path) -> bool:
    def draw(ax):
        ax.barh([r[0] for r in data["rows"]], [r[2] for r in data["rows"]])
        ax.axvline(data["bound_pieces_per_s"], color="gray", linestyle="--",
                   label="compute bound")
        ax.set_xlabel("pieces per second")
        ax.legend()
    return save_figure(path, "Figure 2 pipeline: naive vs double-buffered vs actors", draw)
