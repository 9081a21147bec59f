"""``RayEngine``: an actor graph run on Ray, each stage replica in a Ray actor process,
with the graph's credits kept across processes.

The driver plans the graph as on one machine (register sizes from ``out=`` or piece 0),
checks the budgets per node, starts a Ray actor per stage replica, then coordinates:

- the source is read on the driver; each piece goes into Ray's object store (``ray.put``):
  that object is the source's register;
- an act of a stage is a call on one of its Ray actors, given its inputs' object refs
  (Ray hands the worker the arrays zero-copy); its output stays in the object store, where
  the readers' acts take it, never through the driver;
- credits: an actor may have at most ``buffers`` pieces out that some reader has not
  finished, so in flight per edge never exceeds ``buffers`` and each node's register bytes
  stay within the plan. When the last reader of a piece finishes, the driver drops the
  piece's ref: the credit comes home, and Ray frees the object;
- the driver waits on the acts' small records (``ray.wait``: it blocks until one ends),
  hands outputs to the caller in piece order, and times every act for stats and traces.

An error in a stage, or a Ray actor that dies, stops the run with ActorError naming the
actor, the piece and the node; every Ray actor of the run is killed, so nothing is left
running, and the graph can run again.
"""

from __future__ import annotations

import time

from ..errors import ActorError, PlanError, format_bytes, parse_bytes
from ..runtime.actor import Collector, StageActor
from ..runtime.source import SourceActor
from ..runtime.register import EOS
from ..runtime.spec import unflatten
from .worker import StageFailed, Worker, leaves_of

PER_REPLICA = 2         # calls queued on one Ray actor at once (hides the round trip)


def ray_module():
    try:
        import ray
    except ImportError as e:
        raise ImportError("engine='ray' needs Ray: pip install 'actorflow[ray]'") from e
    return ray


class RayEngine:
    """Runs actor graphs on Ray: ``g.run(engine=af.distributed.RayEngine(...))``, or
    ``engine="ray"`` (a RayEngine with these defaults).

    Args:
        address: the Ray cluster to join (None: the one running, else a local one started
            by ``ray.init(**init)``).
        placement: per actor name, the Ray actor options of its processes (``num_cpus``,
            ``resources``, ...) and ``node``: ``"node:K"`` (the K-th node of ``ray.nodes()``
            order, the driver's first) to pin it there.
        memory: byte budgets per node (``{"node:0": "2GiB"}``) for the graph's registers;
            refused before the first act when they do not fit.
        init: keyword arguments for ``ray.init`` when the engine starts Ray itself (a
            local cluster's workers get the driver's ``sys.path`` as ``PYTHONPATH``, so
            they import the modules the stage functions come from).
    """

    def __init__(self, address=None, placement: dict | None = None,
                 memory: dict | None = None, init: dict | None = None):
        self.address = address
        self.placement = dict(placement or {})
        self.memory = {str(k): parse_bytes(v) for k, v in (memory or {}).items()}
        self.init = dict(init or {})

    def start(self):
        ray = ray_module()
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": False, **self.init}
            if self.address is None:
                # local worker processes import what the driver can (stage functions
                # defined in the caller's modules are pickled by reference)
                opts.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": driver_path()}})
            ray.init(address=self.address, **opts)
        return ray

    def run(self, g, feed=None, trace=None, progress=False):
        """Yields the graph's outputs in piece order, as ``ActorGraph.run`` does."""
        if progress:
            raise ValueError("engine='ray': progress=True is not built yet for Ray runs")
        from .run import RayRun
        ray = self.start()
        plan = plan_for_ray(g, feed, self, ray)
        return RayRun(ray, g, plan, self, trace).outputs()


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
            out[self.nodes[a]] = out.get(self.nodes[a], 0) + self.buffers[a] * self.sizes[a]
        return out


def plan_for_ray(g, feed, engine: RayEngine, ray) -> RayPlan:
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
    for node, need in rp.per_node().items():
        budget = engine.memory.get(node)
        if budget is not None and need > budget:
            rows = ", ".join(f"{a.name} {buffers[a]} x {format_bytes(sizes[a])}"
                             for a in actors if nodes[a] == node)
            one = sum(sizes[a] for a in actors if nodes[a] == node)
            fit = budget // one if one else None
            raise PlanError(
                f"engine='ray': the registers on {node} need {format_bytes(need)} ({rows}), "
                f"over its {format_bytes(budget)} budget; "
                + (f"buffers={fit} would fit" if fit else
                   "even one register per actor does not fit: raise the budget or place "
                   "actors on other nodes"), device=node, needed=need, budget=budget,
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
    """The source's pieces for a Ray run (piece 0 read while planning first)."""
    src.start()
    piece = 0
    while True:
        if piece in src.cached:
            value = unflatten(src.out_spec.structure, src.cached.pop(piece))
        else:
            try:
                value = next(src.it)
            except StopIteration:
                return
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
    name, piece, node = where_of
    dead = RuntimeError(f"its Ray actor process died ({type(e).__name__}: {e})")
    err = ActorError(name, piece, dead, f"(on {node})")
    err.node = node
    err.__cause__ = e
    return err


def make_worker(ray, engine: RayEngine, a: StageActor, leaves, node_ids: list, opts):
    opts = dict(opts)
    node = engine.placement.get(a.name, {}).get("node")
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_ids[int(str(node).split(":")[1])], soft=False)
    opts.setdefault("max_restarts", 0)
    remote = ray.remote(Worker).options(**opts)
    return remote.remote(a.name, a.fn, leaves)


def now() -> float:
    return time.time()


__all__ = ["RayEngine", "ray_module", "leaves_of"]
