"""Program: a recorded sequence of built-in op kernels that an op actor runs per piece.

A step reads values by reference and writes its outputs into the actor's output register
(``out``) or a workspace array planned with the graph (``tmp``). A reference is
``(kind, index, leaf, meta)``:

- ``("in", k, j, meta)``: array ``j`` of the register on input ``k``;
- ``("tmp", t, 0, meta)`` and ``("out", j, 0, meta)``: arrays the program writes;
- ``("const", c, 0, meta)``: a tensor captured by the traced function (copied once);
- ``("state", s, 0, meta)``: state held across pieces (``nn.Graph``'s parameters and
  optimizer state), read by the steps and written back by ``assigns`` after them.

``meta`` is None when the whole array is read as it is, else a ``TensorMeta`` whose shape,
strides and offset (in elements) make the view the op reads (``x.T``, ``x[1:]``...).
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelError, format_bytes
from ..runtime.plan.spec import PieceSpec, Spec
from ..tensor.meta import strided
from ..vm.opcall import kernel_error


class Step:
    __slots__ = ("op", "kernel", "ins", "attrs", "outs")

    def __init__(self, op, kernel, ins, attrs, outs):
        self.op, self.kernel, self.ins, self.attrs, self.outs = op, kernel, ins, attrs, outs


class Program:
    """Steps over refs; ``out_spec`` the register it fills; ``tmp_specs`` its workspace;
    ``consts`` the captured arrays; ``copies`` outputs that are inputs or views (copied)."""

    def __init__(
        self, steps: list, out_spec: PieceSpec, tmp_specs: list, consts: list, copies: list
    ):
        self.steps = steps
        self.out_spec = out_spec
        self.tmp_specs = tmp_specs
        self.consts = consts
        self.copies = copies  # [(out leaf j, ref)]
        self.null = bool(out_spec.specs) and out_spec.specs[0].device.type == "null"
        self.tmp: list = [None] * len(tmp_specs)
        self.const_arrays: list = list(consts)
        self.bound = False
        self.state_specs: list = []  # state held across pieces (nn.Graph): read by
        self.state_arrays: list = []  # refs ("state", i), written back by assigns
        self.assigns: list = []  # [(state i, ref of its new value)]
        self.captured: list = []  # tensors read live: the last states (nn.Graph)
        self.compiled = None  # its compiled form, when compiled (compile.py)

    @property
    def device(self):
        """Where the program's memory is: its output's device, else its state's."""
        for s in list(self.out_spec.specs) + list(self.tmp_specs) + list(self.state_specs):
            return s.device
        return None

    @property
    def workspace_bytes(self) -> int:
        """Workspace, constants and state (state is the caller's memory, not allocated by
        ``bind``, but the plan counts it)."""
        return (
            sum(s.nbytes for s in self.tmp_specs)
            + sum(getattr(c, "nbytes", 0) for c in self.consts)
            + sum(s.nbytes for s in self.state_specs)
        )

    def bind(self, budget, name: str) -> None:
        """Allocates the workspace (and a copy of each constant) under the graph's budget."""
        if self.tmp_specs:
            arrays, _ = budget.allocate(
                PieceSpec(None, self.tmp_specs), f"workspace of {name!r}", key=(name, "workspace")
            )
            self.tmp = arrays
        if self.consts:
            specs = [
                Spec(c.shape, c.dtype, self.out_spec.specs[0].device if self.null else "cpu")
                for c in self.consts
            ]
            arrays, _ = budget.allocate(
                PieceSpec(None, specs), f"constants of {name!r}", key=(name, "constants")
            )
            for dst, src in zip(arrays, self.consts, strict=True):
                if dst is not None:
                    np.copyto(dst, src)
            self.const_arrays = arrays
        self.bound = True

    def unbind(self) -> None:
        self.tmp = [None] * len(self.tmp_specs)
        self.const_arrays = list(self.consts)
        self.bound = False

    def run_new(self, ins: list, write_back: bool = True) -> list:
        """One act into new output arrays, which it returns (None for a leaf on a device
        without data): what an op actor computes piece 0 with while planning, what a Ray
        process runs per piece, what a replay runs. Raises as ``run``."""
        outs = [
            None if s.device.type == "null" else np.empty(s.shape, s.dtype.np)
            for s in self.out_spec.specs
        ]
        self.run(outs, ins, write_back)
        return outs

    def _get(self, ref, outs, ins):
        kind, i, j, meta = ref
        if kind == "in":
            base = ins[i][j]
        elif kind == "tmp":
            base = self.tmp[i] if self.bound else None
        elif kind == "out":
            base = outs[i]
        elif kind == "state":
            base = self.state_arrays[i]
        else:
            base = self.const_arrays[i]
        return strided(base, meta)

    def run(self, outs: list, ins: list, write_back: bool = True) -> None:
        """One act: ``outs`` the output register's arrays, ``ins`` per input its arrays.
        The state is written back after every step has run (``write_back=False``: not at
        all), so a step that fails leaves the state as it was.

        Raises:
            KernelError: a kernel raised; it names the op and holds the kernel's error
                (``original``, also ``__cause__``)."""
        if self.null:
            return  # no data: only the simulated time counts
        if not self.bound and self.tmp_specs:
            self.tmp = [np.empty(s.shape, s.dtype.np) for s in self.tmp_specs]  # (probe)
            self.bound = True
            try:
                self._run(outs, ins, write_back)
            finally:
                self.unbind()
            return
        self._run(outs, ins, write_back)

    def may_write_over(self, out: int, pos: int) -> bool:
        """Whether a run may be given, as its output ``out``, the array of its input ``pos``
        (a gradient written over the one so far it adds into): one kernel writes that output
        whole, and every kernel reading that input runs before it or is it, an elementwise
        one reading it whole (a ufunc may write over what it reads at the same place); no
        output is copied, nor state written back, from that input at the end. Checked on
        the kernels as they run (compiled: a dropped copy's readers read its source)."""
        c = self.compiled
        if c is not None:
            steps = [(ins.step, c.ins_of[ins.index], ins.select) for ins in c.instrs]
            copies, assigns = c.copies, c.assigns
        else:
            steps = [(st, st.ins, False) for st in self.steps]
            copies, assigns = self.copies, self.assigns
        if any(j == out or (r[0], r[2]) == ("in", pos) for j, r in copies):
            return False
        if any((r[0], r[2]) == ("in", pos) for _, r in assigns):  # (read after the steps)
            return False
        writes = [[o for o in st.outs if o[0] == "out" and o[1] == out] for st, _, _ in steps]
        writers = [n for n, w in enumerate(writes) if w]
        if len(writers) != 1 or any(o[3] is not None for o in writes[writers[0]]):
            return False
        w = writers[0]
        for n, (st, ins, select) in enumerate(steps):
            reads = [r for r in ins if r[0] == "in" and r[2] == pos]
            if not reads:
                continue
            if n > w or select:
                return False
            if n == w and not (st.op.elementwise and all(r[3] is None for r in reads)):
                return False
        return True

    def compile(self) -> None:
        """Runs the steps through the compiler pass (``tracing.compile``) from now on, on
        the host: same results bit for bit, fewer kernels."""
        from .compile import compile_program

        self.compiled = compile_program(self)

    def _run(self, outs, ins, write_back: bool = True) -> None:
        if self.compiled is not None:
            self.compiled.run(outs, ins, write_back)
        else:
            self.run_steps(outs, ins, write_back)

    def run_steps(self, outs, ins, write_back: bool = True) -> None:
        """``run``'s work, op by op as recorded (the program bound)."""
        get = self._get
        st = None
        try:
            for st in self.steps:
                args = []
                for r in st.ins:
                    if r[0] == "in" and r[3] is None:  # the common case: a whole input
                        args.append(ins[r[1]][r[2]])
                    else:
                        args.append(get(r, outs, ins))
                st.kernel([get(r, outs, ins) for r in st.outs], args, st.attrs)
        except Exception as e:  # noqa: BLE001 - raised again as the op's KernelError
            raise self.kernel_error(self.steps.index(st), e) from e
        for j, ref in self.copies:
            np.copyto(outs[j], get(ref, outs, ins))
        if write_back:
            for i, ref in self.assigns:  # state written back once every step has read
                np.copyto(self.state_arrays[i], get(ref, outs, ins), casting="no")

    def kernel_error(self, k: int, e: Exception) -> KernelError:
        """The error to raise when step ``k``'s kernel raised ``e``: the op's KernelError
        (``vm.opcall.kernel_error``, as eager mode's), with where it is in the program and
        that the program's state was not written back."""
        dev = self.device
        where = []
        if len(self.steps) > 1:
            where.append(f"op {k + 1} of the {len(self.steps)} this program runs")
        if self.assigns:
            where.append("nothing was written back to its state")
        err = kernel_error(
            self.steps[k].op.name,
            dev if dev is not None else "cpu",
            e,
            note="; ".join(where) or "no later op of its program ran",
        )
        if err is not e:  # (one the kernel raised itself stays as it is)
            err.step = k
        return err

    @property
    def name(self) -> str:
        """Its ops' names (``add+mul``; the first and a count past three), "copy" when it
        runs none."""
        names = [s.op.name for s in self.steps] or ["copy"]
        return "+".join(names) if len(names) <= 3 else f"{names[0]}+...({len(names)} ops)"

    def describe(self) -> str:
        ws = self.workspace_bytes
        return self.name + (f" ws {format_bytes(ws)}" if ws else "")
