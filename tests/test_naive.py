"""The naive scheduler, the deadlock detector and the experiments' claims at small sizes."""

import asyncio
import time

import numpy as np
import pytest

import actorflow as af
from actorflow.experiments import double_buffering, figure1, random_dags
from actorflow.experiments.naive import NaiveOp, NaiveScheduler, ops_from_graph
from actorflow.runtime.sched.credit import CreditScheduler

MiB = 1 << 20
FIG1_ORDER_BAD = ["M1", "M2", "O1", "O2"]
FIG1_ORDER_GOOD = ["M1", "M2", "O2", "O1"]


def test_o1_first_deadlocks_and_names_the_cycle():
    r = NaiveScheduler(figure1.ops(0.001), "8MiB", policy=FIG1_ORDER_BAD, mode="wait").run()
    assert r.status == "deadlock" and r.completed == 2
    e = r.error
    assert isinstance(e, af.DeadlockError)
    assert str(e) == (
        "the naive scheduler deadlocked: O1 waits for 5.0 MiB on cpu (4.0 MiB "
        "free); 3.0 MiB is held by M2's output, freed when O2 finishes; O2 waits "
        "behind O1 on stream cpu:0"
    )
    assert [(a, b) for a, b, _ in e.cycle] == [("O1", "O2"), ("O2", "O1")]
    assert r.detect_s < 1.0
    assert r.peak["cpu"] == 4 * MiB


def test_o1_first_runs_out_of_memory_in_fail_mode():
    r = NaiveScheduler(figure1.ops(0.001), "8MiB", policy=FIG1_ORDER_BAD, mode="fail").run()
    assert r.status == "oom" and isinstance(r.error, af.OutOfMemoryError)
    assert "op O1 asked for 5.0 MiB" in str(r.error) and "4.0 MiB free" in str(r.error)


@pytest.mark.parametrize("mode", ["wait", "fail", "double-buffer"])
def test_o2_first_completes(mode):
    r = NaiveScheduler(figure1.ops(0.001), "8MiB", policy=FIG1_ORDER_GOOD, mode=mode).run()
    assert r.status == "ok" and r.completed == 4 and r.error is None
    assert r.peak["cpu"] == 6 * MiB
    assert r.timeline[-1][2] == 0  # every output freed at the end


def test_figure1_on_actors_is_refused_or_runs_under_its_plan():
    with pytest.raises(af.PlanError, match="even buffers=1 needs 10.0 MiB"):
        figure1.actor_graph(8 * MiB, share=False).plan()
    g = figure1.actor_graph(10 * MiB, share=False)
    outs = list(g.run())
    assert len(outs) == 1
    m = g.stats().memory["null"]
    assert m["peak"] == m["planned"] == 10 * MiB <= m["budget"]
    assert m["live"] is None  # nothing shared


def test_figure1_runs_on_actors_in_the_8_mib_pool():
    g = figure1.actor_graph(8 * MiB)
    plan = g.plan()
    assert plan.sharing is not None and plan.sharing.share.exact
    assert plan.totals[af.device("null")] == 6 * MiB == random_dags.min_peak(figure1.ops(0))
    assert plan.sharing.share.edges  # the order is kept by control edges
    outs = list(g.run())
    assert len(outs) == 1
    m = g.stats().memory["null"]
    assert m["peak"] == m["planned"] == m["live"] == 6 * MiB


def test_figure1_below_the_minimum_is_refused_naming_it():
    with pytest.raises(af.PlanError) as info:
        figure1.actor_graph(5 * MiB).plan()
    msg = str(info.value)
    assert info.value.needed == 6 * MiB and info.value.budget == 5 * MiB
    assert "need 6.0 MiB" in msg and "instead of 10.0 MiB" in msg
    assert "the smallest any order and placement allow" in msg


def test_detector_does_not_fire_on_slow_but_live_runs():
    ops = [
        NaiveOp("a", [], "1MiB", 0.3),
        NaiveOp("b", ["a"], "1MiB", 0.3),
        NaiveOp("c", ["b"], "1MiB", 0.3),
    ]
    t0 = time.perf_counter()
    r = NaiveScheduler(ops, "2MiB").run()
    assert r.status == "ok" and time.perf_counter() - t0 >= 0.9


def test_policies_and_seeds():
    ops = [NaiveOp(f"s{i}", [], "1MiB", 0.0) for i in range(6)]
    ops.append(NaiveOp("join", [o.name for o in ops], "1MiB", 0.0))
    for policy in ("fifo", "lifo", "random"):
        assert NaiveScheduler(ops, "7MiB", policy=policy, seed=1).run().status == "ok"
    a = NaiveScheduler(ops, "7MiB", policy="random", seed=3).run().timeline
    b = NaiveScheduler(ops, "7MiB", policy="random", seed=3).run().timeline
    assert [x[2] for x in a] == [x[2] for x in b]
    with pytest.raises(ValueError, match="policy"):
        NaiveScheduler(ops, "7MiB", policy="newest")
    with pytest.raises(ValueError, match="mode"):
        NaiveScheduler(ops, "7MiB", mode="pray")
    with pytest.raises(ValueError, match="not an op here"):
        NaiveScheduler([NaiveOp("x", ["y"])], "1MiB")


def test_pipeline_naive_deadlocks_and_figure3_allocator_fixes_it():
    ops = double_buffering.naive_ops()
    r = NaiveScheduler(ops, double_buffering.CAPACITY, pieces=12, time_scale=0.2).run()
    assert r.status == "deadlock"
    assert "load[6] waits for 4.0 MiB on cpu (0 B free)" in str(r.error)
    assert "waits behind load[6] on stream cpu:0" in str(r.error)
    r = NaiveScheduler(
        ops, double_buffering.CAPACITY, pieces=12, mode="double-buffer", time_scale=0.2
    ).run()
    assert r.status == "ok" and r.completed == 48 and r.stalls > 0
    assert r.peak["cpu"] <= 4 * 4 * MiB  # two buffers each for two ops


def test_double_buffering_experiment_claims():
    data = double_buffering.run(pieces=24)
    rows = {r[0]: r for r in data["rows"]}
    assert rows["naive (wait)"][1] == "deadlock" and rows["naive (fail)"][1] == "oom"
    assert rows["naive + figure 3 allocator (double-buffer)"][1] == "ok"
    one, two = rows["actors, buffers=1"], rows["actors, buffers=2"]
    assert one[1] == two[1] == "ok"
    assert two[3] == 2 * one[3]  # twice the registers
    # (that two buffers keep compute busier is a time, shown by the experiment's table,
    # not asserted here: a loaded machine would make it flaky)


def test_random_experiment_actors_never_deadlock():
    data = random_dags.run(seed=1, n=20, size=6)
    rows = {(r[0], r[1]): r for r in data["rows"]}
    actors = rows[("actors", "plan")]
    assert actors[3] == 0 and actors[4] == 0 and actors[2] + actors[5] == 20
    naive_bad = sum(r[3] + r[4] for k, r in rows.items() if k[0] != "actors")
    assert naive_bad > 0, "no naive order failed: the capacities are not tight"


def test_min_peak_is_exact_on_figure1():
    assert random_dags.min_peak(figure1.ops(0)) == 6 * MiB


def test_ops_from_graph():
    g = af.ActorGraph()
    s = g.source([np.zeros((4, 4), np.float32)] * 2, name="s", time=0.001)
    g.sink(g.op(af.exp, s, name="e"))
    ops = ops_from_graph(g)
    assert [(o.name, o.inputs, o.nbytes, o.time) for o in ops] == [
        ("s", [], 64, 0.001),
        ("e", ["s"], 64, 0.0),
    ]
    assert NaiveScheduler(ops, "1KiB", pieces=2).run().status == "ok"


async def test_actor_runtime_names_a_stall_instead_of_hanging():
    """A register lost before the run (a bug the plan normally rules out) leaves the source
    with no credit: the credit scheduler reports the stall as DeadlockError."""
    g = af.ActorGraph(buffers=1)
    s = g.source([np.zeros(2)] * 3, name="src", out=af.Spec((2,), af.float64), inline=True)
    g.sink(g.actor(lambda x: x, s, name="copy", inline=True))
    plan = g.plan()
    plan.allocate()
    try:
        plan.ports[s].free.clear()  # the lost register
        sched = CreditScheduler(plan, lambda v: None, 4)
        with pytest.raises(af.DeadlockError, match="src waits for a free register|stalled"):
            await asyncio.wait_for(sched.run(), 1.0)
    finally:
        plan.release()


def test_cli_writes_json(tmp_path, capsys):
    from actorflow.__main__ import main

    main(["experiments", "figure1", "--out", str(tmp_path), "--seed", "3"])
    out = capsys.readouterr().out
    assert "O1 waits for 5.0 MiB on cpu (4.0 MiB free)" in out
    assert (tmp_path / "figure1.json").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["experiments", "random", "--n", "-5"], "--n must be at least 1, got -5"),
        (["experiments", "double-buffering", "--pieces", "-3"], "--pieces must be at least 1"),
        (["experiments", "random", "--n", "many"], "--n must be a whole number"),
        (["experiments", "figure1", "--out", "/proc/no/such/folder"], "cannot make that folder"),
    ],
)
def test_cli_refuses_bad_arguments_with_a_message(argv, says, capsys):
    from actorflow.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_cli_says_its_version(capsys):
    from actorflow.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"actorflow {af.__version__}"


def test_ops_from_a_traced_graph():
    @af.trace
    def f(x, w):
        return af.softmax(af.relu(x @ w), dim=1)

    g = f.actor_graph(af.Spec((64, 100)), af.Spec((100, 10)))
    ops = ops_from_graph(
        g, feed=[(np.zeros((64, 100), np.float32), np.zeros((100, 10), np.float32))]
    )
    assert [o.name for o in ops] == ["inputs of f", "matmul", "relu", "softmax"]
    assert ops[0].nbytes == 4 * (6400 + 1000) and ops[1].nbytes == 4 * 640
    cap = sum(o.nbytes for o in ops[:2])
    r = NaiveScheduler(ops, cap, pieces=3, time_scale=0).run()
    assert r.status == "deadlock" and "inputs of f[1] waits for" in str(r.error)
    # one buffer per op in a pool this small: the counter does not save the naive order
    r = NaiveScheduler(ops, cap, pieces=3, mode="double-buffer", buffers=1, time_scale=0).run()
    assert r.status == "deadlock" and "waits for one of its 1 buffers" in str(r.error)


def test_the_demo_shows_eager_a_pipeline_and_the_named_deadlock(capsys):
    from actorflow.__main__ import main

    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "relu(x) =" in out  # eager tensors
    assert "Plan" in out and "Run: 40 pieces" in out  # a pipeline, plan, stats
    assert "O1 waits for 5.0 MiB on cpu (4.0 MiB free)" in out  # the deadlock, named
    assert "actors, shared by lifetime, budget 8 MiB" in out  # next to the actors


def test_ops_from_graph_sizes_a_graph_the_actors_refuse():
    """Sized, not planned: a graph over its budget still gives its ops (built once)."""
    g = af.ActorGraph(memory={"null": "3MiB"})  # 2 buffers x (1 + 2) MiB = 6 MiB
    a = g.source([None] * 3, out=af.Spec((MiB // 4,), af.float32, "null"), name="a", time=0.001)
    b = g.actor(lambda x: None, a, out=af.Spec((MiB // 2,), af.float32, "null"), name="b")
    g.sink(b)
    with pytest.raises(af.PlanError, match="budget is 3.0 MiB"):
        g.plan()
    ops = ops_from_graph(g)
    assert [(o.name, o.inputs, o.nbytes, o.time, o.device) for o in ops] == [
        ("a", [], MiB, 0.001, "null"),
        ("b", ["a"], 2 * MiB, 0.0, "null"),
    ]
    r = NaiveScheduler(ops, "3MiB", pieces=3, time_scale=0).run()
    assert r.status == "deadlock" and "b[0] waits for 2.0 MiB on null (0 B free)" in str(r.error)
    assert NaiveScheduler(ops, "9MiB", pieces=3, time_scale=0).run().status == "ok"
    with pytest.raises(af.PlanError, match="budget is 3.0 MiB"):
        list(g.run())  # the actors still refuse it


def _null_source(shape=(1024,), dtype=af.float32, n=3):
    return lambda: (af.empty(shape, dtype=dtype, device="null") for _ in range(n))


def test_null_tensors_stand_in_for_the_pieces_of_null_registers():
    spec = af.Spec((1024,), af.float32, "null")
    g = af.ActorGraph(memory={"null": "1MiB"})
    s = g.source(_null_source(), out=spec, name="s")
    t = g.actor(
        lambda x: af.empty((1024,), device="null") if x is None else 1, s, out=spec, name="t"
    )
    g.sink(t)
    assert list(g.run()) == [None] * 3  # a null input arrives as None
    g.plan()  # piece 0 read while planning
    assert list(g.run()) == [None] * 3
    g = af.ActorGraph()  # undeclared: sized by the stand-in
    s = g.source(_null_source((4, 8), af.int32), name="s")
    g.sink(g.actor(lambda x: af.zeros((2,), device="null"), s, name="t"))
    rows = {r["name"]: r for r in g.plan().rows}
    assert rows["s"]["output"] == "int32[4, 8] on null" and rows["s"]["register_bytes"] == 128
    assert rows["t"]["output"] == "float32[2] on null"
    assert list(g.run()) == [None] * 3


@pytest.mark.parametrize(
    "out, says",
    [
        (
            af.Spec((1000,), af.float32, "null"),
            "source 's' (piece 0) returned float32[1024] on null but its register holds "
            "float32[1000]",
        ),
        (
            af.Spec((1024,), af.float64, "null"),
            "returned float32[1024] on null but its register holds float64[1024]",
        ),
        (
            af.Spec((1024,), af.float32),
            "returned a tensor on null, which has no data, but its register is on cpu",
        ),
    ],
)
def test_a_stand_in_is_checked_against_its_register(out, says):
    g = af.ActorGraph()
    g.sink(g.source(_null_source(), out=out, name="s"))
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    assert says in str(info.value)
