"""A compiled stateful Program run on a device with its own memory (a CUDA device):
``nn.Graph``'s step on ``cuda:0``.

``DeviceProgram.submit`` makes one step one VM instruction on the device's compute stream:
it reads the step's input tensors, the state and captured tensors its kernels read and its
constants, and writes its output tensors and the state it writes back (the parameters' and
the optimizer's own storage, in place). When the VM dispatches it, its work is issued on the
compute stream's driver stream: the launches made on the first step (``_prepare``: shapes
are static), each a ``vm.opcall.Launch`` (the op's generated kernel, as an eager call on the
device takes it, or its reference form; a chain of elementwise steps as one generated
kernel, a run, whose intermediates stay in registers and get no memory), into a workspace of
device memory the program keeps, then the new state copied over the old, last. A run only
packs the device arrays. The instruction completes on the event the VM records after it (no
host wait per op, none per step): the step's outputs are tensors on the device, and reading
one is the
caller's sync.

CUDA graphs (``cuda_graph=True``, the default): a step's launches are captured once
(``Stream.begin_capture``/``end_capture``) after a first, uncaptured run of them, over
static buffers: the step's inputs are copied into static input buffers before each replay
and its outputs out of static output buffers after it (a captured graph holds addresses,
so it reads the new inputs only through those copies), and the state in place. A later step
is one replay (``Graph.launch``). The capture holds the state's addresses: when a state
tensor is replaced (an optimizer's state loaded anew...) the step is captured again. A step
with a launch in the reference form (an op's numpy kernel over the device arrays) is
captured only where the driver says a capture may hold its allocations
(``Driver.captures_allocations``: the emulator, which runs references anew at each replay,
and CuPy, whose capture takes the temporaries of numpy-over-cupy calls from a pool the
graph keeps); elsewhere it is launched one by one every step, counted in ``uncaptured``.
A capture the driver refuses (``end_capture`` raising DeviceError: a reference that
synchronizes or reads host memory, say) costs nothing but the attempt: that step already
ran uncaptured, and the program's later steps are launched one by one (``capture_failed``
says why, ``uncaptured`` counts them).

``DeviceSteps`` makes such a program an op actor's: ``nn.Graph.run(..., fused=True)``'s
whole step over device registers, or one op (one state's write-back) of ``run()``'s actor
per op, launched one by one.

A fault of a kernel is the driver stream's sticky error: the commands after it (the state's
write-back among them) are skipped, so the state keeps its values; the instruction fails,
its outputs raise the error when read, and the state is not poisoned (``_kept``): the next
step runs as usual, as on the cpu. An integer division by zero in a step is such an error
too, on purpose (its zero flag is checked by a host function on the stream, ``Launch`` with
``_issue_zero(..., sticky=True)``): that skips the write-back, but it also fails the work
issued on the compute stream behind the step before the step completed (the error message
says so). An eager division checks its flag when its instruction completes instead
(``vm.opcall.ZeroCheck``) and fails only itself and what is computed from it: a step issued
ahead of that check, reading its output, ran whole on the failed values, so its outputs and
the state it wrote back keep the error (load the state anew to go on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..backends import get_backend
from ..dtype import int32
from ..errors import DeviceError, KernelError
from ..ops.registry import get as get_op
from ..tensor.impl import TensorImpl
from ..vm.deps import RAN_ON_FAILED
from ..vm.instruction import Instruction
from ..vm.opcall import Launch, allocate, kernel_of, launch_of, run_launch
from ..vm.scheduler import get_vm

PROGRAM = "program"  # the kind of a compiled program's instruction


def _darray(impl):
    return impl.blob.array.darray


class DeviceProgram:
    """``program`` (a stateful ``Program`` traced on ``device``) run on the device's compute
    stream, one instruction per step (see the module doc). ``name``: what the instruction,
    its errors and a profile call it. ``kernels``: the launches of one step, in order (made
    on the first step, see ``_prepare``). Counts, for tests and profiles: ``captures`` (graphs
    captured), ``replays`` (steps that were one replay), ``launches`` (kernels launched
    one by one, outside a replay), ``captured_commands`` (the last graph's commands),
    ``uncaptured`` (steps with ``cuda_graph`` on launched one by one, because a launch in
    the reference form cannot be captured on the driver: ``reference_launches`` names
    them; or because the driver refused the capture: ``capture_failed`` says why)."""

    def __init__(self, program, device, name: str):
        self.program = program
        self.device = device
        self.name = name
        self.backend = get_backend(device)
        self.tmp: list[TensorImpl | None] = [
            TensorImpl.new(s.shape, s.dtype, device) for s in program.tmp_specs
        ]  # (None: an intermediate a run of launches keeps in registers)
        self.consts: list[TensorImpl] = []  # the constants, copied to the device once
        if program.consts:
            from ..creation import from_numpy

            self.consts = [from_numpy(c).to(str(device))._impl for c in program.consts]
        self.static_ins: list[TensorImpl] | None = None
        self.static_outs: list[TensorImpl] | None = None
        self.graph: Any = None  # the driver's captured Graph
        self.key: tuple | None = None  # the state's device addresses it captured
        self.captures = self.replays = self.launches = self.captured_commands = 0
        self.uncaptured = 0
        self.capture_failed: str | None = None  # the driver's refusal of a capture
        self.reference_launches: tuple = ()
        self.offsets: tuple[int, ...] = (0,)  # per input register, where its arrays start in
        #                      the inputs submit is given (op actors: per port)
        refs = [r for st in program.steps for r in st.ins] + [
            r for _, r in (*program.copies, *program.assigns)
        ]
        self.writes = sorted({i for i, _ in program.assigns})  # the state it writes back,
        self.reads = sorted({r[1] for r in refs if r[0] == "state"} - set(self.writes))  # reads
        self.kernels: list[Launch] | None = None  # and per launch its operands' slots:
        self._slots: list[list[tuple]] | None = None
        self._writes: list[tuple[tuple, tuple, Launch | None]] | None = None
        self._tmp: list | None = None  # the device arrays of tmp and consts
        self._const: list | None = None
        self._flags: list = []  # the zero flags' device memory

    def submit(
        self, ins: list, state: list, captured: list, cuda_graph: bool, outs: list | None = None
    ) -> list:
        """Issues one step: ``ins`` the input tensors' impls (contiguous, on the device, in
        the program's input order), ``state`` the state's, ``captured`` those of the tensors
        the program reads live; ``outs`` the impls to write (an op actor's register), else
        new ones. Returns the output impls (written when the step runs)."""
        if outs is None:
            outs = [TensorImpl.new(s.shape, s.dtype, s.device) for s in self.program.out_spec.specs]
        live = (*state, *captured)  # (what "state" refs index)
        state_blobs = tuple(live[i].blob for i in self.writes)
        consts = tuple(t.blob for t in (*ins, *self.consts)) + tuple(
            live[i].blob for i in self.reads
        )
        muts = tuple(o.blob for o in outs) + state_blobs
        cost = sum(b.nbytes for b in muts) >> 2
        instr = Instruction(
            PROGRAM,
            self.name,
            self.backend.compute,
            consts,
            muts,
            self._run,
            (ins, outs, state, captured, cuda_graph),
            cost,
        )
        instr.waiters = [lambda: _kept(instr, state_blobs, consts)]
        get_vm().submit(instr)
        return outs

    # -- the launches, made once -----------------------------------------------------------
    def _prepare(self, ins: list, outs: list, state: list) -> None:
        """Makes the step's launches from its operands' metas (static: a new layout is a
        new program): each step's launch (``vm.opcall.launch_of``: its generated kernel
        and packed attrs, or the reference form), then each chain of consecutive steps with
        generated kernels (no integer division) over one element count whose intermediates
        are temporaries read only inside the chain as ONE launch (``vm.opcall.run_launch``):
        those intermediates stay in registers and get no memory. A chain is cut after a
        step whose output is a program output, a state's new value or read after the
        chain. Then the output copies and the state's write-back. ``ins``, ``outs``,
        ``state``: the first step's impls (the state's, then the captured tensors')."""
        p = self.program
        offsets = self.offsets
        whole = {
            "in": [t.meta for t in ins],
            "out": [o.meta for o in outs],
            "tmp": [t.meta for t in cast("list[TensorImpl]", self.tmp)],  # (no None yet)
            "state": [t.meta for t in state],
            "const": [t.meta for t in self.consts],
        }

        def meta(ref):
            return ref[3] if ref[3] is not None else whole[ref[0]][_slot(ref, offsets)[1]]

        singles = []
        for s in p.steps:
            refs: Sequence[tuple] = (*s.outs, *s.ins)
            written = {_slot(r, offsets) for r in s.outs}
            singles.append(
                (
                    launch_of(
                        s.kernel,
                        len(s.outs),
                        [meta(r) for r in refs],
                        [r[3] for r in refs],
                        s.attrs,
                        tuple(_slot(r, offsets) in written for r in s.ins),
                    ),
                    refs,
                )
            )
        readers: dict = {}  # slot -> index of the last step reading it
        for k, s in enumerate(p.steps):
            for r in s.ins:
                readers[_slot(r, offsets)] = k
        kept = {_slot(r, offsets) for _, r in (*p.copies, *p.assigns)}

        def joins(k):  # step k may be part of a run
            launch = singles[k][0]
            return launch.gen is not None and not launch.gen.zero

        def inner(k):  # step k's output may stay in registers
            out = singles[k][1][0]
            return out[0] == "tmp" and _slot(out, offsets) not in kept

        def chain_end(k):  # the last step of the chain from step k
            b = k
            if not joins(k):
                return b
            n = singles[k][0].n
            while b + 1 < len(p.steps) and inner(b) and joins(b + 1) and singles[b + 1][0].n == n:
                b += 1
            c = k
            while c < b:  # cut where an intermediate is read later
                if readers.get(_slot(singles[c][1][0], offsets), -1) > b:
                    b, c = c, k
                else:
                    c += 1
            return b

        kernels: list[Launch] = []
        slots: list[list[tuple]] = []
        dropped: set[int] = set()
        k = 0
        while k < len(p.steps):
            b = chain_end(k)
            if b == k:
                launch, refs = singles[k]
            else:
                chain = [singles[c][1][0] for c in range(k, b)]
                inside = {_slot(r, offsets) for r in chain}
                by_key: dict = {}
                parts = []
                for c in range(k, b + 1):
                    launch, refs = singles[c]
                    keys = []
                    for r in refs:  # an intermediate by its slot, else by its view
                        at = _slot(r, offsets)
                        key = at if at in inside or r is refs[0] else (*at, r[3])
                        by_key[key] = r
                        keys.append(key)
                    parts.append((launch, keys))
                one = run_launch(parts)
                if one is None:  # (the generator refused the run: step by step)
                    for c in range(k, b + 1):
                        kernels.append(singles[c][0])
                        slots.append([_slot(r, offsets) for r in singles[c][1]])
                    k = b + 1
                    continue
                launch, keys = one
                refs = [by_key[key] for key in keys]
                dropped |= {r[1] for r in chain}
            kernels.append(launch)
            slots.append([_slot(r, offsets) for r in refs])
            k = b + 1
        # (destination slot, source slot, the launch that copies: None for a plain copy)
        writes: list[tuple[tuple, tuple, Launch | None]] = []
        copy = None
        for dst, ref in [(("out", j, 0, None), r) for j, r in p.copies] + [
            (("state", i, 0, None), r) for i, r in p.assigns
        ]:
            src, dm = meta(ref), meta(dst)
            if ref[3] is None and src.numel == dm.numel and src.dtype == dm.dtype:
                writes.append((_slot(dst, offsets), _slot(ref, offsets), None))
                continue
            if copy is None:
                copy = kernel_of(get_op("copy"), self.device)
            writes.append(
                (
                    _slot(dst, offsets),
                    _slot(ref, offsets),
                    launch_of(copy, 1, [dm, src], [None, ref[3]], {}),
                )
            )
        for launch in kernels + [w[2] for w in writes if w[2] is not None]:
            if launch.needs_zero:
                self._zero_flag(launch)
        self.tmp = [None if i in dropped else t for i, t in enumerate(self.tmp)]
        self.kernels, self._slots, self._writes = kernels, slots, writes
        self.reference_launches = tuple(
            launch.name
            for launch in kernels + [w[2] for w in writes if w[2] is not None]
            if not launch.kernel.source
        )

    def _zero_flag(self, launch) -> None:
        """A generated integer division's zero flag, the program's own: an int32 of device
        memory and two pinned host buffers (0, and the flag read back), so that the step's
        commands hold no allocation (a captured graph replays them)."""
        drv = self.backend.driver()
        flag = TensorImpl.new((1,), int32, self.device)
        seen, zero = drv.pinned((1,), np.int32), drv.pinned((1,), np.int32)
        zero[...] = 0
        self._flags.append(flag)
        launch.zero = (flag, seen, zero)

    # -- on the VM's loop, when the step is dispatched -------------------------------------
    def _run(self, instr) -> None:
        ins, outs, state, captured, cuda_graph = instr.args
        instr.result = True  # (it ran: a failure from now on is the device's)
        stream = self.backend.current
        if self.kernels is None:
            self._prepare(ins, outs, [*state, *captured])
        allocate(outs, self.name)
        if self._tmp is None:
            live = [t for t in self.tmp if t is not None]
            allocate(live + self._flags + self.consts, self.name)
            self._tmp = [None if t is None else _darray(t) for t in self.tmp]
            self._const = [_darray(t) for t in self.consts]
        st = [_darray(t) for t in (*state, *captured)]
        out_arrays = [_darray(o) for o in outs]
        in_arrays = [_darray(i) for i in ins]
        prof = get_vm().profiler
        if prof is not None:  # each kernel timed: launched one by one
            last: list = [None]
            timed = lambda name: prof.device_kernel(instr, name, stream, last)  # noqa: E731
            self._body(stream, out_arrays, in_arrays, st, timed=timed)
            return
        if not cuda_graph:
            self._body(stream, out_arrays, in_arrays, st)
            return
        if self.capture_failed is not None or (
            self.reference_launches and not self.backend.driver().captures_allocations
        ):
            self.uncaptured += 1  # (see the module doc)
            self._body(stream, out_arrays, in_arrays, st)
            return
        if self.static_ins is None or self.static_outs is None:  # (both set at once)
            p = self.program
            self.static_ins = [
                TensorImpl.new(a.shape, a.dtype, self.device) for a in [t.meta for t in ins]
            ]
            self.static_outs = [
                TensorImpl.new(s.shape, s.dtype, self.device) for s in p.out_spec.specs
            ]
        allocate(self.static_ins, self.name)
        allocate(self.static_outs, self.name)
        sins = [_darray(t) for t in self.static_ins]
        souts = [_darray(t) for t in self.static_outs]
        for dst, src in zip(sins, in_arrays, strict=True):
            stream.copy_d2d(dst, src)
        key = tuple(a.ptr for a in st)
        if self.graph is None or key != self.key:
            self._body(stream, souts, sins, st)  # a first run, then the capture
            self.graph = None
            stream.begin_capture()
            try:
                self._body(stream, souts, sins, st, counted=False)
            finally:
                try:
                    graph = stream.end_capture()
                except DeviceError as e:  # refused: this step ran (the first run)
                    self.capture_failed, graph = str(e), None
            if graph is not None:
                self.graph, self.key = graph, key
                self.captures += 1
                self.captured_commands = len(graph) if hasattr(graph, "__len__") else 0
        else:
            self.graph.launch(stream)
            self.replays += 1
        for dst, src in zip(out_arrays, souts, strict=True):
            stream.copy_d2d(dst, src)

    def _body(
        self, stream, outs: list, ins: list, state: list, counted: bool = True, timed=None
    ) -> None:
        """Issues the planned launches, the output copies, then the state's write-back;
        ``timed(name)`` after each launch while a profile is on. Each launch only packs the
        device arrays of its operands' slots."""
        kernels, slots_of, writes = self.kernels, self._slots, self._writes
        # (_run prepared them before the first step)
        assert kernels is not None and slots_of is not None and writes is not None
        arrays: dict[str, Any] = {  # the device arrays, per kind of slot
            "in": ins,
            "out": outs,
            "state": state,
            "tmp": self._tmp,
            "const": self._const,
        }
        for launch, slots in zip(kernels, slots_of, strict=True):
            launch.issue(stream, [arrays[kind][i] for kind, i in slots])
            if timed is not None:
                timed(launch.name)
        if counted:
            self.launches += len(kernels)
        for (dk, di), (sk, si), copy in writes:  # the state, once every kernel read it
            dst, src = arrays[dk][di], arrays[sk][si]
            if copy is None:
                stream.copy_d2d(dst, src)
            else:
                copy.issue(stream, [dst, src])


def _slot(ref, offsets) -> tuple:
    """Where a ref's whole array is: ``(kind, index)``; an input's by its leaf among the
    inputs of every register (``offsets``: where each register's start)."""
    return (ref[0], offsets[ref[1]] + ref[2] if ref[0] == "in" else ref[1])


def _kept(instr, state_blobs, read) -> None:
    """A step's waiter (under the VM lock, as it completes): a step that ran and failed on
    the device skipped its state's write-back (the stream's sticky error skips every later
    command), and a step that did not run because an input it reads (``read``) was poisoned
    wrote nothing: either way its state keeps its values, and the error stays on its outputs
    only. (A step that did not run because its state was poisoned leaves that as it is; a
    step issued ahead of an eager op whose error was known only at its completion, a zero
    flag, ran whole on the values that failed and wrote its state back: that keeps the
    error, ``vm.deps.RAN_ON_FAILED``.)"""
    err = instr.error
    if err is None or instr.result is RAN_ON_FAILED:
        return  # (it ran whole on inputs that failed after it was
    ran = instr.result is True  #  issued: its write-back ran, the state keeps it)
    if not ran and not any(b.error is err for b in read):
        return
    for b in state_blobs:
        if b.error is err:
            b.error = None
    if not ran:
        return
    if not err._reported:  # (says so where the outputs raise it)
        tb = err.kernel_traceback
        KernelError.__init__(
            err,
            err.op,
            err.device,
            err.original,
            False,
            "a kernel of the step failed on the device, so the step's later "
            "commands were skipped: nothing was written back, the "
            "parameters, buffers and optimizer state keep their values, and "
            "the next step runs as usual; its outputs raise this error",
        )
        err.kernel_traceback = tb


class DeviceSteps:
    """A ``DeviceProgram`` as the program of an op actor whose registers are on the device
    (``DeviceOpActor``): each act issues the program once, reading the input registers'
    tensors and writing the output register's (``DeviceProgram.submit``), and the actor
    awaits its completion. Two uses: ``nn.Graph.run(..., fused=True)``'s whole step
    (captured and replayed as ``step()`` is; its state and captured tensors handed in by
    ``attach`` before each run), and one op of ``nn.Graph.run()``'s actor per op, or one
    state's write-back (``state``: the list the graph shares, states then captured
    tensors, filled before each run; launched, not captured). ``writes_state``: it
    writes state back (one act at a time)."""

    tmp_specs: list = []

    def __init__(
        self, device_program, in_spec=None, cuda_graph: bool = True, state: list | None = None
    ):
        self.device_program = dp = device_program
        self.in_bytes = in_spec.nbytes if in_spec is not None else 0
        self.out_spec = dp.program.out_spec
        self.name = dp.program.name
        self.cuda_graph = cuda_graph
        self.state: Sequence = state if state is not None else ()
        self.captured: Sequence = ()
        self.writes_state = bool(dp.writes)

    @property
    def device(self):
        return self.device_program.device

    @property
    def workspace_bytes(self) -> int:
        """The device memory the program keeps besides its registers: its intermediates,
        and with a CUDA graph its static input and output buffers (counted by the plan
        against the device's budget; the device's allocator gives them at the first act)."""
        p = self.device_program.program
        n = sum(s.nbytes for s in p.tmp_specs)
        if self.cuda_graph:
            n += self.in_bytes + p.out_spec.nbytes
        return n

    def attach(self, state: list, captured: list, cuda_graph: bool) -> None:
        """The state's and the captured tensors the next acts read and write."""
        self.state, self.captured, self.cuda_graph = list(state), list(captured), cuda_graph

    def bind(self, budget, name: str) -> None:
        pass

    def unbind(self) -> None:
        pass

    def describe(self) -> str:
        return f"{self.name} on {self.device}"

    def submit(self, outs: list, ins: list) -> None:
        """One act: issues the program on ``ins`` (per input register, its tensors) into
        ``outs`` (the output register's). A kernel's fault poisons ``outs`` (the state
        keeps its values, as ``DeviceProgram``'s module doc says): the act's wait for them
        raises it."""
        dp = self.device_program
        if len(ins) > 1 and len(dp.offsets) != len(ins):
            at = [0]
            for i in ins[:-1]:
                at.append(at[-1] + len(i))
            dp.offsets = tuple(at)
        ins = [t for i in ins for t in i]
        self.device_program.submit(
            [t._impl for t in ins],
            [t._impl for t in self.state],
            [t._impl for t in self.captured],
            self.cuda_graph,
            [t._impl for t in outs],
        )
