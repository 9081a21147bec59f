"""A run's timeline as Chrome trace events (``g.run(trace="run.json")``).

Opens in ui.perfetto.dev and chrome://tracing: one track per actor (a thread id each,
named by metadata events), a complete event (``ph: "X"``) per act with its piece, one per
wait (for input, a credit or a resource) that ended, a flow (``ph: "s"`` at the end of the
producer's act, ``ph: "f"`` at the start of each reader's act of the same piece) for every
register passed between actors, and a counter (``ph: "C"``) per actor of its free
registers at each act. Times are microseconds from the start of the run.

Recording appends to one list from the loop and from actor threads (an append is atomic
in CPython); a run without ``trace=`` has no Timeline and pays one attribute test per act.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

PID = 1


class Timeline:
    """Records a run's acts and waits as plain tuples (cheap: one append per act, from any
    thread) and turns them into trace events when written."""

    def __init__(self, states: list):
        self.t0 = time.perf_counter()
        self.records: list = []         # (kind, name, piece or cause, start, end, inputs, free)
        self.names = [st.actor.name for st in states]
        self.readers = {st.actor.name: len(st.out.consumers) if st.out is not None else 0
                        for st in states}
        self.write_s = 0.0              # how long writing the file took
        self.started: dict = {}         # (name, piece) -> start of an act whose simulated
        # time (time=) ends when the loop's timer fires: recorded then (``delayed``)

    def act(self, name: str, piece: int, start: float, end: float, inputs=(),
            free=None) -> None:
        """One act of ``name`` on ``piece`` from ``start`` to ``end`` (perf_counter
        seconds), reading the registers of ``inputs`` (producer names) for that piece;
        ``free``: its free registers when it started."""
        self.records.append((0, name, piece, start, end, inputs, free))

    def wait(self, name: str, cause: str, start: float, end: float) -> None:
        """``name`` waited for ``cause`` (input, credit, resource) from start to end."""
        self.records.append((1, name, cause, start, end, (), None))

    def events(self) -> list:
        """The trace events (Chrome trace format) of what was recorded."""
        t0, readers = self.t0, self.readers
        tids = {n: i for i, n in enumerate(self.names, start=1)}
        evs = self.events_meta(tids)
        ev = evs.append
        for kind, name, what, start, end, inputs, free in list(self.records):
            tid = tids[name]
            ts = round((start - t0) * 1e6, 3)
            te = round((end - t0) * 1e6, 3)
            if kind == 1:
                ev({"ph": "X", "cat": "wait", "name": f"waits for {what}", "ts": ts,
                    "dur": max(te - ts, 0.0), "pid": PID, "tid": tid,
                    "args": {"cause": what}})
                continue
            ev({"ph": "X", "cat": "act", "name": name, "ts": ts, "dur": max(te - ts, 0.0),
                "pid": PID, "tid": tid, "args": {"piece": what}})
            for p in inputs:
                ev({"ph": "f", "bp": "e", "cat": "register", "name": "register",
                    "id": f"{p}/{what}", "ts": ts, "pid": PID, "tid": tid})
            if readers.get(name):
                ev({"ph": "s", "cat": "register", "name": "register", "id": f"{name}/{what}",
                    "ts": te, "pid": PID, "tid": tid})
            if free is not None:
                ev({"ph": "C", "name": f"{name} free registers", "ts": ts, "pid": PID,
                    "tid": tid, "args": {"free": free}})
        return evs

    def write(self, path) -> Path:
        """Writes the trace JSON (the same events as ``events()``, formatted directly:
        building a dict per event and dumping them took ~25 us per act)."""
        t = time.perf_counter()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        t0, readers = self.t0, self.readers
        tids = {n: i for i, n in enumerate(self.names, start=1)}
        q = {n: json.dumps(n) for n in self.names}            # names as JSON strings
        head = [json.dumps(e) for e in self.events_meta(tids)]
        out = []
        add = out.append
        for kind, name, what, start, end, inputs, free in list(self.records):
            tid = tids[name]
            ts = round((start - t0) * 1e6, 3)
            te = round((end - t0) * 1e6, 3)
            dur = te - ts if te > ts else 0.0
            if kind == 1:
                add(f'{{"ph":"X","cat":"wait","name":"waits for {what}","ts":{ts},'
                    f'"dur":{dur},"pid":{PID},"tid":{tid},"args":{{"cause":"{what}"}}}}')
                continue
            add(f'{{"ph":"X","cat":"act","name":{q[name]},"ts":{ts},"dur":{dur},'
                f'"pid":{PID},"tid":{tid},"args":{{"piece":{what}}}}}')
            for p in inputs:
                add(f'{{"ph":"f","bp":"e","cat":"register","name":"register",'
                    f'"id":{json.dumps(f"{p}/{what}")},"ts":{ts},"pid":{PID},"tid":{tid}}}')
            if readers.get(name):
                add(f'{{"ph":"s","cat":"register","name":"register",'
                    f'"id":{json.dumps(f"{name}/{what}")},"ts":{te},"pid":{PID},"tid":{tid}}}')
            if free is not None:
                add(f'{{"ph":"C","name":{json.dumps(name + " free registers")},"ts":{ts},'
                    f'"pid":{PID},"tid":{tid},"args":{{"free":{free}}}}}')
        with open(path, "w") as f:
            f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
            f.write(",\n".join(head + out))
            f.write("\n]}\n")
        self.write_s = time.perf_counter() - t
        return path

    def events_meta(self, tids: dict) -> list:
        evs = [{"ph": "M", "name": "process_name", "ts": 0, "pid": PID, "tid": 0,
                "args": {"name": "actorflow run"}}]
        for n, i in tids.items():
            evs.append({"ph": "M", "name": "thread_name", "ts": 0, "pid": PID, "tid": i,
                        "args": {"name": n}})
            evs.append({"ph": "M", "name": "thread_sort_index", "ts": 0, "pid": PID,
                        "tid": i, "args": {"sort_index": i}})
        return evs


def record_act(timeline: Timeline, st, piece: int, start: float, end: float,
               delay: float) -> None:
    """Records an act, or (with simulated time) its start, to be recorded once the loop's
    timer ends it (``delayed``): the real end, which its readers start after."""
    if delay > 0:
        timeline.started[(st.actor.name, piece)] = start
    else:
        record(timeline, st, piece, start, end)


def delayed(timeline: Timeline, st, piece: int) -> None:
    """The loop's timer ended an act with simulated time: record it now."""
    start = timeline.started.pop((st.actor.name, piece), None)
    if start is not None:
        record(timeline, st, piece, start, time.perf_counter())


def record(timeline: Timeline, st, piece: int, start: float, end: float) -> None:
    """Records an act of the actor whose run state is ``st`` (its inputs' producers, its
    free registers)."""
    out = st.out
    free = None
    if out is not None:
        free = out.pipe.qsize() if out.pipe is not None else len(out.free)
    timeline.act(st.actor.name, piece, start, end, st.in_names, free)
