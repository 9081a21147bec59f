"""run(trace=...) records the register memory in use per device ("memory DEVICE" counters,
the plan's bytes in otherData); af.plot_timeline draws it beneath the acts; the experiments
write their actors runs' traces and pictures with --timeline."""

import json

import numpy as np
import pytest

import actorflow as af
from actorflow.__main__ import main as cli
from actorflow.experiments import double_buffering, figure1
from actorflow.experiments.common import null_chain

MiB = 1 << 20


def trace_of(path):
    doc = json.loads(path.read_text())
    memory, acts = {}, []
    names = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"].startswith("memory "):
            assert set(e["args"]) == {"bytes in use"} and e["tid"] == 0, e
            memory.setdefault(e["name"][len("memory ") :], []).append(
                (e["ts"], e["args"]["bytes in use"])
            )
        elif e["ph"] == "X" and e["cat"] == "act":
            # (times are written to the ns: ts + dur is the end up to float rounding)
            acts.append(
                (names[e["tid"]], e["args"]["piece"], e["ts"], round(e["ts"] + e["dur"], 3))
            )
    return memory, acts, doc.get("otherData")


def level(points, t):
    """The counter's value at time ``t`` (the last sample at or before it)."""
    return [v for ts, v in points if ts <= t][-1]


def check_counters(memory, stats):
    """One counter per device the plan holds memory on: in time order, from 0 at the start
    back to 0 at the end, never negative, never above what the plan has there."""
    planned = {d: m["planned"] for d, m in stats.memory.items() if m["planned"]}
    assert set(memory) == set(planned)
    for dev, points in memory.items():
        times = [t for t, _ in points]
        values = [v for _, v in points]
        assert times == sorted(times) and points[0] == (0.0, 0), dev
        assert min(values) >= 0 and max(values) <= planned[dev], (dev, max(values))
        assert values[-1] == 0, dev
        assert max(values) > 0, dev


def test_memory_counters_per_device_stay_within_the_plan_and_end_at_zero(tmp_path):
    g = double_buffering.actors(2, 12)  # cpu side on null, gpu side on null:1
    assert len(list(g.run(trace=tmp_path / "db.json"))) == 12
    memory, _, other = trace_of(tmp_path / "db.json")
    stats = g.stats()
    check_counters(memory, stats)
    assert set(memory) == {"null", "null:1"}
    assert other == {
        "memory": {
            d: {"planned": m["planned"], "budget": m["budget"]} for d, m in stats.memory.items()
        }
    }
    # with two registers per stage the cpu side fills its plan: load and preprocess each
    # hold both of theirs while they wait for copy
    assert max(v for _, v in memory["null"]) == stats.memory["null"]["planned"] == 16 * MiB


def test_memory_rises_while_a_piece_is_in_flight(tmp_path):
    # load (1 MiB) -> work (2 MiB), one register each: while work acts on piece p, load's
    # register holds p and work writes its own, 3 MiB; while load acts alone, at least 1
    g = null_chain([("load", MiB, 0.002, "null"), ("work", 2 * MiB, 0.006, "null")], 4, buffers=1)
    list(g.run(trace=tmp_path / "t.json"))
    memory, acts, _ = trace_of(tmp_path / "t.json")
    points = memory["null"]
    work = [(s, e) for name, _, s, e in acts if name == "work"]
    load = [(s, e) for name, _, s, e in acts if name == "load"]
    assert len(work) == len(load) == 4
    for s, e in work:
        assert level(points, (s + e) / 2) == 3 * MiB
    for s, e in load:
        assert level(points, (s + e) / 2) >= MiB
    assert level(points, max(e for *_, e in acts)) == 0  # home after the last read


def test_a_register_nobody_reads_is_home_when_its_act_ends(tmp_path):
    g = af.ActorGraph(buffers=1)
    x = g.source([np.zeros(100)] * 3, out=af.Spec((100,), af.float64), name="src")
    g.actor(
        lambda v: v + 1, x, out=af.Spec((100,), af.float64), name="dangling", time=0.003
    )  # read by nobody
    g.sink(g.actor(lambda v: v[:2], x, out=af.Spec((2,), af.float64), name="other"))
    assert len(list(g.run(trace=tmp_path / "d.json"))) == 3
    memory, acts, _ = trace_of(tmp_path / "d.json")
    check_counters(memory, g.stats())
    for name, k, s, e in acts:
        if name == "dangling":  # src's piece and its own while it acts; then its own is home
            assert level(memory["cpu"], (s + e) / 2) >= 1600
            # src's register is still in use at e where "other" still reads piece k (its
            # thread may end later than this one, on a loaded machine) or src already
            # writes piece k + 1: the counter's level there, not this act's timing, decides
            held = any(
                (n == "other" and j == k and end > e) or (n == "src" and j == k + 1 and t <= e)
                for n, j, t, end in acts
            )
            assert level(memory["cpu"], e) == (800 if held else 0)


def test_shared_registers_in_use_never_exceed_the_arena(tmp_path):
    # figure 1 on actors: registers shared by lifetime in 6 MiB. O1 (5) reads M1 (1): 6
    # MiB at once; then M2 (3) and O2 (1) reuse those bytes once O1 is copied out
    g = figure1.actor_graph(8 * MiB, "auto", time=0.002)
    plan = g.plan()
    assert plan.sharing is not None and plan.totals[af.device("null")] == 6 * MiB
    list(g.run(trace=tmp_path / "f1.json"))
    memory, acts, _ = trace_of(tmp_path / "f1.json")
    check_counters(memory, g.stats())
    points = memory["null"]
    assert max(v for _, v in points) == 6 * MiB == g.stats().memory["null"]["live"]
    span = {name: (s, e) for name, _, s, e in acts}
    assert level(points, sum(span["O1"]) / 2) == 6 * MiB
    assert level(points, sum(span["O2"]) / 2) == 4 * MiB


def test_lazily_sized_stages_and_a_stopped_run_stay_within_the_plan(tmp_path):
    from test_timeline import mixed_graph

    g = mixed_graph()  # stages sized by piece 0, threads, pipes, async
    list(g.run(trace=tmp_path / "lazy.json"))
    check_counters(trace_of(tmp_path / "lazy.json")[0], g.stats())
    g = mixed_graph(pieces=200, slow=0.0)
    for i, _ in enumerate(g.run(trace=tmp_path / "stopped.json")):
        if i == 3:
            break
    assert g.join(10)
    memory, _, _ = trace_of(tmp_path / "stopped.json")
    check_counters(memory, g.stats())  # (pieces never read count until the last act)


def test_piece_0_of_a_stage_sized_by_it_is_not_a_register(tmp_path):
    # the source is sized by its piece 0, which travels in its own arrays (outside the
    # plan): while the stage reads it, only the stage's register is in use
    g = af.ActorGraph(buffers=1)
    x = g.source([np.zeros(1000)], name="src")  # 8000 bytes, sized lazily
    g.sink(g.actor(lambda v: v[:10], x, name="cut", out=af.Spec((10,), af.float64), time=0.005))
    list(g.run(trace=tmp_path / "lazy0.json"))
    memory, acts, _ = trace_of(tmp_path / "lazy0.json")
    assert g.stats().memory["cpu"]["planned"] == 8000 + 80
    ((s, e),) = [(s, e) for name, _, s, e in acts if name == "cut"]
    assert level(memory["cpu"], (s + e) / 2) == 80


def test_plot_timeline_draws_memory_beneath_and_old_traces_still_plot(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from test_experiments import _check_inside

    g = double_buffering.actors(2, 8)
    list(g.run(trace=tmp_path / "t.json"))
    fig = af.plot_timeline(tmp_path / "t.json", tmp_path / "t.png")
    texts = _check_inside(fig)
    assert [ax.get_ylabel() for ax in fig.axes[1:]] == ["memory in use (MiB)"]
    assert "null: planned 16 MiB of 24 MiB budget" in texts
    assert any(t.startswith("null:1: in use, at most") for t in texts)
    mem = fig.axes[1]
    assert max(max(line.get_ydata()) for line in mem.get_lines()) == 16  # MiB, the plan
    plt.close(fig)
    assert (tmp_path / "t.png").stat().st_size > 0

    doc = json.loads((tmp_path / "t.json").read_text())  # as written before memory was
    old = [e for e in doc["traceEvents"] if not e["name"].startswith("memory ")]
    assert len(old) < len(doc["traceEvents"])
    fig = af.plot_timeline(old, tmp_path / "old.png")
    texts = _check_inside(fig)
    assert [ax.get_ylabel() for ax in fig.axes[1:]] == ["free registers"]
    assert "free registers" in fig.get_suptitle() and "memory" not in fig.get_suptitle()
    plt.close(fig)
    assert (tmp_path / "old.png").stat().st_size > 0


def test_the_experiments_write_their_actors_runs_timelines(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    tl = tmp_path / "tl"
    assert (
        cli(
            [
                "experiments",
                "double-buffering",
                "--pieces",
                "4",
                "--out",
                str(tmp_path / "out"),
                "--timeline",
                str(tl),
            ]
        )
        == 0
    )
    assert (
        cli(["experiments", "figure1", "--out", str(tmp_path / "out"), "--timeline", str(tl)]) == 0
    )
    names = [
        "double-buffering-actors-b1",
        "double-buffering-actors-b2",
        "double-buffering-actors-b3",
        "figure1-actors-shared-by-lifetime-8MiB",
        "figure1-actors-side-by-side-10MiB",
    ]
    assert sorted(p.name for p in tl.iterdir()) == sorted(
        f"{n}.{x}" for n in names for x in ("json", "png")
    )
    out = capsys.readouterr().out
    for n in names:
        assert f"wrote {tl / n}.png" in out
        assert (tl / f"{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        memory, acts, other = trace_of(tl / f"{n}.json")
        assert acts and set(memory) == set(other["memory"])
        for points in memory.values():
            assert points[-1][1] == 0 and max(v for _, v in points) > 0
    memory, acts, _ = trace_of(tl / "double-buffering-actors-b2.json")
    assert sum(1 for a in acts if a[0] == "compute") == 4
    data = json.loads((tmp_path / "out" / "double-buffering.json").read_text())
    assert [t["path"] for t in data["traces"]] == [
        str(tl / f"double-buffering-actors-b{b}.json") for b in (1, 2, 3)
    ]


def test_timeline_is_refused_where_no_trace_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli(
            [
                "experiments",
                "random",
                "--n",
                "2",
                "--out",
                str(tmp_path),
                "--timeline",
                str(tmp_path / "tl"),
            ]
        )
    assert "the random experiment writes no trace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(
            ["experiments", "figure1", "--out", str(tmp_path), "--timeline", "/proc/no/such/folder"]
        )
    assert "--timeline '/proc/no/such/folder': cannot make that folder" in capsys.readouterr().err
    from actorflow.experiments import main

    with pytest.raises(SystemExit, match="only figure1 and double-buffering"):
        main("random", out=str(tmp_path), timeline=str(tmp_path / "tl"))
    data = double_buffering.run(pieces=3)  # no folder: nothing traced
    assert data["traces"] == []


def test_memory_counts_each_register_once_per_device(tmp_path):
    # one output on two devices (cpu and null): each device gets its own counter with
    # its part of the register
    g = af.ActorGraph(buffers=1)
    spec = {"a": af.Spec((256,), af.float32), "b": af.Spec((1024,), af.float32, "null")}
    x = g.source(
        [{"a": np.zeros(256, np.float32), "b": np.zeros(1024, np.float32)}] * 3,
        out=spec,
        name="src",
    )
    g.sink(x)
    list(g.run(trace=tmp_path / "two.json"))
    memory, _, _ = trace_of(tmp_path / "two.json")
    check_counters(memory, g.stats())
    assert max(v for _, v in memory["cpu"]) == 1024
    assert max(v for _, v in memory["null"]) == 4096
