"""What every experiment shares: tables, JSON and (when matplotlib is installed) a PNG."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path


def table(headers: list, rows: list) -> str:
    """A plain-text table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    last = len(headers) - 1
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 or i == last else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_json(out_dir: Path, name: str, data: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    data = dict(data)
    data["environment"] = {"python": sys.version.split()[0], "platform": platform.platform()}
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def trace_path(folder, name: str):
    """Where a traced run of an experiment writes its timeline: ``folder/name.json`` (None
    without a folder: the run is not traced)."""
    return None if folder is None else Path(folder) / f"{name}.json"


def pyplot():
    """matplotlib's pyplot (Agg backend), or None when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(title: str, draw, panels: int = 1, size=(7, 3.5), widths=None):
    """A figure of ``panels`` side by side drawn by ``draw(*axes)`` under ``title``, laid
    out so that every label and the title fit inside it; None when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(
        1,
        panels,
        figsize=size,
        layout="constrained",
        gridspec_kw={"width_ratios": widths} if widths else None,
    )
    draw(*([axes] if panels == 1 else list(axes)))
    fig.suptitle(title)
    return fig


def save(fig, path) -> bool:
    """Saves and closes a figure from ``figure``; False when there is none (no matplotlib)."""
    if fig is None:
        return False
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return True


def save_figure(path, title: str, draw, **kw) -> bool:
    """Draws one figure with ``draw(*axes)`` and saves it; False when matplotlib is missing."""
    return save(figure(title, draw, **kw), path)


RESULT_WORDS = {"ok": "ok", "deadlock": "deadlock", "oom": "out of memory", "refused": "refused"}
OUTCOME_COLORS = {
    "ran": "tab:green",
    "deadlocked": "tab:red",
    "out of memory": "tab:orange",
    "refused": "tab:gray",
}


MiB = 1 << 20


def null_chain(stages, pieces: int, **graph):
    """A chain of actors with sizes and simulated time, no data: ``stages`` is
    ``[(name, bytes per register, seconds per act, device)]`` (the first is the source,
    the last the sink; devices are null ones), ``graph`` goes to ActorGraph (buffers=,
    memory=, share=...). The experiments, benchmarks and tests build their pipelines so."""
    from ..runtime.graph.actor_graph import ActorGraph
    from ..runtime.plan.spec import Spec

    g = ActorGraph(**graph)
    node = None
    for name, nbytes, t, dev in stages:
        spec = Spec((int(nbytes) // 4,), "float32", dev)
        if node is None:
            node = g.source([None] * pieces, out=spec, name=name, time=t, inline=True)
        else:
            node = g.actor(lambda x: None, node, out=spec, name=name, time=t, inline=True)
    assert node is not None  # (stages: a source at least)
    g.sink(node)
    return g
