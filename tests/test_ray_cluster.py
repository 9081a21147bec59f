"""engine="ray" on a cluster of several Ray nodes (started on this machine by the test, as
``ray.cluster_utils.Cluster`` does: a raylet and object store per node): stages pinned to
a node or placed by a resource label, budgets per node weighed where the registers lie,
and a node that dies stops the run naming it. Skipped where Ray is not installed."""

import numpy as np
import pytest

import actorflow as af

ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    from actorflow.distributed.rayplan import driver_path

    ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"far": 1})
    c.wait_for_nodes()
    env = {"env_vars": {"PYTHONPATH": driver_path()}}  # (workers import this module)
    ray.init(address=c.address, runtime_env=env, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def items(n=24):
    return lambda: (np.full(8, i, np.float32) for i in range(n))


def double(x):
    return x * 2


def graph(n=24):
    g = af.ActorGraph(buffers=2)
    src = g.source(items(n), name="load")
    near = g.actor(lambda x: x + 1, src, name="near")
    g.sink(g.actor(double, near, name="far"))
    return g


def engine(**kw):
    kw.setdefault("placement", {"near": {"num_cpus": 0.5}, "far": {"num_cpus": 0.5}})
    return af.distributed.RayEngine(**kw)


def test_a_stage_pinned_to_another_node_acts_there(cluster):
    g = graph()
    local = [o.copy() for o in g.run()]
    eng = engine(placement={"near": {"num_cpus": 0.5}, "far": {"node": "node:1"}})
    remote = list(g.run(engine=eng))
    assert len(remote) == 24
    assert all(np.array_equal(x, y) for x, y in zip(local, remote, strict=True))
    stats = g.stats()
    assert stats.actors["far"]["nodes"] == ["node:1"]
    assert stats.actors["near"]["nodes"] == ["node:0"]  # the one CPU of node 1 is taken
    far = stats.memory["node:1"]
    assert far["planned"] == 2 * 4 * 32  # far's registers: 2 x 4 x 32 B
    assert 0 < far["peak"] <= far["planned"]
    assert stats.memory["node:0"]["planned"] == 2 * (2 * 4 * 32)  # load's and near's


def test_budgets_per_node_weigh_where_ray_placed_the_stage(cluster):
    g = graph()
    by_label = {"near": {"num_cpus": 0.5}, "far": {"num_cpus": 0.5, "resources": {"far": 1}}}
    tight = engine(placement=by_label, memory={"node:1": "200B"})
    with pytest.raises(
        af.PlanError,
        match=r"registers on node:1 need 256 B \(far 2 x 4 x "
        r"32 B\), over its 200 B budget \(on the nodes "
        r"Ray placed the stages' processes\); "
        r"buffers=1 would fit",
    ):
        list(g.run(engine=tight))
    ok = engine(placement=by_label, memory={"node:1": "256B", "node:0": "512B"})
    assert len(list(g.run(engine=ok))) == 24
    stats = g.stats()
    assert stats.actors["far"]["nodes"] == ["node:1"]
    assert stats.memory["node:1"]["budget"] == 256
    assert 0 < stats.memory["node:1"]["peak"] <= 256


def test_an_unknown_node_is_refused_naming_the_nodes(cluster):
    g = graph(4)
    with pytest.raises(
        af.PlanError,
        match=r"node 'node:2': it is not one of this cluster's "
        r"2 nodes \(node:0 \.\.\. node:1",
    ):
        list(g.run(engine=engine(placement={"far": {"node": "node:2"}})))


def slow(x):
    import time

    time.sleep(0.05)
    return x


def test_a_node_that_dies_stops_the_run_naming_it(cluster):
    doomed = cluster.add_node(num_cpus=1, resources={"doomed": 1})
    cluster.wait_for_nodes()
    g = af.ActorGraph()
    g.sink(g.actor(slow, g.source(items(200), name="load"), name="work"))
    eng = engine(placement={"work": {"num_cpus": 1, "resources": {"doomed": 1}}})
    outs = []
    with pytest.raises(
        af.ActorError,
        match=r"(?s)actor 'work' failed on piece \d+: "
        r"RuntimeError: its Ray actor process on "
        r"node:[12] died during pieces.*its node has died",
    ) as info:
        for o in g.run(engine=eng):
            outs.append(o)
            if len(outs) == 8:
                cluster.remove_node(doomed)
    assert g.stats().state == "failed" and len(outs) >= 8
    assert [info.value.node] == g.stats().actors["work"]["nodes"] != ["node:0"]
    assert len(list(graph(8).run(engine=engine()))) == 8  # the cluster runs on
