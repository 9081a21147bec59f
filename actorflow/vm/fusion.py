"""Runs: several queued instructions of one stream dispatched together.

When the loop dispatches a large instruction whose ``split`` can plan a run (elementwise
op calls: ``vm/planner.py``), it collects the instructions issued after it on its stream
for as long as each one waits only on instructions already in the run (so the run needs
nothing from outside it) and the planner admits it; releases of blobs ride along. The run
is cut once into slices, every worker runs all of its members on its slice, and the members
complete together, in issue order, when the last slice is done. Ordering is unchanged: a
member still runs after everything it depends on, and everything that depends on a member
still waits for it. What goes away is the meeting of the workers after every op (a thread
wake-up costs tens of microseconds, as much as a slice of a big kernel) and, for
intermediates released inside the run, their memory.

A mixin of the VM (its lock, loop thread, workers and error handling).
"""

from __future__ import annotations

from ..errors import OutOfMemoryError
from .deps import first_error
from .instruction import OP_CALL, RELEASE
from .workers import Countdown


def collect(head, planner, limit: int, errors: bool = False) -> tuple[list, int]:
    """``head`` and the instructions issued after it on its stream that can run with it:
    ``(members, op_calls)``. Caller holds the VM lock. ``errors`` (a kernel has failed
    since the VM started): an op call that writes a poisoned blob ends the run, so that
    it runs alone (deps.error_to_run: a whole overwrite clears the poison; in a run, the
    members' checks tile by tile must see one state, so nothing is cleared)."""
    members = [head]
    waits: dict = {}              # instruction -> how many run members it waits on
    for d in head.dependents:
        waits[d] = waits.get(d, 0) + 1
    stream = head.stream
    ops = 1
    cur = head
    while len(members) < limit:
        d = cur.next
        if d is None or d.done or d.stream is not stream or waits.get(d, 0) != d.pending:
            break
        if d.kind == RELEASE:
            planner.release(d.muts[0])
        elif d.kind == OP_CALL and not (errors and _writes_poisoned(d)) and planner.admit(d):
            ops += 1
        else:
            break
        members.append(d)
        for x in d.dependents:
            waits[x] = waits.get(x, 0) + 1
        cur = d
    return members, ops


def _writes_poisoned(instr) -> bool:
    for b in instr.muts:
        e = b.error
        if e is not None and not e.intact:
            return True
    return False


class _Run(Countdown):
    """A run's members and the count of its slices still running."""
    __slots__ = ("members",)

    def __init__(self, members, n_slices: int):
        super().__init__(n_slices)
        self.members = members


class Fusing:
    fuse_max = 1024               # members per run; 0 turns runs off
    fusion_tile_bytes = 1 << 20   # bytes of one output tile a worker computes at a time
    run_thread_min_work = 1 << 22  # elements x ops per slice from which a run spawns threads
    _no_run_until = None          # after a run found no memory: the last member it tried

    def _dispatch_run(self, head) -> bool:
        """Dispatches ``head`` as the first member of a run; False if no run of two op calls
        or more can be formed (nothing was changed then)."""
        if self.fuse_max < 2:
            return False
        if self._no_run_until is not None:
            if not self._no_run_until.done:
                return False            # those members run one by one (no retry per member)
            self._no_run_until = None
        if self._any_error and first_error(head) is not None:
            return False
        planner = head.split.planner(head)
        if planner is None:
            return False
        with self._lock:
            members, ops = collect(head, planner, self.fuse_max, self._any_error)
        if ops < 2:
            return False
        run = _Run(members, 0)
        try:
            slices = planner.prepare(self.workers, self.fusion_tile_bytes, self._poisoned,
                                     lambda instr, e: self._run_error(run, instr, e))
        except OutOfMemoryError:
            self._no_run_until = members[-1]
            return False                # run the head alone: its own allocation decides
        run.left = len(slices)
        if self.profiler is not None:
            slices = self.profiler.run(members, slices)
        self.fused += ops
        self.fused_runs += 1
        self.elided += planner.elided
        # Every slice runs off the loop thread, which stays free. A long run gets threads of
        # its own: woken together, two sleeping pool workers were often put on the same CPU
        # by the OS and shared it for milliseconds, while a new thread starts on an idle one.
        # Measured on 100 ops of 1M elements, interleaved in one process: new threads 0.60x
        # and 0.71x numpy's median time, pool workers 0.75x and 0.81x.
        long = planner.numel * ops >= self.run_thread_min_work * len(slices)
        for s in slices:
            if long:
                self._pool.spawn(self._run_slice, run, s)
            else:
                self._pool.submit(self._run_slice, run, s)
        return True

    def _poisoned(self, instr) -> bool:
        return self._any_error and first_error(instr) is not None

    def _run_error(self, run, instr, e) -> None:
        with run.lock:
            if instr.error is None:
                self._fail(instr, self._kernel_error(instr, e))

    def _run_slice(self, run, piece) -> None:
        try:
            piece()                      # catches its kernels' errors itself
        except BaseException as e:  # noqa: BLE001 - e.g. no memory for a tile buffer
            for m in run.members:
                if m.kind == OP_CALL:
                    self._run_error(run, m, e)
        if run.finish_one():
            self._loop.call_soon_threadsafe(self._finish_run, run)

    def _finish_run(self, run) -> None:
        """On the loop, once every slice is done: a member whose input was poisoned by a
        member that failed fails too (as it would have run alone), releases free their
        blobs, and the members complete in issue order."""
        members = run.members
        for m in members:
            if m.kind == RELEASE:
                self._execute(m)
            elif self._any_error and m.error is None:
                err = first_error(m)
                if err is not None:
                    self._fail(m, err)
        with self._lock:
            for m in members:
                m.done = True             # so completing one never readies another
            for m in members:
                self._complete(m)
            more = bool(self._ready) and not self._wake_pending
        if more:
            self._drain()
