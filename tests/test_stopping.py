"""Stopping a run: nothing freed early, nothing lost, nothing hung.

A stop (an error, a cancel, ``break``, ``aclose``, the consuming task ending) ends the run at
once; an act running then is abandoned: it finishes on its thread and only then frees the
registers it held. These tests hold stages on gates across stops and check with sentinels
that no register was handed to anyone else meanwhile."""

import asyncio
import contextlib
import gc
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af

N = 1 << 18  # float32 elements: 1 MiB, so freed blocks are cached and reused


def actor_threads():
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("actorflow-")
        and t.name not in ("actorflow-vm", "actorflow-graphs")
        and not t.name.startswith("actorflow-cpu")
    }


def in_use(collect: bool = False):
    if collect:  # (earlier tests' dead tensors are freed lazily: a base
        gc.collect()  # measured before they go would be too high)
    af.synchronize()
    af.lowlevel.get_vm().collect_releases()
    return af.lowlevel.memory_stats("cpu").in_use


def settle(g, timeout=30):
    """Waits for the acts a stop abandoned; then no actor thread is left."""
    assert g.join(timeout)
    for t in actor_threads():
        t.join(timeout)
    assert actor_threads() == set()


# -- 1. a second cancel must not free a register an act still writes ----------------------


async def test_a_second_cancel_frees_nothing_a_running_act_holds():
    base = in_use(collect=True)
    gate, blocked = threading.Event(), threading.Event()

    def stage(x):
        if x[0] == 3:
            blocked.set()
            assert gate.wait(30)
        return np.full(N, 777.0, np.float32)

    g = af.ActorGraph()
    g.sink(g.actor(stage, g.source(lambda: (np.full(N, i, np.float32) for i in range(10)))))

    async def consume():
        async for _ in g.run_async():
            pass

    t = asyncio.create_task(consume())
    while not blocked.is_set():
        await asyncio.sleep(0.005)
    t.cancel()
    for _ in range(5):  # the first cancel lands; the run's clean-up is under way
        await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    zs = [af.zeros(N) for _ in range(8)]  # would take the stage's register if freed
    af.synchronize()
    gate.set()
    await asyncio.to_thread(settle, g)  # (the loop keeps running meanwhile)
    assert all(float(np.abs(z.numpy()).max()) == 0.0 for z in zs)
    del zs
    assert in_use() == base


# -- 2. an async source raising CancelledError is an error, not end of stream ------------


def cancelling_source():
    async def gen():
        for i in range(10):
            if i == 3:
                raise asyncio.CancelledError("the source gave up")
            yield np.full(4, i, np.float32)

    return gen()


def test_an_async_source_raising_cancelled_is_an_actor_error_in_run():
    g = af.ActorGraph()
    g.sink(g.source(cancelling_source, out=af.Spec((4,)), name="feed"))
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    assert info.value.actor == "feed" and info.value.piece == 3
    assert isinstance(info.value.original, asyncio.CancelledError)


async def test_an_async_source_raising_cancelled_is_an_actor_error_in_run_async():
    g = af.ActorGraph()
    g.sink(g.source(cancelling_source, out=af.Spec((4,)), name="feed"))
    got = []
    with pytest.raises(af.ActorError) as info:
        async for x in g.run_async():
            got.append(x)
    assert info.value.actor == "feed" and info.value.piece == 3
    assert len(got) <= 3


@pytest.mark.timeout(30)
def test_a_run_whose_sources_fail_to_start_raises_instead_of_ending_empty(monkeypatch):
    """An error before the loop takes the run (its sources' start) reaches the caller; the
    run's cleanup must not swallow it (a ``return`` in its ``finally`` did: the caller's
    loop just ended, with no output and no error)."""
    from actorflow.runtime.sched.credit import CreditScheduler

    def failing(self, loop):
        raise RuntimeError("sources could not start")

    monkeypatch.setattr(CreditScheduler, "start_sources", failing)
    pipe = af.Pipeline([lambda: iter([np.ones(2)] * 3), lambda y: y * 3])
    with pytest.raises(RuntimeError, match="sources could not start"):
        list(pipe.run())
    monkeypatch.undo()
    assert [o.tolist() for o in pipe.run()] == [[3.0, 3.0]] * 3  # usable again


# -- 3. run() on the graph loop thread is refused, and the loop keeps working -------------


@pytest.mark.timeout(20)
def test_run_inside_an_inline_stage_is_refused_and_nothing_hangs():
    def nested(x):
        return list(af.Pipeline([lambda: iter([x.copy()]), lambda y: y + 1]).run())[0]

    g = af.ActorGraph()
    g.sink(g.actor(nested, g.source([np.zeros(3, np.float32)]), inline=True, name="nest"))
    with pytest.raises(af.ActorError, match="thread that drives actor graphs") as info:
        list(g.run())
    assert info.value.actor == "nest"
    out = list(af.Pipeline([lambda: iter([np.ones(2)]), lambda y: y * 3]).run())
    np.testing.assert_array_equal(out[0], [3.0, 3.0])
    g2 = af.ActorGraph()  # a thread stage may run a graph of its own
    g2.sink(g2.actor(nested, g2.source([np.zeros(3, np.float32)])))
    np.testing.assert_array_equal(list(g2.run())[0], [1.0, 1.0, 1.0])


# -- 4 and 11. what cannot be right is refused with the reason ---------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"buffers": 10**9}, "more than the 1024"),
        ({"buffers": 0}, "buffers must be an int >= 1"),
        ({"time": float("inf")}, "finite number of seconds"),
        ({"time": float("nan")}, "finite number of seconds"),
        ({"time": -1}, "finite number of seconds"),
        ({"time": "1s"}, "give seconds as a number"),
        ({"resources": {"disk": -1}}, r"resources=\{'disk': -1\}"),
        ({"resources": {"disk": 0}}, "whole number >= 1"),
        ({"resources": {"disk": 0.5}}, "whole number >= 1"),
    ],
)
def test_bad_actor_arguments_are_refused_at_once(kw, match):
    g = af.ActorGraph(resources={"disk": 1})
    with pytest.raises((af.PlanError, ValueError, TypeError), match=match) as info:
        g.source([np.zeros(2)], name="feed", **kw)
    assert "feed" in str(info.value)


def test_a_time_function_returning_nan_is_an_actor_error():
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: x,
            g.source([np.zeros(2)] * 3),
            name="st",
            time=lambda p: float("nan") if p == 1 else 0.0,
        )
    )
    with pytest.raises(af.ActorError, match="returned nan for piece 1") as info:
        list(g.run())
    assert info.value.actor == "st" and info.value.piece == 1


def test_two_acts_never_share_one_token():
    """The exclusivity a negative count broke: with disk=1, never two acts at once."""
    g = af.ActorGraph(resources={"disk": 1})
    inside, most = [0], [0]
    lock = threading.Lock()

    def io(x):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        threading.Event().wait(0.001)
        with lock:
            inside[0] -= 1
        return x

    src = g.source([np.zeros(2)] * 20, out=af.Spec((2,), af.float64))
    for i in range(3):
        g.sink(g.actor(io, src, name=f"io{i}", resources={"disk": 1}))
    assert len(list(g.run())) == 20
    assert most[0] == 1


@pytest.mark.parametrize(
    "value, match",
    [
        ("1e309", "more bytes than any device has"),
        ("1.7B", "not a whole number of bytes"),
        ("lots", "cannot read"),
        (-1, ">= 0"),
    ],
)
def test_bad_budgets_are_refused(value, match):
    with pytest.raises(af.PlanError, match=match):
        af.ActorGraph(memory={"cpu": value})


def test_a_budget_not_given_per_device_is_refused_with_the_form_to_use():
    with pytest.raises(
        af.PlanError,
        match=r"memory takes a budget per device, e\.g\. "
        r"\{'cpu': '1MiB'\}",
    ):
        af.ActorGraph(memory="1MiB")


def test_graph_level_arguments_are_checked_as_the_graph_is_made():
    with pytest.raises(af.PlanError, match="ActorGraph: buffers must be an int >= 1"):
        af.ActorGraph(buffers=0)
    with pytest.raises(TypeError, match="whole numbers"):
        af.Spec((2.5,))
    with pytest.raises(TypeError, match="zeros"):
        af.zeros(2.5)


def test_a_plan_larger_than_the_machine_is_refused_naming_the_actor():
    base = in_use()
    g = af.ActorGraph()
    g.sink(g.source([np.zeros(2)], out=af.Spec((2**40, 2**40)), name="huge"))
    for attempt in (g.plan, lambda: list(g.run())):
        with pytest.raises(af.PlanError, match="this machine has .* huge") as info:
            attempt()
        assert info.value.actors["huge"] == 2 * 4 * 2**80
    assert in_use() == base
    assert len(list(af.Pipeline([[np.ones(2)] * 2, lambda x: x]).run())) == 2


# -- 5. planned equals measured when one consumer reads an output on two edges ------------


@pytest.mark.parametrize("plan_first", [False, True])
def test_a_consumer_reading_one_output_twice_is_counted_once(plan_first):
    g = af.ActorGraph(memory={"cpu": 64})
    s = g.source(lambda: iter([np.full(4, i, np.float32) for i in range(5)]), name="s")
    g.sink(g.op(af.add, s, s, name="twice"))
    if plan_first:
        assert g.plan().totals[af.device("cpu")] == 64
    outs = list(g.run())
    assert [float(o[0]) for o in outs] == [0.0, 2.0, 4.0, 6.0, 8.0]
    m = g.stats().memory["cpu"]
    assert m["planned"] == m["peak"] == 64


# -- 9. an empty source feeding an op is a run of 0 pieces, every time -------------------


@pytest.mark.parametrize("empty_first", [True, False])
def test_an_empty_source_feeding_an_op_is_an_empty_run(empty_first):
    for seed in range(40):
        g = af.ActorGraph(seed=seed)
        e = g.source(lambda: iter([]), name="empty")
        s = g.source(lambda: iter([np.ones(4, np.float32)] * 3), name="full")
        g.sink(g.op(af.add, *((e, s) if empty_first else (s, e)), name="add"))
        assert list(g.run()) == []


# -- 7. a cancel landing in the consumer's own code stops the run -------------------------


async def test_a_cancel_in_the_consumers_own_code_stops_and_frees():
    base = in_use()
    g = af.ActorGraph()
    g.sink(
        g.actor(lambda x: x + 1, g.source(lambda: (np.full(N, i, np.float32) for i in range(100))))
    )
    agen = g.run_async()  # still referenced after the task ends
    first = asyncio.Event()

    async def consume():
        async for _ in agen:
            first.set()
            await asyncio.Event().wait()  # the cancel lands here, outside the run

    t = asyncio.create_task(consume())
    await first.wait()
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    await asyncio.sleep(0)  # the run's task ends on its own
    await g.join_async()
    await asyncio.to_thread(settle, g)
    assert in_use() == base
    outs = [x async for x in g.run_async()]  # not "already running"
    assert len(outs) == 100 and float(outs[-1][0]) == 100.0


# -- 10. an error reaches the caller while a sibling is still busy -----------------------


@pytest.mark.parametrize("front", ["run", "run_async"])
async def test_an_error_is_raised_while_a_sibling_stage_still_runs(front):
    gate, slow_started = threading.Event(), threading.Event()
    sibling_returned = []

    def slow(x):
        slow_started.set()
        gate.wait(30)
        sibling_returned.append(True)
        return x

    def bad(x):
        assert slow_started.wait(30)  # the sibling is inside its act now
        raise ValueError("branch b fails")

    g = af.ActorGraph()
    src = g.source([np.zeros(4, np.float32)] * 3, out=af.Spec((4,)))
    g.sink(g.actor(slow, src, name="slow"), "a")
    g.sink(g.actor(bad, src, name="bad"), "b")
    with pytest.raises(af.ActorError, match="branch b fails") as info:
        if front == "run":
            list(g.run())
        else:
            async for _ in g.run_async():
                pass
    assert info.value.actor == "bad"
    assert not gate.is_set() and sibling_returned == []  # raised before the sibling ended
    gate.set()
    await asyncio.to_thread(settle, g)
    assert sibling_returned == [True]


def test_break_returns_while_a_stage_is_busy_and_the_next_run_waits_for_it():
    gate, started = threading.Event(), threading.Event()
    calls = []

    def stage(x):
        calls.append(int(x[0]))
        if int(x[0]) == 1:
            started.set()
            gate.wait(30)
        return x * 2

    g = af.ActorGraph(buffers=1)
    g.sink(g.actor(stage, g.source(lambda: (np.full(N, i, np.float32) for i in range(4)))))
    for _ in g.run():
        assert started.wait(30)
        break
    assert not g.join(0) and not gate.is_set()
    threading.Timer(0.05, gate.set).start()  # the next run must wait for that act
    outs = list(g.run())
    assert [float(o[0]) for o in outs] == [0.0, 2.0, 4.0, 6.0]
    settle(g)


# -- random cancels against random graphs ------------------------------------------------


@st.composite
def cancel_cases(draw):
    n_sources = draw(st.integers(1, 2))
    n_nodes = draw(st.integers(n_sources + 1, 6))
    nodes = []
    for i in range(n_nodes):
        if i < n_sources:
            kind = draw(st.sampled_from(["thread", "inline", "async"]))
            nodes.append({"inputs": [], "kind": kind, "length": draw(st.integers(2, 8))})
            continue
        k = draw(st.integers(1, min(2, i)))
        inputs = sorted(draw(st.sets(st.integers(0, i - 1), min_size=k, max_size=k)))
        nodes.append(
            {"inputs": inputs, "kind": draw(st.sampled_from(["thread", "thread", "inline", "op"]))}
        )
    for node in nodes:
        node["buffers"] = draw(st.integers(1, 3))
        holdable = node["kind"] in ("thread", "async")  # (inline acts hold the loop)
        node["block_at"] = draw(st.one_of(st.none(), st.integers(0, 4))) if holdable else None
    consumed = {j for node in nodes for j in node["inputs"]}
    sinks = [i for i in range(n_nodes) if i not in consumed]
    how = draw(
        st.sampled_from(
            [
                "outside",
                "outside twice",
                "consumer break",
                "consumer raise",
                "consumer own code",
                "aclose",
                "sync break",
            ]
        )
    )
    after = draw(st.integers(0, 4))
    seed = draw(st.integers(0, 2**16))
    return nodes, sinks, how, after, seed


def value_fn(i):
    def f(*xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = acc + x
        return acc * 0.5 + float(i + 1)

    return f


class Probe:
    """Gates stages at chosen pieces and records what they saw."""

    def __init__(self):
        self.gate = threading.Event()
        self.blocked = threading.Event()
        self.bad: list = []

    def stage(self, i, node):
        fn = value_fn(i)

        def f(*xs):
            seen = [float(x[0]) for x in xs]
            if node["block_at"] is not None:
                piece = f.calls
                f.calls += 1
                if piece == node["block_at"] and not self.gate.is_set():
                    self.blocked.set()
                    self.gate.wait(30)
            for x, v in zip(xs, seen, strict=True):  # inputs untouched while it was held
                if not (x[0] == v and x[-1] == v and v != 0.0):
                    self.bad.append((i, v, float(x[0]), float(x[-1])))
            return fn(*xs)

        f.calls = 0
        f.__name__ = f"n{i}"
        return f


def build_cancel_graph(nodes, sinks, seed, probe):
    g = af.ActorGraph(seed=seed)
    actors = []
    for i, node in enumerate(nodes):
        kw = {"name": f"n{i}", "buffers": node["buffers"]}
        if "length" in node:
            n, start = node["length"], float(1000 * (i + 1))
            if node["kind"] == "async":

                async def items(n=n, start=start, node=node):
                    for p in range(n):
                        if p == node["block_at"] and not probe.gate.is_set():
                            probe.blocked.set()
                            while not probe.gate.is_set():
                                await asyncio.sleep(0.002)
                        yield np.full(N, start + p, np.float32)

                a = g.source(items, out=af.Spec((N,)), **kw)
            else:

                def items(n=n, start=start):
                    return (np.full(N, start + p, np.float32) for p in range(n))

                a = g.source(items, inline=node["kind"] == "inline", **kw)
        else:
            ins = [actors[j] for j in node["inputs"]]
            if node["kind"] == "op":
                a = g.op(value_fn(i), *ins, **kw)
            else:
                a = g.actor(probe.stage(i, node), *ins, inline=node["kind"] == "inline", **kw)
        actors.append(a)
    for i in sinks:
        g.sink(actors[i], f"s{i}")
    return g


def expected(nodes, sinks):
    n = min(node["length"] for node in nodes if "length" in node)
    outs = []
    for p in range(n):
        vals = []
        for i, node in enumerate(nodes):
            if "length" in node:
                vals.append(np.full(1, 1000 * (i + 1) + p, np.float32))
            else:
                vals.append(value_fn(i)(*[vals[j] for j in node["inputs"]]))
        outs.append({f"s{i}": float(vals[i][0]) for i in sinks})
    return outs


def first_values(out, sinks):
    out = out if isinstance(out, dict) else {f"s{sinks[0]}": out}
    return {k: float(v[0]) for k, v in out.items()}


async def stop_somehow(g, how, after, probe):
    """Iterates a run and stops it as ``how`` says once ``after`` pieces arrived or a stage
    is held on its gate (or the run ended)."""
    reached = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(
        target=lambda: probe.blocked.wait(30) and loop.call_soon_threadsafe(reached.set),
        daemon=True,
    ).start()
    agen = g.run_async()

    async def consume():
        n = 0
        async for _ in agen:
            n += 1
            if n >= after:
                reached.set()
                if how == "consumer break":  # and close it, as docs/actor-graphs.md says
                    break
                if how == "consumer raise":
                    raise KeyError("stop")
                if how == "consumer own code":
                    await asyncio.Event().wait()
        reached.set()
        if how == "consumer break":
            await agen.aclose()

    if how == "sync break":

        def sync():
            for n, _ in enumerate(g.run(), 1):
                if n >= after or probe.blocked.is_set():
                    break

        await asyncio.to_thread(sync)
        return
    if how == "aclose":
        async with contextlib.aclosing(agen):
            async for n, _ in _enumerate(agen):
                if n >= after or probe.blocked.is_set():
                    break
        return
    t = asyncio.create_task(consume())
    waiter = asyncio.create_task(reached.wait())
    await asyncio.wait([t, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    # a held stage may keep the consumer waiting for its next piece: cancel it then too
    # (for a consumer breaking or raising, that cancel may land in its clean-up)
    t.cancel()
    if how == "outside twice":
        await asyncio.sleep(0)
        t.cancel()
    await asyncio.gather(t, return_exceptions=True)


async def _enumerate(agen):
    n = 0
    async for x in agen:
        n += 1
        yield n, x


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(cancel_cases())
async def test_random_cancels_free_nothing_early_and_the_next_run_is_exact(case):
    nodes, sinks, how, after, seed = case
    base = in_use()
    probe = Probe()
    if how in ("sync break", "aclose"):
        probe.gate.set()  # these consumers can stop only between pieces: hold nothing
    g = build_cancel_graph(nodes, sinks, seed, probe)
    await stop_somehow(g, how, after, probe)
    # a register freed early would be handed to these (1 MiB blocks come from the cache)
    decoys = [af.zeros(N) for _ in range(3 * len(nodes))]
    af.synchronize()
    probe.gate.set()
    await asyncio.to_thread(settle, g)
    assert all(float(np.abs(d.numpy()).max()) == 0.0 for d in decoys)
    assert probe.bad == []
    del decoys
    assert in_use() == base
    outs = [first_values(o, sinks) async for o in g.run_async()]
    assert outs == expected(nodes, sinks)
    assert probe.bad == []
    await asyncio.to_thread(settle, g)
    assert in_use() == base


def test_the_next_run_says_which_abandoned_act_it_waits_for(monkeypatch):
    from actorflow.runtime.sched import loop as loop_module

    gate, started = threading.Event(), threading.Event()
    said = []

    def stage(x):
        if int(x[0]) == 1:
            started.set()
            gate.wait(30)
        return x

    def warn_then_open(stragglers):
        said.append(stragglers.running())
        warn(stragglers)
        gate.set()

    warn = loop_module.warn_waiting
    monkeypatch.setattr(loop_module, "WAIT_WARN_S", 0.001)
    monkeypatch.setattr(loop_module, "warn_waiting", warn_then_open)
    g = af.ActorGraph(buffers=1)
    g.sink(
        g.actor(
            stage, g.source(lambda: (np.full(4, i, np.float32) for i in range(3))), name="slowpoke"
        )
    )
    for _ in g.run():
        assert started.wait(30)
        break
    assert g.stats().abandoned == [("slowpoke", 1)]
    with pytest.warns(RuntimeWarning, match="'slowpoke' on piece 1"):
        assert len(list(g.run())) == 3
    assert said[0] == [("slowpoke", 1)]
    settle(g)


# -- found by review: a task per item, plan() after a stop, a run task cancelled at once --


async def test_a_task_per_item_does_not_stop_the_run():
    """Only a consumer task that is cancelled or fails stops the run; wait_for and a task
    per item each end normally after taking their piece."""
    g = af.ActorGraph()
    g.sink(
        g.actor(lambda x: x + 1, g.source(lambda: (np.full(4, i, np.float32) for i in range(30))))
    )
    for step in (
        lambda gen: asyncio.wait_for(gen.__anext__(), 30),
        lambda gen: asyncio.create_task(gen.__anext__()),
    ):
        gen, got = g.run_async(), []
        while True:
            try:
                got.append(float((await step(gen))[0]))
            except StopAsyncIteration:
                break
        assert got == [float(i + 1) for i in range(30)]


async def test_resuming_a_run_stopped_by_its_task_ending_raises():
    g = af.ActorGraph()
    g.sink(
        g.actor(lambda x: x + 1, g.source(lambda: (np.full(4, i, np.float32) for i in range(30))))
    )
    gen = g.run_async()

    async def take_one_then_fail():
        await gen.__anext__()
        raise KeyError("the consumer failed")

    with pytest.raises(KeyError):
        await asyncio.create_task(take_one_then_fail())
    with pytest.raises(RuntimeError, match="stopped when the task iterating it ended"):
        async for _ in gen:
            pass
    await g.join_async()


def test_plan_waits_for_abandoned_acts_and_the_next_run_is_exact():
    gate, blocked = threading.Event(), threading.Event()

    class Items:
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            i = self.i
            self.i += 1
            if i >= 6:
                raise StopIteration
            if i == 2 and not gate.is_set():
                blocked.set()
                gate.wait(30)
            return np.full(4, i, np.float32)

    g = af.ActorGraph(buffers=1)
    g.sink(g.actor(lambda x: x * 10, g.source(Items, name="src"), name="stage"))
    for _ in g.run():
        assert blocked.wait(30)
        break
    assert g.stats().abandoned == [("src", 2)]
    threading.Timer(0.05, gate.set).start()
    g.plan()  # waits for the source's act, then reads a fresh piece 0
    assert [float(o[0]) for o in g.run()] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]


async def test_a_run_task_cancelled_before_its_first_step_frees_the_plan():
    base = in_use()
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: x + 1,
            g.source(lambda: (np.full(N, i, np.float32) for i in range(10)), out=af.Spec((N,))),
            out=af.Spec((N,)),
        )
    )
    me = asyncio.current_task()

    async def consume():
        async for _ in g.run_async():
            pass

    async def cancel_everything():  # a shutdown handler, right after consume's first step
        for t in asyncio.all_tasks():
            if t is not asyncio.current_task() and t is not me:
                t.cancel()

    c = asyncio.create_task(consume())
    k = asyncio.create_task(cancel_everything())
    await asyncio.gather(c, k, return_exceptions=True)
    await g.join_async()
    assert in_use() == base
    assert len([x async for x in g.run_async()]) == 10


# -- issue 10: a per-actor timeout --------------------------------------------------------


@pytest.mark.parametrize("front", ["run", "run_async"])
async def test_an_act_past_its_timeout_fails_the_run_naming_actor_piece_and_time(front):
    base = in_use()
    gate, held = threading.Event(), threading.Event()

    def stage(x):
        if int(x[0]) == 2:
            held.set()
            gate.wait(30)
        return x

    g = af.ActorGraph()
    g.sink(
        g.actor(
            stage,
            g.source(lambda: (np.full(N, i, np.float32) for i in range(6))),
            name="stuck",
            timeout=0.2,
        )
    )
    with pytest.raises(
        af.ActorError,
        match=r"'stuck' took longer than timeout=0.2 s on "
        r"piece 2",
    ) as info:
        if front == "run":
            list(g.run())
        else:
            async for _ in g.run_async():
                pass
    assert info.value.actor == "stuck" and info.value.piece == 2
    assert isinstance(info.value.original, TimeoutError)
    assert held.is_set() and not gate.is_set()  # raised while the act still ran
    assert ("stuck", 2) in g.stats().abandoned
    gate.set()
    await asyncio.to_thread(settle, g)
    assert in_use() == base
    assert len(list(g.run())) == 6  # acts within the timeout: fine


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"timeout": 0}, "> 0"),
        ({"timeout": float("inf")}, "finite"),
        ({"timeout": 1, "inline": True}, "needs an actor on a"),
    ],
)
def test_bad_timeouts_are_refused(kw, match):
    g = af.ActorGraph()
    with pytest.raises(ValueError, match=match):
        g.actor(lambda x: x, g.source([np.zeros(2)]), **kw)


@pytest.mark.parametrize("schedule", ["inline", "seeded"])
def test_an_endless_run_on_the_loop_alone_can_be_stopped(schedule):
    """Every act of this run is on the scheduler's loop (inline stages, or a seeded serial
    schedule) and it has no sink, so nothing outside it ever waits: the loop still gets a
    turn now and then, so a timeout (and a stop) comes in instead of a hang."""
    import itertools

    g = af.ActorGraph()
    inline = schedule == "inline"
    src = g.source(
        lambda: (np.zeros(2, np.float32) for _ in itertools.count()), name="load", inline=inline
    )
    g.actor(lambda x: x, src, name="eat", inline=inline)
    with af.testing.seeded(3) if schedule == "seeded" else contextlib.nullcontext():
        with pytest.raises(AssertionError, match=r"did not end within 0.3 s"):
            af.testing.assert_no_deadlock(g, timeout=0.3)
    assert g.stats().actors["eat"]["acts"] > 4096  # (more than one turn's worth)
    g2 = af.ActorGraph()
    g2.sink(g2.actor(lambda x: x + 1, g2.source([np.ones(2, np.float32)]), inline=True))
    assert [float(o[0]) for o in g2.run()] == [2.0]  # the runtime goes on
