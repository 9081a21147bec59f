"""Planning a Ray run (``RayPlan``: the Ray actor processes, their nodes, budgets per node
and per Ray resource, and CPUs, all checked before the first act) and what the coordinator
needs around it: the sources' pieces and errors as ActorError."""

from __future__ import annotations

import traceback

from ..errors import ActorError, PlanError
from ..runtime.graph.actors import Collector, OpActor, StageActor
from ..runtime.graph.source import SourceActor
from ..runtime.plan.spec import unflatten
from .cluster import Nodes, budget_keys, check_budgets
from .worker import END, Items, OpCall, SourceStage, Stage, StageFailed, source_piece

PER_REPLICA = 2  # calls queued on one Ray actor at once (hides the round trip)
AUTO_CALL_BYTES = 4 << 20  # batch="auto": a call carries about this much of the largest
AUTO_MAX_BATCH = 64  # register's pieces (at most this many pieces)


def ray_module():
    try:
        import ray
    except ImportError as e:
        raise ImportError("engine='ray' needs Ray: pip install 'actorflow[ray]'") from e
    return ray


def driver_path() -> str:
    import os
    import sys

    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


class Unit:
    """Ray actor processes of one kind: one stage's replicas, or a group's (``members``
    share each process; replica ``r`` of each member acts in process ``r``)."""

    def __init__(self, name: str, members: list, grouped: bool):
        self.name, self.members, self.grouped = name, members, grouped
        self.replicas = max(a.replicas for a in members)
        self.is_async = any(getattr(a, "is_async", False) for a in members)
        self.options: dict = {}
        self.node: int | None = None  # the index of the node it is pinned to, or None

    def stages(self, batch: int) -> list:
        """What its processes host: a ``Stage`` per member (a ``SourceStage`` per source)."""
        out: list[Stage | SourceStage] = []
        for a in self.members:
            if isinstance(a, SourceActor):
                out.append(
                    SourceStage(
                        a.name, a.source, a.out_spec, a.declared, a.fed, batch, a.single_argument
                    )
                )
                continue
            fn = OpCall(a.program) if isinstance(a, OpActor) else a.fn
            out.append(Stage(a.name, fn, a.out_spec, a.declared, a.time))
        return out


class RayPlan:
    """What a Ray run needs from the graph: its actors in order, registers per actor, the
    processes (units) and node of each actor, the sources read on the driver
    (``sources``; the others act in a unit), the sinks and the collector."""

    # set by plan_for_ray once the units are placed: the cluster's nodes, the fused chains
    # (``{a: b}`` and back), the budgets' keys, pieces per call, and what the budgets hold
    nodes: Nodes
    fuse_next: dict
    fuse_prev: dict
    budgets: dict
    batch: int
    need: dict

    def __init__(self, actors, buffers, sizes, sources, sinks, collector, units, unit_of):
        self.actors, self.buffers, self.sizes = actors, buffers, sizes
        self.sources, self.sinks, self.collector = sources, sinks, collector
        self.units, self.unit_of = units, unit_of

    def held(self, nodes_of) -> list:
        """Per actor what ``check_budgets`` weighs: its registers, the nodes they may lie
        on (``nodes_of(actor)``) and the Ray resources its processes ask."""
        out = []
        for a in self.actors:
            u = self.unit_of.get(a)
            asks = dict(u.options.get("resources", {})) if u else {}
            if u:
                asks["CPU"] = u.options.get("num_cpus", 0)
                asks["GPU"] = u.options.get("num_gpus", 0)
            out.append((a.name, self.buffers[a], self.sizes[a], nodes_of(a), asks))
        return out


def plan_for_ray(g, feed, engine, ray) -> RayPlan:
    """The local plan (sizes from ``out=`` or piece 0, computed on the driver), the Ray
    actor processes (a stage's replicas, or a group's), the node of each, and the budget
    checks per node and per Ray resource."""
    plan = g._make_plan(feed, lazy=False)
    g._plan = None
    actors = [a for a in plan.actors if not isinstance(a, Collector)]
    for a in actors:
        if any(s.device.type != "cpu" for s in a.out_spec.specs):
            raise PlanError(
                f"engine='ray': actor {a.name!r} writes "
                f"{a.out_spec.describe()}; Ray runs move data between processes, "
                f"so registers are on cpu (the null device has none)"
            )
        if a.state_reads or a.state_writes:
            raise PlanError(
                f"engine='ray': actor {a.name!r} reads or writes state across "
                f"pieces ({', '.join(a.state_reads + a.state_writes)}), which "
                f"lives in one process's memory; run it with the local engine "
                f"(nn.Graph.run)"
            )
        if not isinstance(a, (SourceActor, StageActor, OpActor)):
            raise PlanError(
                f"engine='ray': actor {a.name!r} is {a.describe()}, which Ray "
                f"runs do not take; run it with the local engine"
            )
    names = {a.name: a for a in actors}
    units, unit_of = make_units(engine, actors, names)
    sources = [a for a in actors if isinstance(a, SourceActor) and a not in unit_of]
    nodes = Nodes(ray)
    for u in units.values():
        opts = dict(engine.placement.get(u.name, {}))
        if "node" in opts:
            u.node = nodes.resolve(opts.pop("node"), f"placement of {u.name!r}")
        u.options = opts
    have = ray.cluster_resources()
    check_resources(have, list(units.values()))
    collector = next(a for a in plan.actors if isinstance(a, Collector))
    rp = RayPlan(
        actors,
        {a: plan.buffers[a] for a in actors},
        {a: a.out_spec.nbytes for a in actors},
        sources,
        list(collector.inputs),
        collector,
        units,
        unit_of,
    )
    rp.nodes = nodes
    rp.fuse_next = fuse_chains(units.values(), actors) if engine.fuse else {}
    rp.fuse_prev = {b: a for a, b in rp.fuse_next.items()}
    rp.budgets = budget_keys(engine.memory, nodes, have)

    def where(a):  # before the processes start: pinned, or one node
        u = unit_of.get(a)
        if u is None:
            return ["node:0"]  # a source: read on the driver
        if u.node is not None:
            return [f"node:{u.node}"]
        return ["node:0"] if len(nodes.ids) == 1 else []

    rp.batch = engine.batch if engine.batch != "auto" else auto_batch(rp, where)
    rp.need = check_budgets(rp.held(where), rp.budgets, rp.batch, "")
    return rp


def auto_batch(rp, where) -> int:
    """``batch="auto"``: pieces per call so that a call carries about ``AUTO_CALL_BYTES``
    of the largest register's pieces (each Ray call costs the driver about as much as
    copying a few MiB, so small pieces go many to a call), halved until the budgets fit."""
    big = max(rp.sizes.values(), default=0) or 1
    b = max(1, min(AUTO_MAX_BATCH, AUTO_CALL_BYTES // big))
    while b > 1:
        try:
            check_budgets(rp.held(where), rp.budgets, b, "")
            break
        except PlanError:
            b //= 2
    return b


def make_units(engine, actors: list, names: dict):
    """The Ray actor processes: a unit per group of ``engine.groups``, per other stage, and
    per source that placement= names (the other sources are read on the driver);
    ``placement=`` names units (a group, a stage or a source not in one)."""
    units: dict = {}
    unit_of: dict = {}
    grouped: dict = {}
    for group, members in engine.groups.items():
        if group in names:
            raise PlanError(
                f"engine='ray': group {group!r} has the name of an actor; give "
                f"groups names of their own"
            )
        for m in members:
            a = names.get(m)
            if a is None:
                raise PlanError(
                    f"engine='ray': group {group!r} names {m!r}, which is not "
                    f"an actor of this graph; its actors: {sorted(names)}"
                )
            _on_a_worker(a)
            if a in unit_of:
                raise PlanError(
                    f"engine='ray': {m!r} is in groups {unit_of[a]!r} and "
                    f"{group!r}; a stage acts in one process kind"
                )
            unit_of[a] = group
            grouped.setdefault(group, []).append(a)
    for group, members in grouped.items():
        units[group] = Unit(group, members, True)
    unit_of = {a: units[group] for a, group in unit_of.items()}
    for a in actors:
        if a not in unit_of and (not isinstance(a, SourceActor) or a.name in engine.placement):
            _on_a_worker(a)
            unit_of[a] = units[a.name] = Unit(a.name, [a], False)
    for key in engine.placement:
        if key in units:
            continue
        a = names.get(key)
        if a is not None and a in unit_of:
            raise PlanError(
                f"engine='ray': placement= names {key!r}, which acts in group "
                f"{unit_of[a].name!r}'s processes; place the group"
            )
        raise PlanError(
            f"engine='ray': placement= names {key!r}, which this graph does not "
            f"have; it places {sorted(units)} (and sources, to read them in a "
            f"Ray actor process)"
        )
    return units, unit_of


def fuse_chains(units, actors: list) -> dict:
    """``{a: b}``: stage ``b`` of the same plain (not async) group reads only ``a``, with
    as many replicas: ``b`` acts only in the calls sent for ``a`` (a chain of them,
    followed on), so a group of cheap stages costs one Ray call per batch, not one per
    stage; the chain waits until each of its stages holds a free register, as one actor
    with several outputs would. Stages with ``timeout=`` or tokens act in calls of their
    own."""
    fuse: dict = {}
    for u in units:
        if u.is_async or not u.grouped:
            continue
        for b in u.members:
            a = b.inputs[0] if len(b.inputs) == 1 else None
            if a is None or a not in u.members or a in fuse or a.replicas != b.replicas:
                continue
            if any(x.timeout is not None or x.resources for x in (a, b)):
                continue
            if b.inputs.count(a) == 1:
                fuse[a] = b
    return fuse


def _on_a_worker(a) -> None:
    """A source read in a Ray actor process is opened there: not one fed by the caller."""
    if isinstance(a, SourceActor) and a.fed:
        raise PlanError(
            f"engine='ray': input {a.name!r} takes its pieces from "
            f"run(feed=...) on the driver; it cannot be placed or grouped"
        )


def check_resources(have: dict, units: list) -> None:
    """Every Ray actor the run starts must fit the cluster, or its creation would wait
    forever: refused now, naming what is asked and what there is. A unit without
    ``num_cpus`` in placement= asks an equal share of the CPUs the others leave (at most
    1; when they leave none, of all the CPUs, which is then refused)."""
    cpus = have.get("CPU", 0.0)
    given = sum(u.replicas * u.options["num_cpus"] for u in units if "num_cpus" in u.options)
    left = cpus - given
    if left > 0:
        share = left / max(1, sum(u.replicas for u in units if "num_cpus" not in u.options))
    else:
        share = cpus / max(1, sum(u.replicas for u in units))
    share = min(1.0, share)
    share = int(share * 100) / 100  # (Ray counts CPUs to 1/10,000)
    asked: dict = {}
    for u in units:
        u.options.setdefault("num_cpus", share)
        want = {
            "CPU": u.options["num_cpus"],
            "GPU": u.options.get("num_gpus", 0),
            **u.options.get("resources", {}),
        }
        for k, v in want.items():
            asked.setdefault(k, []).append((u.name, u.replicas, v))
    for k, rows in asked.items():
        total = sum(r * v for _, r, v in rows)
        if total > have.get(k, 0) + 1e-9:
            says = ", ".join(f"{name} {r} x {v:g}" for name, r, v in rows if v)
            raise PlanError(
                f"engine='ray': the stages' Ray actors ask {total:g} {k} "
                f"({says}) and the cluster has {have.get(k, 0):g}; their "
                f"creation would wait forever. Ask less in placement= "
                f"(e.g. {{'name': {{'num_cpus': 0.5}}}}) or add nodes"
            )


def source_items(src: SourceActor):
    """The source's pieces for a Ray run read on the driver (piece 0 read while planning
    first), each leaf as the array a register would hold, checked as the local engine checks
    it (a wrong piece: ActorError holding the same error). An async source is driven on a
    loop of its own."""
    src.start()
    spec = src.out_spec
    assert spec is not None  # (plan_for_ray sized every actor)
    items = Items(src.it)
    piece = 0
    try:
        while True:
            if piece in src.cached:
                value = unflatten(spec.structure, src.cached.pop(piece))
            else:
                value = items.next()
                if value is END:
                    return
                try:
                    value = source_piece(
                        src.name, piece, value, spec, src.declared, src.fed, src.single_argument
                    )
                except Exception as e:  # noqa: BLE001 - the local engine's error, as there
                    raise ActorError(src.name, piece, e, traceback.format_exc()) from e
            yield value
            piece += 1
    finally:
        items.close()


def actor_error(e, where_of) -> ActorError:
    """ActorError from what ``ray.get`` raised for an act: the stage's own exception (with
    its traceback and node), or the death of its Ray actor process."""
    cause = getattr(e, "cause", None)
    f = e if isinstance(e, StageFailed) else cause
    if isinstance(f, StageFailed):
        pid, node, host = f.where
        err = ActorError(
            f.name,
            f.piece,
            f.original,
            f"(on node {node} ({host}), Ray actor process {pid})\n{f.tb}",
        )
        err.node = node
        err.__cause__ = f.original
        return err
    name, piece, last, node, fused = where_of
    during = f"piece {piece}" if last == piece else f"pieces {piece} to {last} (one call)"
    if fused:
        during += f", in a call that acts for {fused} (fused)"
    dead = RuntimeError(
        f"its Ray actor process on {node} died during {during} ({type(e).__name__}: {e})"
    )
    err = ActorError(name, piece, dead)
    err.node = node
    err.__cause__ = e
    return err


__all__ = ["RayPlan", "plan_for_ray", "ray_module", "PER_REPLICA"]
