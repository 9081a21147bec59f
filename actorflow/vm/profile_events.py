"""A profile's records (``profiler.Rec``) as Chrome trace events (``trace_events``'s
builder), and its summary table.

- one track (tid) per stream, named ``device:stream`` (``cpu:compute``, ``null:compute``),
  with a complete event (``ph: "X"``, cat ``op``) per kernel: args ``op``, ``id`` (the
  instruction's number in the profile), ``bytes`` written, ``thread`` it ran on,
  ``waited_us``. A run of elementwise ops is one event (name ``run of N ops``) whose args
  list its members;
- its waits from issue to start (``ph: "X"``, cat ``wait``), when longer than
  ``WAIT_MIN_US``, on wait lanes beside the stream's track (a stream's waits overlap one
  another, and a track's slices must nest): at most ``MAX_WAIT_LANES`` lanes per stream, a
  wait that finds none free is left out of the trace (its op's ``waited_us`` still says
  it). ``args.for``: ``inputs`` (a kernel it reads from ended after it was issued),
  ``stream`` (the kernel before it on its stream did), or ``dispatch`` (the hop to the loop
  thread or a worker);
- a flow (``ph: "s"`` just before the writer's end, ``ph: "f"`` at the reader's start, one
  id per pair) from the kernel that last wrote a blob to each later kernel reading it;
- a counter (``ph: "C"``) per device of the allocator's bytes in use, sampled when a kernel
  finished and it had changed, and at the block's start and end.

Times are microseconds from the start of the block.
"""

from __future__ import annotations

from collections import defaultdict

from ..trace_events import TraceEvents, quote
from .instruction import RELEASE

PID = 1
WAIT_MIN_US = 2.0
MAX_WAIT_LANES = 8


def _label(stream) -> str:
    return f"{stream.device}:{stream.name}"


def _thread_names(thread, names: dict) -> str:
    if thread is None:
        return ""
    ids = thread if isinstance(thread, tuple) else (thread,)
    return ", ".join(dict.fromkeys(names.get(i, str(i)) for i in ids))


def build_trace(recs: list, samples: list, t0: float, threads: dict) -> TraceEvents:
    """The trace of ``recs`` (in issue order) and the memory ``samples``."""
    tr = TraceEvents(t0)
    us = tr.us
    tracks: dict = {}  # stream label -> tid
    for r in recs:
        tracks.setdefault(_label(r.stream), len(tracks) + 1)
    lanes: dict = defaultdict(list)  # stream label -> the end (us) of each wait lane
    lane_tids: dict = {}  # (label, lane) -> tid
    left_out = 0
    writer: dict = {}  # blob -> the last record that wrote it
    prev_end: dict = {}  # stream label -> end of the kernel before, seconds
    runs: dict = defaultdict(list)  # run id -> its member records
    flow = 0
    linked = set()
    for r in recs:
        if r.run is not None:
            runs[r.run].append(r)
    for r in recs:
        label = _label(r.stream)
        tid = tracks[label]
        ts, te = us(r.start), us(r.end)
        # the flows into it, and what its wait was for
        cause = None
        if r.kind != RELEASE:
            for b in r.consts:
                p = writer.get(b)
                if p is None or p is r or (p.run is not None and p.run == r.run):
                    continue
                if p.end > r.issue:
                    cause = "inputs"
                key = (p.run if p.run is not None else id(p), r.run if r.run is not None else id(r))
                if key in linked:
                    continue
                linked.add(key)
                flow += 1
                tr.flow(
                    PID,
                    tracks[_label(p.stream)],
                    "flow",
                    "blob",
                    flow,
                    max(us(p.start), us(p.end) - 0.001),
                    True,
                )
                tr.flow(PID, tid, "flow", "blob", flow, ts, False)
            for b in r.muts:
                writer[b] = r
        else:
            for b in r.muts:
                writer.pop(b, None)
        if cause is None:
            cause = "stream" if prev_end.get(label, r.issue) > r.issue else "dispatch"
        prev_end[label] = r.end
        ti = us(r.issue)
        waited = round(max(ts - ti, 0.0), 3)
        if waited >= WAIT_MIN_US:
            ends = lanes[label]
            lane = next((i for i, e in enumerate(ends) if e <= ti), None)
            if lane is None and len(ends) < MAX_WAIT_LANES:
                lane = len(ends)
                ends.append(ti)
            if lane is None:
                left_out += 1
            else:
                ends[lane] = ts
                wtid = lane_tids.get((label, lane))
                if wtid is None:
                    wtid = lane_tids[(label, lane)] = len(tracks) + len(lane_tids) + 1
                tr.complete(
                    PID,
                    wtid,
                    "wait",
                    f"{r.name} waits for {cause}",
                    ti,
                    waited,
                    f'{{"op":{quote(r.name)},"id":{r.seq},"for":"{cause}"}}',
                )
        dur = round(max(te - ts, 0.0), 3)
        thread = _thread_names(r.thread, threads)
        if r.run is None:  # (args as JSON text: an event per kernel)
            args = (
                f'{{"op":{quote(r.name)},"id":{r.seq},"bytes":{r.nbytes},'
                f'"thread":{quote(thread)},"waited_us":{waited}'
            )
            if r.launched is not None:
                args += f',"launched_us":{round(us(r.launched), 3)}'
            if r.inner:
                args += f',"kernels":{r.inner}'
            if r.skipped:
                args += ',"skipped":"its inputs were poisoned by a failed kernel"'
            elif r.failed:
                args += ',"failed":"the kernel raised (the error surfaces at the next sync point)"'
            tr.complete(PID, tid, "op", r.name, ts, dur, args + "}")
        elif runs[r.run][0] is r:
            members = runs[r.run]
            tr.complete(
                PID,
                tid,
                "op",
                f"run of {len(members)} ops",
                ts,
                dur,
                {
                    "ops": [m.name for m in members],
                    "ids": [m.seq for m in members],
                    "bytes": sum(m.nbytes for m in members),
                    "thread": thread,
                },
            )
    for t, device, n in samples:
        tr.counter(PID, 0, f"memory {device}", max(us(t), 0.0), f'{{"bytes in use":{n}}}')
    tr.process(PID, "actorflow eager VM", **({"waits_left_out": left_out} if left_out else {}))
    tr.thread(PID, 0, "memory")
    sort = 0
    for label, tid in tracks.items():  # each stream's track, then its wait lanes
        sort += 1
        tr.thread(PID, tid, label, sort)
        for lane in range(len(lanes.get(label, ()))):
            sort += 1
            tr.thread(
                PID,
                lane_tids[(label, lane)],
                f"{label} waits" + (f" {lane + 1}" if lane else ""),
                sort,
            )
    return tr


def summary_table(recs: list, window_ms: float) -> str:
    """Per op name: count, total kernel ms, mean us, share of all kernel time (a member of a
    run of elementwise ops is counted with the run's time shared equally)."""
    recs = [r for r in recs if not r.inner]  # (a compiled program's: its kernels count)
    per_run: dict = defaultdict(int)
    for r in recs:
        if r.run is not None:
            per_run[r.run] += 1
    totals: dict = {}
    for r in recs:
        s = r.end - r.start
        if r.run is not None:
            s /= per_run[r.run]
        n, t = totals.get(r.name, (0, 0.0))
        totals[r.name] = (n + 1, t + s)
    all_s = sum(t for _, t in totals.values())
    streams = len({_label(r.stream) for r in recs})
    lines = [
        f"af.profile: {len(recs)} kernels on {streams} stream"
        f"{'' if streams == 1 else 's'} in {window_ms:.3f} ms "
        f"(kernel time {all_s * 1e3:.3f} ms)"
    ]
    width = max([len("op")] + [len(k) for k in totals])
    lines.append(f"{'op':<{width}}  {'count':>7}  {'total ms':>10}  {'mean us':>10}  {'share':>6}")
    for name, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        share = t / all_s * 100 if all_s > 0 else 0.0
        lines.append(
            f"{name:<{width}}  {n:>7}  {t * 1e3:>10.3f}  {t / n * 1e6:>10.1f}  {share:>5.1f}%"
        )
    if per_run:
        lines.append(
            f"({len(per_run)} runs of elementwise ops: their members share the run's time equally)"
        )
    return "\n".join(lines)
