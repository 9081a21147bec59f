"""Planning a Ray run (``RayPlan``: sizes, nodes, budgets and CPUs checked before the
first act) and what the coordinator needs around it: the source's pieces, the stage
workers, and errors as ActorError."""

from __future__ import annotations

import time

from ..errors import ActorError, PlanError, format_bytes
from ..runtime.actor import Collector, StageActor
from ..runtime.source import SourceActor
from ..runtime.spec import as_array, flatten, unflatten
from .worker import StageFailed, Worker, leaves_of

PER_REPLICA = 2         # calls queued on one Ray actor at once (hides the round trip)


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


class RayPlan:
    """What a Ray run needs from the graph: its actors in order, registers per actor, the
    node of each, and what each node's registers take."""

    def __init__(self, actors, buffers, nodes, sizes, source, sinks, collector):
        self.actors, self.buffers, self.nodes = actors, buffers, nodes
        self.sizes, self.source, self.sinks, self.collector = sizes, source, sinks, collector

    def per_node(self) -> dict:
        out: dict = {}
        for a in self.actors:
            out[self.nodes[a]] = (out.get(self.nodes[a], 0)
                                  + self.buffers[a] * self.batch * self.sizes[a])
        return out


def plan_for_ray(g, feed, engine, ray) -> RayPlan:
    """The local plan (sizes from ``out=`` or piece 0, computed on the driver), the node of
    each actor, and the budget check per node."""
    plan = g._make_plan(feed, lazy=False)
    g._plan = None
    sources = [a for a in plan.actors if isinstance(a, SourceActor)]
    for a in plan.actors:
        if isinstance(a, (SourceActor, Collector)):
            continue
        if not isinstance(a, StageActor) or a.is_async:
            raise PlanError(f"engine='ray': actor {a.name!r} is {a.describe()}; Ray runs "
                            f"Python stages (g.actor(fn, ...) with a plain def) and one "
                            f"source; run op actors and async stages with the local engine")
        if a.resources:
            raise PlanError(f"engine='ray': actor {a.name!r} takes tokens {a.resources}; "
                            f"give it Ray resources in placement= instead")
    if len(sources) != 1:
        raise PlanError(f"engine='ray' reads one source on the driver; this graph has "
                        f"{len(sources)}")
    nodes_known = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    actors = [a for a in plan.actors if not isinstance(a, Collector)]
    unknown = set(engine.placement) - {a.name for a in actors}
    if unknown:
        raise PlanError(f"engine='ray': placement= names {sorted(unknown)}, which this graph "
                        f"does not have; its actors: {[a.name for a in actors]}")
    nodes, sizes = {}, {}
    for a in actors:
        node = engine.placement.get(a.name, {}).get("node", "node:0")
        try:
            k = int(str(node).split(":")[1])
            nodes_known[k]
        except (IndexError, ValueError):
            raise PlanError(f"engine='ray': placement of {a.name!r}: node {node!r} is not "
                            f"one of this cluster's {len(nodes_known)} nodes "
                            f"(node:0 ... node:{len(nodes_known) - 1})") from None
        nodes[a] = f"node:{k}"
        sizes[a] = a.out_spec.nbytes
    opts = check_resources(ray, engine, [a for a in actors if not isinstance(a, SourceActor)])
    buffers = {a: plan.buffers[a] for a in actors}
    collector = next(a for a in plan.actors if isinstance(a, Collector))
    rp = RayPlan(actors, buffers, nodes, sizes, sources[0], list(collector.inputs), collector)
    rp.options = opts
    rp.batch = engine.batch
    for node, need in rp.per_node().items():
        budget = engine.memory.get(node)
        if budget is not None and need > budget:
            b = engine.batch
            rows = ", ".join(f"{a.name} {buffers[a]} x {b} x {format_bytes(sizes[a])}"
                             for a in actors if nodes[a] == node)
            one = sum(b * sizes[a] for a in actors if nodes[a] == node)
            fit = budget // one if one else None
            raise PlanError(
                f"engine='ray': the registers on {node} need {format_bytes(need)} ({rows}), "
                f"over its {format_bytes(budget)} budget; "
                + (f"buffers={fit} would fit" if fit else
                   "even one register (a batch of pieces) per actor does not fit: raise the "
                   "budget, lower batch= or place actors on other nodes"), device=node, needed=need, budget=budget,
                fitting_buffers=fit or None)
    return rp


def check_resources(ray, engine, stages: list) -> dict:
    """Every Ray actor the run starts must fit the cluster, or its creation would wait
    forever: refused now, naming what is asked and what there is. A stage without
    ``num_cpus`` in placement= asks an equal share of the cluster's CPUs (at most 1)."""
    have = ray.cluster_resources()
    n = sum(a.replicas for a in stages)
    share = min(1.0, have.get("CPU", 0.0) / max(1, n))
    share = int(share * 100) / 100            # (Ray counts CPUs to 1/10,000)
    asked: dict = {}
    options: dict = {}
    for a in stages:
        opts = {k: v for k, v in engine.placement.get(a.name, {}).items() if k != "node"}
        opts.setdefault("num_cpus", share)
        options[a.name] = opts
        want = {"CPU": opts["num_cpus"], "GPU": opts.get("num_gpus", 0),
                **opts.get("resources", {})}
        for k, v in want.items():
            asked.setdefault(k, []).append((a.name, a.replicas, v))
    for k, rows in asked.items():
        total = sum(r * v for _, r, v in rows)
        if total > have.get(k, 0) + 1e-9:
            says = ", ".join(f"{name} {r} x {v:g}" for name, r, v in rows if v)
            raise PlanError(f"engine='ray': the stages' Ray actors ask {total:g} {k} "
                            f"({says}) and the cluster has {have.get(k, 0):g}; their "
                            f"creation would wait forever. Ask less in placement= "
                            f"(e.g. {{'name': {{'num_cpus': 0.5}}}}) or add nodes")
    return options


def source_items(src: SourceActor):
    """The source's pieces for a Ray run (piece 0 read while planning first), each leaf as
    the array a register would hold (a Python float is float32, a tensor its numpy data),
    checked against piece 0's shapes."""
    src.start()
    want = [(s.shape, s.dtype.np) for s in src.out_spec.specs]
    piece = 0
    while True:
        if piece in src.cached:
            value = unflatten(src.out_spec.structure, src.cached.pop(piece))
        else:
            try:
                value = next(src.it)
            except StopIteration:
                return
            what = f"source {src.name!r} (piece {piece})"
            leaves, structure = flatten(value)
            arrays = [as_array(x, what) for x in leaves]
            got = [(a.shape, a.dtype) for a in arrays]
            if structure != src.out_spec.structure or got != want:
                raise ActorError(src.name, piece, TypeError(
                    f"{what} gave {got}, but its registers hold {want} (sized by piece 0); "
                    f"give the same shapes and dtypes for every piece"))
            value = unflatten(structure, arrays)
        yield value
        piece += 1


def actor_error(e, where_of) -> ActorError:
    """ActorError from what ``ray.get`` raised for an act: the stage's own exception (with
    its traceback and node), or the death of its Ray actor process."""
    cause = getattr(e, "cause", None)
    if isinstance(e, StageFailed) or isinstance(cause, StageFailed):
        f = e if isinstance(e, StageFailed) else cause
        pid, node, host = f.where
        err = ActorError(f.name, f.piece, f.original,
                         f"(on node {node} ({host}), Ray actor process {pid})\n{f.tb}")
        err.node = node
        err.__cause__ = f.original
        return err
    name, piece, last, node = where_of
    during = f"piece {piece}" if last == piece else f"pieces {piece} to {last} (one call)"
    dead = RuntimeError(f"its Ray actor process died during {during} "
                        f"({type(e).__name__}: {e})")
    err = ActorError(name, piece, dead, f"(on {node})")
    err.node = node
    err.__cause__ = e
    return err


def make_worker(ray, engine, a: StageActor, leaves, node_ids: list, opts):
    opts = dict(opts)
    node = engine.placement.get(a.name, {}).get("node")
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_ids[int(str(node).split(":")[1])], soft=False)
    opts.setdefault("max_restarts", 0)
    remote = ray.remote(Worker).options(**opts)
    return remote.remote(a.name, a.fn, leaves, a.out_spec.structure)


def now() -> float:
    return time.time()


__all__ = ["RayPlan", "plan_for_ray", "ray_module", "leaves_of", "PER_REPLICA"]
