"""Figure 1 of the article: O2 first frees memory and O1 then fits; O1 first does not fit.

Producers M1 (1 MiB output) and M2 (3 MiB); consumers O1 (reads M1, writes 5 MiB) and O2
(reads M2, writes 1 MiB); a pool of 8 MiB. After M1 and M2, 4 MiB are free: O1 needs 5.
If O2 runs first it frees M2's 3 MiB and O1 fits. If O1 is issued first, it waits for
memory at the head of the one stream, and O2, which would free it, waits behind O1: a
deadlock (``wait``), or an out-of-memory error (``fail``), although a safe order exists.
On actors the planner finds a safe order when it plans, and the offsets that let registers
whose lifetimes never overlap share bytes: here O1 runs (and its output is copied out)
before M2 and O2 write into its bytes, 6 MiB in all, the smallest peak any order has;
control edges O1 -> M2 and O1 -> O2 make the run keep that order. With every register
side by side (``share=False``) the graph needs 10 MiB and 8 MiB is refused.
"""

from __future__ import annotations

from ..errors import PlanError
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.plan.spec import Spec
from .common import RESULT_WORDS, MiB, save, table, trace_path
from .common import figure as figure_of
from .naive import NaiveOp, NaiveScheduler
from .random_dags import min_peak

SIZES = {"M1": 1 * MiB, "M2": 3 * MiB, "O1": 5 * MiB, "O2": 1 * MiB}
CAPACITY = 8 * MiB


def ops(time: float):
    return [
        NaiveOp("M1", [], SIZES["M1"], time),
        NaiveOp("M2", [], SIZES["M2"], time),
        NaiveOp("O1", ["M1"], SIZES["O1"], time),
        NaiveOp("O2", ["M2"], SIZES["O2"], time),
    ]


def actor_graph(budget: int, share="auto", time: float | None = None) -> ActorGraph:
    """The four ops as actors on the null device, one piece; ``time``: each act's
    simulated duration (what the naive runs give every op)."""

    def spec(name):
        return Spec((SIZES[name] // 4,), "float32", "null")

    g = ActorGraph(memory={"null": budget}, buffers=1, share=share)
    m1 = g.source([None], out=spec("M1"), name="M1", inline=True, time=time)
    m2 = g.source([None], out=spec("M2"), name="M2", inline=True, time=time)
    o1 = g.actor(lambda x: None, m1, out=spec("O1"), name="O1", inline=True, time=time)
    o2 = g.actor(lambda x: None, m2, out=spec("O2"), name="O2", inline=True, time=time)
    g.sink(o1, "O1")
    g.sink(o2, "O2")
    return g


def run(seed: int = 0, time: float = 0.002, timeline=None) -> dict:
    """The table and what the picture draws; with ``timeline`` (a folder), the actors runs
    that run also write their traces there (``figure1-actors-shared-by-lifetime-8MiB.json``,
    ``figure1-actors-side-by-side-10MiB.json``), listed under "traces" with a title for
    each picture."""
    rows, runs, traces = [], {}, []
    for label, order in (
        ("O2 first", ["M1", "M2", "O2", "O1"]),
        ("O1 first", ["M1", "M2", "O1", "O2"]),
    ):
        for mode in ("wait", "fail"):
            r = NaiveScheduler(ops(time), CAPACITY, policy=order, mode=mode, seed=seed).run()
            runs[f"naive, {label}, {mode}"] = r
            rows.append(
                [
                    f"naive, {label}",
                    mode,
                    r.status,
                    r.peak["cpu"] / MiB,
                    "" if r.detect_s is None else f"{r.detect_s * 1e3:.2f} ms",
                    str(r.error or ""),
                ]
            )
    for budget, share, how in (
        (CAPACITY, "auto", "shared by lifetime"),
        (CAPACITY, False, "side by side"),
        (10 * MiB, False, "side by side"),
    ):
        g = actor_graph(budget, share, time or None)
        label = f"actors, {how}, budget {budget // MiB} MiB"
        try:
            plan = g.plan()
            trace = trace_path(
                timeline, f"figure1-actors-{how.replace(' ', '-')}-{budget // MiB}MiB"
            )
            outs = list(g.run(trace=trace))
            if trace is not None:
                traces.append(
                    {
                        "path": str(trace),
                        "title": (
                            f"Figure 1 on actors, registers {how} in {budget // MiB} MiB: "
                            + (
                                "O1 and its copy out before M2 and O2 reuse its bytes"
                                if share
                                else "every register has its own bytes"
                            )
                        ),
                    }
                )
            m = g.stats().memory["null"]
            edges = ""
            if plan.sharing is not None:
                names = [a.name for a in plan.sharing.nodes]
                edges = ", control edge " + ", ".join(
                    f"{names[j]} -> {names[i]}" for j, i in plan.sharing.share.edges
                )
            rows.append(
                [
                    label,
                    "plan",
                    "ok",
                    m["peak"] / MiB,
                    "",
                    f"{len(outs)} piece, planned {m['planned'] / MiB:g} MiB{edges}",
                ]
            )
        except PlanError as e:
            rows.append(
                [
                    label,
                    "plan",
                    "refused",
                    0.0,
                    "",
                    str(e).splitlines()[0] + " " + str(e).splitlines()[-1],
                ]
            )
    headers = ["scheduler", "mode", "result", "peak MiB", "detected in", "reason"]
    data = {
        "capacity": CAPACITY,
        "sizes": SIZES,
        "headers": headers,
        "rows": rows,
        "min_peak": min_peak(ops(0)),
        "timelines": {k: r.timeline for k, r in runs.items()},
        "traces": traces,
    }
    data["table"] = table(headers, rows)
    return data


def bars(data: dict) -> list:
    """What the right-hand panel draws, one entry per table row: ``(label, peak MiB, text
    on the bar)``; the text names the result (and a refused plan's reason, in short)."""
    out = []
    for r in data["rows"]:
        label = f"{r[0]}, {r[1]}" if r[0].startswith("naive") else r[0]
        text = RESULT_WORDS.get(r[2], r[2])
        if r[0].startswith("actors") and r[2] == "ok":
            text = f"ok, within its {r[0].split('budget ')[1]} budget"
            if "shared" in r[0]:
                text = f"ok, shared: {r[3]:g} MiB of its {r[0].split('budget ')[1]}"
        if r[2] == "refused":
            text = "refused: " + (
                "the plan needs " + r[5].split("registers need ")[1].split(" (")[0]
                if "registers need " in r[5]
                else "see table"
            )
        out.append((label, r[3], text))
    return out


def figure(data: dict):
    """Left: memory in use over time for both issue orders (wait mode; fail mode stops at
    the same point with an out-of-memory error). Right: every table row's peak against the
    8 MiB capacity, with its result. None without matplotlib."""
    rows = bars(data)
    ys = list(range(len(rows)))
    cap = data["capacity"] / MiB

    def draw(left, right):
        end = max(tl[-1][0] for tl in data["timelines"].values()) * 1e3
        for key, name in (
            ("naive, O2 first, wait", "O2 first: ok"),
            ("naive, O1 first, wait", "O1 first: deadlock (wait) or out of memory (fail)"),
        ):
            tl = data["timelines"][key]
            (line,) = left.step(
                [t * 1e3 for t, _, _ in tl], [b / MiB for _, _, b in tl], where="post", label=name
            )
        left.hlines(
            tl[-1][2] / MiB, tl[-1][0] * 1e3, end, color=line.get_color(), linestyle=":"
        )  # O1 first: stuck from there on
        left.annotate(
            "O1 needs 5 MiB, 4 MiB free;\nO2 waits behind it",
            xy=(tl[-1][0] * 1e3, tl[-1][2] / MiB),
            xytext=(0.05, 0.6),
            textcoords="axes fraction",  # (where, whatever the run's times)
            arrowprops={"arrowstyle": "->"},
        )
        left.axhline(cap, color="gray", linestyle="--", label=f"pool: {cap:.0f} MiB")
        left.set_ylim(0, 11)
        left.set_xlabel("time (ms)")
        left.set_ylabel("memory in use (MiB)")
        left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize="small")
        colors = {"ok": "tab:green", "deadlock": "tab:red", "out of memory": "tab:orange"}
        right.barh(
            ys,
            [r[1] for r in rows],
            color=[colors.get(r[2].split(",")[0], "tab:gray") for r in rows],
        )
        for y, r in zip(ys, rows, strict=True):
            right.text(
                r[1] + 0.2,
                y,
                r[2],
                va="center",
                fontsize="small",
                zorder=3,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
        right.axvline(cap, color="gray", linestyle="--")
        right.set_yticks(ys, [r[0] for r in rows])
        right.invert_yaxis()  # top to bottom as in the table
        right.set_xlim(0, 18)
        right.set_xlabel("peak MiB (dashed: the 8 MiB pool)")

    return figure_of(
        "Figure 1: the issue order decides whether O1 fits; actors plan it",
        draw,
        panels=2,
        size=(13, 4),
        widths=[1, 1.2],
    )


def plot(data: dict, path) -> bool:
    return save(figure(data), path)
