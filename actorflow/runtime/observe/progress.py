"""``run(progress=True)``: a progress bar (tqdm, the ``progress`` extra) of a run's pieces,
with the pieces per second and the current bottleneck (``RunStats.bottleneck``).

The bar is drawn by a thread of its own that looks at the run's counters every
``REFRESH_S`` (a display refresh, not a wait for completion: nothing in the run waits on
it); it reads counts only, so the run pays nothing per act. ``progress`` may be True, or a
dict of tqdm arguments (``{"total": 1000, "desc": "train"}``); the total is otherwise the
source's ``len()`` when it has one.
"""

from __future__ import annotations

import threading

from . import hooks as observe
from .stats import RunStats

REFRESH_S = 0.25
NECK_EVERY = 4  # the bottleneck line is recomputed every 4 refreshes


def tqdm_class():
    try:
        from tqdm import tqdm
    except ImportError as e:
        raise ImportError(
            "run(progress=True) draws its bar with tqdm: pip install "
            "'actorflow[progress]' (or pip install tqdm)"
        ) from e
    return tqdm


def pieces_of(sched) -> int:
    """Pieces the run has delivered (its output's acts), or read (its sources') when it
    has no output: what RunStats counts as ``pieces``."""
    out = sched.collector
    if out is not None:
        return out.acts
    return max((st.acts for st in sched.actor_runs if not st.ins), default=0)


def total_of(sched):
    for st in sched.actor_runs:
        if not st.ins and getattr(st.actor, "source", None) is not None:
            return total_of_source(st.actor)
    return None


def total_of_source(actor):
    """The source's ``len()``, when it has one (else None: the bar counts without a
    total)."""
    try:
        return len(actor.source)
    except TypeError:
        return None


def open_bar(progress, total, desc: str):
    """A tqdm bar for ``progress`` (True, or tqdm's arguments as a dict, which win)."""
    opts = dict(progress) if isinstance(progress, dict) else {}
    opts.setdefault("total", total)
    opts.setdefault("unit", "piece")
    opts.setdefault("desc", desc)
    opts.setdefault("dynamic_ncols", True)
    return tqdm_class()(**opts)


class ProgressBar:
    """The bar of one run; closes itself when the run ends (a watcher of ``observe``)."""

    def __init__(self, sched, progress):
        self.bar = open_bar(progress, total_of(sched), "run")
        self.sched = sched
        self.shown = 0
        self.neck = None
        self.over = threading.Event()
        observe.watch(self)
        self.thread = threading.Thread(target=self._main, name="actorflow-progress", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        n = 0
        while not self.over.wait(REFRESH_S):
            n += 1
            self._show(n % NECK_EVERY == 0)

    def _show(self, neck: bool) -> None:
        sched = self.sched
        done = pieces_of(sched)
        if done > self.shown:
            self.bar.update(done - self.shown)
            self.shown = done
        if neck and sched.start_time is not None:
            try:
                line = RunStats(sched, sched.plan).bottleneck()
            except (RuntimeError, KeyError, ValueError):  # a count changed as it was read
                line = None
            if line and line != self.neck:
                self.neck = line
                self.bar.set_postfix_str(line, refresh=True)

    def started(self, g, sched) -> None:
        pass

    def ended(self, g, sched) -> None:
        if sched is not self.sched:
            return
        observe.unwatch(self)
        self.over.set()
        self.thread.join()
        self._show(True)  # the final count and bottleneck
        self.bar.close()
