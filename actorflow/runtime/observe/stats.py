"""RunStats: what a run of an actor graph did, per actor and per device."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...errors import format_bytes
from ..sched.actor_runs import CREDIT, INPUT, RESOURCE

if TYPE_CHECKING:
    from ..plan.reservation import Plan
    from ..sched.credit import CreditScheduler


class RunStats:
    """``wall_s`` (under a test's serial schedule, plus the seconds its virtual clock
    skipped); ``pieces`` (delivered by ``run()``, or read by the sources when the
    graph has no sink); ``actors``: per actor name ``{kind, mode, replicas, acts,
    compute_s, wait_input_s, wait_credit_s, wait_resource_s, busy}`` (``mode``: inline,
    thread, pipe (a thread stage that takes its own acts: ``pipes.py``) or async);
    ``memory``: per device ``{planned, peak, budget, live}`` in bytes (``peak`` measured:
    the most register bytes held at once; ``live``, where registers share memory: the
    most bytes of registers in use at once, measured, the unshared ones counted whole,
    None elsewhere); ``state``:
    "finished", "stopped" (a cancel, a break), "failed" or "running" (a live snapshot);
    ``abandoned``: ``[(actor name, piece)]`` of the acts still running when the run stopped
    (each frees its registers when it returns; ``ActorGraph.join`` waits for them)."""

    def __init__(self, sched: CreditScheduler, plan: Plan) -> None:
        now = sched.end_time or time.perf_counter()
        self.wall_s: float = now - (sched.start_time or now)
        clock = getattr(sched, "clock", None)
        if clock is not None:  # a serial test run: its simulated seconds count
            self.wall_s += clock.now
        self.actors: dict = {}
        for st in sched.actor_runs:
            waits = dict(st.waits)
            if st.cause is not None:  # still waiting when the run ended
                waits[st.cause] += now - st.since
            self.actors[st.actor.name] = {
                "kind": st.actor.kind,
                "mode": "pipe" if st.piped else st.mode,
                "acts": st.acts,
                "replicas": getattr(st.actor, "replicas", 1),
                "compute_s": st.compute_s,
                "wait_input_s": waits[INPUT],
                "wait_credit_s": waits[CREDIT],
                "wait_resource_s": waits[RESOURCE],
                "busy": st.compute_s / self.wall_s if self.wall_s > 0 else 0.0,
            }
        mem = plan.budget.stats()
        self.memory: dict = {}
        for dev, total in plan.totals.items():
            m = mem.get(str(dev), {})
            self.memory[str(dev)] = {
                "planned": total,
                "peak": m.get("peak", 0),
                "budget": plan.budget.budget(dev),
                "live": None,
            }
            if sched.live is not None and plan.sharing is not None and dev in sched.live.peak:
                self.memory[str(dev)]["live"] = (
                    sched.live.peak[dev] + total - plan.sharing.arenas.get(dev, 0)
                )
        self.abandoned: list = sched.stragglers.running()
        tl, path = getattr(sched, "timeline", None), getattr(sched, "trace_path", None)
        self.trace = (
            None
            if path is None or tl is None
            else {  # run(trace=...): what was written
                "path": str(path),
                "records": len(tl.records),
                "write_s": tl.write_s,
            }
        )
        if not sched.finished:
            self.state = "running"  # a live snapshot (stats() during a run)
        elif sched.error is not None:
            self.state = "failed"
        elif sched.stopping:
            self.state = "stopped"  # a cancel, a break, Ctrl-C: before the end
        else:
            self.state = "finished"
        out = [r["acts"] for r in self.actors.values() if r["kind"] == "output"]
        self.pieces = (
            out[0]
            if out
            else max((r["acts"] for r in self.actors.values() if r["kind"] == "source"), default=0)
        )

    def bottleneck(self) -> str | None:
        """The run's bottleneck in one line: the busiest actor, and the actor that waited
        most besides it, on what, and what that means; None before anything ran."""
        wall = self.wall_s
        rows = {n: r for n, r in self.actors.items() if r["kind"] != "output"}
        if wall <= 0 or not rows:
            return None
        busy = {n: r["compute_s"] / (wall * max(1, r["replicas"])) for n, r in rows.items()}
        b = max(busy, key=busy.__getitem__)
        line = f"{b} is busy {busy[b]:.0%}"
        out_wait = self.actors.get("(output)", {}).get("wait_credit_s", 0.0) / wall
        if out_wait > 0.5:  # the caller holds the pieces back: all else waits
            return (
                f"the consumer of run() takes the pieces slower than they come: the "
                f"run's output waited {out_wait:.0%} of the time for it ({line})"
            )
        waits = [
            (r[f"wait_{c}_s"] / wall, n, c)
            for n, r in rows.items()
            if n != b
            for c in ("input", "credit", "resource")
        ]
        if not waits:
            return line
        frac, w, cause = max(waits)
        if frac < 0.05:
            return line + "; no other actor waits long"
        line += f"; {w} waits on {cause} {frac:.0%} of the time"
        if cause == "credit":
            return line + (f": {b} sets the pace, so more buffers after {w} buy nothing")
        if cause == "input":
            return line + f": it is fed no faster than {b} goes"
        return line + ": it waits for tokens or a state another actor holds"

    def as_dict(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "pieces": self.pieces,
            "state": self.state,
            "actors": self.actors,
            "memory": self.memory,
            "abandoned": self.abandoned,
            "trace": self.trace,
            "bottleneck": self.bottleneck(),
        }

    def table(self) -> str:
        w = max([16] + [len(name) for name in self.actors])
        head = (
            f"{'actor':<{w}} {'mode':<8} {'acts':>6} {'compute s':>10} {'wait input':>11} "
            f"{'wait credit':>12} {'wait res.':>10} {'busy':>6}"
        )
        n = self.pieces
        state = {
            "finished": "",
            "stopped": ", stopped before its end",
            "failed": ", stopped by an error",
            "running": ", still running (so far)",
        }
        lines = [
            f"Run: {n} piece{'' if n == 1 else 's'} in {self.wall_s:.3f} s{state[self.state]}",
            head,
            "-" * len(head),
        ]
        for name, r in self.actors.items():
            mode = r["mode"] if r["replicas"] == 1 else f"{r['mode']}x{r['replicas']}"
            lines.append(
                f"{name:<{w}} {mode:<8} {r['acts']:>6} {r['compute_s']:>10.4f} "
                f"{r['wait_input_s']:>11.4f} {r['wait_credit_s']:>12.4f} "
                f"{r['wait_resource_s']:>10.4f} {r['busy']:>6.0%}"
            )
        neck = self.bottleneck()
        if neck:
            lines.append(f"bottleneck: {neck}")
        for dev, m in self.memory.items():
            b = f" of {format_bytes(m['budget'])} budget" if m["budget"] is not None else ""
            live = (
                f", registers in use at once at most {format_bytes(m['live'])}"
                if m["live"] is not None
                else ""
            )
            lines.append(
                f"memory on {dev}: planned {format_bytes(m['planned'])}, measured peak "
                f"{format_bytes(m['peak'])}{b}{live}"
            )
        for name, piece in self.abandoned:
            lines.append(
                f"abandoned when the run stopped: {name!r} on piece {piece} (frees "
                f"its registers when it returns)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()

    __str__ = __repr__
