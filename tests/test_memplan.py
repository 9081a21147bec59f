"""The memory planner on its own: orders, placements, what the run must wait for."""

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorflow.runtime.plan import lifetimes as memplan
from actorflow.runtime.plan import placement
from actorflow.runtime.plan.lifetimes import overlaps, plan_sharing

D = "dev"


@st.composite
def dags(draw, max_n=7):
    n = draw(st.integers(1, max_n))
    inputs = []
    for i in range(n):
        k = draw(st.integers(0, min(2, i)))
        inputs.append(
            sorted(draw(st.sets(st.integers(0, i - 1), min_size=k, max_size=k))) if k else []
        )
    sizes = [{D: draw(st.integers(1, 8)) * 64} for _ in range(n)]
    return sizes, inputs


def topo_orders(inputs):
    n = len(inputs)
    for perm in itertools.permutations(range(n)):
        pos = {a: k for k, a in enumerate(perm)}
        if all(pos[j] < pos[i] for i in range(n) for j in inputs[i]):
            yield list(perm)


def brute_force(sizes, inputs):
    """The smallest arena over every order and every placement (each order's intervals
    packed by trying every placement order at lowest offsets), and the smallest live peak."""
    cons = placement.consumers_of(inputs)
    size = [s[D] for s in sizes]
    best_arena, best_live = None, None
    for order in topo_orders(inputs):
        ivs = placement.intervals(order, cons)
        live = placement.live_peaks(sizes, ivs, [D])[D]
        best_live = live if best_live is None else min(best_live, live)
        for perm in itertools.permutations(range(len(size))):
            off = {}
            for i in perm:
                busy = sorted(
                    (off[j], off[j] + size[j])
                    for j in off
                    if not (ivs[j][1] < ivs[i][0] or ivs[i][1] < ivs[j][0])
                )
                cur = 0
                for a, b in busy:
                    if a - cur >= size[i]:
                        break
                    cur = max(cur, b)
                off[i] = cur
            top = max(off[i] + size[i] for i in off)
            best_arena = top if best_arena is None else min(best_arena, top)
    return best_arena, best_live


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_n=5))
def test_exact_planner_matches_brute_force(case):
    sizes, inputs = case
    plan = plan_sharing(sizes, inputs)
    arena, live = brute_force(sizes, inputs)
    assert plan.exact
    assert plan.arenas[D] == arena
    assert plan.lower * sum(s[D] for s in sizes) == pytest.approx(live)
    assert plan.arenas[D] >= plan.live[D] >= live
    assert overlaps(plan, sizes) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_n=9))
def test_every_plan_is_valid_and_no_worse_than_its_heuristics(case):
    sizes, inputs = case
    plan = plan_sharing(sizes, inputs)
    assert overlaps(plan, sizes) == []
    pos = {a: k for k, a in enumerate(plan.order)}
    assert sorted(plan.order) == list(range(len(sizes)))
    assert all(pos[j] < pos[i] for i in range(len(sizes)) for j in inputs[i])
    assert all(plan.arenas[D] <= tried[D] for tried in plan.tried.values())
    assert plan.arenas[D] <= sum(s[D] for s in sizes)
    assert plan.arenas[D] >= plan.live[D]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_n=8), st.integers(0, 2**31))
def test_waits_make_every_gated_schedule_safe(case, seed):
    """Runs the plan's gates (preds: same piece, succs: the previous piece) in a random
    simulation of 3 pieces with 2 waves: no two registers live at once share a byte, and
    the run never stalls."""
    sizes, inputs = case
    plan = plan_sharing(sizes, inputs)
    n, k, pieces = len(sizes), 2, 3
    cons = placement.consumers_of(inputs)
    rng = random.Random(seed)
    off = plan.offsets[D]
    size = [memplan.aligned(s[D]) for s in sizes]
    done = set()  # (node, piece) acted
    live = {}  # (node, piece) -> (lo, hi) in the wave's region

    def is_home(j, p):
        return all((c, p) in done for c in cons[j])

    def gate(i, p):
        u = p // k
        ok = all(is_home(j, p) and (j, p) in done for j in plan.preds[i])
        if u:
            ok &= all((z, p - k) in done and is_home(z, p - k) for z in plan.succs[i])
        own = p < k or ((i, p - k) in done and is_home(i, p - k))
        return ok and own

    while len(done) < n * pieces:
        for key in [x for x in live if is_home(*x)]:
            del live[key]
        ready = [
            (i, p)
            for p in range(pieces)
            for i in range(n)
            if (i, p) not in done
            and ((i, p - 1) in done or p == 0)
            and all((j, p) in done for j in inputs[i])
            and gate(i, p)
        ]
        assert ready, "the gates stalled a run the data allow"
        i, p = rng.choice(ready)
        lo = (p % k) * plan.arenas[D] + off[i]
        for (j, q), (a, b) in live.items():
            assert not (a < lo + size[i] and lo < b), f"{i}@{p} overwrites {j}@{q}"
        live[(i, p)] = (lo, lo + size[i])
        done.add((i, p))


def test_heuristics_plan_a_thousand_nodes_and_stay_valid():
    rng = random.Random(3)
    n = 1000
    inputs = [
        sorted(rng.sample(range(max(0, i - 30), i), min(i, rng.randint(1, 2)))) if i else []
        for i in range(n)
    ]
    sizes = [{D: rng.randint(1, 64) * 4096} for _ in range(n)]
    plan = plan_sharing(sizes, inputs)
    assert not plan.exact and plan.lower is None
    assert plan.arenas[D] < sum(s[D] for s in sizes) / 10
    assert plan.arenas[D] >= plan.live[D]
    assert len(plan.tried) == 9
    # spot-check validity on the registers live together with the largest ones
    big = sorted(range(n), key=lambda i: -sizes[i][D])[:40]
    ivs, off = plan.intervals, plan.offsets[D]
    for a in big:
        for b in range(n):
            if a != b and not (ivs[a][1] < ivs[b][0] or ivs[b][1] < ivs[a][0]):
                assert off[a] + sizes[a][D] <= off[b] or off[b] + sizes[b][D] <= off[a]


def test_figure1_needs_a_control_edge_the_data_do_not_give():
    # M1, M2 -> O1 (reads M1), O2 (reads M2): the least peak puts O1's bytes where M2's
    # or O2's go, in an order the data alone do not force
    MiB = 1 << 20
    sizes = [{D: 1 * MiB}, {D: 3 * MiB}, {D: 5 * MiB}, {D: 1 * MiB}]
    inputs = [[], [], [0], [1]]
    plan = plan_sharing(sizes, inputs)
    assert plan.exact and plan.arenas[D] == 6 * MiB
    assert plan.edges and all(j != i for j, i in plan.edges)
    assert plan_sharing(sizes, inputs, exact_max=0).arenas[D] >= 6 * MiB  # heuristics


def test_a_chain_alternates_two_slots():
    sizes = [{D: 100 * 64}] * 6
    inputs = [[]] + [[i] for i in range(5)]
    plan = plan_sharing(sizes, inputs)
    assert plan.arenas[D] == 2 * 100 * 64
    assert plan.edges == []  # a chain's data already order every reuse
    assert all(len(p) <= 1 for p in plan.preds)


def test_devices_are_planned_apart():
    sizes = [{"a": 64, "b": 640}, {"a": 64}, {"b": 64}]
    inputs = [[], [0], [1]]
    plan = plan_sharing(sizes, inputs)
    assert plan.arenas == {"a": 128, "b": 640}  # node 2 reuses node 0's bytes on b
    assert overlaps(plan, sizes) == []
