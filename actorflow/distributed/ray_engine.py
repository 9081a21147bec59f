"""``RayEngine``: an actor graph run on Ray, each stage replica in a Ray actor process,
with the graph's credits kept across processes.

The driver plans the graph as on one machine (register sizes from ``out=`` or piece 0),
checks the budgets per node and per Ray resource, starts a Ray actor per stage replica
(or per group of cheap stages: one process hosts them all), then coordinates:

- the sources are read on the driver; each batch of pieces goes into Ray's object store
  (``ray.put``): that object is the source's register;
- an act of a stage is a call on one of its Ray actors, given its inputs' object refs
  (Ray hands the worker the arrays zero-copy); its output stays in the object store, where
  the readers' acts take it, never through the driver;
- credits: an actor may have at most ``buffers`` pieces out that some reader has not
  finished, so in flight per edge never exceeds ``buffers`` and each node's register bytes
  stay within the plan. When the last reader of a piece finishes, the driver drops the
  piece's ref: the credit comes home, and Ray frees the object;
- shared tokens (``ActorGraph(resources=)``) are the driver's too: a call takes all of
  its stage's tokens when it is sent and gives them back when its record comes in;
- the driver waits on the acts' small records (``ray.wait``: it blocks until one ends),
  hands outputs to the caller in piece order, and times every act for stats and traces.

An error in a stage, or a Ray actor that dies, stops the run with ActorError naming the
actor, the piece and the node; every Ray actor of the run is killed, so nothing is left
running, and the graph can run again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ..errors import parse_bytes
from ..runtime.graph.source import SourceActor
from ..runtime.observe.progress import tqdm_class
from .procs import kill
from .rayplan import driver_path, plan_for_ray, ray_module
from .run import RayRun

if TYPE_CHECKING:
    from ..runtime.graph.actor_graph import ActorGraph, Progress, TracePath


class RayEngine:
    """Runs actor graphs on Ray: ``g.run(engine=af.distributed.RayEngine(...))``, or
    ``engine="ray"`` (a RayEngine with these defaults).

    Args:
        address: the Ray cluster to join (None: the one running, else a local one started
            by ``ray.init(**init)``).
        placement: per stage (or group) name, the Ray actor options of its processes
            (``num_cpus``, ``num_gpus``, ``resources`` labels, ...) and ``node`` to pin
            them: ``"node:K"`` (node 0 is the driver's, the others follow by address and
            port), a NodeID, or a node's IP address.
        groups: ``{"light": ["decode", "crop"]}``: cheap stages that share Ray actor
            processes (replica ``r`` of each in process ``r``), so that each does not take
            a process and a CPU share of its own; placement= then places the group.
        fuse: a stage of a group that reads only the one before it in the group acts in
            that stage's Ray calls (one call per batch for a chain, not one per stage),
            when each holds a free register; False: a call per stage.
        memory: byte budgets for the graph's registers, per node (``{"node:0": "2GiB"}``,
            any name ``node`` takes) or per Ray resource (``{"GPU": "8GiB"}``: the
            registers of the stages whose processes ask it); refused before the first act
            when they do not fit (a stage Ray places itself is counted on the node it
            started on, before the first act).
        batch: pieces per Ray call and per object (4): a call costs about a millisecond
            of Ray's own work on each side, which a batch shares. A register then holds a
            batch: ``buffers`` batches in flight per edge, planned as such. ``"auto"``:
            calls of about 4 MiB of the largest register's pieces (1 to 64 pieces),
            fewer until the budgets fit; ``g.stats().batch`` says what a run used.
        keep_workers: after a run that finished, keep its Ray actor processes for the
            next run of the same graph (each run otherwise starts its own: about a second
            here); ``close()`` ends them. A kept process runs what a new one would: each
            run pickles its stages as they are then (functions with the values they read
            then, sources, op programs with their constants) and the process loads them
            afresh (sent only when their bytes changed), so nothing an earlier run did to
            the stages' own objects carries over. It is replaced when its placement, node
            or replicas changed, or a module its stages come from changed on disk. What
            it keeps is its process: the modules it imported and their globals (a stage
            from an importable module reads the process's copy, as a new process's
            import would start it), random generators, threads it started. A run that
            fails or stops kills its own, and a run of another graph ends them (they
            would hold the CPUs it needs).
        start_timeout: seconds a run waits for its Ray actors to start (Ray waits
            forever for resources other actors hold): then PlanError, and they are killed.
        init: keyword arguments for ``ray.init`` when the engine starts Ray itself (a
            local cluster's workers get the driver's ``sys.path`` as ``PYTHONPATH``, so
            they import the modules the stage functions come from).
    """

    def __init__(
        self,
        address: str | None = None,
        placement: dict | None = None,
        memory: dict | None = None,
        init: dict | None = None,
        batch: int | Literal["auto"] = 4,
        keep_workers: bool = False,
        start_timeout: float = 60.0,
        groups: dict | None = None,
        fuse: bool = True,
    ) -> None:
        if batch != "auto" and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
            raise ValueError(
                f"RayEngine(batch={batch!r}): pieces per Ray call must be a "
                f'whole number >= 1, or "auto"'
            )
        self.batch = batch
        self.keep_workers = keep_workers
        self.start_timeout = float(start_timeout)
        self.kept: dict = {}  # (graph, unit name) -> procs.Kept
        self.address = address
        self.placement = dict(placement or {})
        self.fuse = bool(fuse)
        self.groups = {}
        for k, v in (groups or {}).items():
            if not isinstance(v, (list, tuple)) or not v or not all(isinstance(n, str) for n in v):
                raise ValueError(
                    f"RayEngine(groups={{{k!r}: {v!r}}}): a group is a list of stage names"
                )
            self.groups[str(k)] = list(v)
        self.memory = {str(k): parse_bytes(v) for k, v in (memory or {}).items()}
        self.init = dict(init or {})

    def start(self) -> ModuleType:
        ray = ray_module()
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": False, **self.init}
            if self.address is None:
                # local worker processes import what the driver can (stage functions
                # defined in the caller's modules are pickled by reference)
                opts.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": driver_path()}})
            ray.init(address=self.address, **opts)
        return ray

    def close(self) -> None:
        """Ends the Ray actor processes kept for later runs (``keep_workers=True``)."""
        ray = ray_module()
        for kept in self.kept.values():
            kill(ray, kept.workers)
        self.kept.clear()

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        g: ActorGraph,
        feed: Iterable[Any] | None = None,
        trace: TracePath | None = None,
        progress: Progress = False,
    ) -> Iterator[Any]:
        """Yields the graph's outputs in piece order, as ``ActorGraph.run`` does."""
        if progress:
            tqdm_class()  # (missing: said before the run starts)
        if g._running:  # (before planning reads piece 0 of its source)
            raise RuntimeError("this graph is already running; wait for that run to end")
        ray = self.start()
        try:
            plan = plan_for_ray(g, feed, self, ray)
        except BaseException:
            for a in g.actors:  # (planning opened the sources and read piece 0)
                if isinstance(a, SourceActor):
                    a.close()
            raise
        return RayRun(ray, g, plan, self, trace, progress).outputs()
