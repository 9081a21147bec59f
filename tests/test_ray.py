"""engine="ray": the same graph gives the same outputs on Ray as locally, credits bound
what is in flight across processes, budgets per node are planned, faults stop the run
naming actor, piece and node, and stats and traces come from every process. On a local
Ray cluster the tests start themselves (2 CPUs); skipped where Ray is not installed."""

import json
import os

import numpy as np
import pytest

import actorflow as af

ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def engine(ray_engine):
    return ray_engine


def items(n=24):
    return lambda: (np.full(8, i, np.float32) for i in range(n))


def double(x):
    return x * 2


def plus_pid(x):
    return x + 1, np.int64(os.getpid())


def fan_graph(n=24, **kw):
    g = af.ActorGraph(**kw)
    src = g.source(items(n), name="load")
    a = g.actor(double, src, name="double", replicas=2)
    b = g.actor(lambda x: x - 1, src, name="minus")
    g.sink(g.actor(lambda x, y: x + y, a, b, name="join"))
    return g


def test_the_same_outputs_as_the_local_run(engine):
    g = fan_graph()
    local = [o.copy() for o in g.run()]
    remote = list(g.run(engine=engine))
    assert len(remote) == len(local) == 24
    assert all(np.array_equal(x, y) for x, y in zip(local, remote, strict=True))
    stats = g.stats()
    assert stats.state == "finished" and stats.pieces == 24
    assert {n: r["acts"] for n, r in stats.actors.items()} == {
        "load": 24,
        "double": 24,
        "minus": 24,
        "join": 24,
    }
    assert stats.actors["double"]["mode"] == "ray" and stats.actors["double"]["replicas"] == 2


GAIN = 1.0  # (read by scaled, a stage function of this module)


def scaled(x):
    return x * GAIN


def test_a_global_a_stage_reads_has_the_drivers_value(engine):
    """A global of the stage function's module, rebound in the driver between runs: the
    Ray processes (whose own import of this module has the file's value) compute with the
    driver's value, as the local run does."""
    global GAIN
    try:
        for gain in (3.0, 0.5):
            GAIN = gain
            g = af.ActorGraph()
            g.sink(g.actor(scaled, g.source(items(4)), name="scaled"))
            assert [float(v[0]) for v in g.run(engine=engine)] == [i * gain for i in range(4)]
    finally:
        GAIN = 1.0


def test_stages_run_in_other_processes_and_replicas_share_the_work(engine):
    g = af.ActorGraph()
    g.sink(g.actor(plus_pid, g.source(items(16), name="load"), name="work", replicas=2))
    outs = list(g.run(engine="ray"))
    assert [float(x[0]) for x, _ in outs] == [i + 1.0 for i in range(16)]
    pids = {int(p) for _, p in outs}
    assert os.getpid() not in pids and len(pids) == 2  # two Ray actor processes


def test_credits_bound_the_pieces_in_flight_per_edge(engine):
    for buffers in (1, 2, 3):
        g = fan_graph(n=30, buffers=buffers)
        assert len(list(g.run(engine=engine))) == 30
        for name, row in g.stats().actors.items():
            if name != "(output)":
                assert 1 <= row["most_held"] <= buffers, (name, row["most_held"])
        m = g.stats().memory["node:0"]
        assert 0 < m["peak"] <= m["planned"]


def test_budgets_per_node_are_refused_before_the_first_act(engine):
    g = fan_graph()
    small = af.distributed.RayEngine(memory={"node:0": "200B"})
    with pytest.raises(af.PlanError, match=r"node:0 need .* over its 200 B budget"):
        list(g.run(engine=small))
    with pytest.raises(
        af.PlanError, match="node 'node:3': it is not one of this cluster's 1 nodes"
    ):
        list(g.run(engine=af.distributed.RayEngine(placement={"join": {"node": "node:3"}})))
    with pytest.raises(af.PlanError, match=r"ask 7 CPU \(double 2 x 3, minus 1 x 0.5"):
        list(g.run(engine=af.distributed.RayEngine(placement={"double": {"num_cpus": 3}})))
    assert len(list(g.run(engine=engine))) == 24  # and the graph still runs


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether process ``pid`` has ended (waits for it up to ``within`` seconds)."""
    import time

    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def failing(x):
    if int(x[0]) == 5:
        raise ValueError("piece five is bad")
    return x


def dying(x):
    if int(x[0]) == 3:
        os._exit(1)
    return x


@pytest.mark.parametrize(
    "fn, what",
    [
        (failing, "ValueError: piece five is bad"),
        (dying, "Ray actor process on node:0 died during pieces 0 to 3"),
    ],
)  # (a batch of 4)
def test_a_fault_stops_the_run_naming_actor_piece_and_node(engine, fn, what):
    g = af.ActorGraph()
    g.sink(g.actor(fn, g.source(items(12), name="load"), name="stage"))
    with pytest.raises(af.ActorError, match=what) as info:
        list(g.run(engine=engine))
    assert info.value.actor == "stage"
    assert info.value.piece == (5 if fn is failing else 0)
    assert info.value.node
    assert g.stats().state == "failed"
    pids = g.stats().actors["stage"]["processes"]
    assert len(pids) == 1 and pids[0] != os.getpid()
    assert gone(pids[0])  # nothing is left running: its process ended
    g2 = af.ActorGraph()
    g2.sink(g2.actor(double, g2.source(items(4), name="load"), name="stage"))
    assert [float(x[0]) for x in g2.run(engine=engine)] == [0.0, 2.0, 4.0, 6.0]


def test_a_run_stopped_early_kills_its_actors_and_runs_again(engine):
    g = fan_graph(n=40)
    for i, _ in enumerate(g.run(engine=engine)):
        if i == 3:
            break
    assert g.stats().state == "stopped"
    rows = g.stats().actors
    assert rows["load"]["processes"] == [os.getpid()]  # read on the driver
    pids = [p for name, row in rows.items() if name != "load" for p in row.get("processes", [])]
    assert len(pids) == 4 and all(gone(p) for p in pids)  # double x2, minus, join
    assert len(list(g.run(engine=engine))) == 40


def test_a_trace_merges_every_process(engine, tmp_path):
    g = fan_graph()
    list(g.run(engine=engine, trace=tmp_path / "ray.json"))
    evs = json.loads((tmp_path / "ray.json").read_text())["traceEvents"]
    acts = [e for e in evs if e["ph"] == "X"]
    assert len(acts) == 24 * 3  # double, minus, join (load: the driver)
    assert all({"ph", "ts", "pid", "tid"} <= set(e) for e in evs)
    assert all(e["dur"] >= 0 for e in acts)
    pids = {e["pid"] for e in acts}
    assert len(pids) == 4  # double x2, minus, join: a process each
    named = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in acts} <= named
    assert any(e["ph"] == "C" and e["name"] == "memory node:0" for e in evs)
    assert g.stats().trace["records"] == 24 * 3


def test_what_ray_does_not_run_is_refused(engine):
    g = af.ActorGraph()
    src = g.source(items(4), name="load", out=af.Spec((8,), af.float32, "null"))
    g.sink(g.actor(double, src, name="double"))
    with pytest.raises(af.PlanError, match="actor 'load' writes .*null.*registers are on cpu"):
        list(g.run(engine=engine))
    h = af.ActorGraph()
    h.sink(h.op(af.relu, h.source(items(4), name="load"), name="relu"))
    h.actors[1].state_writes = ("weight",)  # (as nn.Graph's state writers)
    with pytest.raises(
        af.PlanError,
        match=r"actor 'relu' reads or writes state across "
        r"pieces \(weight\)",
    ):
        list(h.run(engine=engine))
    with pytest.raises(ValueError, match="engines are 'local' and 'ray'"):
        list(g.run(engine="spark"))


def test_the_example_runs_and_equals_the_local_run(engine):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "examples/ray_pipeline.py", "--pieces", "16"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "outputs equal to the local run: True" in r.stdout
    assert "preprocess       rayx2        16" in r.stdout
    import re

    rows = dict(re.findall(r"  (augment|features): processes \[(\d+)\]", r.stdout))
    assert rows["augment"] == rows["features"]  # the group's one process
    fused = re.search(r"features: .*stage before it: (\d+)", r.stdout)
    assert int(fused.group(1)) > 0  # acted in augment's calls


def test_kept_workers_serve_the_next_run_and_close_ends_them(engine):
    g = af.ActorGraph()
    g.sink(g.actor(plus_pid, g.source(items(8), name="load"), name="work", replicas=2))
    with af.distributed.RayEngine(keep_workers=True) as warm:
        first = {int(p) for _, p in g.run(engine=warm)}
        second = {int(p) for _, p in g.run(engine=warm)}
        assert first == second and len(first) == 2  # the same two processes
        g.actors[1].fn = double  # another function: new ones
        third = list(g.run(engine=warm))
        assert [float(x[0]) for x in third] == [2.0 * i for i in range(8)]
        assert all(gone(p) for p in first)
        pids = g.stats().actors["work"]["processes"]
    assert all(gone(p) for p in pids)  # close() ended them


def test_actors_that_cannot_start_are_refused_not_waited_for(engine):
    @ray.remote(num_cpus=1.5)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())  # 1.5 of the 2 CPUs are taken
    try:
        g = af.ActorGraph()
        g.sink(g.actor(double, g.source(items(4), name="load"), name="stage"))
        quick = af.distributed.RayEngine(start_timeout=2)
        with pytest.raises(
            af.PlanError,
            match=r"Ray actors of \['stage'\] did not start "
            r"within 2 s",
        ):
            list(g.run(engine=quick))
    finally:
        ray.kill(hog)
    assert gone_ok(g, engine)


def gone_ok(g, engine) -> bool:
    """The graph runs again once the CPUs are free."""
    return [float(x[0]) for x in g.run(engine=engine)] == [0.0, 2.0, 4.0, 6.0]


def test_an_actor_sunk_twice_and_an_input_read_twice(engine):
    g = af.ActorGraph()
    src = g.source(items(6), name="load")
    twice = g.actor(lambda x, y: x + y, src, src, name="twice")  # one input, two slots
    g.sink(twice, name="one")
    g.sink(twice, name="two")  # one actor, two sinks
    local = [{k: v.copy() for k, v in o.items()} for o in g.run()]
    remote = list(g.run(engine=engine))
    assert len(remote) == len(local) == 6
    assert all(
        set(x) == set(y) == {"one", "two"} and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(local, remote, strict=True)
    )


def test_a_stage_nobody_reads_gives_its_credits_back(engine):
    g = af.ActorGraph(buffers=1)
    src = g.source(items(12), name="load")
    g.actor(lambda x: x * 3, src, name="unread")  # no reader, no sink
    g.sink(g.actor(double, src, name="double"))
    assert [float(x[0]) for x in g.run(engine=engine)] == [2.0 * i for i in range(12)]
    assert g.stats().actors["unread"]["acts"] == 12


def test_python_numbers_are_stored_as_locally(engine):
    g = af.ActorGraph()
    src = g.source(items(6), name="load")
    g.sink(g.actor(lambda x: float(x.sum()), src, name="total"))  # float32, as locally
    local = [o.copy() for o in g.run()]
    remote = list(g.run(engine=engine))
    assert [(o.dtype, o.shape) for o in remote] == [(np.dtype(np.float32), ())] * 6
    assert all(np.array_equal(x, y) for x, y in zip(local, remote, strict=True))


def same_error(g, engine) -> af.ActorError:
    """Runs ``g`` locally, then on Ray: both stop with ActorError for the same actor and
    piece, holding the same error (type and words: one piece check for both engines).
    Returns Ray's."""
    errors = []
    for how in (None, engine):
        with pytest.raises(af.ActorError) as info:
            list(g.run(engine=how))
        errors.append(info.value)
    local, remote = errors
    assert (remote.actor, remote.piece) == (local.actor, local.piece)
    assert type(remote.original) is type(local.original)
    assert str(remote.original) == str(local.original)
    return remote


def test_a_later_piece_of_another_shape_is_an_actor_error(engine):
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: np.zeros(3 if int(x[0]) < 5 else 4, np.float32),
            g.source(items(9), name="load"),
            name="shape",
        )
    )
    e = same_error(g, engine)
    assert e.piece == 5 and isinstance(e.original, af.ShapeError)
    assert str(e.original) == (
        "actor 'shape' (piece 5) returned float32[4] but its register "
        "holds float32[3]; return the same shape for every piece, or "
        "declare out=af.Spec(...)"
    )


def test_a_later_piece_of_another_dtype_is_an_actor_error(engine):
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda x: x.astype(np.float64) if int(x[0]) == 4 else x,
            g.source(items(9), name="load"),
            name="cast",
        )
    )
    e = same_error(g, engine)
    assert e.piece == 4 and isinstance(e.original, af.DTypeError)
    assert str(e.original).startswith(
        "actor 'cast' (piece 4) returned float64[8] but its register holds float32[8]; cast it"
    )


def nothing(x):
    return None


def test_none_is_refused_and_taken_as_locally(engine):
    g = af.ActorGraph()
    g.sink(
        g.actor(
            nothing, g.source(items(4), name="load"), name="quiet", out=af.Spec((8,), af.float32)
        )
    )
    e = same_error(g, engine)
    assert isinstance(e.original, TypeError) and "did the function forget to return?" in str(
        e.original
    )
    h = af.ActorGraph()
    h.sink(h.actor(nothing, h.source(items(4), name="load"), name="quiet", out=()))
    assert list(h.run(engine=engine)) == list(h.run()) == [()] * 4


def test_a_kept_worker_that_died_is_replaced(engine):
    import signal

    g = af.ActorGraph()
    g.sink(g.actor(plus_pid, g.source(items(8), name="load"), name="work"))
    with af.distributed.RayEngine(keep_workers=True) as warm:
        first = {int(p) for _, p in g.run(engine=warm)}
        os.kill(first.pop(), signal.SIGKILL)
        assert gone(g.stats().actors["work"]["processes"][0])
        again = list(g.run(engine=warm))
        assert [float(x[0]) for x, _ in again] == [i + 1.0 for i in range(8)]


def stuck_at_two(x):
    if int(x[0]) == 2:
        import time

        time.sleep(600)
    return x


def test_a_call_past_its_timeout_stops_the_run(engine):
    g = af.ActorGraph()
    g.sink(g.actor(stuck_at_two, g.source(items(8), name="load"), name="stage", timeout=0.5))
    with pytest.raises(
        af.ActorError,
        match=r"took longer than timeout=0.5 s per piece on "
        r"pieces 0 to 3",
    ) as info:
        list(g.run(engine=engine))
    assert isinstance(info.value.original, TimeoutError)
    assert all(gone(p) for p in g.stats().actors["stage"]["processes"])


def test_a_progress_bar_for_a_ray_run(engine):
    import io

    out = io.StringIO()
    g = af.ActorGraph()
    g.sink(
        g.actor(
            double,
            g.source([np.full(4, i, np.float32) for i in range(10)], name="load"),
            name="stage",
        )
    )
    assert len(list(g.run(engine=engine, progress={"file": out, "desc": "on ray"}))) == 10
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("on ray: 100%") and "10/10" in last, last
    assert "is busy" in last  # the bottleneck line, at the end


def test_source_numbers_are_stored_as_locally_and_a_wrong_shape_is_named(engine):
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: x * 2, g.source([1.5, 2.5, 3.5], name="load"), name="twice"))
    local = [o.copy() for o in g.run()]
    remote = list(g.run(engine=engine))
    assert [(o.dtype, float(o)) for o in remote] == [(o.dtype, float(o)) for o in local]
    assert remote[0].dtype == np.float32
    bad = af.ActorGraph()
    bad.sink(
        bad.actor(
            double, bad.source([np.zeros(4), np.zeros(4), np.zeros(5)], name="load"), name="stage"
        )
    )
    e = same_error(bad, engine)
    assert e.piece == 2 and isinstance(e.original, af.ShapeError)
    assert str(e.original).startswith(
        "source 'load' (piece 2) returned float64[5] but its register holds float64[4]"
    )


def pair_then_list(x):
    a, b = x[:2], x[2:4]
    return [a, b] if int(x[0]) == 3 else (a, b)


def test_a_later_piece_nested_otherwise_is_an_actor_error(engine):
    g = af.ActorGraph()
    g.sink(g.actor(pair_then_list, g.source(items(6), name="load"), name="split"))
    e = same_error(g, engine)
    assert e.piece == 3 and type(e.original) is TypeError
    assert str(e.original).startswith(
        "actor 'split' (piece 3) gave a list of 2 where piece 0 "
        "gave a tuple of 2; give a tuple of 2, the same "
        "structure, for every piece"
    )


@af.trace
def relu_twice(x):
    return af.relu(x) * 2


def test_a_one_input_traced_graph_takes_1_tuples_on_ray_as_locally(engine):
    """(A traced graph's outputs are picked from its sinks' registers: on Ray as locally,
    each output whole, not its first row.)"""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(5)]
    want = [np.maximum(x, 0) * 2 for x in xs]
    g = relu_twice.actor_graph(af.Spec((3, 4)))
    for feed in ((x for x in xs), ((x,) for x in xs)):  # bare arrays, and 1-tuples
        outs = list(g.run(feed=feed, engine=engine))
        assert [o.shape for o in outs] == [(3, 4)] * 5
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-6)
    g = relu_twice.actor_graph(af.Spec((3, 4)), source=[(x,) for x in xs])
    outs = list(g.run(engine=engine))
    assert [o.shape for o in outs] == [(3, 4)] * 5
    np.testing.assert_allclose(outs[4], want[4], rtol=1e-6)


@af.trace
def parts(x):
    y = af.relu(x)
    return y, y[1], y.sum(0)


def test_a_traced_graph_with_several_outputs_gives_each_whole_on_ray(engine):
    xs = [np.arange(12, dtype=np.float32).reshape(3, 4) - 5 + i for i in range(4)]
    g = parts.actor_graph(af.Spec((3, 4)))
    local = list(g.run(feed=iter(xs)))
    remote = list(g.run(feed=iter(xs), engine=engine))
    assert len(remote) == 4
    for (a, b, c), (x, y, z) in zip(local, remote, strict=True):
        assert (x.shape, y.shape, z.shape) == ((3, 4), (4,), (4,))
        np.testing.assert_array_equal(x, a)
        np.testing.assert_array_equal(y, b)
        np.testing.assert_array_equal(z, c)
