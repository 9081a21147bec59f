"""Deadlock and double-buffering experiments: ``python -m actorflow experiments NAME``.

Each experiment is a module with ``run(seed=...) -> dict`` (its table under "table") and
``plot(data, path) -> bool`` (False when matplotlib is not installed).
"""

from __future__ import annotations

from pathlib import Path

from . import double_buffering, figure1, random_dags
from .common import write_json

EXPERIMENTS = {"figure1": figure1, "double-buffering": double_buffering,
               "random": random_dags}


def main(name: str, seed: int = 0, out: str = "experiments-out", **kw) -> dict:
    """Runs one experiment: prints its table, writes NAME.json and NAME.png under ``out``."""
    if name not in EXPERIMENTS:
        raise SystemExit(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    mod = EXPERIMENTS[name]
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
    return data
