"""``af.profile()``: a timeline of the eager VM, as Chrome trace events.

While a profile is on, the VM hands every kernel it runs to a ``Recorder`` (its
``profiler`` attribute; None otherwise, so the VM pays one attribute test per instruction):

- ``issue(instr)`` (``VM.submit``, under the VM lock) notes the issue time, puts a timing
  wrapper in ``instr.run`` (whoever runs the kernel, the issuing thread, the loop or a
  worker, times it) and adds a waiter that notes the completion: the end of a simulated
  kernel (the null device's timer), the bytes written and the device's memory in use;
- ``inline(...)`` (``VM.run_inline``) wraps an op call run on the spot;
- ``pieces`` (a kernel cut into slices) and ``run`` (a run of elementwise ops,
  ``runs.py``) wrap the slices; the op's span is from its first slice's start to its
  last slice's end, and the members of a run share the run's span;
- on a device with its own memory (cuda), the host only issues the work: the timing
  wrapper records a driver event before and after it on the stream it is issued on, and
  the record's span is from the first event's completion to the second's, as the host saw
  them (the time ``Event.then`` called back: the callback's latency is in it, so a span is
  not the device's own clock, and a kernel shorter than that latency shows it; the issue
  to the driver is ``launched``); a compiled
  program's instruction (``nn.Graph``'s step) adds a record per kernel it launches
  (``device_kernel``), timed by an event after each, inside its own span (the summary
  counts its kernels, not it).

Records are plain objects appended to one list under the VM lock, so their order is the
issue order. They hold the blobs an instruction read and wrote, never its tensors or
arguments: a blob's memory goes with its last tensor (``TensorImpl.__del__``), so holding
the Blob object pins no data, and the identities let the trace draw a flow from each
writer to its later readers. ``profile_events.py`` turns records into trace events (with
``trace_events``, the builder every trace of the library is made with).

Profiles nest, and may be on in several threads at once: one Recorder serves every open
profile (a window on its list, from the profile's start to its end) and leaves the VM when
the last one closes. On exit a profile waits for everything issued so far (kernel errors
stay for the next sync point), keeps the records of its window that completed, and writes
its file if it has a path.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Literal

from ..backends import loaded_backends
from ..errors import add_note
from .instruction import OP_CALL, RELEASE
from .opcall import device_call_op, run_op
from .profile_events import build_trace, summary_table

_perf = time.perf_counter
_ident = threading.get_ident


def _thread(threads: dict) -> int:
    i = _ident()
    if i not in threads:
        threads[i] = threading.current_thread().name
    return i


class Rec:
    """One kernel the VM ran: times are ``perf_counter`` seconds; ``thread`` the ident of
    the thread that ran it (a tuple when slices ran on several); ``run`` the id of the run
    of elementwise ops it was a member of (None: it ran alone)."""

    __slots__ = (
        "rec",
        "seq",
        "kind",
        "name",
        "stream",
        "consts",
        "muts",
        "issue",
        "start",
        "end",
        "thread",
        "parts",
        "run",
        "nbytes",
        "done",
        "skipped",
        "failed",
        "fn",
        "launched",
        "device",
        "inner",
    )

    def __init__(self, rec, kind, name, stream, consts, muts, fn, issue):
        self.rec, self.kind, self.name, self.stream = rec, kind, name, stream
        self.consts, self.muts, self.fn = consts, muts, fn
        self.seq = len(rec.records)  # (made and appended under the VM lock)
        self.issue = self.start = self.end = issue
        self.thread = self.parts = self.run = None
        self.nbytes = 0
        self.done = self.skipped = self.failed = False
        self.launched = None  # (device work) when the host issued it to the driver
        self.device: list[float | None] | None = None  # (device work) [start, end] told by
        #                                                  its events
        self.inner = 0  # kernels recorded inside it (a compiled program's)

    def call(self, instr) -> None:
        """``instr.run`` while profiled: the kernel, timed on whichever thread runs it (on a
        device with its own memory, by events around the work issued, see the module
        doc)."""
        t = _perf()
        backend = self.stream.backend
        dstream = None
        if not backend.host_memory and backend.current is not None:  # (a device RELEASE
            dstream = backend.current  # is host work)
            times: list[float | None] = [None, None]
            self.device = times
            dstream.record().then(lambda: times.__setitem__(0, _perf()))
        try:
            self.fn(instr)
        except BaseException:
            self.failed = True
            raise
        finally:
            self.end = _perf()
            self.start = t
            self.thread = _thread(self.rec.threads)
            if dstream is not None:
                self.launched = t
                dstream.record().then(lambda: times.__setitem__(1, _perf()))

    def call_inline(self, args) -> None:
        """An op call run on the spot (``VM.run_inline``, under the VM lock): it waited for
        nothing, so its issue is its start."""
        t = _perf()
        self.skipped = False
        try:
            self.fn(args)
        except BaseException:
            self.failed = True
            raise
        finally:  # (finish, inlined: this runs once per small op)
            self.end = end = _perf()
            self.start = self.issue = t
            rec = self.rec
            self.thread = _thread(rec.threads)
            n = 0
            for b in self.muts:
                n += b.nbytes
            self.nbytes = n
            self.fn = None
            rec.sample(self.stream.backend.allocator, end)

    def finish(self) -> None:
        """The instruction completed (a waiter, called under the VM lock)."""
        now = _perf()
        parts = self.parts
        if parts:
            self.start = min(p[0] for p in parts)
            self.end = max(p[1] for p in parts)
            ids = tuple(sorted({p[2] for p in parts}))
            self.thread = ids[0] if len(ids) == 1 else ids
        if self.start is None:  # never ran: its inputs were poisoned
            self.start = self.end = now
            self.skipped = True
        elif self.device is not None:  # the device's times, where its events told them
            start, end = self.device
            self.start = self.start if start is None else start
            self.end = now if end is None else end
        elif self.stream.simulated:
            self.end = now  # the simulated kernel ends when the timer fires
        if self.kind != RELEASE and not self.skipped:
            n = 0
            for b in self.muts:
                n += b.nbytes
            self.nbytes = n
        self.rec.sample(self.stream.backend.allocator, now)
        self.fn = None
        self.done = True


def _device_op(instr) -> None:
    instr.result = device_call_op(instr.args, instr.stream.backend.current)


def _rec_of(instr):
    run = instr.run
    return run.__self__ if getattr(run, "__func__", None) is Rec.call else None


class _Timed:
    """A slice of a kernel or of a run, noting ``(start, end, thread)`` when it runs."""

    __slots__ = ("parts", "fn", "threads")

    def __init__(self, parts, fn, threads):
        self.parts, self.fn, self.threads = parts, fn, threads

    def __call__(self) -> None:
        t = _perf()
        try:
            self.fn()
        finally:
            self.parts.append((t, _perf(), _thread(self.threads)))  # (atomic append)


class Recorder:
    """What the VM calls while at least one profile is on (see the module doc)."""

    def __init__(self):
        self.records: list = []
        self.samples: list = []  # (time, device, bytes in use), when it changed
        self.last: dict = {}  # allocator -> bytes in use at its last sample
        self.threads: dict = {}  # thread ident -> name
        self.runs = itertools.count()
        self.windows = 0  # profiles open on it

    def issue(self, instr) -> None:
        run = instr.run
        if run is run_op and not instr.stream.backend.host_memory:
            run = _device_op  # (what the VM's dispatch runs on such a device)
        r = Rec(self, instr.kind, instr.name, instr.stream, instr.consts, instr.muts, run, _perf())
        r.start = None  # (set when it runs)
        instr.run = r.call
        if instr.waiters is None:
            instr.waiters = [r.finish]
        else:
            instr.waiters.append(r.finish)
        self.records.append(r)

    def inline(self, name, stream, consts, muts, fn):
        r = Rec(self, OP_CALL, name, stream, consts, muts, fn, _perf())
        r.skipped = r.done = True  # until it runs (it does not when poisoned)
        self.records.append(r)
        return r.call_inline

    def pieces(self, instr, pieces):
        r = _rec_of(instr)
        if r is None or not pieces:
            return pieces
        r.parts = []
        return [_Timed(r.parts, p, self.threads) for p in pieces]

    def run(self, members, slices) -> list:
        """A run of ``members`` cut into ``slices``: every op call in it gets the run's
        span."""
        parts: list = []
        run = next(self.runs)
        for m in members:
            r = _rec_of(m) if m.kind == OP_CALL else None
            if r is not None:
                r.parts, r.run = parts, run
        return [_Timed(parts, s, self.threads) for s in slices]

    def device_kernel(self, instr, name: str, dstream, last: list) -> None:
        """A kernel ``name`` that the device instruction ``instr`` (a compiled program's)
        launched just now on the driver stream ``dstream``: a record of its own, inside
        ``instr``'s, ended by an event recorded after it and started where the kernel before
        it (``last``, a one-item list the caller keeps per instruction: that kernel's end,
        None for the first) ended."""
        parent = _rec_of(instr)
        if parent is None:
            return
        r = Rec(self, OP_CALL, name, instr.stream, (), (), None, _perf())
        r.thread = _ident()
        r.launched = r.issue
        parent.inner += 1
        times = parent.device
        self.records.append(r)

        def done():
            now = _perf()
            start = last[0] if last[0] is not None else (times[0] if times else None)
            r.start = r.issue if start is None else start
            r.end = last[0] = now
            r.done = True

        dstream.record().then(done)

    def sample(self, allocator, now: float) -> None:
        n = allocator.bytes_in_use()
        if self.last.get(allocator) != n:
            self.last[allocator] = n
            self.samples.append((now, allocator.device, n))


def _memory(now: float) -> list:
    return [(now, b.allocator.device, b.allocator.bytes_in_use()) for b in loaded_backends()]


class Profile:
    """What ``af.profile()`` returns (see ``profile``)."""

    def __init__(self, path=None):
        self.path = None if path is None else Path(path)
        self.t0 = self.t1 = None
        self._recorder = None
        self._records = self._samples = self._trace = self._events = None
        self._threads: dict = {}

    def __enter__(self) -> Profile:
        from .scheduler import get_vm

        if self.t0 is not None:
            raise RuntimeError(
                "this af.profile() was entered already; a profile records one "
                "block: make a new one with af.profile(...)"
            )
        vm = get_vm()
        with vm._lock:
            rec = vm.profiler
            if rec is None:
                rec = vm.profiler = Recorder()
            rec.windows += 1
            self._recorder = rec
            self._first, self._first_sample = len(rec.records), len(rec.samples)
            self.t0 = _perf()
        self._start_memory = _memory(self.t0)
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        from .scheduler import get_vm

        vm = get_vm()
        rec = self._recorder
        try:
            vm.synchronize_quietly()  # every kernel recorded so far finishes
        finally:
            with vm._lock:
                self.t1 = _perf()
                self._records = [r for r in rec.records[self._first :] if r.done]
                self._samples = (
                    self._start_memory + rec.samples[self._first_sample :] + _memory(self.t1)
                )
                self._threads = dict(rec.threads)
                rec.windows -= 1
                if rec.windows == 0 and vm.profiler is rec:
                    vm.profiler = None
            self._recorder = None
        if self.path is not None:
            try:
                self._built().write(self.path)
            except OSError as e:
                err = OSError(
                    f"af.profile({str(self.path)!r}): the block ran and its "
                    f"{len(self._records)} kernels are kept on the profile "
                    f"(prof.events(), prof.summary()), but the trace could not be "
                    f"written there: {e}; give a path in a folder you can write"
                )
                if exc is None:
                    raise err from e
                add_note(exc, str(err))  # (the block's own error goes on)
        return False

    def events(self) -> list:
        """The trace events (Chrome trace format) of what was recorded: once the block has
        ended, or so far while it runs."""
        if self._events is not None:
            return self._events
        if self._records is None:  # still on: what has completed so far
            rec = self._recorder
            if rec is None:
                return []
            recs = [r for r in rec.records[self._first :] if r.done]
            return build_trace(
                recs,
                self._start_memory + rec.samples[self._first_sample :],
                self.t0,
                dict(rec.threads),
            ).events()
        self._events = self._built().events()
        return self._events

    def _built(self):
        """The trace of the ended block (``trace_events.TraceEvents``), built once."""
        if self._trace is None:
            self._trace = build_trace(self._records, self._samples, self.t0, self._threads)
        return self._trace

    def summary(self) -> str:
        """A table per op name: count, total kernel ms, mean us, share of the total."""
        if self._records is None:
            return "af.profile: still recording (the summary is made when the block ends)"
        return summary_table(self._records, (self.t1 - self.t0) * 1e3)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        state = "on" if self._records is None else f"{len(self._records)} kernels"
        return f"<af.profile {state}{'' if self.path is None else ', ' + str(self.path)}>"


def profile(path: str | os.PathLike[str] | None = None) -> Profile:
    """Records every kernel the eager VM runs inside the block; on exit waits for them and,
    with ``path``, writes a Chrome trace (open it in ui.perfetto.dev or chrome://tracing).

    Example::

        with af.profile("eager.json") as prof:
            y = af.relu(x @ w) + 1
            y.numpy()
        print(prof)                  # a table per op: count, total ms, mean us, share

    One track per stream (``cpu:compute``, ``null:compute``...) with a slice per kernel
    (args: op name, instruction id, bytes written, the thread it ran on, its wait), the
    waits from issue to start on lanes beside it, flows from the kernel that wrote a blob
    to each later one reading it, and a counter of each device's memory in use. Profiles
    nest (each records its own block); kernel errors are left for the next sync point.
    """
    return Profile(path)
