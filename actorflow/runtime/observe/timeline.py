"""A run's timeline as Chrome trace events (``g.run(trace="run.json")``).

Opens in ui.perfetto.dev and chrome://tracing: one track per actor (a thread id each,
named by metadata events), a complete event (``ph: "X"``) per act with its piece, one per
wait (for input, a credit or a resource) that ended, a flow (``ph: "s"`` at the end of the
producer's act, ``ph: "f"`` at the start of each reader's act of the same piece) for every
register passed between actors, a counter (``ph: "C"``) per actor of its free
registers at each act, and a counter per device of the register memory in use
(``"memory DEVICE"``, ``{"bytes in use": n}``). Times are microseconds from the start of
the run. The plan's bytes per device (``planned``, ``budget``) are in ``otherData``.

Memory in use, per device: the bytes of the registers that hold a piece, each from the
start of the act that writes it to the end of the last act that reads it (the scheduler
takes it a moment before that act and has it home a moment after that read); a register
nobody read by the end of the run (a stopped run) counts until the last act. Registers
allocated but free are reserved, not in use: the plan reserves ``planned`` for the whole
run. Piece 0 of a stage sized by piece 0 travels in its own arrays, outside the plan, and
is not counted. It is worked out from the acts when the trace is written, so it costs
nothing while running.

Recording appends to one list from the loop and from actor threads (an append is atomic
in CPython); a run without ``trace=`` has no Timeline and pays one attribute test per act.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import numpy as np

from ...trace_events import TraceEvents, quote
from ..graph.actors import OpActor

PID = 1


class Timeline:
    """Records a run's acts and waits as plain tuples (cheap: one append per act, from any
    thread) and turns them into trace events when written."""

    def __init__(self, states: list, plan=None, keep: int = 0):
        self.t0 = time.perf_counter()
        # (kind, name, piece or cause, start, end, inputs, free); kind 0 an act, 1 a wait,
        # 2 an act that raised (its error as text where free goes); with ``keep``, the last
        # ``keep`` acts only (3 x keep records: waits take room too; a test's record)
        self.records: deque | list = deque(maxlen=3 * keep) if keep else []
        self.names = [st.actor.name for st in states]
        self.readers = {
            st.actor.name: len(st.out.consumers) if st.out is not None else 0 for st in states
        }
        self.plan = plan  # its bytes per device go in the trace (otherData)
        self.outs = {st.actor.name: st.out for st in states if st.out is not None}
        whole = plan is not None and plan.whole
        self.lazy = {
            st.actor.name
            for st in states
            if st.out is not None
            and st.out.spec is None
            and (whole or not isinstance(st.actor, OpActor))
        }
        # (stages sized by piece 0: that piece travels outside the plan; op actors sized
        # then are sized by inference, before their own piece 0, into a register; in a
        # plan made whole, every actor's piece 0 travels outside it: Plan.defer)
        self.write_s = 0.0  # how long writing the file took
        self.started: dict = {}  # (name, piece) -> start of an act whose simulated
        # time (time=) ends when the loop's timer fires: recorded then (``delayed``)

    def act(self, name: str, piece: int, start: float, end: float, inputs=(), free=None) -> None:
        """One act of ``name`` on ``piece`` from ``start`` to ``end`` (perf_counter
        seconds), reading the registers of ``inputs`` (producer names) for that piece;
        ``free``: its free registers when it started."""
        self.records.append((0, name, piece, start, end, inputs, free))

    def wait(self, name: str, cause: str, start: float, end: float) -> None:
        """``name`` waited for ``cause`` (input, credit, resource) from start to end."""
        self.records.append((1, name, cause, start, end, (), None))

    def events(self) -> list:
        """The trace events (Chrome trace format) of what was recorded: what ``write``
        writes."""
        return self.build().events()

    def build(self) -> TraceEvents:
        """The trace of what was recorded: a track per actor (in graph order), then per
        record its events, then the memory counters."""
        tr = TraceEvents(self.t0)
        tr.process(PID, "actorflow run")
        for i, n in enumerate(self.names, start=1):
            tr.thread(PID, i, n, sort=i)
        tids = {n: i for i, n in enumerate(self.names, start=1)}
        t0, readers = self.t0, self.readers
        free_of = {n: f"{n} free registers" for n in self.names}
        complete, flow, counter = tr.complete, tr.flow, tr.counter
        for kind, name, what, start, end, inputs, free in list(self.records):
            tid = tids[name]
            ts = round((start - t0) * 1e6, 3)  # (tr.us, inlined: once per record)
            te = round((end - t0) * 1e6, 3)
            dur = te - ts if te > ts else 0.0
            if kind == 1:
                complete(
                    PID, tid, "wait", f"waits for {what}", ts, dur, f'{{"cause":{quote(what)}}}'
                )
                continue
            if kind == 2:
                complete(PID, tid, "act", name, ts, dur, {"piece": what, "error": free})
                continue
            ts = repr(ts)  # (as text once, for its events)
            complete(PID, tid, "act", name, ts, dur, f'{{"piece":{what}}}')
            for p in inputs:
                flow(PID, tid, "register", "register", f"{p}/{what}", ts, False)
            if readers.get(name):
                flow(PID, tid, "register", "register", f"{name}/{what}", te, True)
            if free is not None:
                counter(PID, tid, free_of[name], ts, f'{{"free":{free}}}')
        for dev, (times, values) in self.memory().items():
            tr.series(PID, 0, f"memory {dev}", "bytes in use", times, values)
        return tr

    def memory(self) -> dict:
        """``{device name: (times, bytes in use)}``, in time order from 0 at the start, one
        entry per change: see the module's doc for what counts."""
        sizes = {}  # actor -> {device name: bytes per register}
        for name, out in self.outs.items():
            b = {} if out.spec is None else {str(d): n for d, n in out.spec.bytes_on().items() if n}
            if b:
                sizes[name] = b
        return memory_in_use(list(self.records), sizes, self.readers, self.lazy, self.t0)

    def other(self) -> dict:
        """The trace's ``otherData``: the plan's bytes per device (``planned``, what it
        reserves for the run, and ``budget``, None without one)."""
        plan = self.plan
        if plan is None:
            return {}
        return {
            "memory": {
                str(d): {"planned": n, "budget": plan.budget.budget(d)}
                for d, n in sorted(plan.totals.items(), key=lambda kv: str(kv[0]))
            }
        }

    def write(self, path) -> Path:
        """Writes the trace JSON (``build()``, with ``other()`` as its ``otherData``)."""
        t = time.perf_counter()
        path = self.build().write(path, self.other())
        self.write_s = time.perf_counter() - t
        return path


def record_act(
    timeline: Timeline, st, piece: int, start: float, end: float, delay: float, err=None
) -> None:
    """Records an act, or (with simulated time) its start, to be recorded once the loop's
    timer ends it (``delayed``): the real end, which its readers start after. ``err``: the
    act raised (``(exception, traceback text)``): recorded as failed (``record_failed``)."""
    if err is not None:
        record_failed(timeline, st, piece, start, end, err[0])
        return
    if delay > 0:
        timeline.started[(st.actor.name, piece)] = start
        return
    out = st.out  # (record() inlined: this runs once per act)
    timeline.records.append(
        (
            0,
            st.actor.name,
            piece,
            start,
            end,
            st.in_names,
            None if out is None else out.pipe.qsize() if out.pipe is not None else len(out.free),
        )
    )


def record_failed(
    timeline: Timeline, st, piece: int, start: float, end: float, error: BaseException
) -> None:
    """Records an act that raised (kind 2): what a failing test's report and the trace
    show as the act the run stopped at, with its error."""
    said = str(error).strip().splitlines()
    timeline.records.append(
        (
            2,
            st.actor.name,
            piece,
            start,
            end,
            st.in_names,
            type(error).__name__ + (f": {said[0]}" if said else ""),
        )
    )


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


def memory_in_use(records, sizes: dict, readers: dict, lazy, t0: float) -> dict:
    """Bytes in use per device over a run, from its act records: each register from the
    start of the act that writes piece p of an actor in ``sizes`` (``{name: {device:
    bytes}}``) to the end of the last act that reads it (at once when nobody does,
    ``readers``; at the last act when none did); piece 0 of the ``lazy`` actors is not a
    register. Returns ``{device: (times, bytes)}`` (times in us from ``t0``, lists), in
    time order from 0 at ``t0``, one entry per time it changed. (The records are read once
    in Python, the rest is numpy: about 1 us per act on the 8-actor chain.)"""
    if not sizes:
        return {}
    names = list(sizes)
    index = {n: i for i, n in enumerate(names)}
    m = len(names)
    wkey: list = []  # writes (key, start), reads (key, end)
    wstart: list = []
    rkey: list = []
    rend: list = []
    last = t0
    for kind, name, piece, start, end, inputs, _ in records:
        if end > last:
            last = end
        if kind:
            continue
        i = index.get(name)
        if i is not None and not (piece == 0 and name in lazy):
            wkey.append(piece * m + i)
            wstart.append(start)
            if not readers.get(name):  # nobody reads it: home after its act
                rkey.append(piece * m + i)
                rend.append(end)
        for p in inputs:
            j = index.get(p)
            if j is not None:
                rkey.append(piece * m + j)
                rend.append(end)
    okey, ostart = np.array(wkey, np.int64), np.array(wstart, np.float64)
    ckey, cend = np.array(rkey, np.int64), np.array(rend, np.float64)
    order = np.lexsort((cend, ckey))
    ckey, cend = ckey[order], cend[order]
    final = np.ones(len(ckey), bool)
    final[:-1] = ckey[1:] != ckey[:-1]
    ckey, cend = ckey[final], cend[final]  # each register's last read
    if len(ckey):
        at = np.minimum(np.searchsorted(ckey, okey), len(ckey) - 1)
        oend = np.where(ckey[at] == okey, cend[at], last)
    else:
        oend = np.full(len(okey), last)
    live = oend > ostart
    n = int(live.sum())
    t = np.concatenate([ostart[live], oend[live]])
    up = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    who = np.concatenate([okey[live] % m] * 2)
    o = np.lexsort((up, t))  # (at the same time: homes before takes)
    t, up, who = t[o], up[o], who[o]
    out = {}
    for d in sorted({d for b in sizes.values() for d in b}):
        nb = np.array([sizes[name].get(d, 0) for name in names], np.int64)[who]
        mine = nb != 0
        td, level = t[mine], np.cumsum(up[mine] * nb[mine])
        final = np.ones(len(td), bool)
        final[:-1] = td[1:] != td[:-1]  # one entry per time: the level after it
        out[d] = ([0.0] + np.round((td[final] - t0) * 1e6, 3).tolist(), [0] + level[final].tolist())
    return out
