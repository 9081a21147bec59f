"""Pipeline: the stage-list front end over ActorGraph.

Example::

    pipe = af.Pipeline([read_batches, normalize, train_step], buffers=2,
                       memory={"cpu": "64MiB"})
    for loss in pipe.run(): ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .runtime.graph.actor_graph import (
    ActorGraph,
    Buffers,
    Engine,
    Progress,
    SpecTree,
    TracePath,
)
from .runtime.graph.device_acts import Copy
from .runtime.sched.processes import OwnsProcesses

if TYPE_CHECKING:
    from .runtime.observe.stats import RunStats
    from .runtime.plan.reservation import Plan
    from .runtime.sched.processes import StageProcesses


class Pipeline(OwnsProcesses):
    """A chain of stages: the first entry is the source (an iterable, async iterable or
    zero-argument callable returning one), each later entry a function of one piece, or
    ``af.Copy(device)``: a copy of each piece to a device (``"cuda:0"``) or back to
    ``"cpu"`` (``ActorGraph.copy``); the functions after a copy to a device get and return
    tensors there.

    Args:
        stages: the source, then the functions.
        buffers: registers per stage (an int, or one int per stage; None, the default:
            chosen by the plan, at least 2: see ActorGraph).
        memory: byte budgets per device, as for ActorGraph.
        resources: shared tokens, as for ActorGraph; ``stage_resources`` gives each
            stage's (a list, one dict or None per stage).
        out: Specs per stage (a list, None where piece 0 sizes the stage).
        seed: seeds the scheduling order of ties (tests).
        replicas: threads per stage (an int for every stage after the source, or a list
            with one entry per stage, None or 1 for the source): see ActorGraph.actor.
        processes: worker processes per stage instead of threads (an int for every stage
            after the source, or a list with one entry per stage, None for the source and
            for stages on threads): see ActorGraph.actor. ``close()`` ends them.
    """

    def __init__(
        self,
        stages: Iterable[Any],
        buffers: Buffers | Sequence[Buffers | None] | None = None,
        memory: dict | None = None,
        resources: dict | None = None,
        stage_resources: dict | Sequence[dict | None] | None = None,
        out: Sequence[SpecTree | None] | None = None,
        seed: int | None = None,
        names: Sequence[str | None] | None = None,
        replicas: int | Sequence[int | None] | None = None,
        processes: int | Sequence[int | StageProcesses | None] | None = None,
    ) -> None:
        stages = list(stages)
        if len(stages) < 2:
            raise ValueError(
                f"Pipeline: give a source and at least one stage, got "
                f"{len(stages)} entr{'y' if len(stages) == 1 else 'ies'}"
            )
        n = len(stages)
        per = _per_stage(buffers, n, "buffers")
        res = _per_stage(stage_resources, n, "stage_resources")
        outs = _per_stage(out, n, "out")
        names = _per_stage(names, n, "names")
        if isinstance(replicas, (list, tuple)) and len(replicas) != n:
            raise ValueError(
                f"Pipeline: replicas has {len(replicas)} entries ({list(replicas)!r}) but "
                f"needs {n}, one per entry of stages: entry 0 is the source (None or 1: it "
                f"reads one iterator in order), then one per stage, e.g. replicas="
                f"{[None] + [2] * (n - 1)!r}; or an int for every stage after the source "
                f"(replicas=2)"
            )
        reps = (
            [None] + [replicas] * (n - 1)
            if isinstance(replicas, int)
            else _per_stage(replicas, n, "replicas")
        )
        if reps[0] not in (None, 1):
            raise ValueError(
                f"Pipeline: replicas[0] is {reps[0]!r}, but entry 0 is the "
                f"source, which reads one iterator in order: give None (or 1) "
                f"there, e.g. replicas={[None] + list(reps[1:])!r}; replicas "
                f"are for the stages after it"
            )
        if isinstance(processes, (list, tuple)) and len(processes) != n:
            raise ValueError(
                f"Pipeline: processes has {len(processes)} entries "
                f"({list(processes)!r}) but needs {n}, one per entry of stages "
                f"(None for the source), e.g. processes="
                f"{[None] + [2] * (n - 1)!r}; or an int for every stage"
            )
        procs = (
            [None] + [processes] * (n - 1)
            if isinstance(processes, int)
            else _per_stage(processes, n, "processes")
        )
        if procs[0] is not None:
            raise ValueError(
                f"Pipeline: processes[0] is {procs[0]!r}, but entry 0 is the "
                f"source, read here in order: give None there"
            )
        self.graph = ActorGraph(memory=memory, resources=resources, seed=seed)
        g = self.graph
        node = g.source(
            stages[0], out=outs[0], buffers=per[0], resources=res[0], name=names[0] or "source"
        )
        self.actors = [node]
        for i, fn in enumerate(stages[1:], start=1):
            if isinstance(fn, Copy):
                node = g.copy(node, fn.device, name=names[i], buffers=per[i])
                self.actors.append(node)
                continue
            if not callable(fn):
                raise TypeError(
                    f"Pipeline: stage {i} must be a function of one piece or a "
                    f"copy (af.Copy('cuda:0')), got {type(fn).__name__}"
                )
            node = g.actor(
                fn,
                node,
                out=outs[i],
                buffers=per[i],
                resources=res[i],
                name=names[i],
                replicas=reps[i] or 1,
                processes=procs[i],
            )
            self.actors.append(node)
        g.sink(node)

    def plan(self) -> Plan:
        """The graph's Plan (see ActorGraph.plan)."""
        return self.graph.plan()

    def run(
        self,
        feed: None = None,
        trace: TracePath | None = None,
        progress: Progress = False,
        engine: str | Engine | None = None,
    ) -> Iterator[Any]:
        """Yields the last stage's result for each piece, in order (plain code). Takes
        ActorGraph.run's arguments and hands them to it: ``trace``: a path for the run's
        timeline (Chrome trace JSON); ``progress``: a progress bar (tqdm); ``engine``:
        None or "local" (this process), "ray" or an engine object
        (``af.distributed.RayEngine``: each stage in Ray actor processes).

        Raises:
            ValueError: ``feed`` given (a Pipeline reads its first entry, its source)."""
        _no_feed(feed, "run")
        return self.graph.run(feed=feed, trace=trace, progress=progress, engine=engine)

    def run_async(
        self, feed: None = None, trace: TracePath | None = None, progress: Progress = False
    ) -> AsyncIterator[Any]:
        """``async for`` twin of ``run()``, with ActorGraph.run_async's arguments."""
        _no_feed(feed, "run_async")
        return self.graph.run_async(feed=feed, trace=trace, progress=progress)

    def stats(self) -> RunStats:
        return self.graph.stats()

    def close(self) -> None:
        """Ends the stages' worker processes (``processes=``), as ``ActorGraph.close``."""
        self.graph.close()


def _no_feed(feed, method: str) -> None:
    """``feed=`` is ActorGraph's for graphs with ``g.input()``; a Pipeline has none."""
    if feed is not None:
        raise ValueError(
            f"Pipeline.{method}(feed={type(feed).__name__}): a Pipeline reads "
            f"its pieces from its first entry, the source; give the pieces "
            f"there (Pipeline([pieces, ...])), or build an ActorGraph with "
            f"g.input() to feed them per run"
        )


def _per_stage(value, n: int, what: str) -> list:
    """``value`` spread over ``n`` stages: ``buffers`` and ``stage_resources`` may be one
    value for all; ``out`` and ``names`` are None or a list with one entry per stage."""
    if isinstance(value, list) or (isinstance(value, tuple) and what not in ("out",)):
        if len(value) != n:
            raise ValueError(f"Pipeline: {what} has {len(value)} entries for {n} stages")
        return list(value)
    if value is None:
        return [None] * n
    if what in ("buffers", "stage_resources"):
        return [value] * n
    raise TypeError(
        f"Pipeline: {what}= takes a list with one entry per stage (None where "
        f"not given), got {type(value).__name__}"
    )
