"""What a Ray run reports: ``RayRunStats`` (``g.stats()`` after ``engine="ray"``) and
its Chrome trace, merged from every process's acts (``trace_events``'s builder)."""

from __future__ import annotations

import os
import time

from ..runtime.graph.source import SourceActor
from ..runtime.observe.stats import RunStats
from ..trace_events import TraceEvents


class RayRunStats(RunStats):
    """RunStats of a Ray run: per actor acts, compute (inside its Ray actors), waits (the
    driver's view: no input yet, or no credit), busy, ``most_held`` (the most pieces it
    had out at once: at most its ``buffers``) and ``processes`` (the pids its acts ran
    in), ``nodes`` (their nodes) and ``fused_acts`` (acts in a call sent for the stage
    before it in its group); memory per node: planned, and the most register bytes out at
    once (``peak``, counted by the driver)."""

    def __init__(self, run, wall: float):
        self.wall_s = wall
        self.actors = {}
        for a in run.actors:
            w = run.waits[a]
            self.actors[a.name] = {
                "kind": a.kind,
                "mode": "ray",
                "acts": run.acts[a],
                "replicas": getattr(a, "replicas", 1),
                "compute_s": run.compute[a],
                "wait_input_s": w["input"],
                "wait_credit_s": w["credit"],
                "wait_resource_s": w["resource"],
                "busy": run.compute[a] / (wall * max(1, getattr(a, "replicas", 1)))
                if wall > 0
                else 0.0,
                "most_held": run.peak_held[a],
                "processes": _where(run, a, 0),
                "nodes": _where(run, a, 1),
                "fused_acts": run.fused[a],
            }
        plan = run.plan
        self.memory = {
            key: {
                "planned": need,
                "peak": run.node_peak.get(key),
                "budget": plan.budgets.get(key),
                "live": None,
            }
            for key, need in plan.need.items()
        }
        self.abandoned = []
        self.trace = None
        self.state = run.state
        self.pieces = run.delivered
        self.startup_s = run.started_s
        self.batch = run.plan.batch

    def table(self) -> str:
        if self.startup_s is None:
            return super().table()
        return (
            super().table() + f"\nRay actor processes of the run up after "
            f"{self.startup_s:.3f} s (counted in the run's time); calls of "
            f"{self.batch} pieces"
        )

    def as_dict(self) -> dict:
        return {**super().as_dict(), "startup_s": self.startup_s, "batch": self.batch}


def _where(run, a, k: int) -> list:
    """Per replica of ``a`` its process id (k=0) or node (k=1); a source: the driver's."""
    u = run.plan.unit_of.get(a)
    if u is None:
        return [os.getpid(), "node:0"][k : k + 1]
    return [w[k] for w in run.where.get(u, [])[: a.replicas]]


def write_trace(run, path) -> dict:
    """The run's acts from every process in one Chrome trace: a process per Ray actor
    process (pid), a track per actor replica, and the driver's count of register bytes
    out per node."""
    t = time.perf_counter()
    tr = TraceEvents(run.t0)
    us = tr.us
    tr.process(0, "driver")
    tids: dict = {}
    pids: set = set()
    for name, piece, r, s, e, pid, node in run.records:
        key = (name, r, pid)
        if key not in tids:
            tids[key] = len(tids) + 1
            tr.thread(pid, tids[key], f"{name} (replica {r})")
        if pid not in pids:
            pids.add(pid)
            tr.process(pid, f"Ray actor process {pid} on node {node}")
        tr.complete(
            pid,
            tids[key],
            "act",
            name,
            us(s),
            round(max(e - s, 0) * 1e6, 3),
            f'{{"piece":{piece}}}',
        )
    for s, node, n in run.memory_points:
        tr.counter(0, 0, f"memory {node}", us(s), f'{{"bytes in use":{n}}}')
    p = tr.write(path)
    return {"path": str(p), "records": len(run.records), "write_s": time.perf_counter() - t}


class RunBar:
    """``progress``: a tqdm bar of the pieces a Ray run delivered, drawn by the driver
    after each batch, with the run's bottleneck line (every second at most)."""

    def __init__(self, run):
        from ..runtime.observe.progress import open_bar, total_of_source

        self.run = run
        sources = [a for a in run.actors if isinstance(a, SourceActor)]
        known = [n for n in map(total_of_source, sources) if n is not None]
        self.bar = open_bar(run.progress, min(known, default=None), "ray run")
        self.neck_at = 0.0

    def show(self, last: bool = False) -> None:
        run = self.run
        self.bar.update(run.delivered - self.bar.n)
        now = time.perf_counter()
        if last or now - self.neck_at > 1.0:
            self.neck_at = now
            line = RayRunStats(run, time.time() - run.t0).bottleneck()
            if line:
                self.bar.set_postfix_str(line, refresh=True)

    def close(self) -> None:
        self.show(last=True)
        self.bar.close()
