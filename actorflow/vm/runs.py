"""Runs: several queued instructions of one stream dispatched together.

When the loop dispatches a large instruction whose ``split`` can plan a run (elementwise
op calls: ``vm/run_cuts.py``), it collects the instructions issued after it on its stream
for as long as each one waits only on instructions already in the run (so the run needs
nothing from outside it) and the planner admits it; releases of blobs ride along. The run
is cut once into slices, every worker runs all of its members on its slice, and the members
complete together, in issue order, when the last slice is done. Ordering is unchanged: a
member still runs after everything it depends on, and everything that depends on a member
still waits for it. What goes away is the meeting of the workers after every op (a thread
wake-up costs tens of microseconds, as much as a slice of a big kernel) and, for
intermediates released inside the run, their memory.

On a device with its own memory (cuda), a run is one launch instead (``Runs.device_run``):
the same walk behind an elementwise op call being dispatched, members that take their
generated kernels; it writes the outputs that outlive it (an intermediate no tensor holds
stays in registers); ``opcall.run_launch`` makes its kernel (a compiled step's chains use
the same), the VM issues it (``VM._issue_run``) and every member completes when the event
after it does. Off while profiling: each op call is its own launch then.

``Runs`` is the VM's component for them: it owns the settings of runs and their counts, and
is handed the VM, whose lock, workers and loop a run uses; the members complete on the VM
(``VM._finish_run``), as every instruction does.
"""

from __future__ import annotations

from ..errors import OutOfMemoryError
from .deps import first_error
from .instruction import OP_CALL, OUTPUTS, RELEASE
from .opcall import run_launch
from .run_cuts import DeviceRunPlanner
from .workers import Countdown


def collect(head, planner, limit: int, errors: bool = False) -> tuple[list, int]:
    """``head`` and the instructions issued after it on its stream that can run with it:
    ``(members, op_calls)``. Caller holds the VM lock. ``errors`` (a kernel has failed
    since the VM started): an op call that writes a poisoned blob ends the run, so that
    it runs alone (deps.error_to_run: a whole overwrite clears the poison; in a run, the
    members' checks tile by tile must see one state, so nothing is cleared)."""
    members = [head]
    waits: dict = {}  # instruction -> how many run members it waits on
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


class Runs:
    """Forms runs behind large instructions and sends their slices to the workers, for
    ``vm`` (``VM.runs``). Settings: ``fuse_max`` (members per run; 0 turns runs off),
    ``device_max`` (members per run on a device: one launch; 0 turns them off),
    ``tile_bytes`` (bytes of one output tile a worker computes at a time) and
    ``thread_min_work`` (elements x ops per slice from which a run spawns threads of its
    own). Counts: ``ops`` (op calls run as members), ``count`` (runs), ``elided``
    (intermediates that never got memory)."""

    def __init__(self, vm):
        self.vm = vm
        self.fuse_max = 1024
        self.tile_bytes = 1 << 20
        self.thread_min_work = 1 << 22
        self.device_max = 64  # members per run on a device (cuda); 0 turns them off
        self.ops = self.count = self.elided = 0
        self._no_run_until = None  # after a run found no memory: the last member it tried

    def dispatch(self, head) -> bool:
        """Dispatches ``head`` as the first member of a run; False if no run of two op calls
        or more can be formed (nothing was changed then). On the VM's loop thread."""
        if self.fuse_max < 2:
            return False
        if self._no_run_until is not None:
            if not self._no_run_until.done:
                return False  # those members run one by one (no retry per member)
            self._no_run_until = None
        vm = self.vm
        if vm._any_error and first_error(head) is not None:
            return False
        planner = head.split.planner(head)
        if planner is None:
            return False
        with vm._lock:
            members, ops = collect(head, planner, self.fuse_max, vm._any_error)
        if ops < 2:
            return False
        run = _Run(members, 0)
        try:
            slices = planner.prepare(
                vm.workers,
                self.tile_bytes,
                self._poisoned,
                lambda instr, e: self._run_error(run, instr, e),
            )
        except OutOfMemoryError:
            self._no_run_until = members[-1]
            return False  # run the head alone: its own allocation decides
        run.left = len(slices)
        if vm.profiler is not None:
            slices = vm.profiler.run(members, slices)
        self.ops += ops
        self.count += 1
        self.elided += planner.elided
        # Every slice runs off the loop thread, which stays free. A long run gets threads of
        # its own: woken together, two sleeping pool workers were often put on the same CPU
        # by the OS and shared it for milliseconds, while a new thread starts on an idle one.
        # Measured on 100 ops of 1M elements, interleaved in one process: new threads 0.60x
        # and 0.71x numpy's median time, pool workers 0.75x and 0.81x.
        pool = vm._pool
        send = (
            pool.spawn if planner.numel * ops >= self.thread_min_work * len(slices) else pool.submit
        )
        for s in slices:
            send(self._run_slice, run, s)
        return True

    def device_run(self, head):
        """On a device with its own memory (cuda): the run led by op call ``head``, to be
        issued as one launch, ``(members, writers, launch, keys)``: ``writers``, the
        members whose outputs it writes (``DeviceRunPlanner.writes``: those that outlive
        the run), ``opcall.run_launch``'s launch and the memory of its operands, the
        outputs first; None when no run of two op calls or more forms (nothing was changed
        then). Its members: the op calls issued after ``head`` on its stream that wait only
        on members (``collect``) and take their generated kernels. On the VM's loop
        thread; off while profiling (each op call is its own launch then)."""
        if self.device_max < 2 or self.vm.profiler is not None:
            return None
        vm = self.vm
        errors = vm._any_error
        m = head.args[OUTPUTS][0].meta  # (no reference to the tensor: see _dead)
        planner = DeviceRunPlanner(m.shape, m.device, errors)
        if not planner.admit(head):
            return None
        with vm._lock:
            members, _ = collect(head, planner, self.device_max, errors)
        if len(members) < 2:
            return None
        writes = planner.writes(members)
        made = run_launch(planner.parts, writes)
        if made is None:
            return None
        self.ops += len(members)
        self.count += 1
        self.elided += planner.elided
        return members, [members[k] for k in writes], made[0], made[1]

    def _poisoned(self, instr) -> bool:
        return self.vm._any_error and first_error(instr) is not None

    def _run_error(self, run, instr, e) -> None:
        with run.lock:
            if instr.error is None:
                vm = self.vm
                vm._fail(instr, vm._kernel_error(instr, e))

    def _run_slice(self, run, piece) -> None:
        try:
            piece()  # catches its kernels' errors itself
        except BaseException as e:  # noqa: BLE001 - e.g. no memory for a tile buffer
            for m in run.members:
                if m.kind == OP_CALL:
                    self._run_error(run, m, e)
        if run.finish_one():
            self.vm._loop.call_soon_threadsafe(self.vm._finish_run, run.members)
