"""Registers that share memory: the plan's arenas and the run's memory gates.

When a graph's registers do not fit its budget side by side, the plan asks ``memplan`` for
an order and an offset per register so that registers whose lifetimes never overlap share
bytes (``Sharing.make``). The actors that share (those with the graph's most common
``buffers`` count ``k``) get their registers in per-device arenas, one region per *wave*:
register ``j`` of every such actor serves pieces ``j, j + k, ...`` and lies in region ``j``,
laid out as the planner placed it. Registers of other actors keep their own memory.

The run keeps the planned order where it matters, with a memory gate per actor
(``MemoryGate``): before an actor writes register ``j`` for piece ``p`` (use ``u = p // k``
of it), every register that used its bytes before it in the planned order must be home
from the same piece (``preds``: the control edges), and every register after it in the
order that shares its bytes must be home from the previous piece (``succs``). Those uses of
the bytes form one sequence, consistent with running piece after piece in the planned
order, so the gates never stall a run that data and credits let through (the first act not
done in that sequence can always go), and no two registers live at once share a byte: the
scheduler checks the latter on every take and stops the run if it ever failed.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...backends import get_backend
from ...errors import format_bytes
from ..graph.actors import Collector
from .lifetimes import aligned, plan_sharing
from .spec import PieceSpec, Spec

SHARED_KEY = ("shared registers",)  # the arenas' memory key in the MemoryBudget


class Sharing:
    """The shared part of a plan: ``share`` (memplan's SharePlan), ``members`` (actor ->
    node index), ``k`` (registers per sharing actor), ``region`` (per device, the bytes of
    one wave), ``arenas`` (per device, ``k`` regions), ``unshared`` (per device, what the
    same registers need side by side)."""

    def __init__(self, nodes: list, members: dict, share, k: int, sizes: list):
        self.nodes = nodes
        self.members = members
        self.share = share
        self.k = k
        self.sizes = sizes
        self.region = dict(share.arenas)
        self.arenas = {d: b * k for d, b in self.region.items()}
        self.unshared: dict = {}
        for i in members.values():
            for d, b in sizes[i].items():
                self.unshared[d] = self.unshared.get(d, 0) + b * k
        self.base: dict = {}  # device -> the arena's array (None on null devices)

    @staticmethod
    def make(actors: list, buffers: dict, budget) -> Sharing | None:
        """Plans sharing for the sized actors of a plan (``actors`` in plan order, the
        collector excluded); None when no two registers could share. Each device's arena
        is weighed against what its budget leaves after the bytes that do not share (the
        other actors' registers, op workspaces)."""
        nodes = _ordered([a for a in actors if not isinstance(a, Collector)])
        index = {a: i for i, a in enumerate(nodes)}
        counts = Counter(buffers[a] for a in nodes if _layout_bytes(a.out_spec))
        if not counts:
            return None
        k = counts.most_common(1)[0][0]
        members = {
            a: index[a]
            for a in nodes  # (device memory is not viewed
            if buffers[a] == k
            and _layout_bytes(a.out_spec)  # into arenas)
            and all(get_backend(sp.device).host_memory for sp in a.out_spec.specs)
            and getattr(a, "procs", None) is None
        }  # (processes': a shared block)
        sizes = [_layout_bytes(a.out_spec) if a in members else {} for a in nodes]
        inputs = [[index[p] for p in a.inputs] for a in nodes]
        after = [[index[r] for r in _readers_before(a, nodes)] for a in nodes]
        fixed: dict = {}
        for a in nodes:
            if a not in members:
                for d, b in a.out_spec.bytes_on().items():
                    fixed[d] = fixed.get(d, 0) + b * buffers[a]
            prog = getattr(a, "program", None)
            if prog is not None and prog.workspace_bytes:
                fixed[prog.device] = fixed.get(prog.device, 0) + prog.workspace_bytes
        scale = {}
        for d in {d for sz in sizes for d in sz}:
            b = budget.budget(d)
            if b is not None:
                scale[d] = max(b - fixed.get(d, 0), 1) / k
        share = plan_sharing(sizes, inputs, scale, after=after)
        return Sharing(nodes, members, share, k, sizes)

    # -- memory ----------------------------------------------------------------------------
    def allocate(self, budget) -> None:
        """Takes the arenas (one per device, all filed under SHARED_KEY)."""
        specs = [Spec((b // 8,), "int64", d) for d, b in self.arenas.items() if b]
        arrays, _ = budget.allocate(
            PieceSpec(list(range(len(specs))), specs), "shared registers", key=SHARED_KEY
        )
        self.base = {
            s.device: None if a is None else a.view(np.uint8)
            for s, a in zip(specs, arrays, strict=True)
        }

    def arrays(self, actor, j: int) -> list:
        """Register ``j`` of ``actor``: views into its wave's region of the arenas."""
        i = self.members[actor]
        at = {d: self.region[d] * j + self.share.offsets[d][i] for d in self.sizes[i]}
        out: list = []
        for s in actor.out_spec.specs:
            base = self.base.get(s.device)
            o = at[s.device]
            at[s.device] += aligned(s.nbytes)
            if base is None:
                out.append(None)
            else:
                out.append(base[o : o + s.nbytes].view(s.dtype.np).reshape(s.shape))
        return out

    def ranges(self, actor, j: int) -> dict:
        """``{device: (first byte, end)}`` of register ``j`` of ``actor`` in the arenas."""
        i = self.members[actor]
        return {
            d: (
                self.region[d] * j + self.share.offsets[d][i],
                self.region[d] * j + self.share.offsets[d][i] + b,
            )
            for d, b in self.sizes[i].items()
        }

    # -- display ---------------------------------------------------------------------------
    def lines(self) -> list:
        s, names = self.share, [a.name for a in self.nodes]
        how = (
            "exact: the smallest any order and placement allow"
            if s.exact
            else "the best of the heuristics"
        )
        out = [
            f"shared registers: {len(self.members)} actors' registers share memory by "
            f"lifetime ({how}; {s.method}; planned in {s.seconds * 1e3:.1f} ms)"
        ]
        for d in sorted(self.arenas, key=str):
            out.append(
                f"  {d}: {format_bytes(self.arenas[d])} for what needs "
                f"{format_bytes(self.unshared[d])} side by side"
                + (f" ({self.k} waves of {format_bytes(self.region[d])})" if self.k > 1 else "")
            )
        out.append("  order: " + " -> ".join(names[i] for i in s.order))
        if s.edges:
            out.append(
                "  control edges (the readers of the first are done before the second "
                "writes): " + ", ".join(f"{names[j]} -> {names[i]}" for j, i in s.edges)
            )
        cross = sum(len(x) for x in s.succs)
        if cross:
            out.append(
                f"  across pieces: {cross} register(s) wait for a later actor's "
                f"previous piece in their wave before writing (the cost in overlap: "
                f"a wave's pieces pass those bytes in turn)"
            )
        return out


def _readers_before(a, nodes: list) -> list:
    """The actors that read a state ``a`` writes: the run's state gates make ``a`` act on
    a piece after all of them (``gates.py``), so the planned order must too."""
    writes = set(getattr(a, "state_writes", ()))
    if not writes:
        return []
    return [r for r in nodes if r is not a and writes & set(getattr(r, "state_reads", ()))]


def _ordered(nodes: list) -> list:
    """``nodes`` in an order where each comes after its inputs and after the readers of
    the states it writes (the plan's own order, where that already holds)."""
    before = {a: set(a.inputs) | set(_readers_before(a, nodes)) for a in nodes}
    placed: set = set()
    out: list = []
    while len(out) < len(nodes):
        for a in nodes:
            if a not in placed and before[a] <= placed:
                placed.add(a)
                out.append(a)
                break
        else:
            raise RuntimeError("the actors' inputs and state gates form a cycle")
    return out


def _layout_bytes(spec) -> dict:
    out: dict = {}
    for s in spec.specs:
        out[s.device] = out.get(s.device, 0) + aligned(s.nbytes)
    return {d: b for d, b in out.items() if b}


class MemoryGate:
    """One sharing actor's gate in one run: the gates it waits on, its registers' uses
    completed (``homes[j]``), who waits on it, and its registers' byte ranges."""

    __slots__ = ("k", "preds", "succs", "homes", "waiters", "ranges", "live")

    def __init__(self, k: int, ranges: list, live: LiveBytes):
        self.k = k
        self.preds: list = []  # ActorStates
        self.succs: list = []
        self.homes = [0] * k
        self.waiters: set = set()
        self.ranges = ranges  # per register index: {device: (start, end)}
        self.live = live  # the run's LiveBytes


class LiveBytes:
    """The shared registers being written or read in a run: ``ranges`` per device
    (``{(start, end): who}``), bytes ``used`` now and their ``peak`` (measured)."""

    def __init__(self, devices):
        self.ranges = {d: {} for d in devices}
        self.used = dict.fromkeys(devices, 0)
        self.peak = dict.fromkeys(devices, 0)


def bind_gates(sharing: Sharing, by_actor: dict) -> LiveBytes:
    """Gives every sharing actor's state its MemoryGate for this run."""
    live = LiveBytes(sharing.arenas)
    states = {}
    for a in sharing.members:
        st = by_actor[a]
        st.share = MemoryGate(sharing.k, [sharing.ranges(a, j) for j in range(sharing.k)], live)
        states[sharing.members[a]] = st
    s = sharing.share
    for a, i in sharing.members.items():
        g = by_actor[a].share
        g.preds = [states[j] for j in s.preds[i] if j in states]
        g.succs = [states[j] for j in s.succs[i] if j in states]
    return live


def gate_open(st) -> bool:
    """May ``st`` write its next piece's register? Its register ``p % k`` must be free and
    the bytes' earlier users in the sequence done (see the module's doc). If not, it waits
    on the gate that holds it (woken by ``went_home`` or that actor's end)."""
    g = st.share
    p = st.next_piece
    j, u = p % g.k, p // g.k
    for y in g.preds:
        if not _done(y, j, u, st):
            return False
    if u:
        for z in g.succs:
            if not _done(z, j, u - 1, st):
                return False
    free = st.out.free
    for _ in range(len(free)):
        if free[0].index == j:
            return True
        free.rotate(-1)
    return False  # (its own register j is not home yet)


def _done(y, j: int, u: int, waiter) -> bool:
    """Is every use of ``y``'s register ``j`` bytes, up to ``y``'s use ``u`` in the
    sequence, over? Yes if that use is home. If ``y`` ended before it (its stream ran
    out, or nobody reads it), that use never comes: then it is over once the uses before
    it are (``y``'s own gate for that use) and ``y``'s register is home. Otherwise
    ``waiter`` waits on ``y``."""
    g = y.share
    if g.homes[j] > u:
        return True
    if y.ended and y.out.home():
        if all(_done(x, j, u, waiter) for x in g.preds):
            return u == 0 or all(_done(z, j, u - 1, waiter) for z in g.succs)
        return False
    g.waiters.add(waiter)
    return False


def taken(st, reg) -> None:
    """``st`` writes ``reg`` now: its bytes are live. Raises if a live register shares
    them (a planner or gate bug: the run stops instead of corrupting data)."""
    g = st.share
    live = g.live
    for d, (a, b) in g.ranges[reg.index].items():
        ranges = live.ranges[d]
        for (x, y), who in ranges.items():
            if x < b and a < y:
                raise RuntimeError(
                    f"memory sharing broke: {st.actor.name!r} (register "
                    f"{reg.index}) would write bytes {a}-{b} on {d} while "
                    f"{who} holds {x}-{y}; please report this"
                )
        ranges[(a, b)] = f"{st.actor.name!r} (register {reg.index})"
        live.used[d] += b - a
        if live.used[d] > live.peak[d]:
            live.peak[d] = live.used[d]


def untaken(st, reg) -> None:
    """``reg`` comes back unwritten (its act found end of stream): not a use."""
    g = st.share
    for d, r in g.ranges[reg.index].items():
        if g.live.ranges[d].pop(r, None) is not None:
            g.live.used[d] -= r[1] - r[0]


def went_home(st, reg, wake) -> None:
    """``reg`` of ``st`` is free again: one more use of it is done."""
    g = st.share
    g.homes[reg.index] += 1
    untaken(st, reg)
    waiters = g.waiters
    while waiters:
        wake(waiters.pop())
