"""Edge cases of the actor runtime: each of these once hung, leaked, gave wrong
numbers or a misleading message."""

import asyncio
import contextlib
import sys
import threading
import time

import numpy as np
import pytest

import actorflow as af
from actorflow.experiments.naive import NaiveOp, NaiveScheduler

MiB = 1 << 20


def test_piece_0_is_copied_when_a_stage_returns_a_view_of_its_input():
    def gen():
        for i in range(6):
            yield {"x": np.full((4, 3), i, np.float32), "y": np.int64(i)}

    g = af.ActorGraph()
    s = g.source(gen(), out={"x": af.Spec((4, 3)), "y": af.Spec((), af.int64)})
    pick = g.actor(lambda b: b["x"], s)  # returns a view, sized by piece 0
    g.sink(g.actor(lambda x: (time.sleep(0.01), x * 1)[1], pick))
    assert [float(o[0, 0]) for o in g.run()] == [0, 1, 2, 3, 4, 5]

    buf = np.zeros((4, 3), np.float32)

    def reuse():
        for i in range(5):
            buf[:] = i
            yield buf

    g = af.ActorGraph()
    g.sink(g.actor(lambda x: (time.sleep(0.02), x.copy())[1], g.source(reuse())))
    assert [float(o[0, 0]) for o in g.run()] == [0, 1, 2, 3, 4]


def test_non_contiguous_piece_0_feeds_ops_correctly():
    xs = [np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * i for i in range(3)]
    g = af.ActorGraph()
    t = g.actor(lambda x: x.T, g.source(xs, out=af.Spec((4, 3))))
    g.sink(g.op(lambda y: y[1:] + 0, t))
    for x, o in zip(xs, g.run(), strict=True):
        np.testing.assert_array_equal(o, x.T[1:])


async def _items(n):
    for i in range(n):
        yield np.full((4, 3), i, np.float32)


def test_breaking_out_of_a_run_with_an_async_source():
    g = af.ActorGraph(output_buffers=2)
    g.sink(g.source(lambda: _items(1000), out=af.Spec((4, 3))))
    for _ in range(3):
        for _ in g.run():
            break


async def test_aclosing_a_run_with_an_async_source():
    g = af.ActorGraph()
    g.sink(g.source(lambda: _items(1000), out=af.Spec((4, 3))))
    async with contextlib.aclosing(g.run_async()) as it:
        async for _ in it:
            break


@pytest.mark.parametrize("inline", [True, False])
def test_system_exit_in_a_stage_is_an_actor_error_and_the_loop_survives(inline):
    def stage(x):
        if x[0, 0] == 1:
            sys.exit("stop")
        return x

    g = af.ActorGraph()
    s = g.source([np.full((4, 3), i, np.float32) for i in range(5)], out=af.Spec((4, 3)))
    g.sink(g.actor(stage, s, name="st", inline=inline))
    with pytest.raises(af.ActorError, match="SystemExit") as info:
        list(g.run())
    assert info.value.piece == 1
    g2 = af.ActorGraph()
    g2.sink(g2.source([np.zeros(2)] * 3))
    assert len(list(g2.run())) == 3


@pytest.mark.parametrize("piece", [0, 2])
def test_a_time_function_that_raises_is_an_actor_error(piece):
    g = af.ActorGraph()
    s = g.source([np.zeros((2,), np.float32)] * 5, out=af.Spec((2,)))
    g.sink(g.actor(lambda x: x * 2, s, name="st", time=lambda p: 0 * (1 / (p - piece))))
    with pytest.raises(af.ActorError, match="ZeroDivisionError") as info:
        list(g.run())
    assert info.value.actor == "st" and info.value.piece == piece


def test_an_actor_that_never_gets_piece_0_does_not_hold_the_run():
    g = af.ActorGraph()
    e = g.source([], name="empty")
    g.actor(lambda x: x, e, name="dangling")
    g.sink(g.source([np.zeros((4, 3), np.float32)] * 3, out=af.Spec((4, 3))))
    assert len(list(g.run())) == 3


def test_plan_during_a_run_and_two_runs_at_once_are_refused():
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x, g.source(lambda: [np.zeros(3)] * 20)))
    for i, _ in enumerate(g.run()):
        if i == 1:
            with pytest.raises(RuntimeError, match="running"):
                g.plan()
    results = {}
    bar = threading.Barrier(2)

    def worker(k):
        bar.wait()
        try:
            results[k] = len(list(g.run()))
        except RuntimeError as e:
            results[k] = str(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got = sorted(map(str, results.values()))
    assert "20" in got and (got.count("20") == 2 or any("already running" in v for v in got))


def test_plan_then_edit_then_run_keeps_piece_0():
    g = af.ActorGraph()
    s = g.source(iter([np.full(2, i, np.float32) for i in range(5)]))
    a = g.actor(lambda x: x * 2, s)
    g.plan()  # reads piece 0 of the iterator
    g.sink(a)  # an edit: the next run plans again
    assert [float(o[0]) for o in g.run()] == [0, 2, 4, 6, 8]


def test_a_source_whose_callable_fails_is_named():
    def broken():
        raise OSError("no such file")

    g = af.ActorGraph()
    g.sink(g.source(broken, name="files", out=af.Spec((2,))))
    with pytest.raises(af.ActorError, match="actor 'files'.*OSError: no such file"):
        list(g.run())


def test_bad_output_buffers():
    with pytest.raises(ValueError, match="output_buffers"):
        af.ActorGraph(output_buffers=0)


def test_numpy_scalars_keep_their_dtype():
    g = af.ActorGraph()
    s = g.source([np.full(3, 0.4, np.float64)] * 2)
    g.sink(g.actor(lambda x: x.sum(), s))
    outs = list(g.run())
    assert outs[0].dtype == np.float64 and float(outs[0]) == pytest.approx(1.2)


def test_time_does_not_move_a_python_stage_onto_the_loop():
    inner = af.ActorGraph()
    inner.sink(inner.source(lambda: [np.ones((2,), np.float32)] * 2, out=af.Spec((2,))))

    def stage(x):  # runs another graph: needs the loop free
        return x + sum(float(o[0]) for o in inner.run())

    g = af.ActorGraph()
    s = g.source([np.zeros((2,), np.float32)] * 2, out=af.Spec((2,)))
    g.sink(g.actor(stage, s, name="nested", time=0.001))
    assert [float(o[0]) for o in g.run()] == [2.0, 2.0]
    assert g.stats().actors["nested"]["mode"] == "thread"


def test_op_shape_errors_name_the_actor():
    g = af.ActorGraph()
    a = g.source([np.zeros((4, 3), np.float32)], out=af.Spec((4, 3)))
    g.sink(g.op(lambda x, y: x @ y, a, a, name="mm"))
    with pytest.raises(af.PlanError, match="op actor 'mm'.*matmul: shapes"):
        g.plan()


def test_naive_input_checks_and_rerun():
    ops = [NaiveOp("M1", [], "1MiB"), NaiveOp("O1", ["M1"], "1MiB")]
    with pytest.raises(ValueError, match="issues 'O1' before its input 'M1'"):
        NaiveScheduler(ops, "8MiB", policy=["O1", "M1"])
    with pytest.raises(ValueError, match="no pool for device 'gpu'"):
        NaiveScheduler([NaiveOp("x", [], 1, device="gpu")], {"cpu": 10})
    s = NaiveScheduler(ops, "8MiB", policy=["M1", "O1"])
    assert s.run().status == "ok" and s.run().status == "ok"


def test_naive_double_buffer_names_the_counter_that_binds():
    ops = [
        NaiveOp("o0", [], 0, 0.0005, device="gpu"),
        NaiveOp("o1", [], 4 * MiB, 0),
        NaiveOp("o2", [], 1 * MiB, 0),
        NaiveOp("o3", ["o2", "o1"], 0, 0.0005, device="gpu"),
    ]
    r = NaiveScheduler(
        ops,
        {"cpu": 15 * MiB, "gpu": 0},
        policy="random",
        mode="double-buffer",
        seed=205,
        pieces=3,
        buffers=1,
        time_scale=0,
    ).run()
    assert r.status == "deadlock"
    assert "o1[1] waits for one of its 1 buffers; 4.0 MiB is held by o1[2]'s output" in str(r.error)


async def test_stats_pieces_counts_delivered_pieces():
    g = af.ActorGraph()
    a = g.source([np.zeros(2)] * 4, name="a")
    b = g.source([np.zeros(2)] * 3, name="b")
    g.sink(a, "a")
    g.sink(b, "b")
    outs = [o async for o in g.run_async()]
    assert len(outs) == 3 and g.stats().pieces == 3
    await asyncio.sleep(0)


def test_a_one_shot_iterator_source_says_so_on_its_second_run():
    def batches():
        for i in range(3):
            yield np.full(2, i, np.float32)

    g = af.ActorGraph()
    g.sink(g.source(batches(), name="load"))  # a generator object: one pass
    assert len(list(g.run())) == 3
    with pytest.raises(
        af.ActorError, match="one-shot iterator .*g.source\\(read_batches\\)"
    ) as info:
        list(g.run())
    assert info.value.actor == "load"
    g2 = af.ActorGraph()
    g2.sink(g2.source(batches, name="load"))  # a function: a fresh pass per run
    assert len(list(g2.run())) == len(list(g2.run())) == 3


def test_a_stage_returning_none_is_an_error_unless_it_declared_no_output():
    src = [np.ones(2, np.float32)] * 3
    with pytest.raises(af.ActorError, match="returned None.*forget to return.*out=\\(\\)") as info:
        list(af.Pipeline([src, lambda a: None], names=["src", "forgot"]).run())
    assert info.value.actor == "forgot" and info.value.piece == 0
    assert list(af.Pipeline([src, lambda a: None], out=[None, ()]).run()) == [(), (), ()]


def test_writing_into_an_input_says_inputs_are_read_only_views():
    def bump(x):
        x += 1
        return x

    with pytest.raises(af.ActorError, match="read-only views of the producers' registers"):
        list(af.Pipeline([[np.ones(2)] * 2, bump]).run())


@pytest.mark.parametrize(
    "text, want",
    [
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2 MiB", 2 * 2**20),
        ("3MB", 3 * 10**6),
        ("1e6", 10**6),
        ("512B", 512),
    ],
)
def test_byte_counts_follow_one_rule(text, want):
    assert af.ActorGraph(memory={"cpu": text}).memory == {"cpu": text}
    from actorflow.runtime.plan.registers import MemoryBudget

    assert MemoryBudget({"cpu": text}).budget(af.device("cpu")) == want


@pytest.mark.parametrize("text", ["1k", "64m", "2g"])
def test_a_bare_k_m_g_is_refused_as_ambiguous(text):
    with pytest.raises(af.PlanError, match="could mean 1000 or 1024"):
        af.ActorGraph(memory={"cpu": text})


def test_stats_during_a_run_is_a_live_snapshot_and_says_how_the_run_ended():
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: x + 1,
            g.source(lambda: iter([np.ones(2)] * 50), name="a_source_with_a_really_long_name"),
            name="output",
        )
    )  # a user actor may be called "output"
    for i, _ in enumerate(g.run()):
        if i == 5:
            live = g.stats()
            assert live.state == "running" and live.pieces >= 6
            assert "still running" in live.table()
        if i == 20:
            break
    done = g.stats()
    assert done.state == "stopped" and "stopped before its end" in done.table()
    assert done.actors["output"]["kind"] == "stage"  # not the run's own output
    assert done.actors["(output)"]["kind"] == "output" and done.pieces >= 21
    assert "a_source_with_a_really_long_name" in done.table()  # names are not cut
    g.join(30)
    g2 = af.ActorGraph()
    g2.sink(g2.source([np.ones(2)]))
    list(g2.run())
    assert g2.stats().table().splitlines()[0].startswith("Run: 1 piece in ")
    assert g2.stats().state == "finished"
    with pytest.raises(ValueError, match="run's own output"):
        g2.actor(lambda x: x, g2.actors[0], name="(output)")


@pytest.mark.timeout(60)
def test_a_run_advanced_from_an_act_on_the_graph_loop_is_refused_at_every_next():
    """A run started off the loop, then advanced by an inline act (or any act under a
    test's serial schedule): its next() would wait for the thread it runs on."""
    inner = af.ActorGraph()
    inner.sink(
        inner.source(lambda: (np.full(2, i, np.float32) for i in range(1000)), name="numbers")
    )
    it = inner.run()
    assert next(it).tolist() == [0, 0]  # started here, off the loop: fine
    outer = af.ActorGraph()
    outer.sink(
        outer.actor(
            lambda x: next(it),
            outer.source([np.zeros(2, np.float32)] * 100),
            name="advance",
            inline=True,
        )
    )  # (more than the run has ready)
    with pytest.raises(af.ActorError) as info:
        list(outer.run())
    err = info.value.original
    assert isinstance(err, RuntimeError)
    assert (
        "a run started elsewhere was advanced (next()) on the thread that drives actor graphs"
        in str(err)
        and "run_async" in str(err)
    )
    assert inner.join(30)  # that run was stopped, and ended
    assert [x.tolist() for x in inner.run()][:2] == [[0, 0], [1, 1]]  # and runs again
