"""Figure 2's pipeline (load -> preprocess -> copy h2d -> compute, compute the bottleneck):
the naive scheduler alone, the naive scheduler with figure 3's double-buffer allocator, and
actors with 1, 2 and 3 registers per stage: throughput, peak memory per device and stalls,
under the same budgets per device (24 MiB on cpu, 24 MiB on gpu) for every contender.

Memory and time are modelled (the null device: sizes, no data; durations with call_later),
so the numbers show scheduling, not kernels. The naive run issues every load first (its
inputs exist at once) on the one cpu stream, so loads fill the pool and the preprocess that
would free them waits behind a load: a deadlock, or an out-of-memory error. Figure 3's
per-op counter of two buffers with a waiting list fixes that by hand; actors get the same
from their registers, with the memory planned up front.
"""

from __future__ import annotations

from ..device import device
from ..errors import PlanError
from ..runtime.graph.actor_graph import ActorGraph
from .common import RESULT_WORDS, MiB, null_chain, save, table, trace_path
from .common import figure as figure_of
from .naive import NaiveOp, NaiveScheduler

STAGES = [  # name, output bytes, seconds, device, stream
    ("load", 4 * MiB, 0.001, "cpu", "cpu:0"),
    ("preprocess", 4 * MiB, 0.001, "cpu", "cpu:0"),
    ("copy", 4 * MiB, 0.002, "gpu", "gpu:copy"),
    ("compute", 1 * MiB, 0.003, "gpu", "gpu:0"),
]
CAPACITY = {"cpu": 24 * MiB, "gpu": 24 * MiB}  # every contender's budget per device
# the actors' stand-ins of the two memories: two null devices, each budgeted and planned
# on its own, as the naive runs' two pools are
ACTOR_DEVICE = {"cpu": device("null:0"), "gpu": device("null:1")}


def naive_ops():
    ops, prev = [], []
    for name, nbytes, t, dev, stream in STAGES:
        ops.append(NaiveOp(name, prev, nbytes, t, dev, stream))
        prev = [name]
    return ops


def actors(buffers: int, pieces: int, share="auto", budgets: bool = True) -> ActorGraph:
    """The pipeline on actors: cpu-side registers on null, gpu-side ones on null:1, each
    under its device's budget (CAPACITY; none with ``budgets=False``)."""
    return null_chain(
        [(name, nbytes, t, ACTOR_DEVICE[dev]) for name, nbytes, t, dev, _ in STAGES],
        pieces,
        buffers=buffers,
        share=share,
        memory={str(ACTOR_DEVICE[d]): CAPACITY[d] for d in CAPACITY} if budgets else None,
    )


def run(seed: int = 0, pieces: int = 60, timeline=None, progress=False) -> dict:
    """The table and what the picture draws; with ``timeline`` (a folder), each actors
    run also writes its trace there (``double-buffering-actors-bN.json``), listed under
    "traces" with a title for its picture; ``progress``: each actors run shows its bar
    (pieces per second and its bottleneck)."""
    headers = [
        "scheduler",
        "result",
        "pieces/s",
        "peak cpu MiB",
        "peak gpu MiB",
        "stalls",
        "stall ms",
        "compute busy",
        "minimum cpu/gpu MiB",
        "control edges",
    ]
    rows, series, refusals, traces = [], {}, {}, []
    bound = 1.0 / max(t for _, _, t, _, _ in STAGES)
    for label, mode in (
        ("naive", "wait"),
        ("naive", "fail"),
        ("naive + figure 3 allocator", "double-buffer"),
    ):
        r = NaiveScheduler(
            naive_ops(), CAPACITY, policy="fifo", mode=mode, seed=seed, pieces=pieces
        ).run()
        done = r.completed // len(STAGES)
        rate = done / r.elapsed_s if r.status == "ok" else 0.0
        rows.append(
            [
                f"{label} ({mode})",
                r.status,
                rate,
                r.peak["cpu"] / MiB,
                r.peak["gpu"] / MiB,
                r.stalls,
                r.stall_s * 1e3,
                "",
                "",
                "",
            ]
        )
        series[f"{label} ({mode})"] = r.timeline
    for b in (1, 2, 3, 4):
        least = actors(b, pieces, share=True, budgets=False).plan().sharing
        assert least is not None  # (share=True: the plan shares registers)
        mins = "/".join(f"{least.arenas.get(ACTOR_DEVICE[d], 0) / MiB:g}" for d in ("cpu", "gpu"))
        g = actors(b, pieces)
        try:
            g.plan()
        except PlanError as e:
            rows.append(
                [
                    f"actors, buffers={b}",
                    "refused",
                    0.0,
                    0.0,
                    0.0,
                    "",
                    "",
                    "",
                    mins,
                    len(least.share.edges),
                ]
            )
            refusals[b] = str(e).splitlines()[-1]
            continue
        trace = trace_path(timeline, f"double-buffering-actors-b{b}")
        shown = {"desc": f"actors, buffers={b}"} if progress else False
        n = sum(1 for _ in g.run(trace=trace, progress=shown))
        s = g.stats()
        if trace is not None:
            traces.append(
                {
                    "path": str(trace),
                    "title": (
                        f"Figure 2's pipeline on actors, buffers={b}: acts and waits per actor; "
                        f"register memory in use per device beneath (null stands for the cpu, "
                        f"null:1 for the gpu)"
                    ),
                }
            )
        busy = s.actors["compute"]["compute_s"] / s.wall_s
        stalls = sum(1 for a in s.actors.values() if a["wait_credit_s"] > 0)
        wait_ms = sum(a["wait_credit_s"] for a in s.actors.values()) * 1e3
        peak = [s.memory[str(ACTOR_DEVICE[d])]["peak"] / MiB for d in ("cpu", "gpu")]
        rows.append(
            [
                f"actors, buffers={b}",
                "ok" if n == pieces else f"{n} pieces",
                n / s.wall_s,
                *peak,
                stalls,
                wait_ms,
                f"{busy:.0%}",
                mins,
                len(least.share.edges),
            ]
        )
    data: dict = {
        "pieces": pieces,
        "stages": STAGES,
        "capacity": CAPACITY,
        "headers": headers,
        "rows": rows,
        "bound_pieces_per_s": bound,
        "timelines": series,
        "refusals": refusals,
        "traces": traces,
        "note": "actors: 'stalls' counts stages that ever waited for a credit and "
        "'stall ms' sums that waiting; naive: ops set aside or blocked on memory",
    }
    data["table"] = table(headers, rows) + (
        f"\n(compute alone bounds throughput at {bound:.0f} pieces/s; every contender has "
        f"{CAPACITY['cpu'] // MiB} MiB on cpu for load and preprocess and "
        f"{CAPACITY['gpu'] // MiB} MiB on gpu for copy and compute; 'minimum' is the "
        f"smallest peak any order has with registers shared by lifetime: a chain's "
        f"neighbours are live together, so sharing saves nothing here)"
    )
    for b, why in refusals.items():
        data["table"] += f"\nactors, buffers={b} refused: {why}"
    return data


def bars(data: dict) -> list:
    """What the picture draws, one entry per table row: ``(label, pieces/s, text on the bar,
    peak cpu MiB, peak gpu MiB)``; a run that did not finish is named on its (empty) bar."""
    out = []
    for r in data["rows"]:
        text = f"{r[2]:.0f}/s" if r[1] == "ok" else RESULT_WORDS.get(r[1], r[1])
        out.append((r[0], r[2], text, r[3], r[4]))
    return out


def figure(data: dict):
    """Throughput per contender (the compute bound dashed) and its peak per device against
    the per-device budget, as the table; None without matplotlib."""
    rows = bars(data)
    labels = [r[0] for r in rows]
    ys = list(range(len(rows)))

    def draw(left, right):
        left.barh(ys, [r[1] for r in rows], color="tab:blue")
        bound = data["bound_pieces_per_s"]
        for y, r in zip(ys, rows, strict=True):
            if r[1]:  # its rate, inside the end of its bar
                left.text(
                    min(r[1], bound * 1.1) - bound * 0.02,
                    y,
                    r[2],
                    va="center",
                    ha="right",
                    color="white",
                )
            else:  # no bar: what happened instead
                left.text(bound * 0.02, y, r[2], va="center", color="tab:red", fontweight="bold")
        left.axvline(bound, color="gray", linestyle="--", label=f"compute bound ({bound:.0f}/s)")
        left.set_yticks(ys, labels)
        left.invert_yaxis()  # top to bottom as in the table
        left.set_xlim(0, bound * 1.1)
        left.set_xlabel("pieces per second")
        left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        h = 0.38
        right.barh(
            [y - h / 2 for y in ys], [r[3] for r in rows], h, label="cpu", color="tab:orange"
        )
        right.barh(
            [y + h / 2 for y in ys], [r[4] for r in rows], h, label="gpu", color="tab:purple"
        )
        cap = data["capacity"]
        right.axvline(
            cap["cpu"] / MiB,
            color="gray",
            linestyle="--",
            label=f"budget, {cap['cpu'] // MiB} MiB each",
        )
        right.set_yticks(ys, [""] * len(ys))
        right.invert_yaxis()
        right.set_xlim(0, max(cap.values()) / MiB * 1.1)
        right.set_xlabel("peak MiB per device")
        right.legend(
            loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, fontsize="small"
        )

    return figure_of(
        "Figure 2's pipeline: throughput and peak memory per device",
        draw,
        panels=2,
        size=(11, 4),
        widths=[3, 2],
    )


def plot(data: dict, path) -> bool:
    return save(figure(data), path)
