"""Step programs: a training step over global tensors on process ranks, issued once as eager
global calls and from then on replayed by the workers from one command each.

A step of ``nn.Graph`` over global parameters runs ``build`` as eager global calls: every op
is decided here (its SBP signature, its boxing) and sent to every rank as a command. That
costs this process tens of microseconds per op and rank, every step, on the cores the ranks
compute on. But a step issues the same commands every time: the same ops on the same
parameters and optimizer state, new parts for what it makes. So the ranks' commands of a
step are recorded (``Recording``: the ids of the parts the step makes numbered from its
start, its inputs named by position, its collectives counted from its first), and once two
steps in a row recorded the same commands, each rank keeps them as a program (``DEFINE``)
and every later step is one ``REPLAY`` per rank: the inputs' parts, a block of fresh ids for
what the step makes and the collectives' first sequence number. A worker runs the commands
as it would have run them sent one by one (the same kernels, so the same bits as the eager
step, and as inline ranks), dropping each part the step made after its last use there; the
step's outputs are new global tensors over the parts the replay made.

What makes a step's commands the same every time is checked, not assumed: the two steps'
records must be equal, and a step is recorded only under the same key (``StepReplay.key``:
the inputs' shapes, dtypes and layouts, the ids of the parameters', buffers' and optimizer
state's parts, the optimizers' settings, the modules' modes). A step whose record cannot be
replayed says why (``StepReplay.why``) and runs eagerly: one that reads a value on this
process (a ``GET``/``META``: ``.item()`` in ``build``, an output whose shape depends on
values), puts a tensor from this process (a local tensor made global inside ``build``),
reads a global tensor other than its inputs, parameters, buffers and optimizer state (the
value of such a tensor could change between steps), or keeps a part it made other than
its outputs. Steps whose commands change every time (an optimizer whose step count is a
number folded into its update, as Adam's bias correction) never record two equal steps: after
``MISSES`` unequal records under one key, they are no longer recorded.

Only ``ProcessRanks`` replays (``HeldRanks.replays``); inline ranks compute in this process
anyway, and Ray ranks run each step's commands as sent.
"""

from __future__ import annotations

import gc
import itertools
import pickle
import threading
import weakref
from typing import Any

from ..sbp import Layout
from ..tensor.meta import contiguous_strides
from ..tensor.tensor import Tensor, wrap
from ..vm.release import collect
from ..vm.scheduler import get_vm
from . import workers as W
from .interpreter import make, parts_of, sbp_of
from .ranks import HeldRanks, Part

MISSES = 2  # unequal records in a row under one key before a step is no longer recorded
_PROGRAMS = itertools.count(1)  # step program ids (one space for every ranks)


class Recording:
    """The commands ``ranks`` issued during one step, per rank (see the module doc).
    ``inputs``: the ids of the step's input parts, in order; ``state``: the ids of parts
    made before the step that it may read or write (parameters, buffers, optimizer
    state)."""

    def __init__(self, ranks: HeldRanks, inputs: list, state: set) -> None:
        self.ranks = ranks
        self.inputs: dict = {}
        for k, pid in enumerate(inputs):
            self.inputs.setdefault(pid, k)  # (an input given twice: its first place)
        self.n_in = len(inputs)
        self.state = state
        self.cmds: list = [[] for _ in range(ranks.size)]
        self.dropped: set = set()
        self.refused: str | None = None
        self.thread = threading.get_ident()
        if state & self.inputs.keys():
            self.refuse("a parameter, buffer or optimizer state is one of its inputs")
        self.start = next(ranks._ids)  # the step's parts have larger ids
        self.end = self.start
        self.seq0 = ranks._collectives

    # -- what the ranks tell it (under their lock) -----------------------------------------
    def issued(self, rank: int, cmd: tuple) -> None:
        kind = cmd[0]
        if threading.get_ident() != self.thread:
            self.refuse("another thread used the ranks during the step")
        if kind in (W.CALL, W.VIEW, W.SEND, W.RECV, W.COLLECT):
            self.cmds[rank].append(cmd)
        elif kind == W.PUT:
            self.refuse(
                "it puts a tensor from this process (a local tensor made global inside "
                "build: pass it as an input of the step instead)"
            )
        elif kind in (W.GET, W.META, W.PING):
            self.refuse(
                "it reads a value or a shape on this process (.item(), .numpy() or an op "
                "whose output's shape depends on values, inside build)"
            )
        elif kind != W.DROP:
            self.refuse(f"it issues a {W.NAMES[kind]} command")

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def finish(self) -> None:
        self.end = next(self.ranks._ids)
        self.n_coll = self.ranks._collectives - self.seq0

    # -- the record, normalized ------------------------------------------------------------
    def normal_id(self, i: int) -> int:
        """-1 - p for the step's input p, -1 - (inputs + k) for the k-th id the step made,
        the id itself for state; raises LookupError for any other part."""
        k = self.inputs.get(i)
        if k is not None:
            return -1 - k
        if self.start < i < self.end:
            return -1 - (self.n_in + i - self.start - 1)
        if i in self.state:
            return i
        raise LookupError(i)

    def normalized(self) -> list | None:
        """Per rank, the commands with normalized ids and sequence numbers; None (and
        ``refused`` saying why) when the step cannot be replayed."""
        if self.refused is not None:
            return None
        seq0 = self.seq0
        try:
            return [
                [W.map_ids(c, self.normal_id, lambda s: s - seq0) for c in cmds]
                for cmds in self.cmds
            ]
        except LookupError:
            self.refuse(
                "it reads a global tensor made outside the step that is not one of its "
                "inputs, parameters, buffers or optimizer state (pass it as an input)"
            )
            return None


class Program:
    """A recorded step defined on every rank (``DEFINE``): per rank its normalized commands
    and, after each, the parts the step made that are dropped there; the outputs' specs."""

    def __init__(self, rec: Recording, cmds: list, outputs: list) -> None:
        self.ranks = rec.ranks
        self.id = next(_PROGRAMS)
        self.n_in, self.n_made, self.n_coll = rec.n_in, rec.end - rec.start - 1, rec.n_coll
        self.outputs = outputs  # per output leaf: (shape, dtype, sbp, [(id, meta) per rank])
        kept = {p for _, _, _, parts in outputs for p, _ in parts}
        self.frees = [_frees(rank_cmds, self.n_in, kept) for rank_cmds in cmds]
        ranks = self.ranks
        with ranks._lock:
            ranks._live()
            for r in range(ranks.size):
                ranks._issue(r, (W.DEFINE, self.id, cmds[r], self.frees[r]))
            ranks._flush()
        # forgotten on the ranks with the next commands once this is gone (or closed)
        self.close = weakref.finalize(self, ranks._forget.append, self.id)

    def replay(self, inputs: list) -> list:
        """One step: every rank runs the program over ``inputs`` (the input parts' ids, in
        the recorded order); returns the output leaves, global tensors."""
        ranks = self.ranks
        with ranks._lock:
            ranks._live()
            base = next(ranks._ids)
            ranks._ids = itertools.count(base + self.n_made)
            seq_base = ranks._collectives
            ranks._collectives += self.n_coll
            for r in range(ranks.size):
                ranks._issue(r, (W.REPLAY, self.id, inputs, base, seq_base))
            ranks._flush()
            outs = []
            part = W.replay_ids(inputs, base)
            for shape, dtype, sbp, parts in self.outputs:
                held = [
                    Part(r, part(q), meta, dtype, ranks._drops) for r, (q, meta) in enumerate(parts)
                ]
                outs.append(wrap(make(ranks, held, shape, dtype, sbp)))
            return outs


def _same(a: list, b: list | None) -> bool:
    """Whether two steps' normalized records are the same commands (compared pickled: an
    attribute that is NaN is equal to itself there)."""
    if b is None or len(a) != len(b):
        return False
    try:
        return all(
            len(x) == len(y) and pickle.dumps(x, protocol=5) == pickle.dumps(y, protocol=5)
            for x, y in zip(a, b, strict=True)
        )
    except Exception:  # noqa: BLE001 - what does not pickle is not replayed
        return False


def _frees(cmds: list, n_in: int, kept: set) -> list:
    """After each of a rank's normalized commands, the parts the step made whose last use
    it is (as normalized ids), but the outputs (``kept``)."""
    last: dict = {}
    for k, c in enumerate(cmds):
        for i in W.ids_of(c):
            if i < -n_in:  # (made by the step)
                last[i] = k
    frees: list = [[] for _ in cmds]
    for i, k in last.items():
        if i not in kept:
            frees[k].append(i)
    return frees


class StepReplay:
    """The step programs of one ``nn.Graph`` over global tensors (see the module doc):
    ``step(ranks, key, inputs, state, run)`` runs a step, recording it, replaying it or
    running it eagerly (``run()``: the eager step, returning its output leaves). ``why``:
    the reason the last recorded step could not be replayed (None when it could);
    ``replays``: steps replayed so far."""

    def __init__(self) -> None:
        self.key: Any = None
        self.program: Program | None = None
        self.last: list | None = None  # the previous step's normalized record
        self.misses = 0
        self.why: str | None = None
        self.replays = 0
        self.structure: Any = None  # the output's structure (nn.Graph's, of its last eager step)

    def reset(self) -> None:
        if self.program is not None:
            self.program.close()
        self.program, self.last, self.misses, self.key = None, None, 0, None

    def step(self, ranks: Any, key: Any, inputs: list, state: set, run: Any) -> list:
        if not getattr(ranks, "replays", False):
            return run()
        key = (id(ranks), key)
        if key != self.key:
            self.reset()
            self.key = key
        if self.program is not None:
            if self.program.ranks.closed:
                self.reset()
                self.key = key
            else:
                self.replays += 1
                return self.program.replay(inputs)
        if self.misses >= MISSES:
            return run()
        with ranks._lock:
            rec = Recording(ranks, inputs, state)
            ranks._rec = rec
        try:
            outs = run()
        finally:
            with ranks._lock:
                ranks._rec = None
                rec.finish()
        cmds = rec.normalized()
        if cmds is None:
            self.why, self.misses = rec.refused, MISSES
            return outs
        same = _same(cmds, self.last)
        if not same:
            if self.last is not None:
                self.misses += 1
                self.why = "its steps issue different commands each time"
            self.last = cmds
            return outs
        specs = _outputs(rec, outs)
        if specs is None:
            self.why, self.misses = rec.refused, MISSES
            return outs
        self.program = Program(rec, cmds, specs)
        self.why = None
        return outs


def _outputs(rec: Recording, outs: list) -> list | None:
    """The output leaves' specs for replays (see ``Program.outputs``), once every part the
    step made but its outputs is gone; None (``rec.refused`` saying why) otherwise."""
    specs = []
    made: set = set()
    for t in outs:
        impl = getattr(t, "_impl", None)
        if impl is None or not isinstance(impl.meta.device, Layout):
            rec.refuse("it returns something other than global tensors")
            return None
        parts = parts_of(impl)
        m = impl.meta
        if impl.blob.source is not None or m.strides != contiguous_strides(m.shape) or m.offset:
            rec.refuse("it returns a view (x.T, a slice): return a tensor of its own")
            return None
        if any(part.id in made for part in parts):
            rec.refuse("it returns one tensor's parts twice (the same tensor, or a view of it)")
            return None
        normal = []
        for part in parts:
            try:
                q = rec.normal_id(part.id)
            except LookupError:
                q = 0
            if q >= -rec.n_in:  # (an input, the state, or made elsewhere)
                rec.refuse("it returns one of its inputs or a tensor it did not make")
                return None
            normal.append((q, rec.ranks.meta(part)))
            made.add(part.id)
        specs.append((tuple(m.shape), m.dtype, sbp_of(impl), normal))
    gc.collect()  # (parts held only by cycles: an autograd graph's)
    collect(get_vm(), submit_pending=False)  # (saved outputs' blobs, released by backward)
    ranks = rec.ranks
    gone = rec.dropped | {i for _, i in list(ranks._drops)}
    # (every id the step took is a part's: the ones neither dropped nor outputs are held)
    held = [i for i in range(rec.start + 1, rec.end) if i not in gone and i not in made]
    if held:
        rec.refuse(
            f"it keeps {len(held)} part(s) it made other than its outputs (a tensor of the "
            f"step stored outside it)"
        )
        return None
    return specs


def step_inputs(graph: Any, structure: Any, batch: list) -> tuple | None:
    """What ``StepReplay.step`` takes for a step of ``graph`` (an ``nn.Graph`` over global
    tensors) on ``batch`` (its input leaves, the tensors global): ``(ranks, key, input part
    ids, state part ids)``; None where its parameters and inputs are not all on one
    ``HeldRanks`` that replays (the step runs eagerly). The key holds what the step's
    commands depend on besides the values: what ``Graph._check`` compares for a local
    graph's compiled step (``_Traced``: the modules' tree, hooks and attributes, the
    attributes and names ``build`` reads, the optimizers' groups; the modes, options and
    which parameters require grad), every group setting (a rate is folded into the
    update's commands here), the ids of the state's parts, and the inputs' layouts and
    strides, per part too, and which of them are the same tensor."""
    settings = graph._check()
    traced = graph._traced
    state_tensors = list(graph._params())
    hyper = []
    for opt in graph._optimizers:
        for group in opt.param_groups:
            hyper.append(repr(sorted((k, v) for k, v in group.items() if k != "params")))
        for st in opt.state.values():
            state_tensors += [v for v in st.values() if isinstance(v, Tensor)]
            hyper.append(repr(sorted((k, v) for k, v in st.items() if not isinstance(v, Tensor))))
    ranks = getattr(state_tensors[0]._impl.blob, "ranks", None) if state_tensors else None
    if not isinstance(ranks, HeldRanks) or not ranks.replays or ranks.closed:
        return None
    state_ids = []
    for t in state_tensors:
        if getattr(t._impl.blob, "ranks", None) is not ranks:
            return None
        state_ids += [p.id for p in parts_of(t._impl)]
    groups = tuple(
        tuple(tuple(q.id for q in parts_of(p._impl)) for p in g["params"])
        for opt in graph._optimizers
        for g in opt.param_groups
    )
    inputs, metas, others = [], [], []
    for x in batch:
        if not isinstance(x, Tensor):
            others.append(repr(x))
            continue
        if getattr(x._impl.blob, "ranks", None) is not ranks:
            return None
        m = x._impl.meta
        parts = parts_of(x._impl)
        metas.append(
            (m.shape, m.dtype, m.device, m.strides, m.offset)
            + tuple((q.meta.shape, q.meta.strides, q.meta.offset) for q in parts)
        )
        inputs += [q.id for q in parts]
    first: dict = {}
    same = tuple(first.setdefault(i, k) for k, i in enumerate(inputs))  # (aliases)
    key = (
        repr(structure),
        tuple(others),
        tuple(metas),
        same,
        tuple(state_ids),
        groups,
        tuple(hyper),
        settings,
        traced.ident,
    )
    return ranks, key, inputs, set(state_ids)
