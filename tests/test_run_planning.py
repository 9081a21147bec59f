"""What a run plans without ``plan()`` first: under a budget, stages sized by piece 0 are
sized as it flows, then every register is planned at once and shared by lifetime where the
budget needs it, as ``plan()`` would; a run is refused only below the planner's minimum.
Also the checks of what a run is given (``timeout=``, ``Pipeline(replicas=...)``)."""

import asyncio

import numpy as np
import pytest

import actorflow as af

MiB = 1 << 20


def four(budget="16MiB", buffers=1, pieces=4, calls=None):
    """A source of 1 MiB pieces and four stages whose sizes only piece 0 tells (5, 6, 4
    and 2 MiB): 18 MiB side by side, 11 MiB shared by lifetime (a and b live at once)."""

    def stage(name, mib, f):
        def fn(x):
            if calls is not None:
                calls.append((name, float(x[0])))
            return np.full(mib * MiB // 8, f(float(x[0])))

        return fn

    g = af.ActorGraph(memory={"cpu": budget}, buffers=buffers)
    x = g.source(
        lambda: (np.full(MiB // 8, float(p)) for p in range(pieces)),
        name="load",
        out=af.Spec((MiB // 8,), af.float64),
    )
    x = g.actor(stage("a", 5, lambda v: v + 1), x, name="a")
    x = g.actor(stage("b", 6, lambda v: v * 2), x, name="b")
    x = g.actor(stage("c", 4, lambda v: v - 1), x, name="c")
    g.sink(g.actor(stage("d", 2, lambda v: v * 10), x, name="d"))
    return g


def want(pieces):
    return [((p + 1) * 2 - 1) * 10.0 for p in range(pieces)]


def test_run_without_plan_shares_registers_a_budget_needs():
    calls = []
    g = four(calls=calls)
    outs = list(g.run())
    assert [float(o[0]) for o in outs] == want(4)
    assert [o.shape for o in outs] == [(2 * MiB // 8,)] * 4
    assert calls.count(("a", 0.0)) == 1  # piece 0 computed once, in the run
    m = g.stats().memory["cpu"]
    assert m["planned"] == m["peak"] == 11 * MiB  # the planner's, not 18 MiB side by side
    assert m["live"] <= m["planned"] <= 16 * MiB
    af.testing.assert_peak_within(g, "16MiB")
    assert g.stats().state == "finished"
    planned = four().plan()  # what plan() makes: the same bytes
    assert planned.totals[af.device("cpu")] == 11 * MiB and planned.sharing is not None


def test_run_below_the_planners_minimum_is_refused_naming_it():
    g = four("10MiB")
    got = []
    with pytest.raises(af.PlanError) as info:
        for out in g.run():
            got.append(out)
    assert got == []  # nothing delivered before the plan
    text = str(info.value)
    assert "need 11.0 MiB (11534336 B) but the budget is 10.0 MiB" in text
    assert "instead of 18.0 MiB side by side" in text
    assert "even buffers=1 needs 11.0 MiB" in text
    assert "call g.plan()" not in text
    assert info.value.needed == 11 * MiB and info.value.budget == 10 * MiB
    assert g.stats().state == "failed"
    g.memory["cpu"] = "12MiB"  # the graph runs again
    assert [float(o[0]) for o in g.run()] == want(4)


def test_run_says_which_buffers_fit_when_two_do_not():
    with pytest.raises(af.PlanError) as info:
        list(four(buffers=2).run())  # 2 waves of 11 MiB
    assert "buffers=1 for every actor would fit (11.0 MiB)" in str(info.value)
    assert info.value.fitting_buffers == 1
    g = four("24MiB", buffers=2, pieces=12)
    assert [float(o[0]) for o in g.run()] == want(12)
    assert g.stats().memory["cpu"]["planned"] == 22 * MiB


def test_auto_buffers_fit_the_same_budget():
    g = four(buffers="auto", pieces=6)
    assert [float(o[0]) for o in g.run()] == want(6)
    m = g.stats().memory["cpu"]
    assert m["planned"] <= 16 * MiB and m["peak"] <= 16 * MiB


async def test_run_async_plans_the_same_way():
    g = four(pieces=5)
    outs = [float(o[0]) async for o in g.run_async()]
    assert outs == want(5)
    assert g.stats().memory["cpu"]["planned"] == 11 * MiB


def test_a_budget_that_fits_side_by_side_still_pipes_the_chain():
    g = four("64MiB", buffers=2, pieces=20)
    assert [float(o[0]) for o in g.run()] == want(20)
    stats = g.stats()
    assert stats.memory["cpu"]["planned"] == 36 * MiB and stats.memory["cpu"]["live"] is None
    assert {stats.actors[n]["mode"] for n in "abcd"} == {"pipe"}  # piped from piece 1


def test_run_under_a_budget_with_op_actors_async_stages_and_fan_out():
    g = af.ActorGraph(memory={"cpu": "32KiB"})  # 5 x 2 x 4000 B side by side
    src = g.source(lambda: (np.full(1000, float(p), np.float32) for p in range(6)), name="src")

    async def plus(x):
        await asyncio.sleep(0)
        return x + 1

    n = g.op(af.neg, g.actor(plus, src, name="plus"), name="neg")
    e = g.op(af.exp, src, name="e")
    g.sink(g.actor(lambda x, y: x + y[:1], n, e, name="join"))
    outs = list(g.run())
    assert [float(o[0]) for o in outs] == pytest.approx(
        [-(p + 1) + float(np.exp(np.float32(p))) for p in range(6)], rel=1e-6
    )
    m = g.stats().memory["cpu"]
    assert m["planned"] == m["peak"] == 24000  # shared: 3 registers per wave
    assert m["live"] <= m["planned"]


def test_a_stage_failing_on_piece_0_or_an_empty_source_under_a_budget():
    g = af.ActorGraph(memory={"cpu": "1MiB"})

    def bad(x):
        raise ValueError("bad piece")

    g.sink(g.actor(bad, g.source([np.ones(3)] * 3, name="load"), name="bad"))
    with pytest.raises(af.ActorError, match="bad piece") as info:
        list(g.run())
    assert info.value.actor == "bad" and info.value.piece == 0
    assert g.stats().state == "failed"
    g = af.ActorGraph(memory={"cpu": "1MiB"})
    g.sink(g.actor(lambda x: x, g.source([], name="load"), name="copy"))
    assert list(g.run()) == [] and list(g.run()) == []


def test_a_timed_out_piece_0_under_a_budget_fails_the_run_it_belongs_to():
    import threading

    gate = threading.Event()
    g = af.ActorGraph(memory={"cpu": "1MiB"})
    g.sink(
        g.actor(
            lambda x: gate.wait(10) and x,
            g.source([np.ones(3)] * 2, name="load"),
            name="stuck",
            timeout=0.1,
        )
    )
    try:
        with pytest.raises(af.ActorError, match="timeout=0.1"):
            list(g.run())
        assert g.stats().state == "failed"
    finally:
        gate.set()
        assert g.join(10)


# -- checks of what a run is given --------------------------------------------------------


@pytest.mark.parametrize("timeout", [-1, 0, 0.0, float("inf"), float("nan")])
def test_actor_timeout_must_be_seconds_above_zero(timeout):
    g = af.ActorGraph()
    with pytest.raises(ValueError) as info:
        g.actor(lambda x: x, g.source([1]), name="s", timeout=timeout)
    text = str(info.value)
    assert f"actor 's': timeout={timeout!r}" in text
    assert "must be a finite number > 0" in text and ">= 0" not in text
    assert "or None for no limit" in text


def test_actor_timeout_of_another_type_says_what_it_takes():
    g = af.ActorGraph()
    for bad in ("5", True):
        with pytest.raises(TypeError, match=r"timeout=.*a number > 0, not a (str|bool)"):
            g.source([1], name=f"s{bad}", timeout=bad)
    assert g.actor(lambda x: x, g.source([1]), timeout=0.5).timeout == 0.5


def test_testing_timeouts_must_be_seconds_above_zero():
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x, g.source([1, 2])))
    with pytest.raises(ValueError, match=r"assert_no_deadlock: timeout=-1: .* > 0"):
        af.testing.assert_no_deadlock(g, timeout=-1)
    with pytest.raises(ValueError, match=r"assert_no_deadlock: timeout=0: .* > 0"):
        af.testing.assert_no_deadlock(g.run_async(), timeout=0)
    with pytest.raises(ValueError, match=r"wait_all_actors_blocked: timeout=-1: .* > 0"):
        asyncio.run(af.testing.wait_all_actors_blocked(g, timeout=-1))
    assert len(af.testing.assert_no_deadlock(g, timeout=30)) == 2


def test_pipeline_replicas_list_says_entry_0_is_the_source():
    stages = [range(4), lambda x: x + 1, lambda x: x * 2]
    with pytest.raises(ValueError) as info:
        af.Pipeline(stages, replicas=[2, 2])
    text = str(info.value)
    assert "replicas has 2 entries ([2, 2]) but needs 3, one per entry of stages" in text
    assert "entry 0 is the source" in text and "replicas=[None, 2, 2]" in text
    with pytest.raises(
        ValueError,
        match=r"replicas\[0\] is 2, but entry 0 is the source.*"
        r"replicas=\[None, 2, 2\]",
    ):
        af.Pipeline(stages, replicas=[2, 2, 2])
    p = af.Pipeline(stages, replicas=[None, 2, 1])
    assert [int(o) for o in p.run()] == [2, 4, 6, 8]
    assert p.stats().actors[p.actors[1].name]["replicas"] == 2
