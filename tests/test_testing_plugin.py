"""actorflow.testing and its pytest plugin: seeded replays, the virtual clock,
wait_all_actors_blocked, the assertions, the fixtures, and what a failing test prints
(the plugin itself exercised with pytester on small suites)."""

import asyncio
import io
import pathlib
import threading

import numpy as np
import pytest

import actorflow as af
from actorflow.experiments import figure1
from actorflow.experiments.naive import NaiveScheduler
from actorflow.runtime.observe import hooks as observe

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "test_with_actorflow.py"


def fan(pieces=12, output_buffers=16, **kw):
    g = af.ActorGraph(output_buffers=output_buffers, **kw)
    load = g.source(lambda: (np.full(2, i, np.float32) for i in range(pieces)), name="load")
    a = g.actor(lambda x: x + 1, load, name="a")
    b = g.actor(lambda x: x * 2, load, name="b")
    c = g.actor(lambda x: x - 1, load, name="c")
    g.sink(g.actor(lambda x, y, z: x + y + z, a, b, c, name="join"))
    return g


@pytest.fixture
def keep_all(monkeypatch):
    monkeypatch.setattr(observe.SCHEDULE, "keep_acts", 100_000)


def order_of(seed):
    with af.testing.seeded(seed):
        g = fan()
        outs = [float(o[0]) for o in g.run()]
    assert outs == [4.0 * i for i in range(12)]
    return tuple(af.testing.acts(g))


def test_a_seed_gives_one_order_of_acts_and_seeds_differ(keep_all):
    orders = {seed: {order_of(seed) for _ in range(3)} for seed in range(6)}
    assert all(len(o) == 1 for o in orders.values())  # each seed replays
    assert len({next(iter(o)) for o in orders.values()}) > 1  # and the seed decides
    assert len(next(iter(orders[0]))) == 12 * 6  # every act recorded


def test_serial_schedule_acts_on_the_loop():
    with af.testing.seeded(1):
        g = fan()
        list(g.run())
    assert {r["mode"] for r in g.stats().actors.values()} == {"inline"}
    g2 = fan()
    list(g2.run())  # outside: thread stages again
    assert "thread" in {r["mode"] for r in g2.stats().actors.values()}


def test_virtual_clock_runs_simulated_time_in_order(keep_all):
    with af.testing.seeded(0):
        g = af.ActorGraph()
        src = g.source(range(30), name="load", time=100.0)
        slow = g.actor(lambda x: x, src, name="slow", time=300.0)
        g.sink(slow)
        assert list(g.run()) == list(range(30))
    # 30 pieces at 300 simulated s each: a real run would take 2.5 hours; the test's
    # timeout (120 s) is the bound that shows the clock jumped
    assert g.stats().wall_s >= 30 * 300
    acts = af.testing.acts(g)
    # credits: load (2 registers) can be at most 2 pieces ahead of slow's next piece
    done = {"load": 0, "slow": 0}
    for name, piece in acts:
        if name in done:
            done[name] = piece + 1
        assert done["load"] - done["slow"] <= 3


async def test_wait_all_actors_blocked_on_a_slow_consumer():
    g = fan(pieces=100, output_buffers=2, buffers=2)  # (two registers per edge, as counted)
    run = g.run_async()
    first = await run.__anext__()
    await af.testing.wait_all_actors_blocked(g)
    stats = g.stats()
    assert stats.state == "running"
    acts = {n: r["acts"] for n, r in stats.actors.items()}
    # 1 taken, 2 the output holds, 2 in each register pair behind: nothing else can act
    assert acts["(output)"] == 3
    assert acts["join"] == acts["(output)"] + 2
    assert acts["a"] == acts["b"] == acts["c"] == acts["join"] + 2
    assert acts["load"] == acts["a"] + 2
    assert acts["load"] < 100
    said = af.testing.describe_runs()
    assert "load waits for a free register" in said
    assert "a waits for a free register (#0 at join (piece 5), #1 at join (piece 6))" in said
    await run.aclose()
    assert float(first[0]) == 0.0


async def test_wait_all_actors_blocked_waits_for_a_run_to_start_and_end():
    g = fan(pieces=5)

    async def consume():
        return [o async for o in g.run_async()]

    task = asyncio.ensure_future(consume())
    await af.testing.wait_all_actors_blocked(g)  # started, then ran to its end
    assert len(await task) == 5


async def test_wait_all_actors_blocked_times_out_naming_who_acts():
    gate = threading.Event()
    g = af.ActorGraph()
    src = g.source(range(3), name="load")
    g.sink(g.actor(lambda x: gate.wait(30) and x, src, name="stuck"))
    run = g.run_async()
    task = asyncio.ensure_future(run.__anext__())
    try:
        with pytest.raises(TimeoutError, match="stuck is acting"):
            await af.testing.wait_all_actors_blocked(g, timeout=0.3)
    finally:
        gate.set()
        await task
        await run.aclose()


def test_assert_no_deadlock_passes_a_graph_and_names_a_naive_cycle():
    assert len(af.testing.assert_no_deadlock(fan(), timeout=30)) == 12
    order = ["M1", "M2", "O1", "O2"]
    with pytest.raises(AssertionError, match="deadlock: .*O1 waits for"):
        af.testing.assert_no_deadlock(
            lambda: NaiveScheduler(
                figure1.ops(0.0), figure1.CAPACITY, policy=order, mode="wait"
            ).run()
        )
    ok = af.testing.assert_no_deadlock(
        lambda: NaiveScheduler(
            figure1.ops(0.0), figure1.CAPACITY, policy=["M1", "M2", "O2", "O1"]
        ).run()
    )
    assert ok.status == "ok"


def test_assert_no_deadlock_fails_a_run_that_does_not_end():
    gate = threading.Event()
    g = af.ActorGraph()
    src = g.source(range(3), name="load")
    g.sink(g.actor(lambda x: gate.wait(30) and x, src, name="stuck"))
    try:
        with pytest.raises(
            AssertionError,
            match=r"(?s)did not end within 0.3 s.*stuck is "
            r"acting",
        ):
            af.testing.assert_no_deadlock(g, timeout=0.3)
    finally:
        gate.set()
        g.join(30)
    assert len(af.testing.assert_no_deadlock(g, timeout=30)) == 3  # and it runs again


async def test_assert_no_deadlock_async():
    outs = await af.testing.assert_no_deadlock(fan().run_async(), timeout=30)
    assert len(outs) == 12
    gate = asyncio.Event()
    with pytest.raises(AssertionError, match="did not end within"):
        await af.testing.assert_no_deadlock(gate.wait(), timeout=0.05)
    with pytest.raises(TypeError, match="ActorGraph, a callable"):
        af.testing.assert_no_deadlock(42)


def test_assert_peak_within():
    g = af.ActorGraph(memory={"cpu": "1MiB"})
    src = g.source(lambda: (np.zeros(1024, np.float32) for _ in range(4)), name="load")
    g.sink(g.actor(lambda x: x + 1, src, name="inc"))
    list(g.run())
    peak = g.stats().memory["cpu"]["peak"]
    assert peak > 4096
    af.testing.assert_peak_within(g, peak)
    af.testing.assert_peak_within(g.stats(), {"cpu": "1MiB"})
    af.testing.assert_peak_within(g, {"null": 1})  # another device
    with pytest.raises(AssertionError, match=r"memory on cpu: the run .* over the 4.0 KiB"):
        af.testing.assert_peak_within(g, "4KiB")
    alloc = af.lowlevel.allocator("cpu")
    alloc.reset_peak()
    x = af.zeros((256, 1024))  # 1 MiB of eager tensor
    x.numpy()
    with pytest.raises(AssertionError, match="eager tensors on cpu"):
        af.testing.assert_peak_within("cpu", "64KiB")
    del x


def test_progress_bar_counts_pieces_and_names_the_bottleneck():
    out = io.StringIO()
    g = fan(pieces=30)
    assert len(list(g.run(progress={"file": out, "desc": "fan"}))) == 30
    last = out.getvalue().rstrip().split("\r")[-1]  # the bar as it was left
    assert last.startswith("fan: 30piece"), last
    assert "is busy" in last  # the bottleneck, in the postfix
    out = io.StringIO()
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x, g.source(list(range(7)), name="load"), name="x"))
    list(g.run(progress={"file": out}))
    assert "7/7" in out.getvalue().split("\r")[-1]  # a sized source gives the total


def test_progress_without_tqdm_says_which_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)
    g = fan(pieces=3)
    with pytest.raises(ImportError, match=r"actorflow\[progress\]"):
        list(g.run(progress=True))
    assert len(list(g.run())) == 3  # the graph is not left running


# -- the plugin, on small suites (pytester) -------------------------------------------------

SUITE = """
import numpy as np
import pytest
import actorflow as af

def graph(fail_at=None):
    g = af.ActorGraph()
    src = g.source(lambda: (np.full(2, i, np.float32) for i in range(8)), name="load")
    def work(x):
        if fail_at is not None and int(x[0]) == fail_at:
            raise ValueError("bad piece")
        return x + 1
    a = g.actor(work, src, name="work")
    b = g.actor(lambda x: x * 2, src, name="other")
    g.sink(g.actor(lambda x, y: x + y, a, b, name="join"))
    return g

def test_order(af_seed, tmp_path_factory):
    g = graph()
    list(g.run())
    with open("order.txt", "a") as f:
        f.write(repr(af.testing.acts(g)) + "\\n")

def test_fails_after_a_run(af_seed):
    g = graph()
    list(g.run())
    assert False, "the check after the run"

def test_actor_error():
    list(graph(fail_at=3).run())

def test_over_budget(af_memory_budget):
    af_memory_budget("16B")
    list(graph().run())

@pytest.mark.af_gpu
def test_gpu():
    pass
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


def test_plugin_prints_runs_of_a_failing_test(suite):
    r = suite.runpytest(
        "-p", "no:cacheprovider", "-k", "fails_after or actor_error", "--af-last-acts=7"
    )
    r.assert_outcomes(failed=2)
    out = r.stdout.str()
    assert "actorflow (call)" in out
    assert "schedule seed" in out and "--af-seed=" in out  # af_seed's replay line
    assert "run 1: finished after 8 pieces" in out
    assert "last 7 acts" in out  # --af-last-acts
    assert "stopped by an error" in out and "who waits for whom" in out
    assert "bad piece" in out


def test_plugin_seed_option_replays_a_test(suite):
    for seed in (11, 11, 12):
        suite.runpytest(
            "-p", "no:cacheprovider", "-k", "order", f"--af-seed={seed}", "--af-last-acts=1000"
        ).assert_outcomes(passed=1)
    lines = (suite.path / "order.txt").read_text().splitlines()
    assert len(lines) == 3 and lines[0] == lines[1]
    assert lines[0].count("), (") + 1 == 8 * 5  # every act listed (the output too)


def test_plugin_memory_budget_fails_the_test(suite):
    r = suite.runpytest("-p", "no:cacheprovider", "-k", "over_budget")
    r.assert_outcomes(failed=1)  # the registers are refused when the run allocates
    assert "OutOfMemoryError" in r.stdout.str() and "of a 16 B budget" in r.stdout.str()


def test_plugin_gpu_marker_skips_with_the_reason(suite):
    why = af.testing.gpu_missing()
    r = suite.runpytest("-p", "no:cacheprovider", "-k", "gpu", "-rs")
    if why is None:
        r.assert_outcomes(passed=1)
    else:
        r.assert_outcomes(skipped=1)
        assert "needs a CUDA GPU" in r.stdout.str()


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_example_file_passes_in_both_asyncio_modes(pytester, mode):
    pytester.makepyfile(test_example=EXAMPLE.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    r = pytester.runpytest("-p", "no:cacheprovider", f"--asyncio-mode={mode}")
    if af.testing.gpu_missing() is None:
        r.assert_outcomes(passed=7)
    else:
        r.assert_outcomes(passed=6, skipped=1)


# -- regressions (review of the plugin) ------------------------------------------------------


def test_a_seed_replays_simulated_time_whatever_the_caller_does(keep_all):
    # more pieces than output_buffers: the run waits for the caller, whose thread takes the
    # outputs when the OS lets it; the virtual clock must not move meanwhile
    import time

    seen = set()
    for slow in (0, 0.0005, 0, 0.0005):
        with af.testing.seeded(3):
            g = af.ActorGraph(output_buffers=4)
            src = g.source(range(40), name="load", time=60.0)
            a = g.actor(lambda x: x, src, name="a", time=30.0)
            b = g.actor(lambda x: x, src, name="b", time=45.0, replicas=2)
            g.sink(g.actor(lambda x, y: x + y, a, b, name="join", time=10.0))
            for _ in g.run():
                time.sleep(slow)
        seen.add(tuple(af.testing.acts(g)))
    assert len(seen) == 1


async def test_a_caller_that_stops_reading_holds_the_virtual_clock():
    with af.testing.seeded(3):
        g = af.ActorGraph(output_buffers=2)
        src = g.source(range(100), name="load", time=1.0)
        g.sink(g.actor(lambda x: x, src, name="work", time=2.0))
        run = g.run_async()
        await run.__anext__()
        await af.testing.wait_all_actors_blocked(g, timeout=10)
        assert "stands still until the caller takes" in af.testing.describe_runs()
        assert g.stats().actors["load"]["acts"] < 10
        await run.aclose()


def test_serial_replicas_with_some_untimed_pieces_keep_piece_order():
    g = af.ActorGraph()
    src = g.source(range(8), name="load")
    g.sink(g.actor(lambda x: x, src, name="w", replicas=2, time=lambda p: 0.0 if p % 2 else 1.0))
    with af.testing.seeded(1):
        outs = af.testing.assert_no_deadlock(g, timeout=10)
    assert [int(o) for o in outs] == list(range(8))


def test_serial_runs_keep_timeouts_and_assert_no_deadlock_keeps_its_limit():
    import time

    gate = threading.Event()
    g = af.ActorGraph()
    src = g.source(range(3), name="load")
    g.sink(g.actor(lambda x: gate.wait(5) and x, src, name="stuck", timeout=0.2))
    t = time.perf_counter()
    try:
        with af.testing.seeded(1):
            with pytest.raises(af.ActorError, match="timeout=0.2"):
                list(g.run())
        assert time.perf_counter() - t < 4
    finally:
        gate.set()
        assert g.join(10)
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: time.sleep(0.2) or x, g.source(range(3), name="load"), name="slow"))
    with af.testing.seeded(1):  # (inline: the stop lands only when the acts end)
        with pytest.raises(AssertionError, match="did not end within 0.1 s"):
            af.testing.assert_no_deadlock(g, timeout=0.1)
    assert len(af.testing.assert_no_deadlock(g, timeout=30)) == 3


def test_progress_arguments_tqdm_refuses_leave_the_graph_runnable():
    g = fan(pieces=3)
    with pytest.raises(Exception, match="nosuchoption"):
        list(g.run(progress={"nosuchoption": 1}))
    assert len(list(g.run())) == 3


INNER = """
from actorflow.runtime.observe import hooks as observe
def test_inner():
    assert observe.SCHEDULE.seed is None and not observe.SCHEDULE.serial
"""


def test_pytester_sessions_neither_inherit_nor_clear_the_outer_tests_schedule(af_seed, pytester):
    from actorflow.testing import plugin

    list(fan(pieces=2).run())
    pytester.makepyfile(test_inner=INNER)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert plugin.RUNS.seed == af_seed and plugin.RUNS.count == 1
    assert observe.SCHEDULE.seed == af_seed and observe.SCHEDULE.serial


BUDGET_SUITE = """
import numpy as np
import actorflow as af

def run(n):
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x + 1, g.source(lambda: (np.zeros(n, np.float32)
                                                      for _ in range(2)), name="load")))
    list(g.run())

def test_first_of_many_runs_over(af_memory_budget):
    run(1 << 16)                        # 256 KiB per register
    for _ in range(60):
        run(4)
    af_memory_budget("64KiB")
"""


def test_memory_budget_checks_every_run_of_a_test(pytester):
    pytester.makepyfile(test_budget=BUDGET_SUITE)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    r = pytester.runpytest("-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, errors=1)
    assert "run 1 of this test went over" in r.stdout.str()


def test_a_stage_that_fails_acts_no_more_in_a_serial_run():
    calls = []

    def bad(x):
        calls.append(int(x))
        if x == 3:
            raise ValueError("bad piece")
        return x

    g = af.ActorGraph(buffers=4)
    g.sink(g.actor(bad, g.source(list(range(8)), name="load"), name="inc"))
    with af.testing.seeded(1):
        with pytest.raises(af.ActorError, match="bad piece"):
            list(g.run())
    assert calls == [0, 1, 2, 3]  # (an error stops a run at once)


async def test_assert_no_deadlock_times_an_async_def_function():
    async def never():
        await asyncio.Event().wait()

    with pytest.raises(AssertionError, match="did not end within 0.05 s"):
        await asyncio.wait_for(af.testing.assert_no_deadlock(never, timeout=0.05), 5)

    async def consume():
        return [o async for o in fan(pieces=3).run_async()]

    assert len(await af.testing.assert_no_deadlock(consume, timeout=30)) == 3


TRACED_SUITE = """
import actorflow as af

def test_traced(tmp_path):
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x, g.source(range(200), name="load"), name="w"))
    list(g.run(trace=tmp_path / "t.json"))
    assert False
"""


def test_last_acts_zero_prints_no_acts_of_a_traced_run(pytester):
    pytester.makepyfile(test_traced=TRACED_SUITE)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    r = pytester.runpytest("-p", "no:cacheprovider", "--af-last-acts=0")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert "run 1: finished after 200 pieces" in out and "acts (ms from" not in out


def test_nn_graph_progress_is_one_bar_across_batch_layouts():
    from actorflow import nn

    class Step(nn.Graph):
        def __init__(self, m, opt):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.m(x) ** 2).mean()
            loss.backward()
            return loss

    m = nn.Linear(4, 2)
    data = [af.tensor(np.ones((3, 4), np.float32))] * 5 + [
        af.tensor(np.ones((2, 4), np.float32))
    ] * 3  # two layouts: two runs
    out = io.StringIO()
    steps = Step(m, af.optim.SGD(m.parameters(), lr=0.1)).run(data, progress={"file": out})
    assert sum(1 for _ in steps) == 8
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("steps: 100%") and "8/8" in last, last


FAILED_ACT_SUITE = """
import actorflow as af

def test_stopped_report(af_seed):
    g = af.ActorGraph(buffers=1)
    s = g.source(list(range(6)), name="load")
    def boom(x):
        if x == 3:
            raise ValueError("no")
        return x
    g.sink(g.actor(boom, s, name="boom"))
    af.testing.assert_no_deadlock(g)

def test_async_failure():
    g = af.ActorGraph()
    async def aboom(x):
        if x == 2:
            raise KeyError("missing")
        return x
    g.sink(g.actor(aboom, g.source(list(range(5)), name="load"), name="aboom"))
    list(g.run())
"""


def _failed_act_report(pytester, which: str) -> str:
    """The output of the one failing test ``which`` of FAILED_ACT_SUITE."""
    pytester.makepyfile(test_failed=FAILED_ACT_SUITE)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    r = pytester.runpytest("-p", "no:cacheprovider", "-k", which)
    r.assert_outcomes(failed=1)
    return r.stdout.str()


def test_plugin_report_leads_with_the_failed_act_and_lists_it_last(pytester):
    out = _failed_act_report(pytester, "stopped_report")
    section = out[out.index("actorflow (call)") :]
    lines = [x.strip() for x in section.splitlines()[1:]]
    assert lines[0] == "run 1 was stopped by an error: boom failed on piece 3: ValueError: no"
    assert (
        "boom failed on piece 3: ValueError: no" in lines[lines.index("who waits for whom:") + 1 :]
    )
    assert not any(x.startswith("boom waits") for x in lines)  # it failed, not waits
    acts = [x for x in lines if " piece " in x and x[0].isdigit()]
    assert acts[-1].split()[1:4] == ["boom", "piece", "3"]
    assert acts[-1].endswith("raised ValueError: no")
    assert "(output)  piece 2" in " ".join(acts)


def test_plugin_report_names_a_failed_async_act(pytester):
    out = _failed_act_report(pytester, "async_failure")
    assert "run 1 was stopped by an error: aboom failed on piece 2: KeyError: 'missing'" in out
    assert "aboom  piece 2" in out and "raised KeyError: 'missing'" in out


def test_acts_and_the_trace_include_the_act_that_raised(tmp_path):
    import json

    g = af.ActorGraph(buffers=1)

    def boom(x):
        if x == 3:
            raise ValueError("no")
        return x

    g.sink(g.actor(boom, g.source(list(range(6)), name="load"), name="boom"))
    with pytest.raises(af.ActorError):
        list(g.run(trace=tmp_path / "t.json"))
    assert af.testing.acts(g)[-1] == ("boom", 3)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    failed = [e for e in events if e.get("args", {}).get("error")]
    assert [(e["name"], e["args"]["piece"], e["args"]["error"]) for e in failed] == [
        ("boom", 3, "ValueError: no")
    ]
    assert g.stats().state == "failed"
