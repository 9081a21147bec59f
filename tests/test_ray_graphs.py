"""engine="ray" runs what a local run runs: op actors, async stages, groups of cheap
stages in one process, shared tokens, several sources (an async one too), fed inputs,
and budgets per Ray resource. On a local Ray cluster the module starts (2 CPUs and a
custom resource); skipped where Ray is not installed."""

import asyncio
import json
import os

import numpy as np
import pytest

import actorflow as af

ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
pytestmark = pytest.mark.ray


RAY_RESOURCES = {"ssd": 2}  # (for the budgets per Ray resource)


@pytest.fixture(scope="module")
def engine(ray_engine):
    return ray_engine


def items(n=24):
    return lambda: (np.full(8, i, np.float32) for i in range(n))


def same_as_local(g, engine, **kw):
    local = [_copy(o) for o in g.run()]
    remote = list(g.run(engine=engine, **kw))
    assert len(remote) == len(local) > 0
    for x, y in zip(local, remote, strict=True):
        if isinstance(x, dict):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        else:
            assert np.array_equal(x, y)
    return remote


def _copy(o):
    return {k: v.copy() for k, v in o.items()} if isinstance(o, dict) else o.copy()


def double(x):
    return x * 2


def with_pid(x):
    return x + 1, np.int64(os.getpid())


async def slow_double(x):
    await asyncio.sleep(0.01)
    return x * 2


def test_op_actors_run_their_traced_kernels_on_ray(engine):
    w = af.tensor(np.arange(24, dtype=np.float32).reshape(8, 3))
    g = af.ActorGraph()
    src = g.source(items(), name="load")
    r = g.op(af.relu, g.actor(lambda x: x - 5, src, name="shift"), name="relu")
    g.sink(g.op(lambda x: x.reshape(1, 8) @ w, r, name="matmul"))
    out = same_as_local(g, engine)
    assert out[10].shape == (1, 3) and float(out[10].sum()) > 0
    assert g.stats().actors["matmul"]["acts"] == 24
    assert g.stats().actors["matmul"]["mode"] == "ray"


def test_async_stages_await_their_pieces_in_a_ray_process(engine):
    g = af.ActorGraph(buffers=3)
    src = g.source(items(), name="load")
    g.sink(g.actor(slow_double, src, name="fetch"))
    same_as_local(g, engine)
    row = g.stats().actors["fetch"]
    assert row["acts"] == 24 and row["most_held"] <= 3
    assert len(row["processes"]) == 1 and os.getpid() not in row["processes"]


async def failing_later(x):
    await asyncio.sleep(0)
    if int(x[0]) == 6:
        raise KeyError("six")
    return x


def test_an_async_stage_that_raises_names_its_piece(engine):
    g = af.ActorGraph()
    g.sink(g.actor(failing_later, g.source(items(), name="load"), name="fetch"))
    with pytest.raises(af.ActorError, match=r"actor 'fetch' failed on piece 6.*KeyError"):
        list(g.run(engine=engine))
    assert g.stats().state == "failed"


def test_a_group_of_cheap_stages_shares_its_processes(engine):
    g = af.ActorGraph()
    src = g.source(items(), name="load")
    a = g.actor(with_pid, src, name="decode", replicas=2)
    b = g.actor(lambda p: (p[0] * 3, p[1]), a, name="crop", replicas=2)
    c = g.actor(lambda p: (p[0] - 1, p[1], np.int64(os.getpid())), b, name="scale")
    g.sink(c)
    eng = af.distributed.RayEngine(
        groups={"light": ["decode", "crop", "scale"]}, placement={"light": {"num_cpus": 0.5}}
    )
    outs = list(g.run(engine=eng))
    assert [float(x[0]) for x, _, _ in outs] == [(i + 1) * 3.0 - 1 for i in range(24)]
    stats = g.stats().actors
    assert stats["decode"]["processes"] == stats["crop"]["processes"]
    assert len(set(stats["decode"]["processes"])) == 2  # the group's two processes
    assert stats["scale"]["processes"] == stats["decode"]["processes"][:1]
    assert {int(p) for _, p, _ in outs} | {int(q) for _, _, q in outs} <= set(
        stats["decode"]["processes"]
    )


def test_groups_and_their_placement_are_checked(engine):
    g = af.ActorGraph()
    src = g.source(items(4), name="load")
    g.sink(g.actor(double, g.actor(double, src, name="a"), name="b"))

    def refused(match, **kw):
        with pytest.raises(af.PlanError, match=match):
            list(g.run(engine=af.distributed.RayEngine(**kw)))

    refused(
        r"group 'light' names 'c', which is not an actor of this graph; its actors: "
        r"\['a', 'b', 'load'\]",
        groups={"light": ["a", "c"]},
    )
    refused(r"'a' is in groups 'x' and 'y'", groups={"x": ["a"], "y": ["a", "b"]})
    refused("group 'a' has the name of an actor", groups={"a": ["b"]})
    refused(
        r"placement= names 'a', which acts in group 'x'.*place the group",
        groups={"x": ["a", "b"]},
        placement={"a": {"num_cpus": 1}},
    )
    refused(r"ask 3 CPU \(x 1 x 3\)", groups={"x": ["a", "b"]}, placement={"x": {"num_cpus": 3}})
    with pytest.raises(ValueError, match="a group is a list of stage names"):
        af.distributed.RayEngine(groups={"x": "a"})
    assert len(list(g.run(engine=af.distributed.RayEngine(groups={"x": ["a", "b"]})))) == 4


def test_an_async_stage_in_a_group_with_a_plain_one(engine):
    g = af.ActorGraph()
    src = g.source(items(), name="load")
    g.sink(g.actor(double, g.actor(slow_double, src, name="fetch"), name="twice"))
    eng = af.distributed.RayEngine(groups={"io": ["fetch", "twice"]})
    same_as_local(g, eng)
    stats = g.stats().actors
    assert stats["fetch"]["processes"] == stats["twice"]["processes"]


def holding(x):
    import time

    time.sleep(0.004)
    return x


def test_shared_tokens_hold_across_processes(engine, tmp_path):
    g = af.ActorGraph(resources={"disk": 1})
    src = g.source(items(), name="load")
    a = g.actor(holding, src, name="read_a", resources={"disk": 1}, replicas=2)
    b = g.actor(holding, src, name="read_b", resources={"disk": 1})
    g.sink(g.actor(lambda x, y: x + y, a, b, name="join"))
    same_as_local(g, engine, trace=tmp_path / "t.json")
    calls: dict = {}  # (name, replica, first piece of its call) -> [start, end]
    evs = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    for e in evs:
        if e["ph"] == "X" and e["name"] in ("read_a", "read_b"):
            key = (e["name"], e["tid"], e["args"]["piece"] // engine.batch)
            span = calls.setdefault(key, [e["ts"], e["ts"] + e["dur"]])
            span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"] + e["dur"])
    spans = sorted(calls.values())
    assert len(spans) == 12  # 2 stages x 6 calls of 4
    # one holds the token: each span ends before the next starts (consecutive pairs)
    assert all(s[1] <= t[0] for s, t in zip(spans, spans[1:], strict=False))
    stats = g.stats().actors
    assert stats["read_a"]["wait_resource_s"] + stats["read_b"]["wait_resource_s"] > 0


async def numbers(n):
    for i in range(n):
        await asyncio.sleep(0)
        yield np.full(4, 10 * i, np.float32)


def test_several_sources_an_async_one_and_fed_inputs(engine):
    g = af.ActorGraph()
    a = g.source(items(10), name="a")
    b = g.source(lambda: numbers(7), name="b")  # the shorter one ends the run
    g.sink(g.actor(lambda x, y: x[:4] + y, a, b, name="add"))
    outs = same_as_local(g, engine)
    assert len(outs) == 7 and float(outs[6][0]) == 66.0
    h = af.ActorGraph()
    x = h.input(af.Spec((8,), af.float32), name="x")
    h.sink(h.actor(double, x, name="double"))
    feed = [np.full(8, i, np.float32) for i in range(9)]
    outs = list(h.run(engine=engine, feed=feed))
    assert [float(o[0]) for o in outs] == [2.0 * i for i in range(9)]


def test_budgets_per_ray_resource(engine):
    g = af.ActorGraph(buffers=2)
    src = g.source(items(), name="load")
    a = g.actor(double, src, name="fast")
    g.sink(g.actor(double, a, name="slow"))
    on_ssd = {"slow": {"resources": {"ssd": 1}}}
    eng = af.distributed.RayEngine(placement=on_ssd, memory={"ssd": "200B"})
    with pytest.raises(
        af.PlanError,
        match=r"registers on the actors asking Ray resource "
        r"'ssd' need 256 B \(slow 2 x 4 x 32 B\), over "
        r"its 200 B budget; buffers=1 would fit",
    ) as info:
        list(g.run(engine=eng))
    assert info.value.fitting_buffers == 1
    ok = af.distributed.RayEngine(placement=on_ssd, memory={"ssd": "256B"})
    assert len(list(g.run(engine=ok))) == 24
    assert g.stats().memory["ssd"] == {"planned": 256, "peak": None, "budget": 256, "live": None}
    with pytest.raises(
        af.PlanError,
        match=r"memory= names 'tape', which is neither a node "
        r"nor a Ray resource.*'ssd'",
    ):
        list(g.run(engine=af.distributed.RayEngine(memory={"tape": "1MiB"})))


def test_nodes_are_named_by_id_or_address(engine):
    g = af.ActorGraph()
    g.sink(g.actor(double, g.source(items(8), name="load"), name="double"))
    here = ray.get_runtime_context().get_node_id()
    address = ray.util.get_node_ip_address()
    for name in (here, f"node:{address}", address, 0):
        eng = af.distributed.RayEngine(placement={"double": {"node": name}})
        assert len(list(g.run(engine=eng))) == 8
        assert g.stats().actors["double"]["nodes"] == ["node:0"]
    with pytest.raises(af.PlanError, match=r"node:0 need .* over its 10 B budget"):
        list(g.run(engine=af.distributed.RayEngine(memory={address: "10B"})))


def read_with_pid(n):
    def read():
        for i in range(n):
            yield np.full(8, i, np.float32), np.int64(os.getpid())

    return read


@pytest.mark.parametrize("n", [8, 10, 1])  # whole batches, a part, one piece
def test_a_placed_source_is_read_in_a_ray_process(engine, n):
    g = af.ActorGraph()
    src = g.source(read_with_pid(n), name="load")
    g.sink(g.actor(lambda p: (p[0] * 2, p[1]), src, name="double"))
    eng = af.distributed.RayEngine(placement={"load": {"num_cpus": 0.5}})
    outs = list(g.run(engine=eng))
    assert [float(x[0]) for x, _ in outs] == [2.0 * i for i in range(n)]
    readers = {int(p) for _, p in outs}
    stats = g.stats().actors
    assert readers == set(stats["load"]["processes"]) and os.getpid() not in readers
    assert stats["load"]["acts"] == n and stats["double"]["acts"] == n
    assert stats["load"]["most_held"] <= 2


def test_a_source_in_a_group_and_an_async_one_in_a_process(engine):
    g = af.ActorGraph()
    a = g.source(lambda: numbers(9), name="a")
    b = g.source(items(12), name="b")
    g.sink(g.actor(lambda x, y: x + y[:4], a, b, name="add"))
    eng = af.distributed.RayEngine(groups={"io": ["a", "add"]}, placement={"b": {"num_cpus": 0.25}})
    outs = same_as_local(g, eng)
    assert len(outs) == 9
    stats = g.stats().actors
    assert stats["a"]["processes"] == stats["add"]["processes"] != [os.getpid()]
    assert stats["b"]["processes"] != [os.getpid()]


def bad_source(n, bad_at, shape=False):
    def read():
        for i in range(n):
            if i == bad_at and not shape:
                raise OSError(f"disk gone at {i}")
            yield np.full(4 if i == bad_at else 8, i, np.float32)

    return read


def test_a_placed_source_that_fails_names_its_piece(engine):
    placed = af.distributed.RayEngine(placement={"load": {}})
    g = af.ActorGraph()
    g.sink(g.actor(double, g.source(bad_source(12, 6), name="load"), name="double"))
    with pytest.raises(
        af.ActorError,
        match=r"actor 'load' failed on piece 6.*OSError: disk "
        r"gone at 6",
    ):
        list(g.run(engine=placed))
    h = af.ActorGraph()
    h.sink(h.actor(double, h.source(bad_source(12, 5, shape=True), name="load"), name="double"))
    words = (
        "source 'load' (piece 5) returned float32[4] but its register holds "
        "float32[8]; return the same shape for every piece, or declare out=af.Spec(...)"
    )
    for how in (None, placed, engine):  # local, in a process, read on the driver
        with pytest.raises(af.ActorError) as info:
            list(h.run(engine=how))
        assert info.value.piece == 5 and type(info.value.original) is af.ShapeError
        assert str(info.value.original) == words


def test_what_cannot_be_read_in_a_process_is_refused(engine):
    g = af.ActorGraph()
    g.sink(
        g.actor(
            double,
            g.source(
                (np.full(8, i, np.float32) for i in range(4)),
                out=af.Spec((8,), af.float32),
                name="load",
            ),
            name="double",
        )
    )
    with pytest.raises(
        af.PlanError,
        match=r"'load' cannot be sent to a Ray actor process "
        r"\(TypeError: cannot pickle 'generator' object\)"
        r".*g.source\(read\), not "
        r"g.source\(read\(\)\)",
    ):
        list(g.run(engine=af.distributed.RayEngine(placement={"load": {}})))
    h = af.ActorGraph()
    h.sink(h.actor(double, h.input(af.Spec((8,), af.float32), name="x"), name="double"))
    with pytest.raises(af.PlanError, match=r"input 'x' takes its pieces from run\(feed=...\)"):
        list(h.run(engine=af.distributed.RayEngine(placement={"x": {}}), feed=[]))


def test_a_chain_in_a_group_acts_in_one_call_per_batch(engine, tmp_path):
    g = af.ActorGraph()
    src = g.source(items(), name="load")
    a = g.actor(lambda x: x + 1, src, name="decode")
    b = g.actor(lambda x: x * 3, a, name="crop")
    c = g.actor(lambda x: x - 2, b, name="scale")
    g.sink(c, name="out")
    g.sink(b, name="crop")  # a middle stage read outside too
    g.sink(g.actor(double, a, name="side"), name="side")  # read by a stage elsewhere
    fused = af.distributed.RayEngine(groups={"light": ["load", "decode", "crop", "scale"]})
    same_as_local(g, fused, trace=tmp_path / "t.json")
    rows = g.stats().actors
    assert [rows[n]["fused_acts"] for n in ("load", "decode", "crop", "scale", "side")] == [
        0,
        24,
        24,
        24,
        0,
    ]  # every act in the source's calls
    assert all(
        rows[n]["acts"] == 24 and rows[n]["most_held"] <= 2
        for n in ("load", "decode", "crop", "scale", "side")
    )
    assert len({p for n in ("load", "decode", "crop", "scale") for p in rows[n]["processes"]}) == 1
    names = [
        e["name"]
        for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
        if e["ph"] == "X"
    ]
    assert all(names.count(n) == 24 for n in ("load", "decode", "crop", "scale"))
    apart = af.distributed.RayEngine(groups={"light": ["decode", "crop", "scale"]}, fuse=False)
    same_as_local(g, apart)
    assert all(row["fused_acts"] == 0 for row in g.stats().actors.values())


def test_batch_auto_sizes_calls_by_bytes_and_budget(engine):
    def graph(size):
        g = af.ActorGraph(buffers=2)
        src = g.source(lambda: (np.full(size, i, np.float32) for i in range(70)), name="load")
        g.sink(g.actor(double, src, name="double"))
        return g

    small = graph(8)  # 32 B pieces: the most, 64
    same_as_local(small, af.distributed.RayEngine(batch="auto"))
    assert small.stats().batch == 64 and "calls of 64 pieces" in small.stats().table()
    big = graph(1 << 16)  # 256 KiB pieces: 16 per 4 MiB
    assert len(list(big.run(engine=af.distributed.RayEngine(batch="auto")))) == 70
    assert big.stats().batch == 16 and big.stats().as_dict()["batch"] == 16
    tight = af.distributed.RayEngine(batch="auto", memory={"node:0": "7MiB"})
    assert len(list(big.run(engine=tight))) == 70  # 2 actors x 2 x B x 256 KiB
    assert big.stats().batch == 4
    with pytest.raises(
        af.PlanError,
        match=r"need 1.0 MiB \(load 2 x 1 x 256.0 KiB, double "
        r"2 x 1 x 256.0 KiB\), over its 512.0 KiB budget; "
        r"buffers=1 would fit",
    ):
        list(big.run(engine=af.distributed.RayEngine(batch="auto", memory={"node:0": "512KiB"})))
    with pytest.raises(ValueError, match=r"a whole number >= 1, or \"auto\""):
        af.distributed.RayEngine(batch="big")
