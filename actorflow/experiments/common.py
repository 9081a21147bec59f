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
    lines = ["  ".join(c.ljust(w) if i == 0 or i == last else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in cells]
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


def pyplot():
    """matplotlib's pyplot (Agg backend), or None when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(path, title: str, draw) -> bool:
    """Draws one figure with ``draw(ax)`` and saves it; False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.5))
    draw(ax)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


MiB = 1 << 20
