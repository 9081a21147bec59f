"""g.run(trace=...): the run's timeline as Chrome trace events, checked against the format
(every event has ph/ts/pid/tid, complete events a duration, flows connect) and against
what the run did (an act per actor per piece, waits where the bottleneck makes them)."""

import asyncio
import json
import time
from collections import Counter

import numpy as np
import pytest

import actorflow as af
from actorflow.experiments.common import null_chain


def mixed_graph(pieces=12, slow=0.002):
    g = af.ActorGraph(buffers=1)
    x = g.source(
        [np.full(4, float(i)) for i in range(pieces)], out=af.Spec((4,), af.float64), name="load"
    )
    a = g.actor(lambda v: v + 1, x, name="slow", time=slow)
    b = g.actor(lambda v: v * 2, a, name="piped")
    c = g.op(af.neg, b, name="neg")

    async def f(v):
        await asyncio.sleep(0)
        return v

    g.sink(g.actor(f, c, name="async"))
    return g


def events(path):
    doc = json.loads(path.read_text())
    assert (
        {"traceEvents", "displayTimeUnit"}
        <= set(doc)
        <= {"traceEvents", "displayTimeUnit", "otherData"}
    )
    return doc["traceEvents"]


def check_format(evs):
    for e in evs:
        assert {"ph", "ts", "pid", "tid"} <= set(e), e
        assert e["ph"] in ("X", "s", "f", "C", "M")
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "name" in e
    starts = {e["id"]: e for e in evs if e["ph"] == "s"}
    ends: dict = {}
    for e in evs:
        if e["ph"] == "f":
            ends.setdefault(e["id"], []).append(e)
    assert set(starts) == set(ends), "every register sent is read, and only those"
    for i, s in starts.items():
        for f in ends[i]:
            assert f["ts"] >= s["ts"] - 1.0, (s, f)  # read after it was written
    named = {
        e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert all(e["tid"] in named for e in evs if e["ph"] in ("X", "s", "f"))
    return named


def test_a_run_writes_a_valid_timeline_with_an_act_per_actor_per_piece(tmp_path):
    g = mixed_graph()
    outs = list(g.run(trace=tmp_path / "run.json"))
    assert len(outs) == 12
    evs = events(tmp_path / "run.json")
    named = check_format(evs)
    assert set(named.values()) == {"load", "slow", "piped", "neg", "async", "(output)"}
    acts = Counter(named[e["tid"]] for e in evs if e["ph"] == "X" and e["cat"] == "act")
    assert acts == {name: 12 for name in named.values()}
    pieces = sorted(
        e["args"]["piece"]
        for e in evs
        if e["ph"] == "X" and e["cat"] == "act" and named[e["tid"]] == "neg"
    )
    assert pieces == list(range(12))
    flows = Counter(e["id"].split("/")[0] for e in evs if e["ph"] == "s")
    assert flows == {name: 12 for name in ("load", "slow", "piped", "neg", "async")}


def test_waits_show_where_the_bottleneck_is(tmp_path):
    g = mixed_graph(slow=0.003)
    list(g.run(trace=tmp_path / "run.json"))
    evs = events(tmp_path / "run.json")
    named = check_format(evs)
    waits = Counter(
        (named[e["tid"]], e["args"]["cause"]) for e in evs if e["ph"] == "X" and e["cat"] == "wait"
    )
    assert waits[("load", "credit")] > 0  # one register: load waits for slow
    assert waits[("piped", "input")] > 0  # and piped waits for slow's pieces
    counters = [e for e in evs if e["ph"] == "C" and e["name"] == "load free registers"]
    assert len(counters) == 12 and {e["args"]["free"] for e in counters} <= {0, 1}


def test_a_stopped_run_still_writes_its_timeline(tmp_path):
    g = mixed_graph(pieces=200, slow=0.0)
    for i, _ in enumerate(g.run(trace=tmp_path / "stopped.json")):
        if i == 3:
            break
    assert g.join(10)
    evs = events(tmp_path / "stopped.json")
    for e in evs:
        assert {"ph", "ts", "pid", "tid"} <= set(e)
    assert any(e["ph"] == "X" for e in evs)


def test_run_async_traces_too_and_no_trace_writes_nothing(tmp_path):
    async def main():
        g = mixed_graph(pieces=5)
        return [o async for o in g.run_async(trace=tmp_path / "a.json")], g

    outs, g = asyncio.run(main())
    assert len(outs) == 5
    check_format(events(tmp_path / "a.json"))
    list(g.run())  # no trace: no file, nothing recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_traced_run_gives_the_same_outputs():
    g = mixed_graph(pieces=8)
    plain = [o.tolist() for o in g.run()]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        traced = [o.tolist() for o in g.run(trace=f"{d}/t.json")]
    assert plain == traced


@pytest.mark.parametrize("kind", ["thread", "inline"])
def test_each_kind_of_act_is_timed_from_its_start(tmp_path, kind):
    def stage(v):
        time.sleep(0.002)
        return v

    g = af.ActorGraph()
    x = g.source([np.zeros(2)] * 3, out=af.Spec((2,), af.float64), name="load")
    g.sink(g.actor(stage, x, name="s", inline=kind == "inline"))
    list(g.run(trace=tmp_path / "k.json"))
    evs = events(tmp_path / "k.json")
    named = check_format(evs)
    durs = [
        e["dur"] for e in evs if e["ph"] == "X" and e["cat"] == "act" and named[e["tid"]] == "s"
    ]
    assert len(durs) == 3 and all(d >= 2000 for d in durs)  # at least its sleep, in us


def test_the_written_file_holds_exactly_the_timeline_events(tmp_path):
    from actorflow.runtime.observe import timeline as tl_module

    seen = []
    real = tl_module.Timeline.write

    def keep(self, path):
        seen.append(self)
        return real(self, path)

    tl_module.Timeline.write = keep
    try:
        g = af.ActorGraph()
        x = g.source([np.zeros(2)] * 4, out=af.Spec((2,), af.float64), name='lo"ad')
        g.sink(g.actor(lambda v: v, x, name="s\\1"))
        list(g.run(trace=tmp_path / "q.json"))
    finally:
        tl_module.Timeline.write = real
    assert events(tmp_path / "q.json") == seen[0].events()  # names with quotes too
    assert g.stats().trace["records"] == len(seen[0].records) > 0


def timed_chain(times, buffers=2, pieces=40):
    return null_chain([(name, 1024, t, "null") for name, t in times], pieces, buffers=buffers)


def test_stats_name_the_bottleneck_and_what_waiting_upstream_means():
    g = timed_chain([("load", 0.001), ("preprocess", 0.001), ("compute", 0.005)])
    list(g.run())
    line = g.stats().bottleneck()
    assert line.startswith("compute is busy")
    assert "waits on credit" in line and "more buffers after" in line
    assert f"bottleneck: {line}" in g.stats().table()
    assert g.stats().as_dict()["bottleneck"] == line


def test_stats_name_a_starved_stage_and_a_slow_consumer():
    g = timed_chain([("load", 0.005), ("preprocess", 0.0), ("compute", 0.0)])
    list(g.run())
    line = g.stats().bottleneck()
    assert line.startswith("load is busy") and "waits on input" in line
    assert "fed no faster than load goes" in line
    g = timed_chain([("load", 0.0), ("work", 0.0)], pieces=30)
    for _ in g.run():
        time.sleep(0.005)  # the caller is the slow part
    assert "the consumer of run() takes the pieces slower" in g.stats().bottleneck()


def test_a_pipeline_traces_its_stages(tmp_path):
    pipe = af.Pipeline([lambda: iter([np.zeros(3)] * 5), lambda x: x + 1, lambda x: x * 2])
    assert len(list(pipe.run(trace=tmp_path / "p.json"))) == 5
    named = check_format(events(tmp_path / "p.json"))
    assert len(named) == 4  # source, two stages, the output


def test_plot_timeline_draws_a_trace_and_stats_inside_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from test_experiments import _check_inside

    g = timed_chain([("load", 0.001), ("preprocess", 0.001), ("compute", 0.003)], pieces=15)
    list(g.run(trace=tmp_path / "t.json"))
    fig = af.plot_timeline(tmp_path / "t.json", tmp_path / "t.png")
    texts = _check_inside(fig)
    assert {"load", "preprocess", "compute", "(output)", "acting"} <= set(texts)
    bars = sum(len(c.get_paths()) for c in fig.axes[0].collections)
    assert bars >= 15 * 4  # an act per actor per piece
    plt.close(fig)
    assert (tmp_path / "t.png").stat().st_size > 0
    fig = af.plot_timeline(g.stats(), tmp_path / "s.png")
    texts = _check_inside(fig)
    assert any("compute is busy" in t for t in texts)
    plt.close(fig)


def test_a_trace_path_that_cannot_be_written_says_so_and_the_graph_runs_again(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    g = af.ActorGraph()
    g.sink(g.actor(lambda v: v, g.source([np.zeros(2)] * 3, out=af.Spec((2,), af.float64))))
    with pytest.raises(OSError, match="the run ended .finished. but its timeline could not"):
        list(g.run(trace=blocker / "x.json"))
    assert g.stats().state == "finished"
    assert len(list(g.run(trace=tmp_path / "ok.json"))) == 3
    assert g.stats().trace["write_s"] > 0


def test_an_nn_graph_run_traces_every_op_actor_and_each_layout(tmp_path):
    from actorflow import nn, optim
    from test_graph_mode import TrainStep

    af.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3))
    step = TrainStep(model, optim.SGD(model.parameters(), lr=0.1))
    rng = np.random.default_rng(0)
    data = [
        (rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)) for _ in range(3)
    ]
    data.append((data[0][0][:4], data[0][1][:4]))  # a last, smaller batch
    losses = list(step.run(data, trace=tmp_path / "train.json"))
    assert len(losses) == 4
    named = check_format(events(tmp_path / "train.json"))
    ops = len(step.stats().actors) - 2  # the source and the output
    assert len(named) == ops + 2 and ops > 10
    check_format(events(tmp_path / "train.1.json"))  # the smaller batch's own run
