"""Piped thread stages: a chain of thread stages fed by one source passes pieces from
thread to thread without the loop, with the same registers, credits, errors and stops."""

import threading

import numpy as np
import pytest

import actorflow as af


def chain(n=5, pieces=50, fn=None, buffers=2, memory=None, out=True):
    g = af.ActorGraph(buffers=buffers, memory=memory)
    x = g.source(
        [np.full(8, float(p)) for p in range(pieces)],
        out=af.Spec((8,), af.float64) if out else None,
        name="load",
    )
    for i in range(n):
        x = g.actor(
            fn or (lambda v: v + 1.0),
            x,
            name=f"s{i}",
            out=af.Spec((8,), af.float64) if out else None,
        )
    g.sink(x, "out")
    return g


def modes(g):
    return {n: r["mode"] for n, r in g.stats().actors.items()}


@pytest.mark.parametrize("buffers", [1, 2, 4])
@pytest.mark.parametrize("declared", [True, False])
def test_a_chain_of_thread_stages_is_piped_and_exact(buffers, declared):
    g = chain(buffers=buffers, out=declared)
    outs = [float(o[0]) for o in g.run()]
    assert outs == [p + 5.0 for p in range(50)]
    m = modes(g)
    assert all(m[f"s{i}"] == "pipe" for i in range(5))
    s = g.stats()
    assert all(s.actors[f"s{i}"]["acts"] == 50 for i in range(5))
    assert s.memory["cpu"]["peak"] == s.memory["cpu"]["planned"]
    assert "pipe" in s.table()


def test_credits_still_bound_the_pieces_in_flight():
    inside, most, lock = [0], [0], threading.Lock()

    def enter(v):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        return v

    def leave(v):
        with lock:
            inside[0] -= 1
        threading.Event().wait(0.001)
        return v

    g = af.ActorGraph(buffers=2)
    spec = af.Spec((4,), af.float64)  # (sized up front: no one-off piece-0 register)
    x = g.source([np.zeros(4)] * 40, out=spec)
    a = g.actor(enter, x, name="enter", out=spec)
    b = g.actor(lambda v: v, a, name="mid", out=spec)
    g.sink(g.actor(leave, b, name="leave", out=spec))
    assert len(list(g.run())) == 40
    assert set(modes(g)[k] for k in ("enter", "mid", "leave")) == {"pipe"}
    # between enter and leave: enter's 2 registers and mid's 2 (and the one leave holds
    # is one of mid's): never more pieces than registers
    assert most[0] <= 4


def test_an_error_in_a_piped_stage_names_it_and_the_graph_runs_again():
    bad = {"at": 7}

    def f(v):
        if float(v[0]) == bad["at"]:
            raise ValueError("seven")
        return v

    g = chain(fn=f)
    with pytest.raises(af.ActorError, match="seven") as info:
        list(g.run())
    assert info.value.actor == "s0" and info.value.piece == 7
    bad["at"] = -1
    assert len(list(g.run())) == 50


def test_break_abandons_a_running_piped_act_and_the_next_run_waits_for_it():
    release, entered = threading.Event(), threading.Event()

    def slow(v):
        if float(v[0]) == 3.0:
            entered.set()
            release.wait(10)
        return v

    g = chain(fn=slow, n=3)
    for _ in g.run():
        if entered.wait(10):
            break
    assert g.stats().state == "stopped"
    assert any(name == "s0" for name, _ in g.stats().abandoned)
    release.set()
    assert g.join(10)
    assert len(list(g.run())) == 50


def test_async_consumer_cancel_stops_piped_stages():
    import asyncio

    async def main():
        g = chain(n=3, pieces=10_000)
        got = 0
        async for _ in g.run_async():
            got += 1
            if got == 5:
                break
        await g.join_async()
        return g.stats().state

    assert asyncio.run(main()) in ("stopped", "finished")


def test_two_sources_or_a_fan_out_fall_back_to_the_loop():
    g = af.ActorGraph()
    a = g.source([np.ones(2)] * 5, out=af.Spec((2,), af.float64), name="a")
    b = g.source([np.ones(2)] * 5, out=af.Spec((2,), af.float64), name="b")
    c = g.actor(lambda x: x * 2, a, name="c")
    g.sink(g.actor(lambda x, y: x + y, c, b, name="d"))
    assert [float(o[0]) for o in g.run()] == [3.0] * 5
    assert modes(g)["c"] == "thread"  # two sources: none is piped
    g = af.ActorGraph()
    a = g.source([np.ones(2)] * 5, out=af.Spec((2,), af.float64), name="a")
    c = g.actor(lambda x: x * 2, a, name="c")
    d = g.actor(lambda x: x + 1, c, name="d")
    e = g.actor(lambda x: x - 1, c, name="e")
    g.sink(g.actor(lambda x, y: x + y, d, e, name="f"))
    assert [float(o[0]) for o in g.run()] == [4.0] * 5
    m = modes(g)
    assert m["c"] == "thread" and m["d"] == "pipe" and m["e"] == "pipe"


def test_a_lazy_plan_sizes_piped_stages_from_piece_zero_and_refuses_over_budget():
    # (share=False: each stage's registers are allocated as its piece 0 is sized; with
    # sharing, a run sizes every stage first and shares them, see test_sharing.py)
    g = chain(out=False, memory={"cpu": 2 * 8 * 8 * 3})  # 6 registers of 64 B fit
    g.share = False
    with pytest.raises(af.PlanError):
        list(g.run())
    g = chain(out=False, n=2, memory={"cpu": 2 * 8 * 8 * 3})
    g.share = False
    assert [float(o[0]) for o in g.run()] == [p + 2.0 for p in range(50)]
    assert modes(g)["s0"] == "pipe"


def test_a_stage_with_no_inputs_counts_as_a_second_source():
    # z never ends by itself: it stops when its readers close, which a piped reader of it
    # never did (the run delivered everything, then hung with b spinning)
    g = af.ActorGraph()
    x = g.source(
        [np.full(3, float(p)) for p in range(5)], out=af.Spec((3,), af.float64), name="src"
    )
    z = g.actor(lambda: np.ones(3), name="z", out=af.Spec((3,), af.float64))
    b = g.actor(lambda v: v * 10.0, z, name="b", out=af.Spec((3,), af.float64))
    a = g.actor(lambda v: v + 1.0, x, name="a")
    g.sink(g.actor(lambda p, q: p + q, a, b, name="f"))
    assert [float(o[0]) for o in g.run()] == [11.0, 12.0, 13.0, 14.0, 15.0]
    assert g.stats().state == "finished" and modes(g)["b"] == "thread"


def test_a_piped_stage_counts_the_wait_a_stop_cut_short():
    import time

    def src():
        yield np.zeros(8)
        time.sleep(0.3)
        yield np.zeros(8)

    g = af.ActorGraph()
    g.sink(g.actor(lambda v: v, g.source(src, out=af.Spec((8,), af.float64)), name="s"))
    for _ in g.run():
        time.sleep(0.2)
        break
    r = g.stats().actors["s"]
    assert r["mode"] == "pipe" and r["wait_input_s"] > 0.1


def test_a_stall_among_piped_stages_is_named_not_a_hang():
    # piped threads wait on their queues, not on the loop: a stall there (impossible by
    # construction; made here by taking a stage's credits away) is found by the run's
    # periodic look and raised as a DeadlockError naming who waits for whom
    g = chain(n=3, pieces=20, buffers=2)
    stolen = []

    def steal(v):
        sched = g._current[0]
        st = next(s for s in sched.actor_runs if s.actor.name == "s2")
        if not stolen:  # its credits, as they come home
            stolen.append(st.out.pipe.get())
            stolen.append(st.out.pipe.get())
        return v + 1.0

    g = chain(n=3, pieces=20, buffers=2)
    g.actors[1].fn = steal  # s0 takes s2's registers away on piece 0
    with pytest.raises(af.DeadlockError, match="s2 waits for a free register") as info:
        list(g.run())
    # the loop knows where each register of the chain is: s1's two are with s2
    assert "s1 waits for a free register (#0 at s2 (piece 0), #1 at s2 (piece 1))" in str(
        info.value
    )


# -- the source and the output of a piped chain ---------------------------------------------


def loop_handled(monkeypatch):
    """Counts what the loop does per piece: acts it sends to a thread, registers it sends
    on or takes home."""
    from actorflow.runtime.sched.credit import CreditScheduler

    n = [0]
    for meth in ("_dispatch", "_send", "_hand_back"):
        orig = getattr(CreditScheduler, meth)

        def counted(self, *a, _orig=orig):
            n[0] += 1
            return _orig(self, *a)

        monkeypatch.setattr(CreditScheduler, meth, counted)
    return n


@pytest.mark.parametrize("declared", [True, False])
def test_the_source_and_output_of_a_piped_chain_do_not_go_through_the_loop(monkeypatch, declared):
    g = chain(n=3, pieces=200, buffers=2, out=declared)
    n = loop_handled(monkeypatch)
    outs = [float(o[0]) for o in g.run()]
    assert outs == [p + 3.0 for p in range(200)]
    # registers sized up front: the loop handles no piece; sized by piece 0: only piece 0
    # (the loop used to send each act to the source's thread and two registers on)
    assert n[0] == 0 if declared else n[0] <= 3 * 4, n[0]
    s = g.stats()
    assert modes(g)["load"] == "pipe"
    assert s.actors["load"]["acts"] == 200 and s.actors["(output)"]["acts"] == 200
    assert s.memory["cpu"]["peak"] == s.memory["cpu"]["planned"]


def test_a_piped_source_and_output_keep_credits_and_the_callers_room():
    import time

    taken, ahead = [0], [0]

    def src():
        for p in range(60):
            ahead[0] = max(ahead[0], p + 1 - taken[0])  # made (this one too), not taken
            yield np.full(8, float(p))

    g = af.ActorGraph(buffers=2, output_buffers=3)
    spec = af.Spec((8,), af.float64)
    x = g.source(src, out=spec, name="load")
    for i in range(2):
        x = g.actor(lambda v: v + 1.0, x, name=f"s{i}", out=spec)
    g.sink(x, "out")
    outs = []
    for o in g.run():
        time.sleep(0.002)  # a slow caller: every credit and the room fill up
        outs.append(float(o[0]))
        taken[0] += 1
    assert outs == [p + 2.0 for p in range(60)]
    assert modes(g)["load"] == "pipe"
    # 2 registers each for load, s0, s1, 3 outputs delivered and not taken, and the one
    # the caller works on (its credit went back as it took it)
    assert 6 < ahead[0] <= 6 + 3 + 1
    assert g.stats().actors["(output)"]["wait_credit_s"] > 0


def test_an_error_in_a_piped_source_names_it():
    def src():
        for p in range(20):
            if p == 6:
                raise KeyError("six")
            yield np.full(8, float(p))

    g = af.ActorGraph(buffers=2)
    x = g.source(src, out=af.Spec((8,), af.float64), name="load")
    g.sink(g.actor(lambda v: v, x, name="s0", out=af.Spec((8,), af.float64)), "out")
    got = []
    with pytest.raises(af.ActorError, match="six") as info:
        for o in g.run():
            got.append(float(o[0]))
    assert info.value.actor == "load" and info.value.piece == 6
    assert got == [float(p) for p in range(len(got))]
    assert modes(g)["load"] == "pipe"


@pytest.mark.parametrize("how", ["break", "close"])
def test_stopping_a_piped_output_leaves_no_thread_behind(how):
    g = chain(n=2, pieces=100_000, buffers=2)
    g.output_buffers = 2
    it = g.run()
    for k, _ in enumerate(it):
        if k == 5:
            break
    if how == "close":
        it.close()
    else:
        del it
    assert g.join(10)
    names = {"actorflow-load", "actorflow-s0", "actorflow-s1"}
    for _ in range(100):
        if not any(t.name in names for t in threading.enumerate()):
            break
        threading.Event().wait(0.05)
    assert not any(t.name in names for t in threading.enumerate())
    assert g.stats().state == "stopped"
    assert [float(o[0]) for o in chain(n=2, pieces=7).run()] == [p + 2.0 for p in range(7)]


def test_a_piped_output_records_each_act_in_the_trace(tmp_path):
    import json
    from collections import Counter

    g = chain(n=2, pieces=30, out=False)
    assert len(list(g.run(trace=tmp_path / "t.json"))) == 30
    evs = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    named = {
        e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    acts = Counter(named[e["tid"]] for e in evs if e["ph"] == "X" and e["cat"] == "act")
    assert acts == {"load": 30, "s0": 30, "s1": 30, "(output)": 30}
    starts = {e["id"] for e in evs if e["ph"] == "s"}
    assert starts == {e["id"] for e in evs if e["ph"] == "f"}  # every register read


def test_an_error_copying_a_piped_output_names_the_output(monkeypatch):
    from actorflow.runtime.graph.actors import Collector

    part = Collector.part

    def bad(self, k, x):
        if float(x[0]) == 6.0:  # piece 5 (+ 1)
            raise RuntimeError("bad copy")
        return part(self, k, x)

    monkeypatch.setattr(Collector, "part", bad)
    g = chain(n=1, pieces=20)
    with pytest.raises(af.ActorError, match="bad copy") as info:
        list(g.run())
    assert info.value.actor == "(output)" and info.value.piece == 5
    assert g.join(10) and g.stats().state == "failed"
    monkeypatch.setattr(Collector, "part", part)
    assert len(list(g.run())) == 20
