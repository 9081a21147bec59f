"""Planning a graph's run: the actors ordered, fed inputs pointed at ``feed``, the
collector added, every register sized (from ``out=``, an op's inference, or piece 0 read
and computed once here) and the ``Plan`` built and checked against the budgets."""

from __future__ import annotations

import time
import traceback

from ...errors import ActorError, PlanError
from ..graph.actors import Collector, OpActor, read_piece
from ..graph.source import SourceActor
from .autotune import AUTO, FLOOR, default_counts, stage_time, tune
from .registers import EOS, MemoryBudget
from .reservation import Plan
from .spec import NOTHING


def topo_order(actors: list) -> list:
    """The actors in an order where producers come before consumers (insertion order
    otherwise); the collector last. Raises PlanError on a cycle."""
    order: list = []
    state: dict = {}

    def visit(a, path):
        s = state.get(a)
        if s == 2:
            return
        if s == 1:
            raise PlanError("the graph has a cycle: " + " -> ".join(x.name for x in path + [a]))
        state[a] = 1
        for p in a.inputs:
            visit(p, path + [a])
        state[a] = 2
        order.append(a)

    for a in actors:
        visit(a, [])
    return order


def plan_graph(
    graph_actors: list,
    sinks: list,
    picks,
    feed,
    lazy: bool,
    default_buffers,
    budget: MemoryBudget,
    resources: dict,
    check: bool = True,
    share="auto",
    measured: dict | None = None,
    whole: bool = False,
) -> Plan:
    """Plans a graph's actors for a run (``ActorGraph.plan`` and a run's start): points fed
    inputs at ``feed``, adds the collector of the ``sinks`` (``picks``: a traced graph's
    outputs), forgets what the last plan sized (a source keeps a piece 0 it already read),
    then ``build_plan`` (``check=False``: sized only, the budgets not checked; such a plan
    is for reading, e.g. ``ops_from_graph``, never for a run; ``whole``: as for
    ``build_plan``). On failure nothing stays cached and the sources are closed."""
    if not graph_actors:
        raise PlanError("the graph has no actors; add a source first")
    if feed is not None and not (
        callable(feed) or hasattr(feed, "__iter__") or hasattr(feed, "__aiter__")
    ):
        raise PlanError(
            f"run(feed={feed!r}): feed takes the pieces: an iterable (a list, a "
            f"generator), an async iterable, or a function returning one; got "
            f"{type(feed).__name__}"
        )
    for a in graph_actors:
        if isinstance(a, SourceActor) and a.fed:
            if feed is None:
                if a.declared:
                    a.source = None  # sized by its Spec: plan() needs no pieces
                    continue
                raise PlanError(f"{a.name!r} reads its pieces from run(feed=...); pass feed=")
            a.source, a.it, a.spent = feed, None, False
            a.cached.clear()
            if not a.declared:
                a.out_spec = None
    actors = list(graph_actors)
    names = [n for _, n in sinks]
    if picks is not None and sinks:
        actors.append(Collector([s for s, _ in sinks], names, *picks))
    elif sinks:
        actors.append(Collector([s for s, _ in sinks], names))
    for a in graph_actors:
        if not isinstance(a, SourceActor):  # a source keeps the piece 0 it already read
            a.cached.clear()
        if isinstance(a, OpActor):
            a.program = None
            if a.inline_given is None:
                a.inline = None  # decided again once sized (this run's shapes)
            if not a.declared:
                a.out_spec = None
        elif not a.declared and not (isinstance(a, SourceActor) and 0 in a.cached):
            a.out_spec = None
    try:
        plan = build_plan(
            actors, default_buffers, budget, resources, lazy, check, share, measured, whole
        )
    except BaseException:
        for a in graph_actors:
            a.cached.clear()
            if isinstance(a, SourceActor):
                a.close()
        raise
    for a in graph_actors:
        if isinstance(a, OpActor) and a.inline_given is None and a.program is not None:
            a.inline = a.small()
    return plan


def build_plan(
    actors: list,
    default_buffers,
    budget: MemoryBudget,
    resources: dict,
    lazy: bool = False,
    check: bool = True,
    share="auto",
    measured: dict | None = None,
    whole: bool = False,
) -> Plan:
    """Sizes every register (reading piece 0 through the graph if a stage's output size is
    not declared), chooses the ``buffers="auto"`` counts (from ``measured``: actor name ->
    seconds per act of the last run, else ``time=`` or piece 0 timed here) and those of
    the default (``default_buffers`` None and no ``buffers=``: ``default_counts``; an
    actor sized by the run gets its count when sized), checks the
    budgets (unless ``check`` is False) and returns the Plan. ``lazy``: leave the stages
    that need piece 0 unsized; the run sizes them as piece 0 flows (``Plan.size``).
    ``whole`` (with ``lazy``): when a stage is left unsized, no register is allocated
    before every size is known; then the budgets are checked and the registers shared by
    lifetime where they need it, as for a plan sized here (``Plan.defer``)."""
    order = topo_order(actors)
    for a in order:
        for name, n in a.resources.items():
            if name not in resources:
                raise PlanError(
                    f"actor {a.name!r} takes resource {name!r}, which the graph "
                    f"does not declare; add resources={{{name!r}: ...}} to the "
                    f"graph"
                )
            if n > resources[name]:
                raise PlanError(
                    f"actor {a.name!r} takes {n} of resource {name!r} but only "
                    f"{resources[name]} exist, so it could never act"
                )
        a.infer()
    empty = []
    auto = {
        a
        for a in order
        if not isinstance(a, Collector)
        and (a.buffers == AUTO or (a.buffers is None and default_buffers == AUTO))
    }
    untimed = any(
        stage_time(a, measured or {})[1].startswith("unknown")
        for a in order
        if not isinstance(a, Collector)
    ) and not any(isinstance(a, SourceActor) and a.fed and a.source is None for a in order)
    # (a graph fed by run(feed=...) planned without its feed cannot time piece 0)
    if not lazy and (any(a.needs_probe() for a in order) or (auto and untimed)):
        empty = _probe(order)
        for a in order:
            a.infer()
    for a in order:
        if a.out_spec is None and not isinstance(a, Collector) and not lazy:
            if not _downstream_of(a, empty):
                raise PlanError(
                    f"actor {a.name!r}: the size of its output is unknown after "
                    f"computing piece 0; give it out=af.Spec(shape, dtype)"
                )
            a.out_spec = NOTHING  # a source yielded nothing: never used
    buffers = {}
    default = set()  # no buffers= anywhere: the default, "auto"
    for a in order:  # with double buffering as its floor
        buffers[a] = default_buffers if a.buffers is None else a.buffers
        if buffers[a] is None:
            buffers[a] = FLOOR
            if not isinstance(a, Collector):
                default.add(a)
        if isinstance(a, Collector) and buffers[a] == AUTO:
            buffers[a] = 1  # (the run's output holds no register)
    sized = [a for a in order if a.out_spec is not None and not isinstance(a, Collector)]
    waits = lazy and any(
        a.out_spec is None
        for a in order  # (a size comes from the
        if not isinstance(a, Collector)
    )  # run: Plan.size)
    if default and not (waits and whole):  # (a plan made whole chooses in unpend)
        default_counts(sized, default, buffers, budget, measured or {}, lazy=waits)
    tuning = tune(order, auto, buffers, budget, measured or {}) if auto else None
    plan = Plan(order, buffers, budget, resources, share, chosen=auto | default)
    plan.default, plan.measured = default, measured or {}
    plan.tuning = tuning
    plan.empty_sources = empty
    if whole and lazy and plan.pending:
        plan.defer()
    elif check:
        plan.check()
    return plan


def _probe(order: list) -> list:
    """Reads piece 0 and computes it through the graph, one actor at a time, so every
    register can be sized. The results are kept and become piece 0 of the run."""
    values: dict = {}
    empty = []
    for a in order:
        if isinstance(a, Collector):
            continue
        if any(p not in values for p in a.inputs):
            continue  # downstream of an empty source
        ins = []
        for p in a.inputs:
            leaves = values[p]
            ins.append(leaves if isinstance(a, OpActor) else read_piece(leaves, p.out_spec))
        t0 = time.perf_counter()
        try:
            out = a.probe(ins)
            a.probe_s = time.perf_counter() - t0
        except PlanError:
            raise
        except Exception as e:  # noqa: BLE001 - named with the actor, as in a run
            err = ActorError(a.name, 0, e, traceback.format_exc())
            raise err from e
        if out is EOS:
            empty.append(a.name)
            continue
        if out is None:  # an async source with a declared spec
            continue
        values[a] = out
        a.cached[0] = out
    return empty


def _downstream_of(actor, names: list) -> bool:
    if actor.name in names:
        return True
    return any(_downstream_of(p, names) for p in actor.inputs)
