"""Compiling a host Program (``nn.Graph``'s step): a pass over its recorded steps that gives
the same results bit for bit with fewer kernels, fewer passes over memory and no
workspace allocated after the first run (a kernel's own temporaries, as ``where``'s mask,
remain) (``compile_program``, ``Compiled``).

What the pass does, in order:

- **equal values merge**: an elementwise step computing what an earlier one computed
  (the same op on the same values with the same attributes: SGD's ``momentum != 0``,
  made once per parameter) is dropped; its readers read the earlier value;
- **constants fold**: a step reading only constants (or values folded before it) runs once,
  here; its outputs are constants from then on;
- **copies drop**: a ``copy`` (or a ``cast`` to the same dtype) of a contiguous value,
  whose every reader reads it whole, is dropped; its readers read the value copied;
- **outputs written direct**: a ``copy`` (or same-dtype ``cast``) of a whole value into
  a whole output, where one kernel makes that value and nothing else reads it, is
  dropped and that kernel writes the output itself (autograd copies a weight's first
  gradient so that ``.grad`` owns its storage: a pipeline stage's first micro-batch then
  copied its 6 MB weight gradient into the act's output once more); only where no
  kernel after that one reads an input (an output's array may be an input's);
- **selects**: a ``where`` whose condition is a single element (an optimizer's
  ``momentum != 0``, broadcast over a parameter) and whose two values have the output's
  shape and dtype picks one of them per run, reading nothing else: its readers read the
  picked array itself (the bits ``where`` would have copied), unless that array is a
  state another state is written from (then it is copied, as ``where`` would);
- **dead values drop**: a step whose outputs nobody reads (no later step, no output, no
  state written back) is dropped, backwards, so a chain feeding only it goes too;
- **buffers are planned**: every value left gets a workspace buffer, reused by a later value
  of the same shape and dtype once its last reader ran (the program's own workspace
  arrays: ``Program.tmp``, allocated once; the pass allocates nothing per run, and keeps
  none of a run's inputs and outputs past it); an
  elementwise ufunc writes over an input it reads for the last time (``INPLACE``);
- **states are written in place**: a state's new value made by one of the step's last
  kernels (from the first of them on, none raises: ``_SAFE``), when no later kernel reads
  the state's old value, is written into the state itself instead of a buffer copied
  into it after the last kernel (an optimizer's update of a parameter);
- **elementwise chains fuse**: consecutive elementwise steps (forward, backward and the
  optimizer's updates) run as one kernel of the compiled program, a chain of numpy
  ufuncs called in turn, each writing into its planned buffer (``out=``, over its input
  where it may), so that the chain's intermediates are buffers that were hot in cache a
  moment before; every other step is one kernel, its output written into its planned
  buffer (matmuls included: ``np.matmul(..., out=)``).

The kernels stay numpy's, chosen by measurement (2 cores, shared; float32, the MLP step's
SGD-with-momentum update of one 784x256 weight, 200 runs, best): numpy ``out=`` chain of
the recorded ops 680-720 us; numexpr 2.14 ``evaluate`` of the same two expressions 620 us
with 1 thread, 680 us with 2 (numexpr's add of two arrays 109 us against numpy's 71 us:
its block interpreter is slower than numpy's SIMD loops at these sizes); numba 0.68 one
fused loop 150 us (exact), but 0.3 s to import and 1.4 s to compile its first kernel,
every new program paying its own compile (a test suite building hundreds of small
graphs would pay minutes). The selects above take the update's two ``where`` passes out
(each four bitwise passes), which is most of what a fused loop gains there, with numpy's
kernels and so results equal bit for bit to the recorded program's by construction: the
same float32 operations in the same order, no fused multiply-add, no wider intermediates.
Measured with the pass (1 BLAS thread, one process, interleaved with the step run op by
op): the MLP 784-256-10 step 0.66x the time, bench_models' CNN 0.90x, its transformer
0.80x. The pass itself takes about 1 ms per 100 recorded ops, once per compiled step.

A kernel that raises makes the step run again op by op (``Program``'s own interpreter,
nothing written back) so that the error names the op and its place as without the pass.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..tensor.meta import is_contiguous, strided

_WHERE, _COPY, _CAST = "where", "copy", "cast"

# Ops whose cpu kernel is one numpy ufunc call (or copy) over same-shape operands: they may
# write over an input (numpy reads each element before writing it), and they raise
# nothing on floats (so a step may write state in place once only they are left).
_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum")
INPLACE = frozenset(
    _ARITH
    + tuple(f"{n}_scalar" for n in _ARITH)
    + tuple(f"r{n}_scalar" for n in _ARITH)
    + ("neg", "abs", "sqrt", "exp", "log", "tanh", "relu", "copy", "cast")
)
_CMP = ("eq", "ne", "lt", "le", "gt", "ge")
_SAFE = INPLACE | frozenset(
    _CMP + tuple(f"{n}_scalar" for n in _CMP) + (_WHERE, "pow", "pow_scalar", "rpow_scalar")
)

# Set to False to run every Program op by op as recorded (what a program compiled without
# this pass does); tests compare the two.
ENABLED = True


class Instr:
    """One step as the compiled program runs it: ``kernel(outs, args, attrs)`` with
    ``outs`` and ``args`` lists holding the arrays known when bound, ``dyn`` the positions
    ``(is_out, position, ref)`` resolved per run; ``select``: a picked value (``value``:
    its tmp index; ``copy``: copy the picked array into its own buffer)."""

    __slots__ = ("index", "step", "outs", "args", "dyn", "select", "copy", "value")

    def __init__(self, index, step):
        self.index, self.step = index, step
        self.outs = self.args = self.dyn = None
        self.select = False
        self.copy = False
        self.value = None


class Compiled:
    """The compiled form of ``program`` (see the module doc). ``kernels``: the kernels one
    run calls (a fused chain counts one); ``folded_steps``, ``dropped``, ``copies_dropped``,
    ``merged``, ``outputs_direct`` (outputs their maker writes), ``in_place`` (values
    written over an input), ``state_of`` (values written into their state): what the pass
    did; an instruction's ``select``: a pick; ``buffers``:
    the workspace arrays the plan uses (of ``len(program.tmp_specs)``)."""

    def __init__(self, program):
        self.program = program
        steps = list(program.steps)  # (a step writing an output itself: a copy of it here)
        specs = program.tmp_specs
        self.folded: dict = {}  # tmp index -> its array (a constant)
        alias: dict = {}  # tmp index -> the ref it reads instead
        keep = [True] * len(steps)
        self.copies_dropped = 0
        self.folded_steps = 0

        same: dict = {}  # tmp index -> the equal value computed before
        seen: dict = {}  # (op, inputs, attrs) -> the step's outputs
        self.merged = 0

        def rename(ref):
            while ref[0] == "tmp":
                if ref[1] in same:  # (same spec: read through the same view)
                    ref = ("tmp", same[ref[1]], 0, ref[3])
                elif ref[1] in alias and ref[3] is None:  # (whole reads only: below)
                    ref = alias[ref[1]]
                else:
                    break
            return ref

        readers = _readers(program)
        ins_of = []
        for n, st in enumerate(steps):
            ins = [rename(r) for r in st.ins]
            ins_of.append(ins)
            key = _key(st, ins)
            if key is not None:
                if key in seen:  # computed already, from the same values
                    for o, o0 in zip(st.outs, seen[key], strict=True):
                        same[o[1]] = o0[1]
                    keep[n] = False
                    self.merged += 1
                    continue
                seen[key] = st.outs
            if self._fold(st, ins, specs):
                keep[n] = False
                self.folded_steps += 1
                continue
            src = self._copy_source(st, ins, specs)
            if src is not None and all(m is None for m in readers.get(st.outs[0][1], ())):
                alias[st.outs[0][1]] = src
                keep[n] = False
                self.copies_dropped += 1
        self.assigns = [(i, rename(r)) for i, r in program.assigns]
        self.copies = [(j, rename(r)) for j, r in program.copies]
        for n in range(len(steps)):
            ins_of[n] = [rename(r) for r in ins_of[n]]

        # dead values: backwards from what the program writes out or back
        live = {r[1] for _, r in self.assigns + self.copies if r[0] == "tmp"}
        self.dropped = 0
        for n in range(len(steps) - 1, -1, -1):
            if not keep[n]:
                continue
            st = steps[n]
            if all(o[0] == "tmp" and o[1] not in live for o in st.outs):
                keep[n] = False
                self.dropped += 1
                continue
            live.update(r[1] for r in ins_of[n] if r[0] == "tmp")

        self.outputs_direct = self._outputs_direct(steps, keep, ins_of, specs)
        self.instrs = [Instr(n, steps[n]) for n in range(len(steps)) if keep[n]]
        self.ins_of = {ins.index: ins_of[ins.index] for ins in self.instrs}
        self._selects(specs)
        self.buffer_of = self._plan(specs)
        self.state_of = self._states_in_place(specs)
        self.buffers = len(set(self.buffer_of.values()))
        self.groups = self._groups()
        self.kernels = len(self.groups)
        self._bound = None
        self._slots: list = []  # (the kernels' argument lists a run fills: _bind's)

    # -- the pass --------------------------------------------------------------------------
    def _outputs_direct(self, steps, keep, ins_of, specs) -> int:
        """Drops each ``copy`` (or same-dtype ``cast``) of a whole workspace value into a
        whole output where one kernel makes that value and nothing else reads it: that
        kernel writes the output itself (``steps[k]`` replaced by a step writing there;
        the program's own steps are left as recorded, for the op-by-op run). Only where no
        kernel after it reads an input (an output array may be an input's: a gradient
        written over the one so far). Autograd copies a weight's first gradient so
        (``.grad`` owns its storage): a pipeline stage's first micro-batch copied its 6 MB
        weight gradient once more, 0.26 ms an act. Returns how many it dropped."""
        kept = [n for n in range(len(steps)) if keep[n]]
        made: dict = {}  # tmp index -> the kept step making it
        writes: Counter = Counter()  # tmp index -> how many writes of it (one, whole: taken)
        reads: Counter = Counter()  # tmp index -> how many kept steps read it
        for n in kept:
            for o in steps[n].outs:
                if o[0] == "tmp":
                    made[o[1]] = n
                    writes[o[1]] += 1 if o[3] is None else 2
            reads.update(r[1] for r in ins_of[n] if r[0] == "tmp")
        ends = {r[1] for _, r in self.assigns + self.copies if r[0] == "tmp"}
        copied = {j for j, _ in self.copies}
        last_in = max((n for n in kept if any(r[0] == "in" for r in ins_of[n])), default=-1)
        outs = self.program.out_spec.specs
        dropped = 0
        for n in kept:
            st = steps[n]
            if st.op.name not in (_COPY, _CAST) or len(st.outs) != 1 or len(ins_of[n]) != 1:
                continue
            o, src = st.outs[0], ins_of[n][0]
            if o[0] != "out" or o[3] is not None or o[1] in copied:
                continue
            if src[0] != "tmp" or src[3] is not None or src[1] in self.folded:
                continue
            t = src[1]
            k = made.get(t)
            if k is None or writes[t] != 1 or reads[t] != 1 or t in ends or last_in > k:
                continue
            if steps[k].op.dynamic:
                continue
            spec = outs[o[1]]
            if (tuple(spec.shape), spec.dtype.np) != (tuple(specs[t].shape), specs[t].dtype.np):
                continue
            p = steps[k]
            written = [o if x[0] == "tmp" and x[1] == t else x for x in p.outs]
            steps[k] = type(p)(p.op, p.kernel, p.ins, p.attrs, type(p.outs)(written))
            keep[n] = False
            dropped += 1
        return dropped

    def _fold(self, st, ins, specs) -> bool:
        """Runs ``st`` now when it reads only constants and writes workspace values; keeps
        its outputs in ``folded``. A kernel that raises is left to raise at run time."""
        if not ins or any(
            r[0] != "const" and not (r[0] == "tmp" and r[1] in self.folded) for r in ins
        ):
            return False
        if any(o[0] != "tmp" for o in st.outs) or st.op.dynamic:
            return False
        consts = self.program.consts
        args = [strided(consts[r[1]] if r[0] == "const" else self.folded[r[1]], r[3]) for r in ins]
        outs = [np.empty(specs[o[1]].shape, specs[o[1]].dtype.np) for o in st.outs]
        try:
            st.kernel(outs, args, st.attrs)
        except Exception:  # noqa: BLE001 - raised again, as the op's error, when it runs
            return False
        for o, a in zip(st.outs, outs, strict=True):
            self.folded[o[1]] = a
        return True

    def _copy_source(self, st, ins, specs):
        """The ref a copy step ``st`` reads, when dropping it changes nothing: a copy (or
        same-dtype cast) of a contiguous whole value into a workspace value."""
        name = st.op.name
        if name not in (_COPY, _CAST) or st.outs[0][0] != "tmp" or len(ins) != 1:
            return None
        spec = specs[st.outs[0][1]]
        src = ins[0]
        if src[0] in ("in", "out") or src[0] == "tmp" and src[1] in self.folded:
            return None  # (an input's layout is the caller's)
        shape, dtype = self._shape_dtype(src)
        if shape != spec.shape or dtype != spec.dtype.np:
            return None
        m = src[3]
        if m is not None and not is_contiguous(m.shape, m.strides):
            return None
        if src[0] == "state" and any(
            r[1] == st.outs[0][1] and r[0] == "tmp" for _, r in self.program.assigns
        ):
            return None  # (a state written from another's array)
        return src

    def _shape_dtype(self, ref):
        """The shape and numpy dtype of what ``ref`` reads (None, None: not known here)."""
        kind, i, _, m = ref
        if m is not None:
            return tuple(m.shape), m.dtype.np
        p = self.program
        if kind == "tmp":
            s = p.tmp_specs[i]
        elif kind == "state" and i < len(p.state_specs):
            s = p.state_specs[i]
        elif kind == "out":
            s = p.out_spec.specs[i]
        elif kind == "const":
            c = np.asarray(p.consts[i])
            return c.shape, c.dtype
        else:
            return None, None
        return tuple(s.shape), s.dtype.np

    def _selects(self, specs) -> None:
        """Marks the ``where`` steps that pick a whole value (see the module doc)."""
        origins: dict = {}  # select's tmp index -> states it may pick
        for ins in self.instrs:
            st = ins.step
            args = self.ins_of[ins.index]
            if st.op.name != _WHERE or len(args) != 3 or st.outs[0][0] != "tmp":
                continue
            out = specs[st.outs[0][1]]
            cshape, _ = self._shape_dtype(args[0])
            if cshape is None or int(np.prod(cshape)) != 1:
                continue
            if not all(
                r[3] is None
                and r[0] in ("tmp", "state", "const")
                and self._shape_dtype(r) == (tuple(out.shape), out.dtype.np)
                for r in args[1:]
            ):
                continue
            ins.select, ins.value = True, st.outs[0][1]
            o = set()
            for r in args[1:]:
                if r[0] == "state":
                    o.add(r[1])
                elif r[0] == "tmp":
                    o |= origins.get(r[1], set())
            origins[ins.value] = o
        self.origins = origins
        for i, r in self.assigns:  # a state written from another's array: copied
            if r[0] == "tmp" and origins.get(r[1], set()) - {i}:
                for ins in self.instrs:
                    if ins.value == r[1]:
                        ins.copy = True

    def _plan(self, specs) -> dict:
        """Workspace value -> the index of the ``Program.tmp`` array it is written into:
        values of one shape and dtype share an array when their lifetimes do not meet,
        and an elementwise ufunc writes over an input read for the last time (``INPLACE``:
        an out= chain, the chain's intermediates in one hot buffer)."""
        last: dict = {}
        end = len(self.instrs)
        for k, ins in enumerate(self.instrs):
            for r in self.ins_of[ins.index]:
                if r[0] == "tmp":
                    last[r[1]] = k
        for _, r in self.assigns + self.copies:
            if r[0] == "tmp":
                last[r[1]] = end
        for ins in reversed(self.instrs):  # a pick keeps what it may pick alive
            if ins.select:
                for r in self.ins_of[ins.index][1:]:
                    if r[0] == "tmp":
                        last[r[1]] = max(last.get(r[1], 0), last.get(ins.value, 0))
        self.last = last
        picked = {ins.value for ins in self.instrs if ins.select}
        busy: dict = {}  # array index -> [key, last reader's instr]
        of_key: dict = {}  # key -> the array indices of that key
        buffer_of: dict = {}
        self.in_place = 0
        for k, ins in enumerate(self.instrs):
            for o in ins.step.outs:
                if o[0] != "tmp":
                    continue
                t = o[1]
                key = (tuple(specs[t].shape), specs[t].dtype.np)
                b = None
                if not ins.select and ins.step.op.name in INPLACE:
                    for r in self.ins_of[ins.index]:
                        if (
                            r[0] == "tmp"
                            and r[3] is None
                            and r[1] in buffer_of
                            and r[1] not in picked
                            and last.get(r[1]) == k
                            and busy[buffer_of[r[1]]] == [key, k]
                        ):
                            b = buffer_of[r[1]]
                            self.in_place += 1
                            break
                if b is None:
                    b = next((a for a in of_key.get(key, ()) if busy[a][1] < k), None)
                if b is None:
                    b = t
                    of_key.setdefault(key, []).append(b)
                busy[b] = [key, max(last.get(t, k), k)]
                buffer_of[t] = b
        return buffer_of

    def _states_in_place(self, specs) -> dict:
        """Workspace value -> the state it is written into directly, instead of a buffer
        copied into the state after the last step: a state's new value made by one of the
        last steps (``_SAFE``: from the first of them on, no kernel raises, so a step that
        fails still writes no state), read by no later step as the state's old value."""
        instrs, n = self.instrs, len(self.instrs)
        tail = n
        for k in range(n - 1, -1, -1):
            st = instrs[k].step
            if not (
                instrs[k].select
                or st.op.name in _SAFE
                and all(o[0] != "tmp" or specs[o[1]].dtype.np.kind in "fb" for o in st.outs)
            ):
                break
            tail = k
        producer = {o[1]: k for k, ins in enumerate(instrs) for o in ins.step.outs if o[0] == "tmp"}
        sources = Counter(r[1] for _, r in self.assigns if r[0] == "tmp")
        last_read: dict = {}  # state -> the last instr reading its old value
        for k, ins in enumerate(instrs):
            for a in self.ins_of[ins.index]:
                if a[0] == "state":
                    last_read[a[1]] = k
                elif a[0] == "tmp":
                    for i in self.origins.get(a[1], ()):
                        last_read[i] = k
        read_after: dict[int, set] = {}  # state -> values written back or out that may
        for _, a in self.assigns + self.copies:  # be its old array (picks of it)
            if a[0] == "tmp":
                for i in self.origins.get(a[1], ()):
                    read_after.setdefault(i, set()).add(a[1])
        p = self.program
        state_of: dict = {}
        for i, r in self.assigns:
            t = r[1]
            made = producer.get(t)
            if (
                r[0] != "tmp"
                or r[3] is not None
                or sources[t] != 1
                or made is None
                or made < tail
                or instrs[made].select
                or i >= len(p.state_specs)
            ):
                continue
            s = p.state_specs[i]
            if (tuple(s.shape), s.dtype.np) != (tuple(specs[t].shape), specs[t].dtype.np):
                continue
            if last_read.get(i, -1) > made or read_after.get(i, set()) - {t}:
                continue  # (the kernel at made may read it: elementwise)
            state_of[t] = i
        return state_of

    def _groups(self) -> list:
        """The instructions as kernels: a run of consecutive elementwise ones is one."""
        groups: list = []
        chain = False
        for ins in self.instrs:
            ew = ins.select or ins.step.op.elementwise or ins.step.op.name == _WHERE
            if ew and chain:
                groups[-1].append(ins)
            else:
                groups.append([ins])
            chain = ew
        return groups

    # -- running ---------------------------------------------------------------------------
    def _bind(self) -> None:
        """Fills every instruction's argument lists with the arrays known once the
        workspace and constants are (resolved again when they are allocated anew)."""
        p = self.program
        tmp, consts = p.tmp, p.const_arrays
        picked = {ins.value for ins in self.instrs if ins.select}

        def static(ref):
            kind, i, _, m = ref
            if kind == "tmp":
                if i in self.folded:
                    return strided(self.folded[i], m)
                if i in picked or i in self.state_of:
                    return None
                return strided(tmp[self.buffer_of[i]], m)
            if kind == "const":
                return strided(consts[i], m)
            return None

        slots = []  # (list, position): where a run puts an array only it knows
        for ins in self.instrs:
            st, dyn = ins.step, []
            outs: list = []
            for k, o in enumerate(st.outs):
                a = static(o) if o[0] == "tmp" else None
                if a is None:
                    dyn.append((True, k, o))
                    slots.append((outs, k))
                outs.append(a)
            args: list = []
            for k, r in enumerate(self.ins_of[ins.index]):
                a = static(r)
                if a is None:
                    dyn.append((False, k, r))
                    slots.append((args, k))
                args.append(a)
            ins.outs, ins.args, ins.dyn = outs, args, dyn
        self._slots = slots
        self._bound = (tmp, consts)

    def run(self, outs: list, ins: list, write_back: bool = True) -> None:
        """One run (as ``Program.run``'s, the program bound); on a kernel's error the
        program runs again op by op to raise the error it raises (nothing written back)."""
        p = self.program
        state_of = self.state_of
        if state_of and not write_back:  # (its last steps would write the state)
            p.run_steps(outs, ins, write_back)
            return
        if (
            self._bound is None
            or self._bound[0] is not p.tmp
            or self._bound[1] is not p.const_arrays
        ):
            self._bind()
        picks: dict = {}
        state = p.state_arrays
        tmp = p.tmp
        buffer_of = self.buffer_of

        def get(ref):
            kind, i, j, m = ref
            if kind == "in":
                base = ins[i][j]
            elif kind == "state":
                base = state[i]
            elif kind == "out":
                base = outs[i]
            elif kind == "tmp":
                base = (
                    picks[i]
                    if i in picks
                    else state[state_of[i]]
                    if i in state_of
                    else tmp[buffer_of[i]]
                    if i in buffer_of
                    else self.folded[i]
                )
            else:
                base = p.const_arrays[i]
            return strided(base, m)

        ins_ = None
        try:
            for group in self.groups:
                for ins_ in group:
                    args, o = ins_.args, ins_.outs
                    for is_out, k, r in ins_.dyn:
                        if is_out:
                            o[k] = get(r)
                        else:
                            args[k] = get(r)
                    if ins_.select:
                        a = args[1] if args[0] else args[2]
                        if ins_.copy or not a.flags.c_contiguous:
                            a = tmp[buffer_of[ins_.value]]
                            np.copyto(a, args[1] if args[0] else args[2])
                        picks[ins_.value] = a
                    else:
                        ins_.step.kernel(o, args, ins_.step.attrs)
        except Exception as e:  # noqa: BLE001 - the op-by-op run raises the op's error
            self._let_go()
            p.run_steps(outs, ins, write_back=False)
            assert ins_ is not None  # (set first in the loop: nothing raises before it)
            raise p.kernel_error(ins_.index, e) from e
        self._let_go()
        for j, ref in self.copies:
            np.copyto(outs[j], get(ref))
        if write_back:
            for i, ref in self.assigns:
                src = get(ref)
                if src is not state[i]:
                    np.copyto(state[i], src, casting="no")

    def _let_go(self) -> None:
        """The arrays a run gave its kernels (its inputs, outputs, state: set per run) let
        go, so the program holds none of them between runs."""
        for arrays, k in self._slots:
            arrays[k] = None


def _key(st, ins):
    """What makes step ``st`` (reading ``ins``) compute the same value as another: its op,
    inputs and attributes (typed: 1 and 1.0 differ); None for a step not merged (one
    that may raise, or writes an output, or is not a pure elementwise kernel)."""
    if st.op.name not in _SAFE or any(o[0] != "tmp" for o in st.outs):
        return None
    try:
        key = (st.op.name, tuple(ins), tuple(sorted((k, type(v), v) for k, v in st.attrs.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _readers(program) -> dict:
    """Workspace value -> the view metas its readers read it through (None: whole)."""
    readers: dict = {}
    for st in program.steps:
        for r in st.ins:
            if r[0] == "tmp":
                readers.setdefault(r[1], []).append(r[3])
    for _, r in list(program.assigns) + list(program.copies):
        if r[0] == "tmp":
            readers.setdefault(r[1], []).append(r[3])
    return readers


def compile_program(program):
    """The ``Compiled`` form of a host ``program`` (None when the pass is off, or the
    program runs on a device: its steps are issued there as recorded)."""
    if not ENABLED or not program.steps:
        return None
    dev = program.device
    if dev is not None and dev.type != "cpu":
        return None
    return Compiled(program)
