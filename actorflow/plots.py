"""``af.plot_timeline``: a run's timeline as a picture (matplotlib, the ``plot`` extra).

From a trace file written by ``run(trace=...)`` (or its parsed events): a Gantt chart, one
row per actor, its acts as solid bars, its waits shaded beneath them (input, credit,
resource in their own colours), under it the register memory in use per device over time
(with each device's planned bytes dashed), or, in traces written before memory was
recorded, the free registers of each actor.
From ``g.stats()`` (no times per act): per actor, the shares of the run it spent acting and
waiting on input, credit and resources, as stacked bars.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WAIT_COLORS = {"input": "tab:orange", "credit": "tab:red", "resource": "tab:purple"}


def plot_timeline(
    source: Any, path: str | os.PathLike[str] | None = None, title: str | None = None
) -> Figure:
    """Draws ``source`` (a trace path, the trace's events or its parsed JSON, or a
    RunStats) and saves it to ``path`` (PNG, or any format matplotlib knows) when given;
    returns the figure. Raises ImportError naming the extra when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plot_timeline needs matplotlib: pip install 'actorflow[plot]'") from e
    if hasattr(source, "actors") and hasattr(source, "wall_s"):
        fig = _stats_figure(plt, source, title)
    else:
        doc = _trace(source)
        fig = _trace_figure(plt, doc["traceEvents"], doc.get("otherData") or {}, title)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _trace(source) -> dict:
    if isinstance(source, (str, Path)):
        return json.loads(Path(source).read_text())
    if isinstance(source, dict):
        return source
    return {"traceEvents": list(source)}


def _trace_figure(plt, evs: list, other: dict, title):
    names = {
        e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    rows = {tid: i for i, tid in enumerate(sorted(names))}
    free, memory = _counters(evs)
    if memory:  # (it says what the free registers said, in bytes, and reads better)
        free = {}
    panels = [max(len(rows), 1)] + ([2.6] if memory else []) + ([1.6] if free else [])
    fig, axes = plt.subplots(
        len(panels),
        1,
        sharex=True,
        layout="constrained",
        figsize=(11, 1.2 + 0.55 * len(rows) + 1.1 * sum(panels[1:])),
        gridspec_kw={"height_ratios": panels},
    )
    axes = list(axes) if len(panels) > 1 else [axes]
    _gantt(plt, axes[0], evs, names, rows)
    if memory:
        _memory(axes[1], memory, other.get("memory") or {})
    if free:
        _free(axes[-1], free)
    axes[-1].set_xlabel("time (ms)")
    beneath = " and ".join(w for w, c in (("memory in use", memory), ("free registers", free)) if c)
    text = title or (
        "Run timeline: acts and waits per actor" + (f", {beneath} beneath" if beneath else "")
    )
    fig.suptitle("\n".join(textwrap.wrap(text, 100)))
    return fig


def _counters(evs: list):
    """``{actor: [(ms, free registers)]}`` and ``{device: [(ms, bytes in use)]}``, sorted."""
    free: dict = {}
    memory: dict = {}
    for e in evs:
        if e["ph"] != "C":
            continue
        args = e.get("args", {})
        if "free" in args:
            free.setdefault(e["name"].replace(" free registers", ""), []).append(
                (e["ts"] / 1e3, args["free"])
            )
        elif "bytes in use" in args and e["name"].startswith("memory "):
            memory.setdefault(e["name"][len("memory ") :], []).append(
                (e["ts"] / 1e3, args["bytes in use"])
            )
    for points in list(free.values()) + list(memory.values()):
        points.sort(key=lambda p: p[0])
    return free, memory


def _gantt(plt, top, evs, names, rows) -> None:
    acts: dict = {}
    waits: dict = {}
    for e in evs:
        if e["ph"] != "X" or e["tid"] not in rows:
            continue
        span = (e["ts"] / 1e3, e["dur"] / 1e3)  # milliseconds
        if e["cat"] == "act":
            acts.setdefault(e["tid"], []).append(span)
        else:
            waits.setdefault((e["tid"], e["args"]["cause"]), []).append(span)
    for (tid, cause), spans in waits.items():
        top.broken_barh(
            spans,
            (rows[tid] - 0.3, 0.6),
            color=WAIT_COLORS.get(cause, "grey"),
            alpha=0.35,
            linewidth=0,
        )
    for tid, spans in acts.items():
        top.broken_barh(spans, (rows[tid] - 0.3, 0.6), color="tab:blue", linewidth=0)
    top.set_yticks(list(rows.values()), [names[t] for t in rows])
    top.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color="tab:blue", label="acting")]
    handles += [
        plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.35, label=f"waiting on {k}")
        for k, c in WAIT_COLORS.items()
    ]
    top.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=4,
        frameon=False,
        fontsize="small",
    )


def _memory(ax, memory: dict, plans: dict) -> None:
    """Bytes in use per device (steps), each device's planned bytes dashed in its colour."""
    peak = max(
        [n for pts in memory.values() for _, n in pts]
        + [p.get("planned") or 0 for p in plans.values()]
        + [1]
    )
    unit, div = next(
        (u, d)
        for u, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1024), ("bytes", 1))
        if peak >= d
    )
    end = max(t for pts in memory.values() for t, _ in pts)
    for dev in sorted(memory):
        pts = memory[dev]
        top = max(n for _, n in pts)
        (line,) = ax.step(
            [t for t, _ in pts] + [end],
            [n / div for _, n in pts] + [pts[-1][1] / div],
            where="post",
            label=f"{dev}: in use, at most {_amount(top, unit, div)}",
        )
        plan = plans.get(dev) or {}
        if plan.get("planned"):
            budget = plan.get("budget")
            ax.axhline(
                plan["planned"] / div,
                color=line.get_color(),
                linestyle="--",
                linewidth=1,
                label=f"{dev}: planned {_amount(plan['planned'], unit, div)}"
                + (f" of {_amount(budget, unit, div)} budget" if budget else ""),
            )
    ax.set_ylim(0, peak / div * 1.15)
    ax.set_ylabel(f"memory in use ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize="small")


def _amount(n: int, unit: str, div: int) -> str:
    return f"{n / div:.3g} {unit}"


def _free(ax, counters: dict) -> None:
    for name, points in counters.items():
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", label=name)
    ax.set_ylabel("free registers")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize="small")


def _stats_figure(plt, stats, title):
    names = list(stats.actors)
    wall = stats.wall_s or 1.0
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(names)), layout="constrained")
    left = [0.0] * len(names)
    parts = [("acting", "compute_s", "tab:blue")] + [
        (f"waiting on {k}", f"wait_{k}_s", c) for k, c in WAIT_COLORS.items()
    ]
    for label, key, color in parts:
        widths = [min(stats.actors[n][key] / wall, 1.0) for n in names]
        ax.barh(
            range(len(names)),
            widths,
            left=left,
            color=color,
            label=label,
            alpha=1.0 if key == "compute_s" else 0.6,
        )
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("share of the run")
    ax.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False, fontsize="small"
    )
    neck = stats.bottleneck()
    text = title or ("Run: " + (neck or "acting and waiting per actor"))
    fig.suptitle("\n".join(textwrap.wrap(text, 95)), fontsize="medium")
    return fig
