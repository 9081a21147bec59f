"""The fast defaults: registers per output chosen by the plan where none are given (at
least two: double buffering), said in the plan; sizing stages by piece 0 linear in the
graph's size, and a rerun with piece 0 of the same layout sized as the last run was."""

import numpy as np
import pytest

import actorflow as af
from actorflow.runtime.graph.actors import StageActor
from actorflow.runtime.plan import reservation

CPU = af.device("cpu")


def counts(plan):
    return {r["name"]: r["buffers"] for r in plan.rows}


def tiny_pipeline(**kw):
    pieces = [np.full(4, i, np.float32) for i in range(20)]
    return af.Pipeline(
        [lambda: iter(pieces), lambda x: x + 1, lambda x: x * 2], names=["load", "inc", "dbl"], **kw
    )


def test_the_default_is_chosen_by_the_plan_at_least_two_per_output():
    plan = tiny_pipeline().plan()
    # small registers next to short acts on threads: the hand-off registers of "auto"
    assert counts(plan) == {"load": 16, "inc": 16, "dbl": 16}
    assert all(r["auto"] for r in plan.rows)
    big = af.Pipeline([lambda: iter([np.zeros(32 * 1024, np.float32)] * 3), lambda x: x + 1])
    assert set(counts(big.plan()).values()) == {2}  # 128 KiB registers: the floor
    wide = af.ActorGraph()
    x = wide.source([np.zeros(4)] * 6, name="load")
    wide.sink(wide.actor(lambda v: v, x, name="slow", replicas=3, time=0.01))
    assert counts(wide.plan()) == {"load": 3, "slow": 3}  # as many as 3 replicas take
    g = tiny_pipeline()
    assert [float(o[0]) for o in g.run()] == [2.0 * (p + 1) for p in range(20)]
    # the run sized them as piece 0 flowed, with the same counts: 16 registers of 16 B each
    assert g.stats().memory["cpu"]["planned"] == 3 * 16 * 16


def test_the_plan_says_what_it_chose():
    text = tiny_pipeline().plan().table()
    assert "16 auto" in text and 'the default, "auto" with double buffering' in text
    text = tiny_pipeline(buffers=2).plan().table()
    assert "auto" not in text


def test_explicit_buffers_mean_exactly_that_many():
    assert set(counts(tiny_pipeline(buffers=2).plan()).values()) == {2}
    assert counts(tiny_pipeline(buffers=[1, 3, 5]).plan()) == {"load": 1, "inc": 3, "dbl": 5}
    plan = tiny_pipeline(buffers=2).plan()
    assert not any(r["auto"] for r in plan.rows)
    g = af.ActorGraph(buffers=2)
    x = g.source([np.zeros(4)] * 3, name="load", buffers=4)
    g.sink(g.actor(lambda v: v, x, name="s"))
    assert counts(g.plan()) == {"load": 4, "s": 2}


def test_the_default_stays_within_the_budget_and_shares_below_two_each():
    spec = af.Spec((256,), af.float64)  # 2 KiB registers

    def chain(budget):
        g = af.ActorGraph(memory={"cpu": budget})
        x = g.source([np.zeros(256)] * 4, out=spec, name="load")
        for i in range(3):
            x = g.actor(lambda v: v + 1, x, out=spec, name=f"s{i}")
        g.sink(x)
        return g

    plan = chain(40 * 1024).plan()  # 2 each need 16 KiB: room for 20
    c = counts(plan)
    assert plan.sharing is None and plan.totals[CPU] <= 40 * 1024
    assert min(c.values()) >= 2 and sum(c.values()) == 20
    plan = chain(12 * 1024).plan()  # 2 each do not fit: shared, as before
    assert plan.sharing is not None and set(counts(plan).values()) == {2}
    g = chain(12 * 1024)
    assert [float(o[0]) for o in g.run()] == [3.0] * 4


def lazy_chain(n, source):
    g = af.ActorGraph()
    x = g.source(source, inline=True, name="load")
    for i in range(n - 1):
        x = g.actor(lambda v: v + 1, x, inline=True, name=f"s{i}")
    g.sink(x)
    return g


@pytest.fixture
def run_with_plan(monkeypatch):
    """``run(g)``: (the plan the run of ``g`` used, its outputs)."""
    made = []
    allocate = reservation.Plan.allocate
    monkeypatch.setattr(
        reservation.Plan, "allocate", lambda plan: made.append(plan) or allocate(plan)
    )

    def run(g):
        outs = list(g.run())
        return made[-1], outs

    return run


def test_sizing_by_piece_0_is_linear_in_the_actors(monkeypatch, run_with_plan):
    told = []
    describe = StageActor.describe
    monkeypatch.setattr(StageActor, "describe", lambda a: told.append(a) or describe(a))
    n = 40
    g = lazy_chain(n, lambda: iter([np.zeros(4)] * 2))
    plan, outs = run_with_plan(g)
    assert len(outs) == 2 and float(outs[0][0]) == n - 1
    assert told == [] and plan.row_builds == 0  # rows are built when read, not per size
    assert len(plan.rows) == n and plan.row_builds == n and len(told) == n - 1
    _ = plan.rows  # read again
    assert plan.row_builds == n  # once each


def test_a_rerun_reuses_the_sizes_and_sizes_again_when_piece_0_changes(run_with_plan):
    shape = {"n": 4}
    g = lazy_chain(6, lambda: iter([np.zeros(shape["n"])] * 3))
    first, _ = run_with_plan(g)
    assert first.reused == 0
    again, outs = run_with_plan(g)
    assert again.reused == 6 and [o.shape for o in outs] == [(4,)] * 3
    assert again.totals[CPU] == first.totals[CPU]
    shape["n"] = 8  # piece 0 has another layout: sized again
    other, outs = run_with_plan(g)
    assert other.reused == 0 and [o.shape for o in outs] == [(8,)] * 3
    assert other.totals[CPU] == 2 * first.totals[CPU]
    g.sink(g.actor(lambda v: v * 2, g.actors[-1], name="more", inline=True), "more")
    changed, outs = run_with_plan(g)  # a new actor is sized, the rest reused
    assert changed.reused == 6 and float(outs[0]["more"][0]) == 10.0
    bad = lazy_chain(2, lambda: iter([np.zeros(8), np.zeros(4)]))
    with pytest.raises(
        af.ActorError,
        match=r"\(piece 1\) returned float64\[4\] but its "
        r"register holds float64\[8\]",
    ):
        list(bad.run())
