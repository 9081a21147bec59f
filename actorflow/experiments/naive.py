"""The naive scheduler: what today's frameworks do, to reproduce their deadlocks.

An op is issued once its inputs exist, in an order set by a policy; issued ops run in issue
order on their device's single stream (as one CUDA stream would); each allocates its output
from a shared device pool when it starts, and an output is freed when its last consumer is
done. Memory is a resource this scheduler does not see, so an unlucky order deadlocks
(``mode="wait"``: the op at the head of a stream waits for memory, and the stream waits
with it) or runs out of memory (``mode="fail"``) although a safe order existed.
``mode="double-buffer"`` adds the per-op counter of figure 3 of the article: an op may hold
at most ``buffers`` live outputs, else it waits (a waiting list), as hand-written
double-buffer allocators do.

The scheduler models memory and time only (no data): each op has an output size and a
duration, run on the asyncio loop with ``call_later``. When nothing runs and nothing can
start, it builds the wait-for graph and raises ``DeadlockError`` naming the cycle.

Example::

    ops = [NaiveOp("M1", [], "1MiB"), NaiveOp("M2", [], "3MiB"),
           NaiveOp("O1", ["M1"], "5MiB"), NaiveOp("O2", ["M2"], "1MiB")]
    NaiveScheduler(ops, capacity="8MiB", policy=["M1", "M2", "O1", "O2"]).run()
    # DeadlockError: O1 waits for 5.0 MiB on cpu (4.0 MiB free); 3.0 MiB is held by M2's
    # output, freed when O2 finishes; O2 waits behind O1 on stream cpu:0
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import DeadlockError, OutOfMemoryError, format_bytes, parse_bytes
from ..eventloop import new_event_loop
from ..runtime.observe.watchdog import WaitFor, deadlock
from ..runtime.plan.registers import MemoryBudget
from ..runtime.plan.sizing import plan_graph

if TYPE_CHECKING:
    from ..runtime import ActorGraph

POLICIES = ("fifo", "lifo", "random")
MODES = ("wait", "fail", "double-buffer")


class NaiveOp:
    """One op of a naive graph: ``inputs`` (names of ops), output size (bytes or a string),
    duration in seconds, and the device whose stream and pool it uses."""

    def __init__(
        self,
        name: str,
        inputs=(),
        nbytes=0,
        time: float = 0.001,
        device: str = "cpu",
        stream: str | None = None,
    ):
        self.name = name
        self.inputs = list(inputs)
        self.nbytes = parse_bytes(nbytes)
        self.time = float(time)
        self.device = str(device)  # whose memory pool its output uses
        self.stream = stream or f"{self.device}:0"  # where it runs, in issue order

    def __repr__(self) -> str:
        return f"NaiveOp({self.name!r}, {self.inputs}, {format_bytes(self.nbytes)})"


class _Inst:
    """One op on one piece."""

    __slots__ = ("op", "piece", "name", "state", "left", "block", "since")

    def __init__(self, op, piece, multi):
        self.op, self.piece = op, piece
        self.name = f"{op.name}[{piece}]" if multi else op.name
        self.state = "pending"  # pending -> issued -> running -> done
        self.left = 0  # consumers still to finish with its output
        self.block = False  # its output is allocated
        self.since = None


class NaiveResult:
    """``status``: "ok", "deadlock" or "oom"; ``error``; ``elapsed_s``; ``peak`` and
    ``capacity`` per device (bytes); ``timeline``: ``[(t, device, in_use)]``; ``stalls``:
    how many times an op waited for memory and ``stall_s`` for how long; ``completed``;
    ``detect_s``: wall time from the last event to the deadlock being named."""

    # (set from the keywords ``NaiveScheduler.run_async`` gives)
    status: str
    error: BaseException | None
    elapsed_s: float
    peak: dict
    capacity: dict
    timeline: list
    stalls: int
    stall_s: float
    completed: int
    total: int
    detect_s: float | None

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["error"] = str(self.error) if self.error is not None else None
        return d

    def __repr__(self) -> str:
        return (
            f"NaiveResult({self.status}, {self.completed} ops done, "
            f"{self.elapsed_s:.4f} s, peak {self.peak})"
        )


class NaiveScheduler:
    """Runs ``ops`` over ``pieces`` pieces the naive way (see the module docstring).

    Args:
        ops: NaiveOps in a topological order (or ``ops_from_graph(g)``).
        capacity: pool bytes per device: an int or string for every device, or a dict.
        policy: "fifo", "lifo", "random" (with ``seed``) or a list of op names giving the
            issue order (one piece).
        mode: "wait", "fail" or "double-buffer".
        buffers: the per-op counter of "double-buffer" mode.
        time_scale: multiplies every duration (0 runs them back to back).
    """

    def __init__(
        self,
        ops,
        capacity,
        policy="fifo",
        mode: str = "wait",
        seed=None,
        pieces: int = 1,
        buffers: int = 2,
        time_scale: float = 1.0,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(policy, str) and policy not in POLICIES:
            raise ValueError(
                f"policy must be one of {POLICIES} or a list of op names, got {policy!r}"
            )
        self.ops = list(ops)
        names = [o.name for o in self.ops]
        by_name = {o.name: o for o in self.ops}
        for o in self.ops:
            for i in o.inputs:
                if i not in by_name:
                    raise ValueError(f"op {o.name!r} reads {i!r}, which is not an op here")
        if not isinstance(policy, str):
            policy = list(policy)
            if sorted(policy) != sorted(names) or pieces != 1:
                raise ValueError("an explicit order names every op once (one piece)")
            seen: set = set()
            for name in policy:
                late = [i for i in by_name[name].inputs if i not in seen]
                if late:
                    raise ValueError(
                        f"the order issues {name!r} before its input {late[0]!r}; "
                        f"an op is issued only once its inputs exist"
                    )
                seen.add(name)
        self.policy, self.mode, self.buffers = policy, mode, buffers
        self.rng = random.Random(seed)
        self.time_scale = time_scale
        devices = sorted({o.device for o in self.ops})
        if isinstance(capacity, dict):
            missing = [d for d in devices if d not in capacity]
            if missing:
                raise ValueError(
                    f"capacity has no pool for device {missing[0]!r}; give one "
                    f"for each of {devices}"
                )
            self.capacity = {d: parse_bytes(capacity[d]) for d in devices}
        else:
            self.capacity = {d: parse_bytes(capacity) for d in devices}
        self.consumers = {o.name: [c for c in self.ops if o.name in c.inputs] for o in self.ops}
        self.pieces = pieces
        self.order = policy if not isinstance(policy, str) else None

    # -- running ---------------------------------------------------------------------------
    def run(self) -> NaiveResult:
        """Runs on a fresh event loop; returns the result (deadlock and OOM included)."""
        loop = new_event_loop()
        try:
            return loop.run_until_complete(self.run_async())
        finally:
            loop.close()

    async def run_async(self) -> NaiveResult:
        """Runs once from the start (each call is a fresh run of the same ops)."""
        multi = self.pieces > 1
        self.insts = {(o.name, p): _Inst(o, p, multi) for p in range(self.pieces) for o in self.ops}
        self._pending_ready: list = []
        self.loop = asyncio.get_running_loop()
        self.t0 = time.perf_counter()
        self.in_use = {d: 0 for d in self.capacity}
        self.peak = dict(self.in_use)
        self.timeline = [(0.0, d, 0) for d in self.capacity]
        self.streams: dict = {o.stream: deque() for o in self.ops}
        self.waiting: deque = deque()  # double-buffer mode: ops set aside until memory frees
        self.running = 0
        self.live = {o.name: 0 for o in self.ops}  # live outputs per op (figure 3)
        self.stalls, self.stall_s, self.done_count = 0, 0.0, 0
        self.last_event = time.perf_counter()
        self.finished = self.loop.create_future()
        self.next_in_order = 0
        self._issue([i for i in self.insts.values() if not i.op.inputs])
        self._advance()
        status = "ok"
        error: BaseException | None = None
        detect = None
        try:
            await self.finished
        except DeadlockError as e:
            status, error = "deadlock", e
            detect = time.perf_counter() - self.last_event
        except OutOfMemoryError as e:
            status, error = "oom", e
        return NaiveResult(
            status=status,
            error=error,
            elapsed_s=time.perf_counter() - self.t0,
            peak=dict(self.peak),
            capacity=dict(self.capacity),
            timeline=self.timeline,
            stalls=self.stalls,
            stall_s=self.stall_s,
            completed=self.done_count,
            total=len(self.insts),
            detect_s=detect,
        )

    def _issue(self, ready: list) -> None:
        """Puts newly ready ops on their streams, in the policy's order."""
        if self.order is not None:
            self._pending_ready += ready
            while self.next_in_order < len(self.order):
                name = self.order[self.next_in_order]
                inst = next((i for i in self._pending_ready if i.op.name == name), None)
                if inst is None:
                    break  # the next in order is not ready: wait for it
                self._pending_ready.remove(inst)
                self._put(inst)
                self.next_in_order += 1
            return
        if self.policy == "lifo":
            ready = ready[::-1]
        elif self.policy == "random":
            self.rng.shuffle(ready)
        for inst in ready:
            self._put(inst)

    def _put(self, inst) -> None:
        inst.state = "issued"
        self.streams[inst.op.stream].append(inst)

    def _fits(self, inst) -> bool:
        op = inst.op
        if op.nbytes > self.capacity[op.device] - self.in_use[op.device]:
            return False
        return self.mode != "double-buffer" or self.live[op.name] < self.buffers

    def _advance(self) -> None:
        """Starts the head of every idle stream that can allocate; detects the stall."""
        if self.mode == "double-buffer":
            # figure 3: a set-aside op whose buffer or memory is free goes back to the
            # front of its stream; an op that cannot start is set aside, not blocking it
            for inst in list(self.waiting):
                if self._fits(inst) and not any(
                    i.state == "running" for i in self.streams[inst.op.stream]
                ):
                    self.waiting.remove(inst)
                    self.streams[inst.op.stream].appendleft(inst)
            for stream in self.streams.values():
                while stream and stream[0].state != "running" and not self._fits(stream[0]):
                    inst = stream.popleft()
                    if inst.since is None:
                        inst.since = time.perf_counter()
                        self.stalls += 1
                    self.waiting.append(inst)
        for stream in self.streams.values():
            if not stream or stream[0].state == "running":
                continue
            head = stream[0]
            op = head.op
            dev = op.device
            free = self.capacity[dev] - self.in_use[dev]
            short = op.nbytes > free
            counted = self.mode == "double-buffer" and self.live[op.name] >= self.buffers
            if short and self.mode == "fail":
                err = OutOfMemoryError(
                    dev, op.nbytes, self.in_use[dev], self.capacity[dev], f"op {head.name}"
                )
                err.args = (
                    f"{dev}: out of memory: op {head.name} asked for "
                    f"{format_bytes(op.nbytes)} when it started, "
                    f"{format_bytes(self.in_use[dev])} of the "
                    f"{format_bytes(self.capacity[dev])} pool in use ({format_bytes(free)}"
                    f" free); the naive scheduler allocates outputs when ops start, "
                    f"in issue order, whatever memory the others will need",
                )
                self._fail(err)
                return
            if short or counted:
                if head.since is None:
                    head.since = time.perf_counter()
                    self.stalls += 1
                continue
            if head.since is not None:
                self.stall_s += time.perf_counter() - head.since
                head.since = None
            self._allocate(dev, op.nbytes)
            head.block = True
            self.live[op.name] += 1
            head.state = "running"
            self.running += 1
            delay = op.time * self.time_scale
            if delay > 0:
                self.loop.call_later(delay, self._complete, head)
            else:
                self.loop.call_soon(self._complete, head)
        if self.running == 0 and not self.finished.done():
            if self.done_count == len(self.insts):
                self.finished.set_result(None)
            else:
                self._fail(self._deadlock())

    def _fail(self, error) -> None:
        if not self.finished.done():
            self.finished.set_exception(error)

    def _allocate(self, dev, nbytes) -> None:
        self.in_use[dev] += nbytes
        self.peak[dev] = max(self.peak[dev], self.in_use[dev])
        self.timeline.append((time.perf_counter() - self.t0, dev, self.in_use[dev]))

    def _free(self, inst) -> None:
        if inst.block:
            inst.block = False
            dev = inst.op.device
            self.in_use[dev] -= inst.op.nbytes
            self.live[inst.op.name] -= 1
            self.timeline.append((time.perf_counter() - self.t0, dev, self.in_use[dev]))

    def _complete(self, inst) -> None:
        if self.finished.done():
            return
        self.last_event = time.perf_counter()
        self.running -= 1
        inst.state = "done"
        self.done_count += 1
        self.streams[inst.op.stream].popleft()
        consumers = self.consumers[inst.op.name]
        inst.left = len(consumers)
        if not consumers:
            self._free(inst)  # delivered: nobody else reads it
        for name in inst.op.inputs:
            src = self.insts[(name, inst.piece)]
            src.left -= 1
            if src.left == 0:
                self._free(src)
        ready = []
        for c in consumers:
            ci = self.insts[(c.name, inst.piece)]
            if ci.state == "pending" and all(
                self.insts[(n, inst.piece)].state == "done" for n in c.inputs
            ):
                ready.append(ci)
        self._issue(ready)
        self._advance()

    # -- the stall, in words -----------------------------------------------------------------
    def _deadlock(self) -> DeadlockError:
        g = WaitFor()
        stalled = []
        for inst in self.waiting:  # double-buffer mode's set-aside ops
            stalled.append(inst.name)
            self._waits(g, inst, self.live[inst.op.name] >= self.buffers)
        for sname, stream in self.streams.items():
            if not stream:
                continue
            head = stream[0]
            stalled.append(head.name)
            dev = head.op.device
            self._waits(
                g, head, head.op.nbytes <= self.capacity[dev] - self.in_use[dev], f" on {dev}"
            )
            for behind in list(stream)[1:]:
                g.add(
                    behind.name,
                    head.name,
                    f"{behind.name} waits behind {head.name} on stream {sname}",
                )
        for i in self.insts.values():
            if i.state == "pending":
                for n in i.op.inputs:
                    p = self.insts[(n, i.piece)]
                    if p.state != "done":
                        g.add(i.name, p.name, f"{i.name} waits for the output of {p.name}")
        return deadlock(g, "the naive scheduler", stalled)

    def _waits(self, g, inst, counted: bool, where: str = "") -> None:
        """Notes what the stalled ``inst`` waits for (one of its buffers when ``counted``,
        else memory) and who holds that."""
        op, dev = inst.op, inst.op.device
        if counted:
            g.note(inst.name, f"{inst.name} waits for one of its {self.buffers} buffers{where}")
            held = [i for i in self.insts.values() if i.block and i.op is op]
        else:
            free = self.capacity[dev] - self.in_use[dev]
            g.note(
                inst.name,
                f"{inst.name} waits for {format_bytes(op.nbytes)} on {dev} "
                f"({format_bytes(free)} free)",
            )
            held = [
                i
                for i in self.insts.values()
                if i.block and i.op.device == dev and i.state == "done"
            ]
        self._holders(g, inst, held)

    def _holders(self, g, waiter, held) -> None:
        for blk in held:
            for c in self.consumers[blk.op.name]:
                ci = self.insts[(c.name, blk.piece)]
                if ci.state != "done" and ci is not waiter:
                    g.add(
                        waiter.name,
                        ci.name,
                        f"{format_bytes(blk.op.nbytes)} is held by {blk.name}'s output, "
                        f"freed when {ci.name} finishes",
                    )


def ops_from_graph(
    graph: ActorGraph, device_of: Callable[[Any], str] | None = None, feed: Any = None
) -> list[NaiveOp]:
    """NaiveOps for an ActorGraph: one per actor, with its inputs, the bytes of one of its
    registers, its ``time=`` (0 if none or a function) and its register's device (or
    ``device_of(actor)``). Sized, not planned: the budgets are not checked, so a graph the
    actors refuse gives its ops too. A traced graph (or ``g.input``) needs ``feed``. Stages
    without ``out=`` compute piece 0 to be sized. For stand-ins use null-device Specs: a
    stage then gets None for each null input array and returns None (or a null tensor or
    array of its Spec's shape and dtype, checked); ``"null:1"``... budget other memories."""
    graph._wait_abandoned()  # as plan(): the last run's abandoned acts return
    if graph._running:
        raise RuntimeError("ops_from_graph: this graph is running; call it before or after")
    plan = plan_graph(
        graph.actors,
        graph.sinks,
        graph._picks,
        feed,
        False,
        graph.buffers,
        MemoryBudget(graph.memory),
        graph.resources,
        check=False,
    )
    graph._plan = None  # unchecked: the next plan() or run() plans again
    sizes = {r["name"]: r["register_bytes"] for r in plan.rows}
    ops = []
    for a in plan.actors:
        if a.name not in sizes:
            continue  # the run's output collector
        t = a.time if isinstance(a.time, (int, float)) else 0.0
        dev = a.out_spec.specs[0].device if a.out_spec.specs else "cpu"
        ops.append(
            NaiveOp(
                a.name,
                [p.name for p in a.inputs],
                sizes[a.name],
                t,
                device_of(a) if device_of else str(dev),
            )
        )
    return ops
