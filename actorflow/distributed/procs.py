"""The Ray actor processes of a run: started per unit (a stage's replicas, or a group's),
reused when the engine keeps a finished run's warm ones, waited for (within
``start_timeout``), checked against the budgets with the nodes Ray placed them on, and
killed.

What a unit's processes run is its stages pickled when the run starts (``pickled``:
functions with the values they read now, sources, op programs with their constants). A
kept process is reused only as a new one would be: with the same Ray options, node and
replicas, and the same files behind the modules its stages were pickled by reference
from (which a process imports once); it then loads the run's stages afresh, sent only
when their bytes differ from the ones it kept (``Worker.begin``)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import types
from typing import NamedTuple

from ..errors import PlanError
from .cluster import check_budgets
from .worker import AsyncWorker, Worker


class Kept(NamedTuple):
    """A finished run's processes of one unit, kept for the next run of its graph:
    ``made`` (what starting them took: worker class, Ray options, node, replicas, the
    modules their stages come from), ``digest`` (of the stages they last loaded) and the
    Ray actor handles, one per replica."""

    made: tuple
    digest: str
    workers: list


def start_processes(run) -> None:
    """Starts (or takes kept) the processes of every unit of ``run.plan``, waits until
    each answers, and sets ``run.procs`` (unit -> Ray actor handles) and ``run.where``
    (unit -> [(pid, node label, host)])."""
    ray, plan, engine = run.ray, run.plan, run.engine
    others = [k for k in engine.kept if k[0] != id(run.g)]
    if others:  # another graph's warm processes hold CPUs this
        for k in others:  # run's need (kept for one graph at a time)
            kill(ray, engine.kept.pop(k).workers)
    renewed = set()
    for u in plan.units.values():
        program, digest, modules = pickled(ray, u.stages(plan.batch))
        made = (
            (AsyncWorker if u.is_async else Worker).__name__,
            u.options,
            u.node,
            u.replicas,
            modules,
        )
        kept = engine.kept.pop((id(run.g), u.name), None)  # (keep_workers=True: warm)
        reuse = kept is not None and kept.made == made
        if u.replicas > 1 and not (reuse and kept.digest == digest):
            program = ray.put(program)  # (sent to each of its processes: stored once)
        where = None
        if reuse:
            where = renew(
                ray,
                kept.workers,
                digest,
                None if kept.digest == digest else program,
                engine.start_timeout,
            )
        if where is not None:
            run.procs[u] = kept.workers
            run.where[u] = [(pid, plan.nodes.label_of_id(node), host) for pid, node, host in where]
            renewed.add(u)
        else:
            if kept is not None:
                kill(ray, kept.workers)
            run.procs[u] = []  # (filled one by one: a failure kills those made)
            for _ in range(u.replicas):
                run.procs[u].append(_make(ray, u, program, digest, plan.nodes))
        run.made[u] = (made, digest)
        for a in u.members:
            a.cached.clear()  # (piece 0 computed while planning: redone there)
    started = [(u, w.where.remote()) for u, ws in run.procs.items() if u not in renewed for w in ws]
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
            f"holds them, or raise start_timeout="
        )
    for u, ref in started:
        try:
            pid, node, host = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - it died starting (an import that failed...)
            raise PlanError(
                f"engine='ray': the Ray actor process of {u.name!r} "
                f"({', '.join(a.name for a in u.members)}) died while starting: "
                f"{type(e).__name__}: {_first_lines(e)}; can the workers import "
                f"the stages' functions and their modules?"
            ) from e
        run.where.setdefault(u, []).append((pid, plan.nodes.label_of_id(node), host))

    def nodes_of(a):
        u = plan.unit_of.get(a)
        return ["node:0"] if u is None else [n for _, n, _ in run.where[u][: a.replicas]]

    plan.need = check_budgets(
        plan.held(nodes_of),
        plan.budgets,
        plan.batch,
        " (on the nodes Ray placed the stages' processes)",
    )


def keep_or_kill(run, keep: bool) -> None:
    """After a run: its processes kept warm for the next run of the graph, or killed."""
    for u, ws in run.procs.items():
        if keep:
            made, digest = run.made[u]
            run.engine.kept[(id(run.g), u.name)] = Kept(made, digest, ws)
        else:
            kill(run.ray, ws)
    run.procs.clear()


def _make(ray, u, program, digest: str, nodes):
    opts = dict(u.options)
    if u.node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes.ids[u.node], soft=False)
    opts.setdefault("max_restarts", 0)
    try:
        remote = ray.remote(AsyncWorker if u.is_async else Worker).options(**opts)
    except (TypeError, ValueError) as e:
        raise PlanError(
            f"engine='ray': placement of {u.name!r}: Ray refuses the options {u.options}: {e}"
        ) from e
    return remote.remote(program, digest)


def pickled(ray, stages: list) -> tuple:
    """What the processes of a unit load for this run: its ``stages`` pickled as they
    are now (a function defined in ``__main__`` or in a function with the values it reads
    now; one from an importable module by reference) as ``(stream, buffers)``, protocol 5
    with the arrays they hold out of band (as numpy arrays: Ray hands them over
    zero-copy, as it does a stage's arrays); the digest of those bytes; and the modules
    pickled by reference (their classes and functions, and the modules the stages'
    functions use), each with its file's size and time: a process imports a module once,
    so one whose file changed needs a new process.

    Raises:
        PlanError: a stage or source that does not pickle, named."""
    import numpy as np

    buf = io.BytesIO()
    buffers: list = []
    pickler = _pickler_class(ray)(buf, buffers.append)
    try:
        pickler.dump((stages, _constants(stages)))
    except Exception as e:  # noqa: BLE001 - a function or source that does not pickle
        bad = stages[0]
        for s in stages:  # (which one: each alone)
            try:
                ray.cloudpickle.dumps(s)
            except Exception:  # noqa: BLE001 - this one
                bad = s
                break
        raise PlanError(
            f"engine='ray': {bad.name!r} cannot be sent to a Ray actor "
            f"process ({type(e).__name__}: {e}); what a process runs must "
            f"pickle: a source as a function returning its iterator "
            f"(g.source(read), not g.source(read())) or a list, a stage "
            f"as a function"
        ) from e
    stream = buf.getvalue()
    arrays = [np.frombuffer(b.raw(), np.uint8) for b in buffers]  # (views, no copy)
    digest = hashlib.blake2b(stream, digest_size=20)
    for a in arrays:
        digest.update(len(a).to_bytes(8, "little"))
        digest.update(a.data)  # (its bytes: a contiguous view)
    return ((stream, arrays), digest.hexdigest(), tuple(_stamp(m) for m in sorted(pickler.modules)))


def _constants(stages: list) -> list:
    """The constants the stages' functions read (their globals, a method's class
    attributes: ``code_reads.shared_constants``), which a process would otherwise take from
    its own import of their module (the file's values, not what the driver set since)."""
    from ..code_reads import ModelReads, shared_constants

    fns = [s.fn for s in stages if getattr(s, "fn", None) is not None]
    return shared_constants(ModelReads(functions=fns))


_PICKLER: list = []


def _pickler_class(ray):
    """Ray's cloudpickle Pickler, noting the modules of what it pickles by reference."""
    if _PICKLER:
        return _PICKLER[0]
    base = ray.cloudpickle.Pickler

    class Noting(base):
        def __init__(self, file, buffer_callback):
            super().__init__(file, protocol=5, buffer_callback=buffer_callback)
            self.modules: set = set()

        def reducer_override(self, obj):
            out = super().reducer_override(obj)
            if out is NotImplemented:  # (by reference, or not a function or class)
                if isinstance(obj, types.ModuleType):
                    self.modules.add(obj.__name__)
                elif isinstance(obj, (type, types.FunctionType)):
                    self.modules.add(getattr(obj, "__module__", None) or "")
            return out

    _PICKLER.append(Noting)
    return Noting


def _stamp(name: str) -> tuple:
    """A module as a process that imported it would differ: its file's path, size and
    modification time (None for a module without a file)."""
    path = getattr(sys.modules.get(name), "__file__", None)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    return (name, path, st.st_size, st.st_mtime_ns) if st else (name, path, None, None)


def renew(ray, workers: list, digest: str, program, timeout: float):
    """Kept processes loading this run's stages (``program``, or its object ref, sent
    when their bytes changed; None: loaded again from the bytes they kept, which
    ``digest`` names): ``[(pid, node id, host)]`` per process, or None when one died,
    failed to load them or took longer than ``timeout`` seconds (the caller replaces
    them: a new process says why when it fails too)."""
    try:
        return ray.get([w.begin.remote(digest, program) for w in workers], timeout=timeout)
    except Exception:  # noqa: BLE001 - died, does not answer or cannot load: replaced
        return None


def _first_lines(e, n: int = 6) -> str:
    return " / ".join(line.strip() for line in str(e).splitlines()[:n] if line.strip())


def kill(ray, workers) -> None:
    """Ends these Ray actors (one already dead is fine)."""
    for w in workers:
        try:
            ray.kill(w)
        except Exception:  # noqa: BLE001 - already dead
            pass
