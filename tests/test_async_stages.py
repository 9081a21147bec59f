"""async def stages and async generator sources: awaited on the run's loop with their
credits, several acts of one stage in flight (up to its registers), pieces in order."""

import asyncio
import gc
import random
import warnings

import numpy as np
import pytest

import actorflow as af


def in_use():
    """Bytes in use on cpu once the VM has freed what dead tensors held (other tests'
    tensors are freed lazily: without this a measurement can move by their bytes)."""
    import gc

    gc.collect()
    af.synchronize()
    af.lowlevel.get_vm().collect_releases()
    return af.lowlevel.memory_stats("cpu").in_use


def numbers(n, size=4):
    def gen():
        for i in range(n):
            yield np.full(size, i, np.float32)

    return gen


async def agen_numbers(n=5):
    for i in range(n):
        await asyncio.sleep(0)
        yield np.full(4, i, np.float32)


class Overlap:
    """An async stage that records how many of its acts run at once; each act waits until
    ``want`` are running (or a short while, if the run can never start that many)."""

    def __init__(self, want):
        self.want = want
        self.active = 0
        self.most = 0
        self.calls = 0
        self.full = None

    async def __call__(self, x):
        if self.full is None:
            self.full = asyncio.Event()
        self.calls += 1
        self.active += 1
        self.most = max(self.most, self.active)
        if self.active >= self.want:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
        self.active -= 1
        return x * 2


def test_async_def_stage_runs_in_run_and_keeps_piece_order():
    rng = random.Random(0)
    delays = [rng.random() * 0.01 for _ in range(12)]

    async def slow_double(x):  # later pieces often finish first
        await asyncio.sleep(delays[int(x[0])])
        return x * 2

    g = af.ActorGraph(buffers=4)
    s = g.source(numbers(12))
    a = g.actor(slow_double, s)
    g.sink(a)
    outs = list(g.run())
    assert [int(o[0]) for o in outs] == [2 * i for i in range(12)]
    st = g.stats()
    assert st.actors["slow_double"]["mode"] == "async"
    assert st.actors["slow_double"]["acts"] == 12
    assert "async stage slow_double" in str(g.plan())


async def test_async_def_stage_in_run_async():
    async def inc(x):
        await asyncio.sleep(0)
        return x + 1

    g = af.ActorGraph()
    g.sink(g.actor(inc, g.source(agen_numbers)))
    outs = [o async for o in g.run_async()]
    assert [int(o[0]) for o in outs] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_acts_of_an_async_stage_overlap_up_to_its_registers(buffers):
    stage = Overlap(want=buffers)
    g = af.ActorGraph()
    s = g.source(numbers(10), buffers=4)  # inputs are never what limits it
    g.sink(g.actor(stage, s, buffers=buffers, name="overlap"))
    outs = list(g.run())
    assert [int(o[0]) for o in outs] == [2 * i for i in range(10)]
    assert stage.most == buffers  # as many as it has registers, never more


def test_resource_tokens_bound_the_overlap_of_an_async_stage():
    stage = Overlap(want=2)
    g = af.ActorGraph(resources={"net": 2})
    s = g.source(numbers(8), buffers=4)
    g.sink(g.actor(stage, s, buffers=4, resources={"net": 2 // 2}, name="fetch"))
    list(g.run())
    assert stage.most == 2


def test_plan_reads_piece_zero_of_async_source_and_stage_once():
    calls = []

    async def scale(x):
        calls.append(int(x[0]))
        return np.concatenate([x, x])

    g = af.ActorGraph(memory={"cpu": "1MiB"})
    s = g.source(agen_numbers, name="load")  # no out=: piece 0 sizes it
    g.sink(g.actor(scale, s, name="scale"))
    plan = g.plan()
    assert "float32[8] on cpu" in str(plan)
    assert calls == [0]
    outs = list(g.run())
    assert [int(o[0]) for o in outs] == [0, 1, 2, 3, 4]
    assert calls == [0, 1, 2, 3, 4]  # piece 0 was not computed twice


def test_async_source_without_spec_sizes_the_lazy_run():
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x * 3, g.source(agen_numbers)))
    assert [int(o[0]) for o in g.run()] == [0, 3, 6, 9, 12]
    assert [int(o[0]) for o in g.run()] == [0, 3, 6, 9, 12]  # a factory: runs again


def test_error_in_async_stage_names_actor_and_piece_and_graph_runs_again():
    async def picky(x):
        if x[0] == 3 and fail[0]:
            raise ValueError("bad piece")
        return x

    fail = [True]
    g = af.ActorGraph()
    g.sink(g.actor(picky, g.source(numbers(6))))
    with pytest.raises(af.ActorError) as ei:
        list(g.run())
    assert ei.value.actor == "picky" and ei.value.piece == 3
    assert "bad piece" in str(ei.value)
    fail[0] = False
    assert len(list(g.run())) == 6


def test_timeout_of_an_async_act_fails_the_run_and_cancels_it():
    cancelled = []

    async def stuck(x):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(int(x[0]))
            raise
        return x

    g = af.ActorGraph(memory={"cpu": "1MiB"})
    g.sink(g.actor(stuck, g.source(numbers(3)), timeout=0.05, name="stuck"))
    with pytest.raises(af.ActorError) as ei:
        list(g.run())
    assert isinstance(ei.value.__cause__, TimeoutError)
    assert "stuck" in str(ei.value) and "timeout=0.05" in str(ei.value)
    assert g.join(5)
    assert cancelled  # the act was cancelled, not left running
    assert g.stats().state == "failed"


async def test_cancelling_run_async_cancels_pending_async_acts_and_frees_registers():
    started = asyncio.Event()
    cancelled = []

    async def forever(x):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(int(x[0]))
            raise

    g = af.ActorGraph(memory={"cpu": "1MiB"})
    g.sink(g.actor(forever, g.source(numbers(4)), out=af.Spec((4,), af.float32)))
    base = in_use()

    async def consume():
        async for _ in g.run_async():
            pass

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await g.join_async()
    assert cancelled and g.stats().state == "stopped"
    assert in_use() == base


def test_simulated_time_on_an_async_stage_is_awaited_not_slept():
    async def ident(x):
        return x

    g = af.ActorGraph(buffers=4)
    g.sink(g.actor(ident, g.source(numbers(4), buffers=4), time=0.01))
    assert len(list(g.run())) == 4
    assert g.stats().actors["ident"]["compute_s"] >= 4 * 0.01 * 0.5  # counted per act


def test_pipeline_takes_async_stages_and_async_generator_source():
    async def double(x):
        return x * 2

    pipe = af.Pipeline([agen_numbers, double, np.negative])
    assert [int(o[0]) for o in pipe.run()] == [0, -2, -4, -6, -8]


def test_plain_function_returning_a_coroutine_is_refused_without_a_warning():
    async def double(x):
        return x * 2

    g = af.ActorGraph()
    g.sink(g.actor(lambda x: double(x), g.source(numbers(2)), name="wrapped"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(af.ActorError) as ei:
            list(g.run())
        gc.collect()
    assert "declare it 'async def'" in str(ei.value) and "wrapped" in str(ei.value)
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_async_generator_function_as_a_stage_is_refused_with_the_fix():
    async def gen_stage(x):
        yield x

    g = af.ActorGraph()
    s = g.source(numbers(2))
    with pytest.raises(TypeError, match="async generator function.*source"):
        g.actor(gen_stage, s)


def test_async_callable_object_and_partial_are_async_stages():
    import functools

    async def add(k, x):
        return x + k

    g = af.ActorGraph()
    s = g.source(numbers(3))
    a = g.actor(functools.partial(add, 10), s, name="partial")
    b = g.actor(Overlap(want=1), a, name="object")
    g.sink(b)
    assert [int(o[0]) for o in g.run()] == [20, 22, 24]
    modes = {n: r["mode"] for n, r in g.stats().actors.items()}
    assert modes["partial"] == "async" and modes["object"] == "async"


# -- replicas: a thread stage on several threads -------------------------------------------


class ThreadOverlap:
    """A thread stage that records how many of its acts run at once."""

    def __init__(self, delays=None):
        import threading

        self.lock = threading.Lock()
        self.active = self.most = 0
        self.delays = delays

    def __call__(self, x):
        import time

        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.delays[int(x[0])] if self.delays else 0.02)
        with self.lock:
            self.active -= 1
        return x * 2


@pytest.mark.parametrize("replicas,buffers,expect", [(1, 4, 1), (3, 4, 3), (4, 2, 2)])
def test_replicas_overlap_up_to_their_registers_and_keep_order(replicas, buffers, expect):
    rng = random.Random(1)
    stage = ThreadOverlap([rng.random() * 0.02 for _ in range(16)])
    g = af.ActorGraph()
    s = g.source(numbers(16), buffers=8)
    g.sink(g.actor(stage, s, buffers=buffers, replicas=replicas, name="work"))
    assert [int(o[0]) for o in g.run()] == [2 * i for i in range(16)]
    assert stage.most <= expect
    if expect > 1:
        assert stage.most >= 2  # they did overlap


def test_an_error_in_a_replica_names_the_piece_and_stop_frees_everything():
    import threading

    gate = threading.Event()

    def stage(x):
        if int(x[0]) == 5:
            raise ValueError("bad five")
        if int(x[0]) > 5:
            gate.wait(5)
        return x

    g = af.ActorGraph(memory={"cpu": "1MiB"})
    g.sink(g.actor(stage, g.source(numbers(12), buffers=6), buffers=6, replicas=3, name="rep"))
    base = in_use()
    with pytest.raises(af.ActorError) as ei:
        list(g.run())
    assert ei.value.actor == "rep" and ei.value.piece == 5
    gate.set()
    assert g.join(10)
    assert in_use() == base
    with pytest.raises(af.ActorError):  # the graph runs again (and fails again)
        list(g.run())


def test_replicas_arguments_are_checked():
    g = af.ActorGraph()
    s = g.source(numbers(2))
    with pytest.raises(ValueError, match="replicas must be an int from 1 to 64"):
        g.actor(lambda x: x, s, replicas=0)
    with pytest.raises(ValueError, match="inline"):
        g.actor(lambda x: x, s, replicas=2, inline=True)
    with pytest.raises(ValueError, match="timeout"):
        g.actor(lambda x: x, s, replicas=2, timeout=1.0)

    async def a(x):
        return x

    with pytest.raises(ValueError, match="async def"):
        g.actor(a, s, replicas=2)


# -- random mixes of stage kinds ------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402 - with its section
from hypothesis import strategies as hs  # noqa: E402 - with its section

KINDS = ("thread", "inline", "async", "replicas")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=hs.lists(hs.sampled_from(KINDS), min_size=1, max_size=5),
    buffers=hs.lists(hs.integers(1, 4), min_size=6, max_size=6),
    n=hs.integers(0, 12),
    seed=hs.integers(0, 2**16),
    stop_at=hs.one_of(hs.none(), hs.integers(0, 12)),
)
def test_random_chains_of_stage_kinds_keep_order_and_free_everything(
    kinds, buffers, n, seed, stop_at
):
    """A chain of thread, inline, async and replicated stages (random registers, a seeded
    scheduler, random short waits): every piece arrives once, in order, with the value the
    chain computes; stopping early (break) or running to the end frees every register."""
    rng = random.Random(seed)
    waits = [[rng.random() * 0.002 for _ in range(12)] for _ in kinds]

    def stage(k, kind):
        if kind == "async":

            async def f(x):
                await asyncio.sleep(waits[k][int(x[0]) % 12])
                return x + 1

            return f

        def g(x):
            if kind != "inline":
                import time

                time.sleep(waits[k][int(x[0]) % 12])
            return x + 1

        return g

    g = af.ActorGraph(seed=seed, memory={"cpu": "1MiB"})
    node = g.source(numbers(n), buffers=buffers[0])
    for k, kind in enumerate(kinds):
        node = g.actor(
            stage(k, kind),
            node,
            buffers=buffers[k + 1],
            name=f"s{k}",
            inline=kind == "inline",
            replicas=3 if kind == "replicas" else 1,
        )
    g.sink(node)
    base = in_use()
    got = []
    for out in g.run():
        got.append(int(out[0]))
        if stop_at is not None and len(got) > stop_at:
            break
    want = [i + len(kinds) for i in range(n)]
    assert got == want[: len(got)]
    if stop_at is None or stop_at >= n:
        assert got == want
    assert g.join(10)
    assert in_use() <= base  # (a leak holds more; an earlier test's may be freed meanwhile)


def test_pipeline_stages_take_replicas():
    stage = ThreadOverlap()
    pipe = af.Pipeline([numbers(12), stage, np.negative], buffers=[4, 3, 2], replicas=3)
    assert [int(o[0]) for o in pipe.run()] == [-2 * i for i in range(12)]
    assert 2 <= stage.most <= 3
    with pytest.raises(ValueError, match="source"):
        af.Pipeline([numbers(2), np.negative], replicas=[2, 1])


def test_stats_show_replicas():
    pipe = af.Pipeline([numbers(4), np.negative], replicas=[None, 3], names=["src", "neg"])
    list(pipe.run())
    s = pipe.stats()
    assert s.actors["neg"]["replicas"] == 3 and s.actors["src"]["replicas"] == 1
    assert "threadx3" in str(s)


# -- an async def stage iterating another graph's run_async() ------------------------------


def inner_graph(n=3, **kw):
    g = af.ActorGraph(**kw)
    g.sink(g.actor(lambda x: x * 2, g.source([np.ones(2)] * n, name="isrc"), name="double"))
    return g


def outer_graph(make_inner, pieces=4):
    """A graph whose async stage sums, for each piece, another graph's whole run."""
    g = af.ActorGraph()

    async def total(x):
        s = 0.0
        async for o in make_inner().run_async():
            s += float(o.sum())
        return x + s

    g.sink(
        g.actor(
            total, g.source([np.full(2, float(i)) for i in range(pieces)], name="src"), name="total"
        )
    )
    return g


@pytest.mark.timeout(60)
def test_an_async_stage_iterates_another_graphs_run_async():
    outs = af.testing.assert_no_deadlock(outer_graph(inner_graph), timeout=30)
    assert [o.tolist() for o in outs] == [[12.0 + i] * 2 for i in range(4)]


@pytest.mark.timeout(60)
def test_a_nested_run_replays_under_a_seeded_schedule():
    with af.testing.seeded(3):
        outs = af.testing.assert_no_deadlock(outer_graph(inner_graph), timeout=30)
    assert [float(o[0]) for o in outs] == [12.0 + i for i in range(4)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [{"memory": {"cpu": "1MiB"}}, {"buffers": "auto"}, {"share": True}])
def test_a_nested_run_sized_by_piece_0_of_async_actors(kw):
    # the inner graph's async source and stage have no out=: with a budget piece 0 flows
    # first; with buffers="auto" or share=True it is computed before the run, on a thread
    # of its own that awaits them on the run's loop (the graph loop, which runs the outer
    # stage meanwhile)
    def inner():
        g = af.ActorGraph(**kw)
        g.sink(g.actor(Overlap(1), g.source(agen_numbers, name="asrc"), name="aslow"))
        return g

    alone = sum(float(o.sum()) for o in inner().run())  # the inner run by itself
    assert alone > 0
    outs = af.testing.assert_no_deadlock(outer_graph(inner), timeout=30)
    assert [float(o[0]) for o in outs] == [alone + i for i in range(4)]


@pytest.mark.timeout(60)
def test_a_stalled_nested_run_is_named_as_a_cycle_not_a_hang():
    import collections

    class DropsFirst(collections.deque):
        """An input queue that loses the first register sent to it (a bug the plan rules
        out, made here): its reader waits for it, and its producer for that register."""

        dropped = False

        def append(self, x):
            if not self.dropped:
                self.dropped = True
                return
            super().append(x)

    def stalling():
        g = af.ActorGraph(buffers=1)
        y = g.source([np.ones(2)] * 3, name="y", out=af.Spec((2,), af.float64), inline=True)
        x = g.actor(lambda a, b: a + b, y, y, name="x", inline=True)
        g.sink(x)
        start = g._start

        def losing(feed):
            plan = start(feed)
            plan.in_ports[x][0].queue = DropsFirst()
            return plan

        g._start = losing
        return g

    g = outer_graph(stalling, pieces=2)
    with pytest.raises(AssertionError) as info:
        af.testing.assert_no_deadlock(g, timeout=30)
    text = str(info.value)
    assert text.startswith(
        "deadlock in a run that actor 'total' iterated on piece 0: the actor graph deadlocked:"
    )
    assert "one (piece 0) is queued at x; x waits for piece 0 from y" in text
    assert g.join(10)
    assert g.stats().state == "failed"


def test_a_blocking_run_from_an_act_on_the_graph_loop_is_refused_with_the_fix():
    async def blocking(x):
        list(inner_graph().run())
        return x

    for make in (
        lambda: list(inner_graph().run()) or None,  # an inline act
        blocking,
    ):  # an async def stage
        g = af.ActorGraph()
        fn = make if make is blocking else (lambda x, make=make: make() or x)
        g.sink(g.actor(fn, g.source([np.ones(2)]), name="nest", inline=make is not blocking))
        with pytest.raises(af.ActorError) as info:
            list(g.run())
        text = str(info.value)
        assert info.value.actor == "nest" and info.value.piece == 0
        assert "run() was called on the thread that drives actor graphs" in text
        assert "iterate the other graph with 'async for out in g.run_async()'" in text
        assert "make it a thread stage (drop inline=True" in text
    g = af.ActorGraph()  # from a thread stage: a run of its own
    g.sink(
        g.actor(
            lambda x: x + sum(float(o.sum()) for o in inner_graph().run()),
            g.source([np.zeros(2)]),
            name="nest",
        )
    )
    assert [o.tolist() for o in g.run()] == [[12.0, 12.0]]


def test_plan_from_an_async_stage_says_why_it_cannot_await_there():
    async def plans(x):
        g2 = af.ActorGraph()
        g2.sink(g2.actor(lambda v: v, g2.source(agen_numbers, name="asrc")))
        g2.plan()
        return x

    g = af.ActorGraph()
    g.sink(g.actor(plans, g.source([np.ones(2)]), name="plans"))
    with pytest.raises(
        af.ActorError,
        match=r"plan\(\) was called on the thread that drives "
        r"actor graphs .* Give those actors out=",
    ):
        list(g.run())


@pytest.mark.timeout(60)
async def test_run_async_cancelled_while_planning_frees_the_plan():
    import threading

    release = threading.Event()
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    released = []

    def slow(x):
        loop.call_soon_threadsafe(started.set)
        released.append(release.wait(10))  # set by the loop: it is not held
        return x

    g = af.ActorGraph(buffers="auto")  # piece 0 computed before the run
    g.sink(g.actor(slow, g.source(numbers(3)), name="slow"))

    async def consume():
        return [o async for o in g.run_async()]

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(started.wait(), 10)  # (the loop runs while piece 0 is made)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    for _ in range(200):  # the plan made after all is freed
        if not g._running:
            break
        await asyncio.sleep(0.01)
    assert released == [True]
    outs = [int(o[0]) async for o in g.run_async()]
    assert outs == [0, 1, 2]
