"""Memory sharing by lifetime: registers whose lifetimes never overlap share bytes.

The problem, free of actors: ``n`` nodes in a DAG (``inputs[i]``: the nodes node ``i``
reads), each with an output of ``sizes[i]`` bytes per device. Under an order of the nodes
(one piece, one act at a time), node ``i``'s register is live from its act to the act of
its last reader (inclusive: a reader's output is written while it reads); a node nobody
reads frees it at once (the run's output copies it out). Registers live at the same time
need disjoint bytes; the others may share. The planner chooses an order and an offset for
every register in a per-device arena, so that the arena (the plan's peak) is as small as
it can find:

- **exact** for small graphs (``EXACT_MAX`` nodes): the smallest live sum of any order
  (dynamic programming over the sets of finished nodes, a lower bound on any arena), then,
  unless an order packs at that bound at once, a search over the orders and over the
  placements of each (branch and bound) until it meets the bound or has tried them all;
- **heuristics** for large ones, as OneFlow's and TVM's planners do: three orders (the
  graph's, a memory-aware greedy one that runs first what frees most, a depth-first one)
  times three placements (size first best fit, time-line first fit, largest area first),
  the best kept.

``waits`` then says what the run must enforce so that the order holds where it matters:
for every register, the registers that last used its bytes before it (within a piece:
"acts after their readers", a control edge where the data do not already force it; across
pieces: the next piece's write waits until the last user of those bytes is done).
"""

from __future__ import annotations

import time

import numpy as np

from .placement import (
    PACKERS,
    consumers_of,
    exact_pack,
    greedy_order,
    intervals,
    live_peaks,
    min_live,
    pack,
)

ALIGN = 8  # every register starts on an 8-byte boundary (any dtype can view it)
EXACT_MAX = 12  # graphs up to this many nodes are planned exactly
WORK = 200_000  # search steps the exact planner may take before it keeps its best


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class SharePlan:
    """The planner's answer. ``order``: nodes in act order; ``intervals[i]``: (first,
    last) positions node ``i``'s register is live; ``offsets[dev][i]``; ``arenas[dev]``:
    the bytes the device's registers need when shared (the planned peak); ``live[dev]``:
    the most bytes live at once under ``order`` (what the arena would be with a perfect
    placement); ``lower``: the smallest live peak of any order (exact planner only: the
    bound no placement can beat), as a score; ``exact``: the arena is proven the smallest;
    ``method``; ``tried``: ``{method: arenas}`` of every heuristic; ``preds[i]`` / ``succs[i]``:
    the nodes whose use of ``i``'s bytes ends before ``i`` writes in the same piece, and
    (across pieces) the later nodes whose previous piece must be done first; ``edges``:
    ``(j, i)`` pairs of ``preds`` the data do not already order (control edges)."""

    def __init__(self):
        self.order: list = []
        self.intervals: list = []
        self.offsets: dict = {}
        self.arenas: dict = {}
        self.live: dict = {}
        self.lower = None
        self.exact = False
        self.method = ""
        self.tried: dict = {}
        self.preds: list = []
        self.succs: list = []
        self.edges: list = []
        self.seconds = 0.0
        self.score = 0.0
        self.scale: dict = {}

    def least(self, dev):
        """The smallest live peak of any order on ``dev``, in bytes (exact planner, one
        device; None otherwise)."""
        if self.lower is None or len(self.scale) != 1:
            return None
        return round(self.lower * self.scale[dev])


# -- the planner ---------------------------------------------------------------------------
class _Search:
    """Orders tried, their best placements, and the best so far."""

    def __init__(self, sizes, cons, devs, scale):
        self.sizes, self.cons, self.devs, self.scale = sizes, cons, devs, scale
        self.best = None  # (score, total, order, ivs, offsets, arenas, method)
        self.tried: dict = {}

    def score(self, arenas: dict) -> float:
        return max((arenas[d] / self.scale[d] for d in self.devs), default=0.0)

    def evaluate(self, order: list, name: str, note: bool = False) -> None:
        ivs = intervals(order, self.cons)
        arenas, offsets, methods = {}, {}, set()
        for d in self.devs:
            size = [s.get(d, 0) for s in self.sizes]
            best = None
            for pname, (key, fit) in PACKERS.items():
                top, offs = pack(size, ivs, key(size, ivs), fit)
                if note:
                    self.tried.setdefault(f"{name} order, {pname}", {})[d] = top
                if best is None or top < best[0]:
                    best = (top, offs, pname)
            assert best is not None  # (PACKERS is not empty)
            arenas[d], offsets[d] = best[0], best[1]
            methods.add(best[2])
        self.offer(order, ivs, offsets, arenas, f"{name} order, " + " / ".join(sorted(methods)))

    def offer(self, order, ivs, offsets, arenas, method) -> None:
        cand = (self.score(arenas), sum(arenas.values()), order, ivs, offsets, arenas, method)
        if self.best is None or cand[:2] < self.best[:2]:
            self.best = cand

    def search(self, inputs: list, lower: float, budget: list, order_in: list) -> bool:
        """Every order whose live peak could beat the best (depth first, pruned by the
        live peak of its prefix), each placed by the heuristics and, where they miss its
        live peak, exactly. True if it went through them all."""
        sizes, cons, devs, scale = self.sizes, self.cons, self.devs, self.scale
        n = len(sizes)
        need = [sum(1 << j for j in set(ins)) for ins in order_in]
        left = [len(c) for c in cons]
        held = dict.fromkeys(devs, 0)
        order: list = []

        def rec(done, peak):
            if budget[0] <= 0:
                return False
            if peak >= self.best[0] - 1e-12:
                return True
            if len(order) == n:
                budget[0] -= n
                self.evaluate(list(order), "searched")
                if self.best[0] > peak + 1e-12:
                    self._exact_place(list(order), budget)
                return True
            complete = True
            for i in range(n):
                if done >> i & 1 or need[i] & done != need[i]:
                    continue
                now = max((held[d] + sizes[i].get(d, 0)) / scale[d] for d in devs)
                order.append(i)
                freed = [p for p in set(inputs[i]) if left[p] == 1]
                for p in set(inputs[i]):
                    left[p] -= 1
                for p in freed:
                    for d, b in sizes[p].items():
                        held[d] -= b
                if cons[i]:
                    for d, b in sizes[i].items():
                        held[d] += b
                complete &= rec(done | 1 << i, max(peak, now))
                if cons[i]:
                    for d, b in sizes[i].items():
                        held[d] -= b
                for p in freed:
                    for d, b in sizes[p].items():
                        held[d] += b
                for p in set(inputs[i]):
                    left[p] += 1
                order.pop()
                if self.best[0] <= lower + 1e-12:
                    return True
            return complete

        return rec(0, 0.0)

    def _exact_place(self, order: list, budget: list) -> None:
        ivs = intervals(order, self.cons)
        arenas, offsets = {}, {}
        for d in self.devs:
            size = [s.get(d, 0) for s in self.sizes]
            bound = int(self.best[0] * self.scale[d]) + 1
            got = exact_pack(size, ivs, bound, budget, live_peaks(self.sizes, ivs, [d])[d])
            if got is None:
                return
            arenas[d], offsets[d] = got
        self.offer(order, ivs, offsets, arenas, "searched order, exact placement")


def plan_sharing(
    sizes: list,
    inputs: list,
    scale: dict | None = None,
    exact_max: int = EXACT_MAX,
    work: int = WORK,
    after: list | None = None,
) -> SharePlan:
    """Plans shared registers for nodes ``0..n-1`` given in a topological order
    (``inputs[i]`` and ``after[i]`` hold indices below ``i``); ``sizes[i]``: ``{device:
    bytes}``; ``scale``: what a device's bytes are weighed against (what its budget leaves
    for them; by default the unshared sum), so the plan minimises the largest arena
    relative to it. ``after[i]``: nodes ``i`` must act after without reading them (e.g.
    the readers of a state ``i`` writes, as the run's state gates order them)."""
    t0 = time.perf_counter()
    n = len(sizes)
    sizes = [{d: aligned(b) for d, b in s.items() if b} for s in sizes]
    devs = sorted({d for s in sizes for d in s}, key=str)
    scale = {d: (scale or {}).get(d) or sum(s.get(d, 0) for s in sizes) or 1 for d in devs}
    cons = consumers_of(inputs)
    order_in = [sorted(set(inputs[i]) | set(after[i] if after else ())) for i in range(n)]
    s = _Search(sizes, cons, devs, scale)
    s.evaluate(list(range(n)), "graph", note=True)
    s.evaluate(
        greedy_order(sizes, inputs, cons, scale, order_in=order_in), "memory-aware", note=True
    )
    s.evaluate(
        greedy_order(sizes, inputs, cons, scale, depth_first=True, order_in=order_in),
        "depth-first",
        note=True,
    )
    plan = SharePlan()
    if n <= exact_max:
        lower, order = min_live(sizes, inputs, cons, scale, order_in)
        plan.lower = lower
        s.evaluate(order, "least-live")
        plan.exact = s.best[0] <= lower + 1e-12 or s.search(inputs, lower, [work], order_in)
    plan.score, _, plan.order, plan.intervals, plan.offsets, plan.arenas, plan.method = s.best
    plan.tried = s.tried
    plan.scale = scale
    plan.live = live_peaks(sizes, plan.intervals, devs)
    plan.preds, plan.succs = waits(sizes, plan.order, plan.offsets, devs)
    plan.edges = control_edges(plan.preds, order_in, cons)
    plan.seconds = time.perf_counter() - t0
    return plan


# -- what the run enforces -----------------------------------------------------------------
def waits(sizes: list, order: list, offsets: dict, devs: list) -> tuple[list, list]:
    """Per node, the nodes that used its bytes last before it writes them: ``preds`` (the
    same piece, earlier in the order) and ``succs`` (the previous piece, later in the
    order, for bytes no earlier node uses)."""
    n = len(order)
    pos = [0] * n
    for k, i in enumerate(order):
        pos[i] = k
    preds: list[set[int]] = [set() for _ in range(n)]
    succs: list[set[int]] = [set() for _ in range(n)]
    for d in devs:
        size = np.array([s.get(d, 0) for s in sizes], dtype=np.int64)
        lo = np.array(offsets[d], dtype=np.int64)
        hi = lo + size
        for i in range(n):
            if not size[i]:
                continue
            hit = np.nonzero((size > 0) & (lo < hi[i]) & (hi > lo[i]))[0].tolist()
            hit = sorted((j for j in hit if j != i), key=lambda j: -pos[j])
            uncovered = [(int(lo[i]), int(hi[i]))]
            for group, later in ((preds, False), (succs, True)):
                for j in hit:
                    if (pos[j] > pos[i]) != later or not uncovered:
                        continue
                    cut = _subtract(uncovered, int(lo[j]), int(hi[j]))
                    if cut != uncovered:
                        group[i].add(j)
                        uncovered = cut
    return (
        [sorted(p, key=lambda j: pos[j]) for p in preds],
        [sorted(p, key=lambda j: pos[j]) for p in succs],
    )


def _subtract(segments: list, a: int, b: int) -> list:
    out = []
    for x, y in segments:
        if b <= x or y <= a:
            out.append((x, y))
            continue
        if x < a:
            out.append((x, a))
        if b < y:
            out.append((b, y))
    return out


def control_edges(preds: list, inputs: list, cons: list) -> list:
    """``(j, i)`` for each ``j`` in ``preds[i]`` whose readers the data (``inputs``: what
    each node comes after) do not already finish before ``i`` acts (a node nobody reads
    is copied out by the run's output, which no data orders)."""
    anc = [0] * len(inputs)
    for i, ins in enumerate(inputs):
        for p in ins:
            anc[i] |= anc[p] | 1 << p
    edges = []
    for i, ps in enumerate(preds):
        for j in ps:
            if not cons[j] or any(not anc[i] >> r & 1 for r in cons[j]):
                edges.append((j, i))
    return edges


def overlaps(plan: SharePlan, sizes: list) -> list:
    """Pairs of registers live at once whose bytes overlap (none in a correct plan)."""
    sizes = [{d: aligned(b) for d, b in s.items() if b} for s in sizes]
    bad = []
    for d, offs in plan.offsets.items():
        for i in range(len(sizes)):
            for j in range(i + 1, len(sizes)):
                si, sj = sizes[i].get(d, 0), sizes[j].get(d, 0)
                if not si or not sj:
                    continue
                (a0, a1), (b0, b1) = plan.intervals[i], plan.intervals[j]
                if a1 < b0 or b1 < a0:
                    continue
                if offs[i] < offs[j] + sj and offs[j] < offs[i] + si:
                    bad.append((d, i, j))
    return bad
