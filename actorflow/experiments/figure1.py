"""Figure 1 of the article: O2 first frees memory and O1 then fits; O1 first does not fit.

Producers M1 (1 MiB output) and M2 (3 MiB); consumers O1 (reads M1, writes 5 MiB) and O2
(reads M2, writes 1 MiB); a pool of 8 MiB. After M1 and M2, 4 MiB are free: O1 needs 5.
If O2 runs first it frees M2's 3 MiB and O1 fits. If O1 is issued first, it waits for
memory at the head of the one stream, and O2, which would free it, waits behind O1: a
deadlock (``wait``), or an out-of-memory error (``fail``), although a safe order exists.
On actors the same graph needs all four registers (10 MiB): under an 8 MiB budget the plan
is refused when it is built, with the reason; under 10 MiB it runs.
"""

from __future__ import annotations

from ..errors import PlanError
from ..runtime.graph import ActorGraph
from ..runtime.naive import NaiveOp, NaiveScheduler
from ..runtime.spec import Spec
from .common import MiB, save_figure, table

SIZES = {"M1": 1 * MiB, "M2": 3 * MiB, "O1": 5 * MiB, "O2": 1 * MiB}
CAPACITY = 8 * MiB


def ops(time: float):
    return [NaiveOp("M1", [], SIZES["M1"], time), NaiveOp("M2", [], SIZES["M2"], time),
            NaiveOp("O1", ["M1"], SIZES["O1"], time), NaiveOp("O2", ["M2"], SIZES["O2"], time)]


def actor_graph(budget: int) -> ActorGraph:
    def spec(name):
        return Spec((SIZES[name] // 4,), "float32", "null")
    g = ActorGraph(memory={"null": budget}, buffers=1)
    m1 = g.source([None], out=spec("M1"), name="M1", inline=True)
    m2 = g.source([None], out=spec("M2"), name="M2", inline=True)
    o1 = g.actor(lambda x: None, m1, out=spec("O1"), name="O1", inline=True)
    o2 = g.actor(lambda x: None, m2, out=spec("O2"), name="O2", inline=True)
    g.sink(o1, "O1")
    g.sink(o2, "O2")
    return g


def run(seed: int = 0, time: float = 0.002) -> dict:
    rows, runs = [], {}
    for label, order in (("O2 first", ["M1", "M2", "O2", "O1"]),
                         ("O1 first", ["M1", "M2", "O1", "O2"])):
        for mode in ("wait", "fail"):
            r = NaiveScheduler(ops(time), CAPACITY, policy=order, mode=mode, seed=seed).run()
            runs[f"naive, {label}, {mode}"] = r
            rows.append([f"naive, {label}", mode, r.status, r.peak["cpu"] / MiB,
                         "" if r.detect_s is None else f"{r.detect_s * 1e3:.2f} ms",
                         str(r.error or "")])
    for budget in (CAPACITY, 10 * MiB):
        g = actor_graph(budget)
        try:
            g.plan()
            outs = list(g.run())
            m = g.stats().memory["null"]
            rows.append([f"actors, budget {budget // MiB} MiB", "plan", "ok",
                         m["peak"] / MiB, "", f"{len(outs)} piece, planned "
                         f"{m['planned'] // MiB} MiB"])
        except PlanError as e:
            rows.append([f"actors, budget {budget // MiB} MiB", "plan", "refused", 0.0, "",
                         str(e).splitlines()[0] + " " + str(e).splitlines()[-1]])
    headers = ["scheduler", "mode", "result", "peak MiB", "detected in", "reason"]
    data = {"capacity": CAPACITY, "sizes": SIZES, "headers": headers, "rows": rows,
            "timelines": {k: r.timeline for k, r in runs.items()}}
    data["table"] = table(headers, rows)
    return data


def plot(data: dict, path) -> bool:
    def draw(ax):
        for key in ("naive, O2 first, wait", "naive, O1 first, wait"):
            tl = data["timelines"][key]
            ax.step([t * 1e3 for t, _, _ in tl], [b / MiB for _, _, b in tl], where="post",
                    label=key)
        tl = data["timelines"]["naive, O1 first, wait"]
        ax.annotate("deadlock: O1 needs 5 MiB,\n4 MiB free, O2 waits behind it",
                    xy=(tl[-1][0] * 1e3, tl[-1][2] / MiB), xytext=(0.5, 6.5),
                    arrowprops={"arrowstyle": "->"})
        ax.axhline(CAPACITY / MiB, color="gray", linestyle="--", label="capacity")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("memory in use (MiB)")
        ax.legend()
    return save_figure(path, "Figure 1: the issue order decides whether O1 fits", draw)
