"""Testing actor graphs with the actorflow pytest plugin: copy this file next to your tests.

The plugin is on as soon as actorflow is installed (entry point ``pytest11``). It works
with pytest-asyncio in auto and in strict mode (the async tests below carry the marker
strict mode needs). Run: ``pytest examples/test_with_actorflow.py``.
"""

import asyncio
import time

import numpy as np
import pytest

import actorflow as af


def pipeline(pieces=20, buffers=2, output_buffers=16):
    """load -> (left, right) -> join: two branches ready at the same moments."""
    g = af.ActorGraph(buffers=buffers, output_buffers=output_buffers)
    load = g.source(lambda: (np.full(4, i, np.float32) for i in range(pieces)), name="load")
    left = g.actor(lambda x: x + 1, load, name="left")
    right = g.actor(lambda x: x * 2, load, name="right")
    g.sink(g.actor(lambda a, b: a + b, left, right, name="join"))
    return g


def test_the_same_seed_replays_the_same_order(af_seed):
    """af_seed: every run in this test tries ready actors in an order drawn from the seed
    and acts on the loop one act at a time, so the order of acts is the same each time.
    A failing test's report prints the seed; ``pytest --af-seed=N`` replays it."""
    g = pipeline()
    first = [float(o[0]) for o in g.run()]
    order = af.testing.acts(g)
    assert [float(o[0]) for o in g.run()] == first
    assert af.testing.acts(g) == order
    assert first == [3 * i + 1 for i in range(20)]


def test_simulated_time_on_a_virtual_clock(af_seed):
    """Under af_seed, time= (simulated seconds per act) runs on a virtual clock: an hour
    of simulated acts takes no real hour."""
    g = af.ActorGraph()
    src = g.source(range(60), name="load", time=60.0)  # a minute per piece
    g.sink(g.actor(lambda x: x, src, name="work", time=30.0))
    assert len(list(g.run())) == 60
    assert g.stats().wall_s >= 3600


def test_no_deadlock_and_memory_within_budget(af_memory_budget):
    """af_memory_budget: eager tensors on the device may not take more, and every run in
    the test must peak within it (checked when the test ends)."""
    af_memory_budget("1MiB", device="cpu")
    g = pipeline()
    outs = af.testing.assert_no_deadlock(g, timeout=30)
    assert len(outs) == 20
    af.testing.assert_peak_within(g, "1MiB")


def test_null_device_latency(af_null):
    """af_null: eager ops on the null device take simulated time and hold no data."""
    dev = af_null(0.01)
    x = af.ones((256, 256), device=dev)
    t = time.perf_counter()
    y = x @ x
    af.synchronize()
    assert time.perf_counter() - t >= 0.01  # (a lower bound: no flaky upper one)
    assert y.shape == (256, 256) and y.device == dev


@pytest.mark.asyncio
async def test_a_slow_consumer_blocks_every_actor():
    """wait_all_actors_blocked: returns once every actor waits (here on credits, because
    the consumer took one piece and stopped reading)."""
    g = pipeline(pieces=100, output_buffers=2)
    run = g.run_async()
    first = await run.__anext__()
    await af.testing.wait_all_actors_blocked(g)
    stats = g.stats()
    assert stats.state == "running"
    assert stats.actors["load"]["acts"] < 100  # held back by its credits
    await run.aclose()
    assert float(first[0]) == 1.0


@pytest.mark.af_gpu
def test_on_a_gpu():
    """af_gpu: skipped, with the reason, where there is no CUDA GPU."""
    import cupy

    assert int(cupy.arange(4).sum()) == 6


@pytest.mark.asyncio
async def test_async_run_has_no_deadlock():
    g = pipeline()
    outs = await af.testing.assert_no_deadlock(g.run_async(), timeout=30)
    assert len(outs) == 20
    await asyncio.sleep(0)
