"""Deadlock and double-buffering experiments: ``python -m actorflow experiments NAME``.

Each experiment is a module with ``run(seed=...) -> dict`` (its table under "table") and
``plot(data, path) -> bool`` (False when matplotlib is not installed). figure1 and
double-buffering also take ``timeline=FOLDER``: their actors runs write their traces there
(``--timeline`` on the command line, which draws each as a timeline PNG too).
"""

from __future__ import annotations

from pathlib import Path

from . import double_buffering, figure1, random_dags
from .common import save, write_json

EXPERIMENTS = {"figure1": figure1, "double-buffering": double_buffering, "random": random_dags}
TRACED = ("figure1", "double-buffering")  # those with a timeline= option
PROGRESS = ("double-buffering", "random")  # those with a progress= option


def main(
    name: str, seed: int = 0, out: str = "experiments-out", timeline=None, draw=None, **kw
) -> dict:
    """Runs one experiment: prints its table, writes NAME.json and NAME.png under ``out``.
    ``timeline`` (a folder; figure1 and double-buffering): the actors runs also write their
    traces there, and ``draw(trace, png, title)`` (``af.plot_timeline``, which the command
    line hands in: this layer does not import it) draws each next to it as a PNG."""
    if name not in EXPERIMENTS:
        raise SystemExit(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    mod = EXPERIMENTS[name]
    if timeline is not None:
        if name not in TRACED:
            raise SystemExit(
                f"--timeline: {name!r} writes no trace; only {' and '.join(TRACED)} do"
            )
        kw["timeline"] = timeline
    if kw.get("progress") and name not in PROGRESS:
        kw.pop("progress")  # (figure1 is one piece: nothing to show)
    data = mod.run(seed=seed, **kw)
    print(data["table"])
    out_dir = Path(out)
    path = write_json(out_dir, name, data)
    print(f"wrote {path}")
    png = out_dir / f"{name}.png"
    if mod.plot(data, png):
        print(f"wrote {png}")
    else:
        print("(no picture: install matplotlib, e.g. pip install 'actorflow[plot]')")
    for t in data.get("traces", ()):
        print(f"wrote {t['path']}")
        if draw is not None and save(_drawn(draw, t), Path(t["path"]).with_suffix(".png")):
            print(f"wrote {Path(t['path']).with_suffix('.png')}")
    return data


def _drawn(draw, trace: dict):
    """The trace's picture, or None without matplotlib."""
    try:
        return draw(trace["path"], None, trace["title"])
    except ImportError:
        return None
