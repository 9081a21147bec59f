"""Orders and placements for the memory planner (``memplan.py``): the live intervals of
registers under an order, the smallest live peak of any order (exact, for small graphs),
memory-aware list schedules, and placements of intervals at offsets (heuristics, and an
exact branch and bound)."""

from __future__ import annotations

from functools import cache

import numpy as np


def consumers_of(inputs: list) -> list:
    cons: list[list[int]] = [[] for _ in inputs]
    for i, ins in enumerate(inputs):
        for j in set(ins):
            cons[j].append(i)
    return cons


def intervals(order: list, cons: list) -> list:
    pos = [0] * len(order)
    for k, i in enumerate(order):
        pos[i] = k
    return [(pos[i], max([pos[i]] + [pos[c] for c in cons[i]])) for i in range(len(order))]


def live_peaks(sizes: list, ivs: list, devices: list) -> dict:
    """The most bytes live at once per device, under the intervals ``ivs``."""
    n = len(ivs)
    out = {}
    for d in devices:
        delta = [0] * (n + 1)
        for i, (s, e) in enumerate(ivs):
            b = sizes[i].get(d, 0)
            delta[s] += b
            delta[e + 1] -= b
        run, peak = 0, 0
        for x in delta:
            run += x
            peak = max(peak, run)
        out[d] = peak
    return out


# -- placements ----------------------------------------------------------------------------
def pack(size: list, ivs: list, key, fit: str = "best") -> tuple[int, list]:
    """Places registers one at a time in the order ``key`` gives, each in the gap among
    the registers live with it that fits it best (``fit="best"``) or lowest ("first"),
    else on top. Returns (arena bytes, offsets)."""
    n = len(size)
    off = [-1] * n
    top = 0
    if n > 64:  # numpy finds who is live at once
        start = np.array([s for s, _ in ivs])
        end = np.array([e for _, e in ivs])
        sz = np.array(size, dtype=np.int64)
        offs = np.full(n, -1, dtype=np.int64)
    placed: list = []
    for i in sorted((i for i in range(n) if size[i]), key=key):
        s, e = ivs[i]
        if n > 64:
            mask = (offs >= 0) & (start <= e) & (end >= s)
            lo = offs[mask]
            busy = sorted(zip(lo.tolist(), (lo + sz[mask]).tolist(), strict=True))
        else:
            busy = sorted(
                (off[j], off[j] + size[j]) for j in placed if not (ivs[j][1] < s or e < ivs[j][0])
            )
        cur, best = 0, None
        for a, b in busy:
            gap = a - cur
            if gap >= size[i] and (best is None or gap < best[1]):
                best = (cur, gap)
                if fit == "first":
                    break
            cur = max(cur, b)
        o = best[0] if best is not None else cur
        off[i] = o
        placed.append(i)
        if n > 64:
            offs[i] = o
        top = max(top, o + size[i])
    return top, [max(0, o) for o in off]


PACKERS = {
    "size-first best fit": (lambda size, ivs: lambda i: (-size[i], ivs[i][0]), "best"),
    "time-line first fit": (lambda size, ivs: lambda i: (ivs[i][0], -size[i]), "first"),
    "largest area first": (
        lambda size, ivs: lambda i: (-size[i] * (ivs[i][1] - ivs[i][0] + 1), ivs[i][0]),
        "best",
    ),
}


def exact_pack(
    size: list, ivs: list, bound: int, budget: list, floor: int = 0
) -> tuple[int, list] | None:
    """The smallest arena of any placement below ``bound`` (or None if none is), found by
    branch and bound: registers are placed in the order of their offsets, each at its
    lowest free offset. (Any placement can be pushed down until nothing moves; placing its
    registers by offset, each as low as the ones placed allow, rebuilds it: a register
    above a lower one it is live with lies above that one's top. So this order loses
    nothing.) ``floor``: no arena can be lower (the live peak): the search stops there.
    ``budget[0]``: steps left (shared with the caller; the search stops at 0)."""
    items = [i for i in range(len(size)) if size[i]]
    off: dict = {}
    best: list = [bound, None]  # the lowest arena yet, its offsets ({register: offset})

    def rec(height, last):
        if height >= best[0] or budget[0] <= 0:
            return
        if len(off) == len(items):
            best[0], best[1] = height, dict(off)
            return
        budget[0] -= 1
        for i in items:
            if i in off:
                continue
            s, e = ivs[i]
            busy = sorted(
                (off[j], off[j] + size[j]) for j in off if not (ivs[j][1] < s or e < ivs[j][0])
            )
            cur = 0
            for a, b in busy:
                if a - cur >= size[i]:
                    break
                cur = max(cur, b)
            if (cur, i) < last:
                continue  # the same placement comes from another order
            off[i] = cur
            rec(max(height, cur + size[i]), (cur, i))
            del off[i]
            if best[0] <= floor:
                return

    rec(0, (-1, -1))
    if best[1] is None:
        return None
    return best[0], [best[1].get(i, 0) for i in range(len(size))]


# -- orders --------------------------------------------------------------------------------
def greedy_order(
    sizes: list, inputs: list, cons: list, scale: dict, depth_first=False, order_in=None
):
    """A memory-aware list schedule: among the nodes ready, the one whose act adds the
    least (its output, less the inputs it is the last reader of); ``depth_first``: the
    one readied last (chains run through before the next starts). ``order_in[i]``: what
    node ``i`` comes after (its inputs, and any order it must keep; default its inputs)."""
    n = len(sizes)
    order_in = inputs if order_in is None else order_in
    after = consumers_of(order_in)
    missing = [len(set(ins)) for ins in order_in]
    left = [len(c) for c in cons]
    ready = [i for i in range(n) if missing[i] == 0]
    order = []
    weight = [sum(b / scale[d] for d, b in s.items()) for s in sizes]
    while ready:
        if depth_first:
            i = ready.pop()
        else:
            best, k = None, 0
            for idx, j in enumerate(ready):
                freed = sum(weight[p] for p in set(inputs[j]) if left[p] == 1)
                cost = (weight[j] if cons[j] else 0) - freed
                if best is None or cost < best:
                    best, k = cost, idx
            i = ready.pop(k)
        order.append(i)
        for p in set(inputs[i]):
            left[p] -= 1
        for c in after[i]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    return order


def min_live(sizes: list, inputs: list, cons: list, scale: dict, order_in=None):
    """The smallest peak live score of any order (exact, over the sets of finished
    nodes) and an order that reaches it (``order_in``: as for ``greedy_order``)."""
    n = len(sizes)
    full = (1 << n) - 1
    need = [sum(1 << j for j in set(ins)) for ins in (order_in or inputs)]
    devs = list(scale)

    def held(done):
        h = dict.fromkeys(devs, 0)
        for i in range(n):
            if done >> i & 1 and any(not done >> c & 1 for c in cons[i]):
                for d, b in sizes[i].items():
                    h[d] += b
        return h

    @cache
    def best(done):
        if done == full:
            return 0.0, -1
        h = held(done)
        result = None
        for i in range(n):
            if done >> i & 1 or need[i] & done != need[i]:
                continue
            now = max((h[d] + sizes[i].get(d, 0)) / scale[d] for d in devs)
            peak = max(now, best(done | 1 << i)[0])
            if result is None or peak < result[0]:
                result = (peak, i)
        return result

    order, done = [], 0
    while done != full:
        i = best(done)[1]
        order.append(i)
        done |= 1 << i
    score = best(0)[0]
    best.cache_clear()
    return score, order
