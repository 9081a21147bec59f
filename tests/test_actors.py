"""The actor runtime: graphs, plans, budgets, errors, cancellation and both front ends."""

import asyncio
import contextlib
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import actorflow as af


def batches(n, shape=(4, 3)):
    for i in range(n):
        yield np.full(shape, i, np.float32)


def normalize(x):
    return x * 2 - 1


def threads_now():
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("actorflow-")
        and t.name not in ("actorflow-vm", "actorflow-graphs")
        and not t.name.startswith("actorflow-cpu")
    }


@pytest.fixture
def no_leftovers():
    """The test must leave no actor thread running and no register allocated."""
    gc.collect()  # earlier tests' dead tensors: freed first,
    af.synchronize()  # so that what is counted is this test's
    af.lowlevel.get_vm().collect_releases()
    before = af.lowlevel.memory_stats("cpu").in_use
    yield
    for t in threads_now():  # acts abandoned by a stop return, then free what they held
        t.join(timeout=30)
    assert threads_now() == set()
    af.synchronize()
    af.lowlevel.get_vm().collect_releases()  # eager tensors the test dropped
    assert af.lowlevel.memory_stats("cpu").in_use == before


def simple_graph(n=5, memory=None, **kw):
    g = af.ActorGraph(memory=memory or {"cpu": "1MiB"}, **kw)
    load = g.source(batches(n), out=af.Spec((4, 3)), name="load")
    prep = g.actor(normalize, load, name="preprocess")
    h = g.op(af.relu, prep, name="relu")
    g.sink(h, name="out")
    return g


def test_seed_example_runs_in_order(no_leftovers):
    g = simple_graph(6)
    outs = list(g.run())
    assert len(outs) == 6
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.maximum(np.full((4, 3), i * 2 - 1, np.float32), 0))
    s = g.stats()
    assert s.actors["load"]["acts"] == 6 and s.actors["relu"]["acts"] == 6
    assert s.actors["relu"]["mode"] == "inline" and s.actors["preprocess"]["mode"] == "pipe"
    assert s.pieces == 6
    for row in s.actors.values():
        for k in ("compute_s", "wait_input_s", "wait_credit_s", "wait_resource_s"):
            assert row[k] >= 0
    assert "preprocess" in str(s)


def test_plan_table_and_bytes():
    g = simple_graph(3, buffers=3)
    plan = g.plan()
    text = str(plan)
    for name in ("load", "preprocess", "relu"):
        assert name in text
    reg = 4 * 3 * 4
    assert plan.totals[af.device("cpu")] == 3 * 3 * reg
    assert "1.0 MiB budget" in text
    list(g.run())  # the plan made by plan() is the one the run uses
    assert g.stats().memory["cpu"]["planned"] == 3 * 3 * reg


def test_measured_peak_equals_plan_and_fits_budget(no_leftovers):
    g = simple_graph(8, memory={"cpu": 1000})
    list(g.run())
    m = g.stats().memory["cpu"]
    # the default: at least 2 registers of 48 B per actor, more where the budget allows
    assert m["peak"] == m["planned"] and m["planned"] % 48 == 0
    assert 3 * 2 * 48 <= m["peak"] <= m["budget"] == 1000


def test_plan_refused_names_actors_total_budget_and_buffers():
    g = af.ActorGraph(memory={"cpu": "100KiB"}, buffers=3)
    s = g.source(batches(2, (100, 100)), out=af.Spec((100, 100)), name="load")
    e = g.op(af.exp, s, name="exp")
    g.sink(e)
    with pytest.raises(af.PlanError) as info:
        g.plan()
    err = info.value
    msg = str(err)
    assert "load: 3 x 39.1 KiB" in msg and "exp: 3 x 39.1 KiB" in msg
    assert "234.4 KiB" in msg and "100.0 KiB" in msg
    assert "buffers=1" in msg
    assert err.fitting_buffers == 1 and err.needed == 6 * 40000 and err.budget == 102400
    assert err.actors == {"load": 120000, "exp": 120000}


def test_plan_refused_even_with_one_buffer():
    g = af.ActorGraph(memory={"cpu": 1000})
    g.sink(g.source(batches(1, (100, 100)), out=af.Spec((100, 100))))
    with pytest.raises(af.PlanError, match="even buffers=1 needs 39.1 KiB") as info:
        g.plan()
    assert info.value.fitting_buffers is None


def test_budget_strings_and_bad_values():
    with pytest.raises(af.PlanError, match="memory="):
        af.ActorGraph(memory={"cpu": "lots"})
    with pytest.raises(af.PlanError, match="resources="):
        af.ActorGraph(resources={"disk": 0})
    g = af.ActorGraph()
    with pytest.raises(af.PlanError, match="actor 'source': buffers must be an int >= 1"):
        g.source(batches(1), buffers=0)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_short_sources(n, no_leftovers):
    g = af.ActorGraph(buffers=3)
    src = g.source(batches(n))  # sized from piece 0 (none when empty)
    g.sink(g.actor(normalize, src))
    assert len(list(g.run())) == n


def test_piece_structures_tuple_and_dict(no_leftovers):
    def src():
        for i in range(4):
            yield {"x": np.full((2,), i, np.float32), "y": (np.int64(i), np.arange(3))}

    g = af.ActorGraph()
    s = g.source(src)
    st = g.actor(lambda p: (p["x"] + 1, p["y"][1] * p["y"][0]), s)
    g.sink(st)
    outs = list(g.run())
    for i, (a, b) in enumerate(outs):
        np.testing.assert_array_equal(a, np.full((2,), i + 1, np.float32))
        np.testing.assert_array_equal(b, np.arange(3) * i)


def test_stage_sees_read_only_inputs():
    g = af.ActorGraph()

    def scribble(x):
        x[0] = 7
        return x

    g.sink(g.actor(scribble, g.source(batches(2))))
    with pytest.raises(af.ActorError, match="read-only"):
        list(g.run())


def test_stage_changing_shape_or_dtype_is_a_clear_error(no_leftovers):
    def grow(x):
        return np.zeros((int(x[0, 0]) + 1, 3), np.float32)

    g = af.ActorGraph()
    g.sink(g.actor(grow, g.source(batches(3)), name="grow"))
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    e = info.value
    assert e.actor == "grow" and e.piece == 1
    assert isinstance(e.original, af.ShapeError)
    assert "float32[2, 3]" in str(e) and "float32[1, 3]" in str(e)

    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: x.astype(np.float64),
            g.source(batches(2)),
            name="cast",
            out=af.Spec((4, 3), af.float32),
        )
    )
    with pytest.raises(af.ActorError, match="cast") as info:
        list(g.run())
    assert isinstance(info.value.original, af.DTypeError)


def test_error_stops_run_quickly_with_traceback(no_leftovers):
    def forever():
        i = 0
        while True:
            time.sleep(0.002)
            read.append(i)
            yield np.full((2,), i, np.float32)
            i += 1

    def failing(x):
        if x[0] == 5:
            raise ValueError("piece five is bad")
        return x

    read = []
    g = af.ActorGraph()
    g.sink(g.actor(failing, g.source(forever, name="src"), name="check"))
    with pytest.raises(af.ActorError) as info:
        for _ in g.run():
            pass
    g.join(30)
    # the run stopped at the error: past piece 5 the source read only what its registers
    # and the acts in flight could hold
    assert 6 <= len(read) <= 6 + 2 + 2
    e = info.value
    assert e.actor == "check" and e.piece == 5
    assert isinstance(e.original, ValueError) and e.__cause__ is e.original
    assert "piece five is bad" in str(e) and "in failing" in e.actor_traceback
    assert "in failing" in str(e)


def test_runtime_keeps_working_after_error(no_leftovers):
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: 1 / 0, g.source(batches(2))))
    with pytest.raises(af.ActorError, match="ZeroDivisionError"):
        list(g.run())
    assert len(list(simple_graph(3).run())) == 3
    np.testing.assert_array_equal((af.tensor([1.0, -1.0]).relu() * 2).numpy(), [2.0, 0.0])


def test_breaking_out_of_run_cleans_up(no_leftovers):
    g = af.ActorGraph()
    g.sink(g.actor(normalize, g.source(lambda: batches(1000))))
    for i, _ in enumerate(g.run()):
        if i == 3:
            break
    # the same graph runs again from the start (its source is a callable)
    assert len(list(g.run())) == 1000


def test_ctrl_c_in_run_stops_and_frees(no_leftovers):
    def slow(x):
        time.sleep(0.05)
        return x

    g = af.ActorGraph()
    g.sink(g.actor(slow, g.source(lambda: batches(200))))
    # Python turns SIGINT into KeyboardInterrupt only where it was not ignored at start (a
    # shell's background job ignores it): this test installs the handler itself
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    got = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in g.run():
                got += 1
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert 0 < got < 200


async def test_run_async_matches_run(no_leftovers):
    outs = [x async for x in simple_graph(5).run_async()]
    ref = list(simple_graph(5).run())
    assert len(outs) == 5
    for a, b in zip(outs, ref, strict=True):
        np.testing.assert_array_equal(a, b)


async def test_cancel_run_async_frees_everything(no_leftovers):
    def slow(x):
        time.sleep(0.01)
        return x

    g = af.ActorGraph()
    g.sink(g.actor(slow, g.source(lambda: batches(10_000))))
    seen = []

    async def consume():
        async for x in g.run_async():
            seen.append(x)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 0 < len(seen) < 10_000


async def test_async_source_and_aclosing(no_leftovers):
    async def agen():
        for i in range(6):
            await asyncio.sleep(0.001)
            yield np.full((3,), i, np.float32)

    g = af.ActorGraph()
    g.sink(g.op(af.neg, g.source(agen(), out=af.Spec((3,)))))
    outs = [x async for x in g.run_async()]
    assert [float(o[0]) for o in outs] == [-i for i in range(6)]

    g = af.ActorGraph()
    g.sink(g.actor(normalize, g.source(lambda: agen(), out=af.Spec((3,))), out=af.Spec((3,))))
    async with contextlib.aclosing(g.run_async()) as it:
        async for _ in it:
            break
    assert threads_now() == set()


async def test_async_source_sized_by_plan_on_the_graph_loop_and_by_a_run():
    async def agen():
        for i in range(3):
            yield np.full(3, i)

    g = af.ActorGraph()
    g.sink(g.source(agen))
    assert "int64[3] on cpu" in str(g.plan())  # plan() awaits piece 0 on the graph loop
    outs = [x async for x in g.run_async()]  # and the run starts from it
    assert [int(o[0]) for o in outs] == [0, 1, 2]
    outs = [x async for x in g.run_async()]  # a run without plan() sizes from piece 0
    assert [int(o[0]) for o in outs] == [0, 1, 2]


def test_resources_are_exclusive_and_counted():
    spans = {"a": [], "b": []}

    def work(tag):
        def f(x):
            t0 = time.perf_counter()
            time.sleep(0.003)
            spans[tag].append((t0, time.perf_counter()))
            return x

        return f

    g = af.ActorGraph(resources={"disk": 1})
    src = g.source(batches(10))
    a = g.actor(work("a"), src, name="a", resources={"disk": 1})
    b = g.actor(work("b"), src, name="b", resources={"disk": 1})
    g.sink(a, "a")
    g.sink(b, "b")
    outs = list(g.run())
    assert len(outs) == 10 and set(outs[0]) == {"a", "b"}
    for s0, e0 in spans["a"]:
        for s1, e1 in spans["b"]:
            assert e0 <= s1 or e1 <= s0, "two holders of the one disk token overlapped"
    st = g.stats().actors
    assert st["a"]["wait_resource_s"] + st["b"]["wait_resource_s"] > 0


def test_resource_not_declared_or_too_large():
    g = af.ActorGraph(resources={"disk": 1})
    g.sink(g.actor(normalize, g.source(batches(1)), resources={"gpu": 1}))
    with pytest.raises(af.PlanError, match="does not declare"):
        g.plan()
    g = af.ActorGraph(resources={"disk": 1})
    g.sink(g.actor(normalize, g.source(batches(1)), resources={"disk": 2}))
    with pytest.raises(af.PlanError, match="could never act"):
        g.plan()


def test_backpressure_bounds_the_source():
    """With one register per edge and a slow consumer, the source is never more than the
    registers in flight ahead of the slow stage."""
    produced, consumed = [], []

    def src():
        for i in range(30):
            produced.append(i)
            yield np.full((1,), i, np.float32)

    def slow(x):
        consumed.append(int(x[0]))
        assert produced[-1] - consumed[-1] <= 3
        time.sleep(0.001)
        return x

    g = af.ActorGraph(buffers=1)
    g.sink(g.actor(slow, g.source(src)))
    assert len(list(g.run())) == 30
    assert g.stats().actors["source"]["wait_credit_s"] > 0


def test_pipeline_front_end(no_leftovers):
    def read():
        for i in range(7):
            yield np.arange(6, dtype=np.float32).reshape(2, 3) + i

    pipe = af.Pipeline(
        [read(), lambda x: x * 2, lambda x: float(x.sum())],
        memory={"cpu": "1MiB"},
        buffers=[1, 2, 3],
    )
    assert [r["buffers"] for r in pipe.plan().rows] == [1, 2, 3]
    assert [float(v) for v in pipe.run()] == [float((np.arange(6) + i).sum() * 2) for i in range(7)]
    assert pipe.stats().pieces == 7
    with pytest.raises(ValueError, match="at least one stage"):
        af.Pipeline([read()])
    with pytest.raises(ValueError, match="buffers has 2 entries for 3 stages"):
        af.Pipeline([read(), normalize, normalize], buffers=[1, 2])


def test_inputs_must_belong_to_the_graph():
    g1, g2 = af.ActorGraph(), af.ActorGraph()
    s = g1.source(batches(1))
    with pytest.raises(TypeError, match="inputs must be actors of this graph"):
        g2.actor(normalize, s)
    with pytest.raises(ValueError, match="already exists"):
        g1.source(batches(1), name="source")


def test_null_device_registers_are_planned_and_counted():
    g = af.ActorGraph(memory={"null": "1000KiB"})
    src = g.source(batches(5, (256, 256)), out=af.Spec((256, 256), device="null"))
    e = g.op(af.exp, src, time=0.001)
    g.sink(e)
    with pytest.raises(af.PlanError, match="null budget"):
        g.plan()
    g = af.ActorGraph(memory={"null": "2MiB"})
    src = g.source(batches(5, (256, 256)), out=af.Spec((256, 256), device="null"))
    g.sink(g.op(af.exp, src, time=0.001))
    outs = list(g.run())
    assert len(outs) == 5 and outs[0] is None
    m = g.stats().memory["null"]
    assert m["peak"] == m["planned"] == 4 * 256 * 256 * 4 <= m["budget"]


def test_run_sizes_stages_as_piece_0_flows(no_leftovers):
    """run() without plan(): stages are sized by piece 0 while it flows through the
    pipeline (no stage is called twice), and nothing is delivered before the plan is whole."""
    calls = []

    def stage(x):
        calls.append(int(x[0, 0]))
        return np.concatenate([x, x])

    g = af.ActorGraph(memory={"cpu": 10_000}, buffers=2)  # (the sizes, counted below)
    g.sink(g.op(af.neg, g.actor(stage, g.source(batches(4)), name="stage"), name="neg"))
    outs = list(g.run())
    assert calls == [0, 1, 2, 3]
    assert [o.shape for o in outs] == [(8, 3)] * 4
    assert float(outs[3][0, 0]) == -3
    m = g.stats().memory["cpu"]
    assert m["peak"] == m["planned"] == 2 * 48 + 2 * 96 + 2 * 96


def test_lazy_sizing_refuses_before_delivering(no_leftovers):
    def grow(x):
        return np.zeros((1000, 100), np.float32)  # 400 KB per register

    g = af.ActorGraph(memory={"cpu": "500KiB"})
    g.sink(g.actor(grow, g.source(batches(5)), name="grow"))
    got = []
    with pytest.raises(af.PlanError, match="grow: 2 x 390.6 KiB") as info:
        for x in g.run():
            got.append(x)
    assert got == []
    assert "not sized yet" not in str(info.value)
    assert info.value.fitting_buffers == 1


def test_op_actor_with_numpy_code_says_use_actor():
    g = af.ActorGraph()
    g.sink(g.op(np.tanh, g.source(batches(2)), name="tanh"))
    with pytest.raises(af.TraceError, match="op actor 'tanh'.*use g.actor"):
        list(g.run())
    with pytest.raises(ValueError, match="already a sink named"):
        g.sink(g.actors[0], "tanh")
