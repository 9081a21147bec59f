"""The Ray actor processes of a run: started per unit (a stage's replicas, or a group's),
reused when the engine keeps a finished run's warm ones, waited for (within
``start_timeout``), checked against the budgets with the nodes Ray placed them on, and
killed."""

from __future__ import annotations

from ..errors import PlanError
from .cluster import check_budgets
from .worker import AsyncWorker, Worker


def start_processes(run) -> None:
    """Starts (or takes kept) the processes of every unit of ``run.plan``, waits until
    each answers, and sets ``run.procs`` (unit -> Ray actor handles) and ``run.where``
    (unit -> [(pid, node label, host)])."""
    ray, plan, engine = run.ray, run.plan, run.engine
    others = [k for k in engine.kept if k[0] != id(run.g)]
    if others:                          # another graph's warm processes hold CPUs this
        for k in others:                # run's need (kept for one graph at a time)
            kill(ray, engine.kept.pop(k)[1])
    for u in plan.units.values():
        stages = u.stages(plan.batch)
        made = (_fingerprint(stages), u.options, u.node)
        key = (id(run.g), u.name)
        kept = engine.kept.pop(key, None)                 # (keep_workers=True: warm ones)
        if kept is not None and _same(kept[0], made) and len(kept[1]) == u.replicas \
                and alive(ray, kept[1]):
            run.procs[u] = kept[1]
        else:
            if kept is not None:
                kill(ray, kept[1])
            run.procs[u] = []           # (filled one by one: a failure kills those made)
            for _ in range(u.replicas):
                run.procs[u].append(_make(ray, u, stages, plan.nodes))
        run.made[u] = made
        for a in u.members:
            a.cached.clear()            # (piece 0 computed while planning: redone there)
    started = [(u, w.where.remote()) for u, ws in run.procs.items() for w in ws]
    wait = engine.start_timeout
    ready, _ = ray.wait([r for _, r in started], num_returns=len(started), timeout=wait)
    if len(ready) < len(started):
        late = sorted({u.name for u, r in started if r not in ready})
        u = plan.units[late[0]]
        raise PlanError(
            f"engine='ray': the Ray actors of {late} did not start within {wait:g} s: "
            f"the cluster has {ray.available_resources().get('CPU', 0):g} of its "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs free (other Ray actors "
            f"hold the rest?) and these ask {u.options}; ask less in placement=, end what "
            f"holds them, or raise start_timeout=")
    for u, ref in started:
        try:
            pid, node, host = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - it died starting (an import that failed...)
            raise PlanError(f"engine='ray': the Ray actor process of {u.name!r} "
                            f"({', '.join(a.name for a in u.members)}) died while starting: "
                            f"{type(e).__name__}: {_first_lines(e)}; can the workers import "
                            f"the stages' functions and their modules?") from e
        run.where.setdefault(u, []).append((pid, plan.nodes.label_of_id(node), host))

    def nodes_of(a):
        u = plan.unit_of.get(a)
        return ["node:0"] if u is None else [n for _, n, _ in run.where[u][:a.replicas]]
    plan.need = check_budgets(plan.held(nodes_of), plan.budgets, plan.batch,
                              " (on the nodes Ray placed the stages' processes)")


def keep_or_kill(run, keep: bool) -> None:
    """After a run: its processes kept warm for the next run of the graph, or killed."""
    for u, ws in run.procs.items():
        if keep:
            run.engine.kept[(id(run.g), u.name)] = (run.made[u], ws)
        else:
            kill(run.ray, ws)
    run.procs.clear()


def _make(ray, u, stages: list, nodes):
    opts = dict(u.options)
    if u.node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes.ids[u.node],
                                                                     soft=False)
    opts.setdefault("max_restarts", 0)
    for s in stages:
        try:
            ray.cloudpickle.dumps(s)
        except Exception as e:  # noqa: BLE001 - a function or source that does not pickle
            raise PlanError(f"engine='ray': {s.name!r} cannot be sent to a Ray actor "
                            f"process ({type(e).__name__}: {e}); what a process runs must "
                            f"pickle: a source as a function returning its iterator "
                            f"(g.source(read), not g.source(read())) or a list, a stage "
                            f"as a function") from e
    try:
        remote = ray.remote(AsyncWorker if u.is_async else Worker).options(**opts)
    except (TypeError, ValueError) as e:
        raise PlanError(f"engine='ray': placement of {u.name!r}: Ray refuses the options "
                        f"{u.options}: {e}") from e
    return remote.remote(stages)


def _fingerprint(stages: list) -> list:
    """What kept processes must host to be reused: per stage its name, its function (an op
    actor's program), output shapes and nesting, and simulated time."""
    return [(s.name, getattr(s.fn, "program", s.fn), s.leaves, s.structure, s.sim)
            for s in stages]


def _same(a, b) -> bool:
    (fa, oa, na), (fb, ob, nb) = a, b
    return oa == ob and na == nb and len(fa) == len(fb) and all(
        x[0] == y[0] and x[1] is y[1] and x[2:] == y[2:] for x, y in zip(fa, fb))


def _first_lines(e, n: int = 6) -> str:
    return " / ".join(line.strip() for line in str(e).splitlines()[:n] if line.strip())


def kill(ray, workers) -> None:
    """Ends these Ray actors (one already dead is fine)."""
    for w in workers:
        try:
            ray.kill(w)
        except Exception:  # noqa: BLE001 - already dead
            pass


def alive(ray, workers) -> bool:
    """Whether kept Ray actors still answer (one that died between runs is not reused)."""
    try:
        ray.get([w.where.remote() for w in workers], timeout=10)
        return True
    except Exception:  # noqa: BLE001 - died, or does not answer: replaced
        return False
