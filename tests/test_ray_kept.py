"""engine="ray" with ``RayEngine(keep_workers=True)``: a kept Ray actor process runs what a
new one would run. Each run pickles its stages afresh (functions with the values they read
now, sources, op programs with their constants, a group's stages, async stages); a kept
process loads that run's stages (sent when their bytes changed, else loaded again from the
bytes it kept), and it is restarted when a module its stages come from changed on disk.
Also: a Pipeline runs on Ray as locally. On a local Ray cluster the module starts (2 CPUs);
skipped where Ray is not installed."""

import asyncio
import gc
import importlib
import os
import sys
import textwrap

import numpy as np
import pytest

import actorflow as af

ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
pytestmark = pytest.mark.ray

QUARTER = {"num_cpus": 0.25}  # a kept engine and a fresh one fit the 2 CPUs together


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """A folder on the path before Ray starts (its workers import from it): modules the
    tests write there and change between runs."""
    d = tmp_path_factory.mktemp("kept_modules")
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def engine(modules, ray_engine):
    return ray_engine


def items(n):
    return lambda: (np.full(4, i, np.float32) for i in range(n))


def firsts(outs) -> list:
    """The first element of each output (of its first part, for (value, pid) pairs)."""
    return [float(np.asarray(o[0] if isinstance(o, tuple) else o).reshape(-1)[0]) for o in outs]


def pids_of(outs) -> set:
    return {int(p) for _, p in outs}


def test_a_kept_process_sees_what_its_stage_reads_changed_between_runs(engine):
    params = {"k": 2.0}

    def scale(x):
        return x * params["k"], np.int64(os.getpid())

    g = af.ActorGraph()
    g.sink(g.actor(scale, g.source(items(12), name="load"), name="scale", replicas=2))
    with af.distributed.RayEngine(keep_workers=True, placement={"scale": QUARTER}) as warm:
        first = list(g.run(engine=warm))
        pids = g.stats().actors["scale"]["processes"]
        params["k"] = 3.0
        local = firsts(g.run())
        second = list(g.run(engine=warm))
        assert g.stats().actors["scale"]["processes"] == pids  # the same two processes,
        fresh = list(
            g.run(
                engine=af.distributed.RayEngine(  # given the new stage
                    placement={"scale": QUARTER}
                )
            )
        )
    assert firsts(first) == [2.0 * i for i in range(12)]
    assert firsts(second) == local == firsts(fresh) == [3.0 * i for i in range(12)]
    assert pids_of(second) <= set(pids) and len(pids) == 2


def test_a_kept_process_runs_the_stage_as_pickled_for_the_run_not_as_runs_left_it(engine):
    calls = []

    def count(x):
        calls.append(1)  # changes the stage's own state in its process
        return x + len(calls)

    spec = af.Spec((4,), af.float32)  # (out= given: piece 0 is not computed on the driver)
    g = af.ActorGraph()
    g.sink(g.actor(count, g.source(items(5), name="load", out=spec), name="count", out=spec))
    want = [2.0 * i + 1 for i in range(5)]
    with af.distributed.RayEngine(keep_workers=True, placement={"count": QUARTER}) as warm:
        first = firsts(g.run(engine=warm))
        pids = g.stats().actors["count"]["processes"]
        second = firsts(g.run(engine=warm))
        assert g.stats().actors["count"]["processes"] == pids  # kept, not restarted
    fresh = firsts(g.run(engine=af.distributed.RayEngine(placement={"count": QUARTER})))
    assert first == second == fresh == want
    assert calls == []  # (the driver's copy never ran)


def test_a_source_read_in_a_kept_process_reads_what_it_reads_now(engine):
    cfg = {"start": 0.0}
    g = af.ActorGraph()
    src = g.source(
        lambda: (np.full(4, cfg["start"] + i, np.float32) for i in range(5)), name="load"
    )
    g.sink(g.actor(lambda x: x * 2, src, name="double"))
    placement = {"load": QUARTER, "double": QUARTER}
    with af.distributed.RayEngine(keep_workers=True, placement=placement) as warm:
        first = firsts(g.run(engine=warm))
        cfg["start"] = 10.0
        local = firsts(g.run())
        second = firsts(g.run(engine=warm))
    assert first == [2.0 * i for i in range(5)]
    assert second == local == [2.0 * (10 + i) for i in range(5)]


def test_a_kept_group_and_its_fused_chain_run_the_stages_of_the_run(engine):
    off = {"v": 1.0}
    g = af.ActorGraph()
    a = g.actor(lambda x: x + off["v"], g.source(items(8), name="load"), name="a")
    g.sink(g.actor(lambda x: x * 2, a, name="b"))
    eng = dict(groups={"light": ["a", "b"]}, placement={"light": QUARTER})
    with af.distributed.RayEngine(keep_workers=True, **eng) as warm:
        first = firsts(g.run(engine=warm))
        pids = g.stats().actors["a"]["processes"]
        off["v"] = 5.0
        local = firsts(g.run())
        second = firsts(g.run(engine=warm))
        st = g.stats().actors
        assert st["b"]["fused_acts"] == 8 and st["a"]["processes"] == pids
    assert first == [2.0 * (i + 1) for i in range(8)]
    assert second == local == [2.0 * (i + 5) for i in range(8)]


def test_a_kept_async_stage_reads_what_it_reads_now(engine):
    off = {"v": 1.0}

    async def shift(x):
        await asyncio.sleep(0)
        return x + off["v"]

    g = af.ActorGraph()
    g.sink(g.actor(shift, g.source(items(6), name="load"), name="shift"))
    with af.distributed.RayEngine(keep_workers=True, placement={"shift": QUARTER}) as warm:
        first = firsts(g.run(engine=warm))
        off["v"] = -1.0
        local = firsts(g.run())
        second = firsts(g.run(engine=warm))
    assert first == [i + 1.0 for i in range(6)]
    assert second == local == [i - 1.0 for i in range(6)]


def test_a_kept_op_actor_uses_the_constants_its_program_holds_now(engine):
    w = af.tensor(np.full(4, 2.0, np.float32))
    g = af.ActorGraph()
    g.sink(g.op(lambda x: x * w, g.source(items(5), name="load"), name="mul"))
    with af.distributed.RayEngine(keep_workers=True, placement={"mul": QUARTER}) as warm:
        first = firsts(g.run(engine=warm))
        pids = g.stats().actors["mul"]["processes"]
        again = firsts(g.run(engine=warm))  # (traced again: the same program)
        assert g.stats().actors["mul"]["processes"] == pids  # kept
        w.fill_(3.0)  # the captured tensor changed in place
        local = firsts(g.run())
        second = firsts(g.run(engine=warm))
        assert g.stats().actors["mul"]["processes"] == pids  # given the new one
    assert first == again == [2.0 * i for i in range(5)]
    assert second == local == [3.0 * i for i in range(5)]


def test_a_kept_process_loads_again_the_large_arrays_its_stages_hold(engine):
    table = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: in Ray's object store

    def look_up(x):
        return x + table[-4:]

    g = af.ActorGraph()
    g.sink(g.actor(look_up, g.source(items(6), name="load"), name="look_up", replicas=2))
    want = [i + float(table[-4]) for i in range(6)]
    with af.distributed.RayEngine(keep_workers=True, placement={"look_up": QUARTER}) as warm:
        runs = []
        for _ in range(3):  # the last two load the bytes the processes kept
            runs.append(firsts(g.run(engine=warm)))
            runs.append(g.stats().actors["look_up"]["processes"])
            gc.collect()  # (the driver's copy of what it sent is gone)
        table[-4:] += 100.0
        changed = firsts(g.run(engine=warm))
        assert g.stats().actors["look_up"]["processes"] == runs[1]
    assert runs[0::2] == [want] * 3 and runs[1] == runs[3] == runs[5]
    assert changed == [w + 100.0 for w in want]


def _write(path, factor: str) -> None:
    path.write_text(
        textwrap.dedent(f"""
        import os
        import numpy as np


        def scale(x):
            return x * {factor}, np.int64(os.getpid())
    """)
    )
    st = path.stat()  # (a later time, whatever the clock's resolution)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000 * len(factor)))


def test_a_kept_process_is_restarted_when_a_module_of_its_stages_changed(engine, modules):
    path = modules / "kept_stage_module.py"
    _write(path, "2.0")
    sys.modules.pop("kept_stage_module", None)
    import kept_stage_module  # a module the workers import (pickled by reference)

    try:
        g = af.ActorGraph()
        stage = g.actor(kept_stage_module.scale, g.source(items(4), name="load"), name="scale")
        g.sink(stage)
        with af.distributed.RayEngine(keep_workers=True, placement={"scale": QUARTER}) as warm:
            first = list(g.run(engine=warm))
            assert pids_of(list(g.run(engine=warm))) == pids_of(first)  # unchanged: kept
            _write(path, "3.25")  # the module changed on disk, not yet reloaded here
            second = list(g.run(engine=warm))
            fresh = list(g.run(engine=af.distributed.RayEngine(placement={"scale": QUARTER})))
            importlib.reload(kept_stage_module)
            stage.fn = kept_stage_module.scale
            local = firsts(g.run())
            third = list(g.run(engine=warm))
        assert firsts(first) == [2.0 * i for i in range(4)]
        assert (
            firsts(second)
            == firsts(fresh)
            == firsts(third)
            == local
            == [3.25 * i for i in range(4)]
        )
        assert pids_of(second).isdisjoint(pids_of(first))  # a new process imported it
    finally:
        sys.modules.pop("kept_stage_module", None)


def test_a_kept_process_that_cannot_load_the_runs_stages_is_replaced(engine, tmp_path):
    def double(x):
        return x * 2

    g = af.ActorGraph()
    stage = g.actor(double, g.source(items(4), name="load"), name="stage")
    g.sink(stage)
    (tmp_path / "only_on_this_driver.py").write_text("def triple(x):\n    return x * 3\n")
    with af.distributed.RayEngine(keep_workers=True, placement={"stage": QUARTER}) as warm:
        assert firsts(g.run(engine=warm)) == [0.0, 2.0, 4.0, 6.0]
        sys.path.insert(0, str(tmp_path))  # (after Ray started: its workers lack it)
        try:
            import only_on_this_driver

            stage.fn = only_on_this_driver.triple
            with pytest.raises(
                af.PlanError,
                match=r"the Ray actor process of 'stage' "
                r"\(stage\) died while starting.*import",
            ):
                list(g.run(engine=warm))
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("only_on_this_driver", None)
        stage.fn = double
        assert firsts(g.run(engine=warm)) == [0.0, 2.0, 4.0, 6.0]  # and runs again


def test_an_unchanged_unit_pickles_to_the_same_bytes_run_after_run(engine):
    from actorflow.distributed.procs import pickled
    from actorflow.distributed.rayplan import plan_for_ray

    k = {"v": 2.0}
    g = af.ActorGraph()
    a = g.actor(lambda x: x * k["v"], g.source(items(4), name="load"), name="a")
    g.sink(g.op(lambda x: x + 1.0, a, name="b"))
    eng = af.distributed.RayEngine(groups={"light": ["a", "b"]})

    def digest():
        plan = plan_for_ray(g, None, eng, ray)
        for src in plan.sources:
            src.close()
        u = plan.units["light"]
        return pickled(ray, u.stages(plan.batch))[1]

    one, two = digest(), digest()
    k["v"] = 3.0
    assert one == two != digest()  # kept processes are sent stages only when changed


def test_a_pipeline_runs_on_ray_as_locally(engine):
    pipe = af.Pipeline(
        [items(10), lambda x: x + 1, lambda x: x * 3], names=["load", "plus", "times"]
    )
    local = [o.copy() for o in pipe.run()]
    remote = list(pipe.run(engine=engine))
    assert len(remote) == len(local) == 10
    assert all(np.array_equal(x, y) for x, y in zip(local, remote, strict=True))
    assert pipe.stats().actors["times"]["mode"] == "ray"
    with af.distributed.RayEngine(
        keep_workers=True, placement={"plus": QUARTER, "times": QUARTER}
    ) as warm:
        assert all(np.array_equal(x, y) for x, y in zip(local, pipe.run(engine=warm), strict=True))
        assert all(np.array_equal(x, y) for x, y in zip(local, pipe.run(engine=warm), strict=True))
