"""Elementwise runs, the planning half (``vm/runs.py`` dispatches and completes them):
queued elementwise op calls on tensors of one shape, run slice by slice and tile by tile
instead of op by op.

The VM finds a run (``vm/runs.py``: consecutive instructions of one stream, each waiting
only on earlier ones of the run); this planner decides which op calls may join it and how
to cut it. The rules make every slice of the run independent of every other slice:

- each member writes one tensor of the run's shape ``S`` that is its whole blob
  (contiguous, offset 0);
- a blob written in the run is only ever accessed, by every member, as that same whole
  tensor, so element ``i`` of an output depends only on element ``i`` of what was written
  before it in the run;
- inputs never written in the run may have any shape that broadcasts to ``S``.

Then each worker runs every member, in issue order, on its own slice, in tiles small enough
to stay in its cache, and the workers meet once per run instead of once per op. A blob first
written in the run and released in it (an intermediate whose tensor is gone) never gets
memory: each worker keeps it in a tile buffer of its own. A tensor is known to be gone when
its blob's release is in the run, or (CPython, with the GIL) when nothing but the run's own
instructions refers to it any more: no user tensor, view or later instruction can read it
then, and nothing can come to refer to it again.
"""

from __future__ import annotations

import itertools
import sys
import threading

import numpy as np

from ..tensor.meta import contiguous_strides
from .deps import first_error
from .instruction import DYNAMIC, OUTPUTS, Split
from .opcall import allocate, eager_part, split_op

MAX_SLOTS = 16  # tile buffers per worker; further dead intermediates get real memory
# Reference counts tell when a tensor is gone only on CPython with the GIL.
_REFCOUNTS = (
    sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)()
)


class Elementwise(Split):
    """The ``Split`` of an elementwise op call: ``split(instr, n, first_share)`` cuts one call
    into slices; ``planner(head)`` starts planning a run led by ``head`` (None if it cannot
    lead one)."""

    __slots__ = ()

    def __call__(self, instr, n: int, first_share: float = 0.0):
        return split_op(instr, n, first_share)

    def planner(self, head):
        args = head.args
        if args is None or args[DYNAMIC] or len(args[OUTPUTS]) != 1:
            return None
        out = args[OUTPUTS][0].meta
        if 0 in out.shape or not any(s > 1 for s in out.shape):
            return None  # nothing to cut
        p = RunPlanner(out.shape, out.device)
        return p if p.admit(head) else None


ELEMENTWISE = Elementwise()


class RunPlanner:
    """Admits op calls into a run of shape ``shape`` (``admit``), notes the blobs released in
    it (``release``), then allocates and cuts it (``prepare``)."""

    def __init__(self, shape: tuple, device):
        self.shape = shape
        self.device = device  # every tensor a member touches is on it
        self.strides = contiguous_strides(shape)
        self.numel = 1
        for s in shape:
            self.numel *= s
        self.steps: list = []  # (instr, kernel, attrs, outs, ins) of each member op call
        self.written: set = set()  # blobs written in the run
        self.partial: set = set()  # blobs read as something else than the whole S tensor
        self.read: set = set()  # blobs with no memory read in the run before any write
        self.owner: dict = {}  # blob first written in the run, with no memory before
        #                        it -> the tensor that owns it
        self.uses: dict = {}  # such blob -> how often the run's argument lists hold
        #                       its tensor (None: a view of it is used too)
        self.last: dict = {}  # such blob -> index of the last member that touches it
        self.released: set = set()  # blobs whose release is in the run
        self.elided = 0  # intermediates prepare() kept in tile buffers only
        self._allocated: list = []  # output tensors prepare() allocated (undone on failure)

    def _whole(self, impl) -> bool:
        m = impl.meta
        return (
            (m.shape is self.shape or m.shape == self.shape)
            and not m.offset
            and (m.strides is self.strides or m.strides == self.strides)
            and impl.blob.nbytes == self.numel * m.dtype.itemsize
            and m.device is self.device
        )

    def admit(self, instr) -> bool:
        """Adds ``instr`` to the run if the rules above allow it; changes nothing if not."""
        if instr.split is not ELEMENTWISE:
            return False
        kernel, ins, outs, attrs, dynamic, _ = instr.args
        if dynamic or len(outs) != 1:
            return False
        out = outs[0]
        ob = out.blob
        if ob in self.partial or not self._whole(out):
            return False
        written = self.written
        partial = None
        for i in ins:
            if not self._whole(i):
                if i.meta.device is not self.device:
                    return False  # a copy between devices: not a slice-wise kernel
                b = i.blob
                if b in written or b is ob:
                    return False
                partial = [b] if partial is None else partial + [b]
        if partial:
            self.partial.update(partial)
        k = len(self.steps)
        owner = self.owner
        for i in ins:
            b = i.blob
            if b in owner:
                self._use(b, i, k)
            elif not b.allocated and b not in written:
                self.read.add(b)
        if ob in owner:
            self._use(ob, out, k)
        elif ob not in written:
            written.add(ob)
            if not ob.allocated and out.base is None and ob not in self.read:
                owner[ob] = out
                self.uses[ob] = 1
                self.last[ob] = k
        self.steps.append((instr, kernel, attrs, outs, ins))
        return True

    def _use(self, blob, impl, k: int) -> None:
        n = self.uses[blob]
        if n is not None:
            self.uses[blob] = n + 1 if impl is self.owner[blob] else None
        self.last[blob] = k

    def release(self, blob) -> None:
        self.released.add(blob)

    # -- cutting -------------------------------------------------------------------------
    def prepare(self, n: int, tile_bytes: int, skip, fail) -> list:
        """Allocates the outputs that outlive the run and returns one callable per slice (at
        most ``n``); each runs every member on its slice, tile by tile. ``skip(instr)`` says a
        member's inputs are poisoned; ``fail(instr, exc)`` records a kernel error. Raises what
        allocation raises, with every allocation it made undone."""
        shape = self.shape
        axis = next((ax for ax, s in enumerate(shape) if s >= n), None)
        if axis is None:
            axis = next(ax for ax, s in enumerate(shape) if s > 1)
            n = shape[axis]
        slots, dtypes = self._assign_slots()
        self.elided = len(slots)
        try:
            for step in self.steps:
                out = step[3][0]
                b = out.blob
                if not b.allocated and b not in slots:
                    self._allocated.append(out)
                    allocate((out,), step[0].name)
        except BaseException:
            self.undo()
            raise
        size = shape[axis]
        inner = self.numel // size
        itemsize = max(step[3][0].meta.dtype.itemsize for step in self.steps)
        tile = max(1, min(tile_bytes // max(1, inner * itemsize), -(-size // n)))
        seen: dict = {}
        steps = [self._sources(step, axis, slots, seen) for step in self.steps]
        tile_shape = shape[:axis] + (tile,) + shape[axis + 1 :]
        bounds = [size * k // n for k in range(n + 1)]
        return [
            _Slice(steps, axis, lo, hi, tile, tile_shape, dtypes, skip, fail)
            for lo, hi in itertools.pairwise(bounds)
            if hi > lo
        ]

    def undo(self) -> None:
        """Gives back the memory ``prepare`` allocated."""
        for out in self._allocated:
            b = out.blob
            if b.allocated:
                b.backend.allocator.free(*b.detach())
                b.released = False
        self._allocated = []

    def _dead(self) -> set:
        """Blobs first written in the run whose tensor is gone: released in the run, or
        referred to by nothing but the run's argument lists. Never a pinned one (autograd
        reads a saved output through its pin after the tensor is gone), nor one that work
        issued after the run's members reads or writes (a backward rule's reads of a saved
        output come through a tensor of their own over the blob)."""
        owner, uses, released = self.owner, self.uses, self.released
        members = {step[0] for step in self.steps}
        dead = set()
        for b in owner:
            n = uses[b]
            if (
                n is None
                or b.pins
                or b.last_write not in members
                or (b.reads and any(r not in members for r in b.reads))
            ):
                continue
            # references: the n list entries, ``owner`` and getrefcount's own argument
            if b in released or (_REFCOUNTS and sys.getrefcount(owner[b]) == n + 2):
                dead.add(b)
        return dead

    def _assign_slots(self):
        """Tile buffers for the dead intermediates: ``{blob: slot}`` and each slot's dtype. A
        slot is free again after the last member that touches its blob (never reused by that
        member's own output, since a kernel may read its input after writing)."""
        dead = self._dead() if self.owner else None
        if not dead:
            return {}, []
        last = self.last
        slots: dict = {}
        dtypes: list = []
        free: dict = {}
        ends: dict = {}  # member index -> slots free after it
        for k, step in enumerate(self.steps):
            out = step[3][0]
            b = out.blob
            if b in dead and b not in slots:
                dt = out.meta.dtype.np
                spare = free.get(dt)
                if spare:
                    slot = spare.pop()
                elif len(dtypes) < MAX_SLOTS:
                    slot = len(dtypes)
                    dtypes.append(dt)
                else:
                    continue  # out of tile buffers: this one gets real memory
                slots[b] = slot
                ends.setdefault(last[b], []).append(slot)
            for slot in ends.pop(k, ()):
                free.setdefault(dtypes[slot], []).append(slot)
        return slots, dtypes

    def _sources(self, step, axis: int, slots: dict, seen: dict):
        """``(instr, kernel, attrs, sources)``: where each tile of the member's output and
        inputs comes from, a tile buffer ``(slot, None, None)`` or an array and the index
        that cuts it ``(None, array, lead or None)``. ``seen`` keeps the sources of tensors
        already looked at (the same inputs recur along a run)."""
        instr, kernel, attrs, outs, ins = step
        sources = []
        for t in (outs[0], *ins):
            src = seen.get(id(t))
            if src is None:
                src = self._source(t, axis, slots)
                seen[id(t)] = src
            sources.append(src)
        return instr, kernel, attrs, sources

    def _source(self, t, axis: int, slots: dict):
        slot = slots.get(t.blob)
        if slot is not None:
            return (slot, None, None)
        a = t.array()
        ax = axis - (len(self.shape) - a.ndim)
        size = self.shape[axis]
        lead = (slice(None),) * ax if ax >= 0 and a.shape[ax] == size and size != 1 else None
        return (None, a, lead)


class DeviceRunPlanner(RunPlanner):
    """Admits op calls on a device with its own memory (cuda) into a run launched as one
    generated kernel (``opcall.run_launch``): the rules above, and each member takes its
    generated kernel (``opcall.eager_part``; kept in ``parts``) and, after a kernel has
    failed (``errors``), reads no poisoned blob and writes no blob with an error (it then
    runs alone, as ``deps.error_to_run`` has it). ``writes`` says which outputs the run's
    kernel writes: those that outlive it; the dead intermediates stay in registers and
    never get memory."""

    def __init__(self, shape: tuple, device, errors: bool):
        super().__init__(shape, device)
        self.parts: list = []
        self.errors = errors

    def admit(self, instr) -> bool:
        if instr.split is not ELEMENTWISE or (self.errors and _errors_on(instr)):
            return False
        part = eager_part(instr.args)
        if part is None or not super().admit(instr):
            return False
        self.parts.append(part)
        return True

    def writes(self, members: list) -> tuple:
        """The members (indices into ``members``, the op calls ``admit`` took, in order)
        whose outputs the run writes to memory: for each blob written in the run that is
        not a dead intermediate (``_dead``), the last member that writes it (the last
        member's when every one is dead). The dead ones, counted in ``elided``, stay in
        registers and never get memory."""
        dead = self._dead() if self.owner else ()
        last_write: dict = {}
        for k, m in enumerate(members):
            last_write[m.args[OUTPUTS][0].blob] = k
        writes = tuple(sorted(k for b, k in last_write.items() if b not in dead))
        self.elided = len(last_write) - len(writes)
        if not writes:
            writes = (len(members) - 1,)
            self.elided -= 1
        return writes


def _errors_on(instr) -> bool:
    """Whether ``instr`` reads a poisoned blob or writes a blob with an error (poison or a
    note: ``deps.error_to_run`` decides what an op call alone does with those)."""
    if first_error(instr) is not None:
        return True
    for b in instr.muts:
        if b.error is not None:
            return True
    return False


_SCRATCH = threading.local()


def _scratch(slot: int, nbytes: int):
    """This thread's tile buffer number ``slot``, at least ``nbytes`` long (kept between
    runs so a run never page-faults fresh memory)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = []
    while len(bufs) <= slot:
        bufs.append(np.empty(0, np.uint8))
    if bufs[slot].nbytes < nbytes:
        bufs[slot] = np.empty(nbytes, np.uint8)
    return bufs[slot]


class _Slice:
    """One worker's share of a run: rows ``[lo, hi)`` of ``axis``, tile by tile."""

    __slots__ = ("steps", "axis", "lo", "hi", "tile", "tile_shape", "dtypes", "skip", "fail")

    def __init__(self, steps, axis, lo, hi, tile, tile_shape, dtypes, skip, fail):
        self.steps, self.axis, self.lo, self.hi = steps, axis, lo, hi
        self.tile, self.tile_shape, self.dtypes = tile, tile_shape, dtypes
        self.skip, self.fail = skip, fail

    def __call__(self) -> None:
        n_tile = 1
        for s in self.tile_shape:
            n_tile *= s
        scratch = [
            _scratch(k, n_tile * np.dtype(dt).itemsize)[: n_tile * np.dtype(dt).itemsize]
            .view(dt)
            .reshape(self.tile_shape)
            for k, dt in enumerate(self.dtypes)
        ]
        lead = (slice(None),) * self.axis
        skip, fail = self.skip, self.fail
        for t0 in range(self.lo, self.hi, self.tile):
            t1 = min(t0 + self.tile, self.hi)
            rows = slice(t0, t1)
            part = lead + (slice(0, t1 - t0),)
            tiles = [s[part] for s in scratch]
            for instr, kernel, attrs, sources in self.steps:
                if skip(instr):
                    continue
                arrays = []
                for slot, a, alead in sources:
                    if slot is not None:
                        arrays.append(tiles[slot])
                    elif alead is None:
                        arrays.append(a)
                    else:
                        arrays.append(a[alead + (rows,)])
                try:
                    kernel(arrays[:1], arrays[1:], attrs)
                except BaseException as e:  # noqa: BLE001 - recorded, surfaced at sync
                    fail(instr, e)
