"""engine="ray" at its edges (each found by a review, each failing before its fix): a
fused chain headed by a source in a process that ends mid-batch, timeout= counted from
when a call's inputs are computed and per piece, acts per source, warm processes of
another graph, CPU shares around explicit asks, and errors while starting. On a local
Ray cluster the module starts (2 CPUs); skipped where Ray is not installed."""

import os
import sys
import textwrap
import time

import numpy as np
import pytest

import actorflow as af

ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def engine(ray_engine):
    return ray_engine


def items(n):
    return lambda: (np.full(8, i, np.float32) for i in range(n))


def double(x):
    return x * 2


@pytest.mark.parametrize("n, buffers", [(7, 3), (9, 2), (12, 3), (1, 2)])
def test_a_fused_chain_headed_by_a_source_in_a_process_ends_cleanly(engine, n, buffers):
    g = af.ActorGraph(buffers=buffers)
    src = g.source(items(n), name="load")
    g.sink(g.actor(double, src, name="dbl"), name="dbl")
    g.sink(src, name="raw")  # the source read outside too
    local = [{k: v.copy() for k, v in o.items()} for o in g.run()]
    eng = af.distributed.RayEngine(groups={"g": ["load", "dbl"]})
    for _ in range(2):  # (a read past the end: timing)
        remote = list(g.run(engine=eng))
        assert len(remote) == len(local) == n
        assert all(
            np.array_equal(x[k], y[k]) for x, y in zip(local, remote, strict=True) for k in x
        )
        rows = g.stats().actors
        assert rows["dbl"]["fused_acts"] == n and rows["load"]["acts"] == n
        assert max(rows["load"]["most_held"], rows["dbl"]["most_held"]) <= buffers


def slow(x):
    time.sleep(0.15)
    return x


def slow_at_six(x):
    time.sleep(0.3 if int(x[0]) == 6 else 0.0)
    return x


def test_timeout_counts_from_when_the_inputs_are_computed(engine):
    g = af.ActorGraph()
    s = g.actor(slow, g.source(items(8), name="load"), name="slow")
    g.sink(g.actor(double, s, name="fast", timeout=0.1))  # far below slow's 4 x 0.15 s
    outs = list(g.run(engine=engine))
    assert [float(o[0]) for o in outs] == [2.0 * i for i in range(8)]


def test_timeout_holds_per_piece_within_a_call(engine):
    g = af.ActorGraph()
    g.sink(
        g.actor(slow_at_six, g.source(items(12), name="load"), name="stage", timeout=0.2)
    )  # its call of 4: 0.3 s < 0.8 s
    with pytest.raises(
        af.ActorError,
        match=r"actor 'stage' failed on piece 6: "
        r"TimeoutError: actor 'stage' took 0.3\d* s on "
        r"piece 6, longer than timeout=0.2 s",
    ):
        list(g.run(engine=engine))


def test_acts_are_counted_per_source(engine):
    g = af.ActorGraph()
    a = g.source(items(8), name="a")
    b = g.source(items(13), name="b")
    g.sink(g.actor(lambda x, y: x + y, a, b, name="add"))
    assert len(list(g.run(engine=engine))) == 8
    rows = g.stats().actors
    assert rows["a"]["acts"] == 8 and 8 <= rows["b"]["acts"] <= 13 and rows["add"]["acts"] == 8


def test_warm_processes_of_another_graph_give_way(engine):
    def graph():
        g = af.ActorGraph()
        g.sink(g.actor(double, g.source(items(8), name="load"), name="work", replicas=2))
        return g

    one, two = graph(), graph()
    with af.distributed.RayEngine(keep_workers=True, start_timeout=20) as warm:
        assert len(list(one.run(engine=warm))) == 8  # its 2 processes take both CPUs
        assert len(list(two.run(engine=warm))) == 8  # (waited 20 s and failed before)
        assert len(list(one.run(engine=warm))) == 8


def test_cpus_left_by_explicit_asks_are_shared_by_the_others(engine):
    g = af.ActorGraph()
    a = g.actor(double, g.source(items(4), name="load"), name="a")
    g.sink(g.actor(double, a, name="b"))
    eng = af.distributed.RayEngine(placement={"a": {"num_cpus": 1.5}})
    assert len(list(g.run(engine=eng))) == 4  # b asks the 0.5 left


def dies(x):
    if int(x[0]) == 2:  # (piece 0 is computed on the driver while planning)
        os._exit(1)
    return x


def test_a_process_that_dies_in_a_fused_call_names_the_call(engine):
    g = af.ActorGraph()
    a = g.actor(double, g.source(items(8), name="load"), name="a")
    g.sink(g.actor(dies, a, name="b"))
    with pytest.raises(
        af.ActorError,
        match=r"actor 'a' failed on piece 0: RuntimeError: its "
        r"Ray actor process on node:0 died during pieces "
        r"0 to 3 \(one call\), in a call that acts for "
        r"'a' and 'b' \(fused\)",
    ):
        list(g.run(engine=af.distributed.RayEngine(groups={"g": ["a", "b"]})))


def test_errors_while_starting_are_plan_errors(engine, tmp_path):
    (tmp_path / "only_on_the_driver.py").write_text(
        textwrap.dedent("""
        def triple(x):
            return x * 3
    """)
    )
    sys.path.insert(0, str(tmp_path))  # (after Ray started: its workers lack it)
    try:
        import only_on_the_driver

        g = af.ActorGraph()
        g.sink(g.actor(only_on_the_driver.triple, g.source(items(4), name="load"), name="triple"))
        with pytest.raises(
            af.PlanError,
            match=r"the Ray actor process of 'triple' "
            r"\(triple\) died while starting.*import",
        ):
            list(g.run(engine=engine))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_on_the_driver", None)
    h = af.ActorGraph()
    h.sink(h.actor(double, h.source(items(4), name="load"), name="double"))
    with pytest.raises(
        af.PlanError,
        match=r"placement of 'double': Ray refuses the options "
        r"\{'colour': 'red'",
    ):
        list(h.run(engine=af.distributed.RayEngine(placement={"double": {"colour": "red"}})))
    assert len(list(h.run(engine=engine))) == 4  # and the graph runs after both
