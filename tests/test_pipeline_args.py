"""Pipeline's run arguments are ActorGraph's: ``Pipeline.run`` / ``run_async`` take every
argument ``ActorGraph.run`` / ``run_async`` take (checked on their signatures, so the two
front ends cannot drift apart) and hand each to the graph."""

import asyncio
import inspect
import json

import numpy as np
import pytest

import actorflow as af


def pieces(n=5):
    return lambda: (np.full(3, i, np.float32) for i in range(n))


@pytest.mark.parametrize("method", ["run", "run_async"])
def test_pipeline_run_takes_every_argument_actorgraph_run_takes(method):
    ours = inspect.signature(getattr(af.Pipeline, method)).parameters
    theirs = inspect.signature(getattr(af.ActorGraph, method)).parameters
    missing = [p for p in theirs if p not in ours]
    assert not missing, f"Pipeline.{method} lacks ActorGraph.{method}'s {missing}"
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name


class Recording:
    """An engine object that notes what it was asked to run."""

    def __init__(self):
        self.calls = []

    def run(self, g, feed=None, trace=None, progress=False):
        self.calls.append((g, feed, trace, progress))
        return iter(["from the engine"])


def test_pipeline_run_hands_engine_and_trace_to_the_graph(tmp_path):
    pipe = af.Pipeline([pieces(), lambda x: x * 2])
    eng = Recording()
    assert list(pipe.run(engine=eng, trace=str(tmp_path / "t.json"))) == ["from the engine"]
    assert eng.calls == [(pipe.graph, None, str(tmp_path / "t.json"), False)]
    local = [float(o[0]) for o in pipe.run(engine="local", trace=tmp_path / "local.json")]
    assert local == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert json.loads((tmp_path / "local.json").read_text())["traceEvents"]
    with pytest.raises(ValueError, match=r"run\(engine='nowhere'\): the engines are 'local'"):
        pipe.run(engine="nowhere")
    assert [float(o[0]) for o in pipe.run()] == local  # and it runs after the refusal


def test_pipeline_run_async_hands_trace_to_the_graph(tmp_path):
    pipe = af.Pipeline([pieces(), lambda x: x + 1])

    async def main():
        return [float(o[0]) async for o in pipe.run_async(trace=tmp_path / "a.json")]

    assert asyncio.run(main()) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert json.loads((tmp_path / "a.json").read_text())["traceEvents"]


@pytest.mark.parametrize("method", ["run", "run_async"])
def test_pipeline_feed_is_refused_naming_the_source(method):
    pipe = af.Pipeline([pieces(), lambda x: x + 1])
    with pytest.raises(
        ValueError,
        match=rf"Pipeline.{method}\(feed=list\): a Pipeline "
        rf"reads its pieces from its first entry",
    ):
        getattr(pipe, method)(feed=[np.zeros(3, np.float32)])
    assert len(list(pipe.run())) == 5
