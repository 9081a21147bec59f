"""``af.plot_timeline``: a run's timeline as a picture (matplotlib, the ``plot`` extra).

From a trace file written by ``run(trace=...)`` (or its parsed events): a Gantt chart, one
row per actor, its acts as solid bars, its waits shaded beneath them (input, credit,
resource in their own colours), and under it the free registers of each actor over time.
From ``g.stats()`` (no times per act): per actor, the shares of the run it spent acting and
waiting on input, credit and resources, as stacked bars.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

WAIT_COLORS = {"input": "tab:orange", "credit": "tab:red", "resource": "tab:purple"}


def plot_timeline(source, path=None, title: str | None = None):
    """Draws ``source`` (a trace path, the trace's events, or a RunStats) and saves it to
    ``path`` (PNG, or any format matplotlib knows) when given; returns the figure.
    Raises ImportError naming the extra when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plot_timeline needs matplotlib: pip install 'actorflow[plot]'") \
            from e
    if hasattr(source, "actors") and hasattr(source, "wall_s"):
        fig = _stats_figure(plt, source, title)
    else:
        fig = _trace_figure(plt, _events(source), title)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _events(source) -> list:
    if isinstance(source, (str, Path)):
        return json.loads(Path(source).read_text())["traceEvents"]
    if isinstance(source, dict):
        return source["traceEvents"]
    return list(source)


def _trace_figure(plt, evs: list, title):
    names = {e["tid"]: e["args"]["name"] for e in evs
             if e["ph"] == "M" and e["name"] == "thread_name"}
    rows = {tid: i for i, tid in enumerate(sorted(names))}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 1.2 + 0.55 * len(rows) + 2.2),
                                      sharex=True, layout="constrained",
                                      gridspec_kw={"height_ratios": [max(len(rows), 1), 2]})
    acts, waits = {}, {}
    for e in evs:
        if e["ph"] != "X" or e["tid"] not in rows:
            continue
        span = (e["ts"] / 1e3, e["dur"] / 1e3)          # milliseconds
        if e["cat"] == "act":
            acts.setdefault(e["tid"], []).append(span)
        else:
            waits.setdefault((e["tid"], e["args"]["cause"]), []).append(span)
    for (tid, cause), spans in waits.items():
        top.broken_barh(spans, (rows[tid] - 0.3, 0.6), color=WAIT_COLORS.get(cause, "grey"),
                        alpha=0.35, linewidth=0)
    for tid, spans in acts.items():
        top.broken_barh(spans, (rows[tid] - 0.3, 0.6), color="tab:blue", linewidth=0)
    top.set_yticks(list(rows.values()), [names[t] for t in rows])
    top.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color="tab:blue", label="acting")]
    handles += [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.35, label=f"waiting on {k}")
                for k, c in WAIT_COLORS.items()]
    top.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4,
               frameon=False, fontsize="small")
    counters: dict = {}
    for e in evs:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"] / 1e3, e["args"]["free"]))
    for name, points in counters.items():
        points.sort()
        bottom.step([p[0] for p in points], [p[1] for p in points], where="post",
                    label=name.replace(" free registers", ""))
    bottom.set_ylabel("free registers")
    bottom.set_xlabel("time (ms)")
    if counters:
        bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
                      fontsize="small")
    fig.suptitle(title or "Run timeline: acts and waits per actor, free registers beneath")
    return fig


def _stats_figure(plt, stats, title):
    names = list(stats.actors)
    wall = stats.wall_s or 1.0
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(names)), layout="constrained")
    left = [0.0] * len(names)
    parts = [("acting", "compute_s", "tab:blue")] + [
        (f"waiting on {k}", f"wait_{k}_s", c) for k, c in WAIT_COLORS.items()]
    for label, key, color in parts:
        widths = [min(stats.actors[n][key] / wall, 1.0) for n in names]
        ax.barh(range(len(names)), widths, left=left, color=color, label=label,
                alpha=1.0 if key == "compute_s" else 0.6)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("share of the run")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False,
              fontsize="small")
    neck = stats.bottleneck()
    text = title or ("Run: " + (neck or "acting and waiting per actor"))
    fig.suptitle("\n".join(textwrap.wrap(text, 95)), fontsize="medium")
    return fig
