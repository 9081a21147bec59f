"""Registers shared by lifetime in real runs: random DAGs x random budgets x random
schedules, on real data (cpu) and on the null device. Never a deadlock, never over the
budget, outputs equal a one-by-one run, refused only below the smallest peak the planner
found; and what a user sees: the plan, errors, stopping, running again."""

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af
from actorflow.runtime.plan.sharing import SHARED_KEY

CPU = af.device("cpu")


@st.composite
def dags(draw):
    n_sources = draw(st.integers(1, 2))
    n = draw(st.integers(n_sources + 1, 9))
    pieces = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        length = draw(st.integers(1, 48))
        if i < n_sources:
            # sources of one length, or (sometimes) one that runs out earlier
            nodes.append(
                {
                    "inputs": [],
                    "len": length,
                    "kind": "source",
                    "pieces": pieces - (draw(st.integers(0, 1)) if i else 0),
                }
            )
            continue
        k = draw(st.integers(1, min(2, i)))
        ins = sorted(draw(st.sets(st.integers(0, i - 1), min_size=k, max_size=k)))
        kind = draw(st.sampled_from(["inline", "thread", "timed", "async", "op"]))
        if kind == "op":
            ins = ins[:1]
            length = nodes[ins[0]]["len"]
        nodes.append({"inputs": ins, "len": length, "kind": kind})
    consumed = {j for node in nodes for j in node["inputs"]}
    sinks = [i for i in range(n) if i not in consumed]
    return {
        "nodes": nodes,
        "sinks": sinks,
        "buffers": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**16)),
        "where": draw(st.integers(0, 20)) / 20,
    }


def build(case, memory=None, share="auto", device="cpu"):
    g = af.ActorGraph(memory=memory, buffers=case["buffers"], seed=case["seed"], share=share)
    made = []
    for i, node in enumerate(case["nodes"]):
        spec = af.Spec((node["len"],), af.float64, device)
        ins = [made[j] for j in node["inputs"]]
        if node["kind"] == "source":
            items = [np.full(node["len"], p + 100.0 * i) for p in range(node["pieces"])]
            a = g.source(items, out=spec, name=f"n{i}", inline=i % 2 == 0)
        elif node["kind"] == "op":
            a = g.op(lambda x, i=i: x * 0.5 + float(i), *ins, name=f"n{i}")
        else:
            a = g.actor(
                stage(i, node["len"], node["kind"]),
                *ins,
                out=spec,
                name=f"n{i}",
                inline=node["kind"] == "inline",
                time=(lambda p: 0.0003 * (p % 3)) if node["kind"] == "timed" else None,
            )
        made.append(a)
    for i in case["sinks"]:
        g.sink(made[i], f"s{i}")
    return g


def stage(i, length, kind):
    def value(xs):
        if any(x is None for x in xs):  # the null device: no data
            return None
        return np.full(length, sum(float(x.sum()) for x in xs) * 0.5 + i)

    if kind == "async":

        async def f(*xs):
            await asyncio.sleep(0)
            return value(xs)
    else:

        def f(*xs):
            return value(xs)

    return f


def reference(case):
    nodes = case["nodes"]
    n_pieces = min(node["pieces"] for node in nodes if node["kind"] == "source")
    outs = []
    for p in range(n_pieces):
        vals = []
        for i, node in enumerate(nodes):
            xs = [vals[j] for j in node["inputs"]]
            if node["kind"] == "source":
                vals.append(np.full(node["len"], p + 100.0 * i))
            elif node["kind"] == "op":
                vals.append(xs[0] * 0.5 + float(i))
            else:
                vals.append(np.full(node["len"], sum(float(x.sum()) for x in xs) * 0.5 + i))
        outs.append({f"s{i}": vals[i] for i in case["sinks"]})
    return outs


def budgets(case, device="cpu"):
    """(smallest peak the planner finds, every register side by side)."""
    dev = af.device(device)
    shared = build(case, share=True, device=device).plan().totals[dev]
    unshared = build(case, share=False, device=device).plan().totals[dev]
    return shared, unshared


def as_dict(out, case):
    return out if isinstance(out, dict) else {f"s{case['sinks'][0]}": out}


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_under_random_budgets_on_real_data(case):
    low, high = budgets(case)
    assert low <= high
    # where == 0: 8 bytes below the minimum found; else between it and side by side
    budget = low - 8 if case["where"] == 0 else int(low + (high - low) * case["where"])
    g = build(case, memory={"cpu": budget})
    if budget < low:
        with pytest.raises(af.PlanError) as info:
            g.plan()
        assert info.value.needed == low > budget  # it names the minimum found
        return
    plan = g.plan()
    assert plan.totals[CPU] <= budget
    assert (plan.sharing is not None) == (budget < high)  # shared only when needed
    outs = [as_dict(o, case) for o in g.run()]
    ref = reference(case)
    assert len(outs) == len(ref)
    for got, want in zip(outs, ref, strict=True):
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    m = g.stats().memory["cpu"]
    assert m["peak"] <= budget
    if plan.sharing is not None:
        assert m["live"] <= m["planned"] == plan.totals[CPU]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_under_random_budgets_on_the_null_device(case):
    for node in case["nodes"]:
        if node["kind"] == "op":
            node["kind"] = "timed"  # (ops compute; null has no data)
    low, high = budgets(case, "null")
    budget = int(low + (high - low) * case["where"])
    g = build(case, memory={"null": budget}, device="null")
    outs = list(g.run())
    n_pieces = min(node["pieces"] for node in case["nodes"] if node["kind"] == "source")
    assert len(outs) == n_pieces
    s = g.stats()
    assert s.state == "finished"
    assert s.memory["null"]["peak"] <= budget


def chain_graph(memory, share="auto", stage_fn=None, n=4, pieces=6):
    """source -> s1 -> ... -> sink, every register 8 KiB: side by side n+1 of them per
    buffer, shared two per buffer."""
    g = af.ActorGraph(memory=memory, buffers=2, share=share)
    x = g.source(
        [np.full(1024, float(p)) for p in range(pieces)],
        out=af.Spec((1024,), af.float64),
        name="load",
    )
    for i in range(n):
        fn = stage_fn or (lambda v: v + 1.0)
        x = g.actor(fn, x, out=af.Spec((1024,), af.float64), name=f"s{i}")
    g.sink(x, "out")
    return g


def test_a_budget_above_the_unshared_sum_changes_nothing():
    g = chain_graph({"cpu": "1MiB"})
    plan = g.plan()
    assert plan.sharing is None and "shared" not in plan.table()
    assert [float(o[0]) for o in g.run()] == [p + 4.0 for p in range(6)]


def test_a_chain_shares_two_registers_per_wave_and_keeps_its_values():
    g = chain_graph({"cpu": "40KiB"})  # side by side: 5 x 2 x 8 KiB = 80 KiB
    plan = g.plan()
    assert plan.sharing is not None and plan.totals[CPU] == 32 * 1024
    text = plan.table()
    assert "shared registers" in text and "2 waves of 16.0 KiB" in text
    outs = [float(o[0]) for o in g.run()]
    assert outs == [p + 4.0 for p in range(6)]
    m = g.stats().memory["cpu"]
    assert m["peak"] == m["planned"] == 32 * 1024 and m["live"] <= 32 * 1024
    assert "registers in use at once" in g.stats().table()


def test_share_true_shares_even_when_it_fits_and_false_refuses():
    g = chain_graph({"cpu": "1MiB"}, share=True)
    assert g.plan().sharing is not None
    with pytest.raises(af.PlanError, match="buffers=1 for every actor would fit"):
        chain_graph({"cpu": "40KiB"}, share=False).plan()
    with pytest.raises(ValueError, match="share must be"):
        af.ActorGraph(share="yes")


def test_below_the_minimum_the_plan_names_it_and_the_buffers_that_fit():
    with pytest.raises(af.PlanError) as info:
        chain_graph({"cpu": "20KiB"}).plan()  # 2 waves x 16 KiB needed
    msg = str(info.value)
    assert "need 32.0 KiB" in msg and "instead of 80.0 KiB side by side" in msg
    assert "the smallest any order and placement allow" in msg
    assert info.value.fitting_buffers == 1 and "buffers=1 for every actor would fit" in msg


def test_a_run_without_plan_sizes_from_piece_0_then_shares_as_plan_would():
    # 5 x 2 registers of 8 KiB: 80 KiB side by side, 32 KiB shared by lifetime
    g = af.ActorGraph(memory={"cpu": "40KiB"}, buffers=2)
    x = g.source([np.full(1024, float(p)) for p in range(3)], name="load")
    for i in range(4):
        x = g.actor(lambda v: v + 1.0, x, name=f"s{i}")
    g.sink(x)
    assert [float(o[0]) for o in g.run()] == [p + 4.0 for p in range(3)]
    m = g.stats().memory["cpu"]
    assert m["planned"] == m["peak"] == 32 * 1024 and m["live"] <= m["planned"]
    g.plan()  # the same plan, sized before the run
    assert [float(o[0]) for o in g.run()] == [p + 4.0 for p in range(3)]
    assert g.stats().memory["cpu"]["planned"] == 32 * 1024


def test_an_error_in_a_shared_run_frees_the_arena_and_the_graph_runs_again():
    calls = {"n": 0}

    def flaky(v):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("bad piece")
        return v + 1.0

    g = chain_graph({"cpu": "40KiB"}, stage_fn=flaky)
    with pytest.raises(af.ActorError, match="bad piece"):
        list(g.run())
    g.join(10)
    assert g.stats().state == "failed"
    calls["n"] = -100
    outs = [float(o[0]) for o in g.run()]
    assert outs == [p + 4.0 for p in range(6)]


def test_break_abandons_a_running_act_and_keeps_the_arena_until_it_returns():
    import threading

    release = threading.Event()
    entered = threading.Event()

    def slow(v):
        if float(v[0]) >= 2.0:
            entered.set()
            release.wait(10)
        return v + 1.0

    g = chain_graph({"cpu": "40KiB"}, stage_fn=slow, n=2)
    for _ in g.run():
        if entered.wait(10):
            break
    held = g._stragglers.keys
    assert SHARED_KEY in held  # the running act's register is in it
    release.set()
    assert g.join(10)
    outs = [float(o[0]) for o in chain_graph({"cpu": "40KiB"}, n=2).run()]
    assert outs == [p + 2.0 for p in range(6)]


def test_sources_of_different_lengths_end_a_shared_run():
    # n0 runs out after 2 pieces, n1 after 5; n2 reads both; n3 reads n1 alone
    g = af.ActorGraph(memory={"cpu": 3 * 8192}, buffers=1, seed=1)
    spec = af.Spec((1024,), af.float64)
    a = g.source([np.full(1024, 1.0)] * 2, out=spec, name="n0")
    b = g.source([np.full(1024, 2.0)] * 5, out=spec, name="n1")
    c = g.actor(lambda x, y: x + y, a, b, out=spec, name="n2")
    d = g.actor(lambda y: y * 2, b, out=spec, name="n3")
    g.sink(c, "c")
    g.sink(d, "d")
    assert g.plan().sharing is not None
    outs = list(g.run())
    assert len(outs) == 2 and float(outs[1]["c"][0]) == 3.0 and float(outs[1]["d"][0]) == 4.0
    assert g.stats().state == "finished"


# -- regressions found in review -------------------------------------------------------------


def test_a_traced_output_and_a_view_of_it_come_out_as_two_arrays():
    @af.trace
    def f(x):
        t = x * 2.0
        return t, t[0], t

    g = f.actor_graph(af.Spec((3, 4), af.float32))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t, t0, again = next(iter(g.run(feed=[x])))
    assert t.shape == (3, 4) and t0.shape == (4,)
    np.testing.assert_array_equal(t, x * 2)
    np.testing.assert_array_equal(t0, x[0] * 2)
    assert again is not t  # each output its own copy, as before


def test_state_gates_order_the_shared_plan():
    # R reads state s, W writes it: the run's gates make W wait for R on every piece, so
    # the plan must not have R wait for bytes only W's piece frees (a stall before)
    big, small = af.Spec((1024,), af.float64), af.Spec((1,), af.float64)
    g = af.ActorGraph(memory={"cpu": 8192 * 2 + 8 * 2}, buffers=1)
    src = g.source([np.full(1024, float(p)) for p in range(4)], out=big, name="src")
    x = g.actor(lambda v: v + 1, src, out=big, name="X")
    w = g.actor(lambda v: v[:1], x, out=small, name="W")
    w.state_writes = ("s",)
    r = g.actor(lambda v: v * 2, src, out=big, name="R")
    r.state_reads = ("s",)
    rs = g.actor(lambda v: v[:1] * 1, r, out=small, name="S")
    g.sink(w, "w")
    g.sink(rs, "r")
    plan = g.plan()  # shared: R before W, or a stall
    assert plan.sharing is not None
    order = [plan.sharing.nodes[i].name for i in plan.sharing.share.order]
    assert order.index("R") < order.index("W")
    assert [float(o["r"][0]) for o in g.run()] == [0.0, 2.0, 4.0, 6.0]


def test_nn_graph_run_shares_registers_and_equals_the_unbudgeted_run():
    from actorflow import nn, optim

    def make():
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(af.tensor(np.ones(1024, np.float32)))

            def forward(self, x):
                return (x + self.w).sum()

        m = M()
        opt = optim.SGD(m.parameters(), lr=0.01)

        class Step(nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)

            def build(self, x):
                loss = self.m(x)
                loss.backward()
                return loss

        return Step(), m

    xs = [np.full((4, 1024), 0.1, np.float32) for _ in range(4)]
    step, m = make()
    ref = [float(v) for v in step.run(xs, buffers=1)]
    w_ref = m.w.numpy().copy()
    step, m = make()
    got = [float(v) for v in step.run(xs, buffers=1, memory={"cpu": 42000})]
    assert step._graph.stats().memory["cpu"]["live"] is not None  # it shared
    assert got == ref and np.array_equal(m.w.numpy(), w_ref)


def test_two_devices_fit_exactly_what_sharing_on_them_needs():
    def build(memory=None, share="auto"):
        def s(n, d):
            return af.Spec((n,), af.float32, d)

        g = af.ActorGraph(memory=memory, buffers=1, share=share)
        n0 = g.source([None] * 7, out=(s(512, "null"), s(8, "null:1")), name="n0")
        n1 = g.source([None] * 6, out=s(512, "null"), name="n1", buffers=2)
        n2 = g.actor(lambda *x: None, n0, n1, out=(s(512, "null"), s(512, "null:1")), name="n2")
        n3 = g.actor(lambda *x: None, n2, out=(s(8, "null"), s(8, "null:1")), name="n3")
        n4 = g.actor(lambda *x: None, n2, out=s(512, "null:1"), name="n4")
        n5 = g.actor(lambda *x: None, n0, n1, n4, out=s(64, "null:1"), name="n5")
        for a in (n0, n1, n2, n3, n5):
            g.sink(a)
        return g

    need = {str(d): b for d, b in build(share=True).plan().totals.items()}
    g = build(memory=need)
    assert {str(d): b for d, b in g.plan().totals.items()} == need
    assert len(list(g.run())) == 6


def test_an_actor_with_an_empty_output_among_sharing_ones():
    spec = af.Spec((1024,), af.float64)
    g = af.ActorGraph(memory={"cpu": "40KiB"}, buffers=2)
    x = g.source([np.full(1024, float(p)) for p in range(3)], out=spec, name="load")
    e = g.actor(lambda v: np.zeros(0), x, out=af.Spec((0,), af.float64), name="empty")
    y = g.actor(lambda v, _: v + 1, x, e, out=spec, name="y")
    g.sink(g.actor(lambda v: v * 2, y, out=spec, name="z"))
    assert g.plan().sharing is not None
    assert [float(o[0]) for o in g.run()] == [2.0, 4.0, 6.0]
