"""One run of an actor graph on Ray: the driver's coordinator (see ``ray_engine.py``)."""

from __future__ import annotations

import collections
import itertools
import time

from ..errors import DeadlockError
from ..runtime.graph.source import SourceActor
from ..runtime.plan.spec import flatten
from .procs import keep_or_kill, start_processes
from .rayplan import PER_REPLICA, actor_error, source_items
from .report import RayRunStats, RunBar, write_trace
from .timeouts import overran, set_deadline, timed_out, wait_s


class RayRun:
    def __init__(self, ray, g, plan, engine, trace, progress=False):
        self.ray, self.g, self.plan, self.engine, self.trace = ray, g, plan, engine, trace
        self.progress = progress
        self.bar = None
        self.actors = plan.actors
        # reads of each actor's output per piece: one per input slot that names it (a stage
        # may take one input twice) and one per sink (an actor may be sunk twice)
        self.reads = {a: sum(c.inputs.count(a) for c in self.actors) for a in self.actors}
        self.sink_index: dict = {}  # actor -> its sink indexes
        for k, a in enumerate(plan.sinks):
            self.sink_index.setdefault(a, []).append(k)
        self.procs: dict = {}  # unit -> its Ray actor handles (one per replica)
        self.made: dict = {}  # unit -> what its processes host (to keep them)
        self.where: dict = {}  # unit -> [(pid, node label, host)] per replica
        self.busy: dict = {}  # (unit, replica) -> calls queued on that process
        self.limit: dict = {}  # unit -> calls queued per process at most
        self.tokens = dict(g.resources)  # the graph's shared tokens free now
        self.unready: set = set()  # (source, batch) sent to its process, not read yet
        self.chains: dict = {}  # act record ref -> the actors of a fused call
        self.recorded: set = set()  # (actor, batch) whose act's record came in
        self.node_of: dict = {}  # (actor, batch) -> node label of its register
        self.next_piece = {a: 0 for a in self.actors}
        self.held = {a: 0 for a in self.actors}  # batches out, not finished by a reader
        self.peak_held = {a: 0 for a in self.actors}
        self.ended_at: dict = {}  # actor -> pieces it gives in all
        self.refs: dict = {}  # (actor, batch) -> object ref of its outputs
        self.left: dict = {}  # (actor, batch) -> readers not finished
        self.pending: dict = {}  # act record ref -> (actor, batch, replica)
        self.deadline: dict = {}  # act record ref -> when it overran (timeout=)
        self.free_at = collections.defaultdict(float)  # (actor, replica) -> last deadline
        self.parts: dict = {}  # piece -> {sink index: the part copied out}
        self.next_out = 0  # the next batch to deliver
        self.delivered = 0  # pieces delivered
        self.lens: dict = {}  # batch -> its pieces
        self.records: list = []  # (actor, piece, replica, t0, t1, pid, node)
        self.acts = {a: 0 for a in self.actors}
        self.fused = {a: 0 for a in self.actors}  # acts in a call sent for the one before
        self.compute = {a: 0.0 for a in self.actors}
        self.waits = {a: {"input": 0.0, "credit": 0.0, "resource": 0.0} for a in self.actors}
        self.cause: dict = {}  # actor -> (cause, since)
        self.node_bytes: dict = {}  # node -> bytes of registers out now
        self.node_peak: dict = {}
        self.memory_points: list = []  # (time, node, bytes)
        self.state = "running"
        self.t0 = time.time()
        self.started_s = None  # seconds until every Ray actor process was up

    # -- the run ---------------------------------------------------------------------------
    def outputs(self):
        g = self.g
        with g._lock:
            if g._running:
                raise RuntimeError("this graph is already running; wait for that run to end")
            g._running = True
        try:
            if self.progress:
                self.bar = RunBar(self)
            self._start()
            yield from self._loop()
            self.state = "finished"
        except GeneratorExit:
            self.state = "stopped"
            raise
        except BaseException:
            self.state = "failed"
            raise
        finally:
            self._stop()
            g._running = False
            if self.bar is not None:
                self.bar.close()

    def _start(self) -> None:
        self.items = {src: source_items(src) for src in self.plan.sources}
        for a in self.actors:  # (a source read in a process: its own)
            if isinstance(a, SourceActor) and a not in self.items:
                a.close()
        start_processes(self)
        for u in self.procs:
            hosted = PER_REPLICA * len(u.members)
            self.limit[u] = (
                sum(self.plan.buffers[a] for a in u.members) + hosted if u.is_async else hosted
            )
            for r in range(u.replicas):
                self.busy[(u, r)] = 0
        self.started_s = time.time() - self.t0

    def _loop(self):
        ray = self.ray
        while True:
            self._dispatch()
            while self.next_out in self.parts and len(self.parts[self.next_out]) == len(
                self.plan.sinks
            ):
                parts = self.parts.pop(self.next_out)
                self.next_out += 1
                for piece in zip(*(parts[k] for k in range(len(parts))), strict=False):  # as before
                    self.delivered += 1
                    yield self.plan.collector.assemble(list(piece))
                if self.bar is not None:
                    self.bar.show()
            total = min(
                (self.ended_at.get(a) for a in self.plan.sinks),
                default=None,
                key=lambda n: float("inf") if n is None else n,
            )
            if total is not None and self.next_out >= total and not self.pending:
                return
            if not self.pending:
                raise DeadlockError(
                    "the Ray run stalled with nothing running (a bug in the "
                    "coordinator): " + self._who_waits(),
                    [],
                )
            done, _ = ray.wait(list(self.pending), num_returns=1, timeout=wait_s(self))
            if not done:
                overran(self)
            for ref in done:
                self._done(ref)

    def _dispatch(self) -> None:
        batch = self.plan.batch
        for a in self.actors:
            if a in self.ended_at:
                continue
            head = self.plan.fuse_prev.get(a)
            if head is not None:  # fused: acts in its head's calls only
                if head in self.ended_at:
                    self.ended_at[a] = self.ended_at[head]
                continue
            while True:
                j = self.next_piece[a]
                if self.held[a] >= self.plan.buffers[a]:
                    self._blocked(a, "credit")
                    break
                if a in self.items:  # a source read on the driver
                    if not self._tokens(a, +1):
                        break
                    values = list(itertools.islice(self.items[a], batch))
                    self._tokens(a, -1)
                    if values:
                        self.lens[j] = min(self.lens.get(j, batch), len(values))
                        self._take(a, j, self.ray.put(values), "node:0")
                        self.recorded.add((a, j))
                        self.acts[a] += len(values)
                        if a in self.sink_index:
                            self._collect(a, j, values)
                    if len(values) < batch:
                        self.ended_at[a] = j + (1 if values else 0)
                        break
                    continue
                ins = []
                for u in a.inputs:
                    ref = self.refs.get((u, j))
                    if (
                        ref is None
                        or (u, j) in self.unready
                        or (a.timeout is not None and (u, j) not in self.recorded)
                    ):
                        break  # (timed from its send: inputs computed first)
                    ins.append(ref)
                if len(ins) < len(a.inputs):
                    if any(u in self.ended_at and j >= self.ended_at[u] for u in a.inputs):
                        self.ended_at[a] = j
                    else:
                        self._blocked(a, "input")
                    break
                unit = self.plan.unit_of[a]
                r = min(range(a.replicas), key=lambda k: self.busy[(unit, k)])
                if self.busy[(unit, r)] >= self.limit[unit]:
                    break  # its processes have work queued: acting
                chain = self._chain(a)
                if chain is None:
                    break  # a stage fused after it has no free register
                if not self._tokens(a, +1):
                    break
                self.busy[(unit, r)] += 1
                if len(chain) == 1:
                    value_refs = (
                        self.procs[unit][r]
                        .act.options(num_returns=2)
                        .remote(a.name, j * batch, *ins)
                    )
                else:  # (fused: one call acts for the whole chain)
                    value_refs = (
                        self.procs[unit][r]
                        .act_chain.options(num_returns=len(chain) + 1)
                        .remote([c.name for c in chain], j * batch, *ins)
                    )
                    self.chains[value_refs[-1]] = chain
                record_ref = value_refs[-1]
                self.pending[record_ref] = (a, j, r)
                set_deadline(self, a, unit, r, record_ref, self.lens.get(j, batch))
                for c, ref in zip(chain, value_refs, strict=False):  # (the record is last)
                    self._take(c, j, ref, self.where[unit][r][1])
                if isinstance(a, SourceActor):  # (its readers, and those of the stages
                    # fused after it, wait for its record: it says where it ended)
                    self.unready.update((c, j) for c in chain)

    def _chain(self, a):
        """``a`` and the stages of its group fused after it (``RayPlan.fuse_next``), which
        act in its calls only: one call acts for all, when each holds a free register
        (else None: ``a`` waits for that credit, as one actor with several outputs)."""
        chain = [a]
        b = self.plan.fuse_next.get(a)
        while b is not None:
            if self.held[b] >= self.plan.buffers[b]:
                self._blocked(a, "credit")
                return None
            chain.append(b)
            b = self.plan.fuse_next.get(b)
        return chain

    def _tokens(self, a, sign: int) -> bool:
        """Takes (+1) or gives back (-1) all of ``a``'s shared tokens for one call; False
        when some are not free (``a`` waits on them)."""
        need = a.resources
        if not need:
            return True
        if sign > 0 and any(self.tokens[k] < n for k, n in need.items()):
            self._blocked(a, "resource")
            return False
        for k, n in need.items():
            self.tokens[k] -= sign * n
        return True

    def _take(self, a, j: int, ref, node: str) -> None:
        self._unblocked(a)
        self.refs[(a, j)] = ref
        self.node_of[(a, j)] = (node, self.plan.sizes[a] * self.lens.get(j, self.plan.batch))
        self.left[(a, j)] = self.reads[a] + len(self.sink_index.get(a, ()))
        self.next_piece[a] = j + 1
        self.held[a] += 1
        self.peak_held[a] = max(self.peak_held[a], self.held[a])
        self._memory(a, j, +1)

    def _done(self, ref) -> None:
        a, j, r = self.pending.pop(ref)
        unit = self.plan.unit_of[a]
        self.deadline.pop(ref, None)
        self.busy[(unit, r)] -= 1
        self._tokens(a, -1)  # (a call holds its stage's tokens until it ends)
        chain = self.chains.pop(ref, None)
        try:
            times, pid, node = self.ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the stage raised, or its process died
            # (a process that died fails every call queued on it: the first batch it
            # had is the one it died on)
            first = min(
                [j]
                + [
                    p
                    for b, p, q in self.pending.values()
                    if self.plan.unit_of[b] is unit and q == r
                ]
            )
            b = self.plan.batch
            fused = None if chain is None else " and ".join(repr(c.name) for c in chain)
            raise actor_error(
                e,
                (
                    a.name,
                    first * b,
                    first * b + self.lens.get(first, b) - 1,
                    self.where[unit][r][1],
                    fused,
                ),
            ) from None
        if chain is None:
            self._acted(a, j, r, times, pid, node)
        elif (a, j) in self.unready and not times[0]:  # (a source's call past its end)
            self._sourced(a, j, 0)
            for c in chain:
                self.unready.discard((c, j))
                self._release(c, j)
        else:
            for c, t in zip(chain, times, strict=True):
                self._acted(c, j, r, t, pid, node)
            for c, t in zip(chain[1:], times[1:], strict=True):
                self.fused[c] += len(t)

    def _acted(self, a, j: int, r: int, times: list, pid, node) -> None:
        """``a``'s act on batch ``j`` ended (its record: per piece its start and end)."""
        if (a, j) in self.unready:  # a source read in a process: its batch is in
            if not isinstance(a, SourceActor):
                self.unready.discard((a, j))  # (fused after one)
            else:
                self._sourced(a, j, len(times))
                if not times:  # (a call past its end: its credit comes home)
                    self._release(a, j)
                    return
        self.recorded.add((a, j))
        self.acts[a] += len(times)
        for k, (t0, t1) in enumerate(times):
            self.compute[a] += t1 - t0
            self.records.append((a.name, j * self.plan.batch + k, r, t0, t1, pid, node))
            if a.timeout is not None and t1 - t0 > a.timeout:
                timed_out(self, a, j * self.plan.batch + k, t1 - t0, node)
        for u in a.inputs:
            self._read(u, j)
        if a in self.sink_index:
            self._collect(a, j, self.ray.get(self.refs[(a, j)]))
        elif self.left.get((a, j)) == 0:  # nobody reads it: its credit comes home now
            self._release(a, j)  # (absent: its readers' records came in first)

    def _sourced(self, a, j: int, n: int) -> None:
        """A source's batch ``j`` read in its process: ``n`` pieces (fewer at its end: it
        ended; none: a call past its end, whose credit comes home now)."""
        self.unready.discard((a, j))
        batch = self.plan.batch
        self.lens[j] = min(self.lens.get(j, batch), n)
        if n < batch:
            end = j + (1 if n else 0)
            self.ended_at[a] = min(self.ended_at.get(a, end), end)

    def _collect(self, a, j: int, values: list) -> None:
        collector = self.plan.collector
        part = collector.part
        if collector.raw:  # a traced graph's outputs are picked from the
            values = [flatten(v)[0] for v in values]  # register's leaves, as locally
        for k in self.sink_index[a]:
            self.parts.setdefault(j, {})[k] = [part(k, v) for v in values]
            self._read(a, j)

    def _read(self, u, j: int) -> None:
        """A reader of ``u``'s batch ``j`` finished: the last one hands the credit home
        (the ref is dropped, and Ray frees the object)."""
        key = (u, j)
        self.left[key] -= 1
        if self.left[key] == 0:
            self._release(u, j)

    def _release(self, u, j: int) -> None:
        del self.left[(u, j)], self.refs[(u, j)]
        self.recorded.discard((u, j))
        self.held[u] -= 1
        self._memory(u, j, -1)

    def _memory(self, a, j: int, sign: int) -> None:
        node, size = self.node_of[(a, j)] if sign > 0 else self.node_of.pop((a, j))
        n = self.node_bytes.get(node, 0) + sign * size
        self.node_bytes[node] = n
        self.node_peak[node] = max(self.node_peak.get(node, 0), n)
        if self.trace is not None:
            self.memory_points.append((time.time(), node, n))

    def _blocked(self, a, cause: str) -> None:
        if a not in self.cause:
            self.cause[a] = (cause, time.perf_counter())

    def _unblocked(self, a) -> None:
        c = self.cause.pop(a, None)
        if c is not None:
            self.waits[a][c[0]] += time.perf_counter() - c[1]

    def _who_waits(self) -> str:
        return "; ".join(f"{a.name} waits for {c}" for a, (c, _) in self.cause.items())

    def _stop(self) -> None:
        """Kills every Ray actor of the run (nothing is left running), unless the run
        finished and the engine keeps its workers warm for the next run of the graph;
        records stats."""
        keep_or_kill(self, self.engine.keep_workers and self.state == "finished")
        self.pending.clear()
        self.refs.clear()
        for src in self.actors:
            if isinstance(src, SourceActor):
                src.close()
        wall = time.time() - self.t0
        self.g._last = RayRunStats(self, wall)
        if self.trace is not None:
            self.g._last.trace = write_trace(self, self.trace)
