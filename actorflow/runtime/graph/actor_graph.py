"""ActorGraph: build a graph of actors, plan its memory, run it.

Example::

    g = af.ActorGraph(memory={"cpu": "64MiB"}, resources={"disk": 1})
    load = g.source(read_batches, out=af.Spec((256, 784)), name="load",
                    resources={"disk": 1})
    prep = g.actor(normalize, load, name="preprocess")
    h = g.op(af.relu, prep, name="relu")
    g.sink(h, name="out")
    print(g.plan())
    for out in g.run(): ...
    print(g.stats())
"""

from __future__ import annotations

import os
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ...errors import ActorflowError, DeviceError, PlanError, TraceError
from ..observe import hooks as observe
from ..observe.stats import RunStats
from ..plan.autotune import FLOOR
from ..plan.registers import MemoryBudget
from ..plan.sizing import plan_graph
from ..plan.spec import PieceSpec, Spec
from ..sched import driving
from ..sched import loop as loop_module
from ..sched.processes import OwnsProcesses
from .actors import COLLECTOR_NAME, Actor, OpActor, StageActor
from .checks import check_buffers
from .device_acts import (
    DEVICE_ACTORS,
    CopyActor,
    DeviceOpActor,
    DeviceSource,
    DeviceStage,
    device_memory,
    placed_on,
)
from .source import SourceActor

if TYPE_CHECKING:
    from ...device import Device
    from ..plan.reservation import Plan
    from ..sched.processes import StageProcesses
    from ..sched.stragglers import Stragglers

# what users give: ``out=`` a Spec or a tuple/list/dict of them; ``buffers=`` registers per
# output or "auto"; ``time=`` simulated seconds per act, or ``f(piece) -> seconds``;
# ``trace=`` a path; ``progress=`` True or tqdm's arguments
SpecTree = Spec | Sequence[Any] | Mapping[str, Any]
Buffers = int | Literal["auto"]
SimTime = float | Callable[[Any], float]
TracePath = str | os.PathLike[str]
Progress = bool | Mapping[str, Any]


class Engine(Protocol):
    """What ``run(engine=...)`` takes besides a name: an object that runs the graph
    elsewhere (``af.distributed.RayEngine``)."""

    def run(
        self,
        g: ActorGraph,
        feed: Iterable[Any] | None = None,
        trace: TracePath | None = None,
        progress: Progress = False,
    ) -> Iterator[Any]: ...


_OP_TRACER: list = [None]


_ENGINES: dict = {}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    """``run(engine=name)`` makes ``factory()`` run the graph (``actorflow.distributed``
    registers "ray": engines live above the runtime and hand themselves in)."""
    _ENGINES[name] = factory


def use_op_tracer(op_program: Callable[..., Any]) -> None:
    """Sets what ``ActorGraph.op`` traces functions with: ``op_program(fn, in_specs,
    kwargs) -> Program``. Tracing lives above the runtime and hands it in when imported."""
    _OP_TRACER[0] = op_program


class ActorGraph(OwnsProcesses):
    """A graph of actors with credit-based registers.

    Args:
        memory: byte budgets per device, e.g. ``{"cpu": "64MiB"}`` (ints or strings).
        resources: shared tokens, e.g. ``{"disk": 1}``; an actor declaring
            ``resources={"disk": 1}`` takes one for each act (all of its tokens at once).
        buffers: registers per actor output where an actor gives none: None (the
            default) chooses them as "auto" does with double buffering as the floor: 2
            each, up to 16 for small host registers next to short acts on threads where
            the budget allows (the plan's rows say the count and ``auto``); an int is
            exactly that many (2: double buffering); "auto" chooses them for throughput
            under the budget when the plan is made, from the stage times (piece 0 is
            computed before the run to time it).
        seed: seeds the order in which simultaneously ready actors are tried (tests).
        output_buffers: outputs ``run()`` may have delivered but the caller not taken yet.
        share: registers whose lifetimes never overlap share memory, in an order the run
            keeps (control edges): ``"auto"`` when side by side they do not fit the
            budget, ``True`` always, ``False`` never (the plan is refused instead).
    """

    def __init__(
        self,
        memory: dict | None = None,
        resources: dict | None = None,
        buffers: Buffers | None = None,
        seed: int | None = None,
        output_buffers: int = 16,
        share: bool | Literal["auto"] = "auto",
    ) -> None:
        MemoryBudget(memory)  # validates the budgets now
        self.memory = dict(memory or {})
        self.resources = {}
        for name, n in (resources or {}).items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise PlanError(
                    f"resources={{{name!r}: {n!r}}}: a resource needs a whole number of tokens >= 1"
                )
            self.resources[name] = n
        self.buffers = None if buffers is None else check_buffers(buffers, "ActorGraph")
        self.seed = seed
        if (
            not isinstance(output_buffers, int)
            or isinstance(output_buffers, bool)
            or output_buffers < 1
        ):
            raise ValueError(f"output_buffers must be an int >= 1, got {output_buffers!r}")
        self.output_buffers = output_buffers
        if share not in ("auto", True, False):
            raise ValueError(f"share must be 'auto', True or False, got {share!r}")
        self.share = share
        self.actors: list = []
        self._names: set = set()
        self.sinks: list = []
        self._plan: Plan | None = None
        self._last: RunStats | None = None
        self._last_timeline = None
        self._running = False
        self._lock = threading.Lock()
        self._picks: tuple | None = None
        self.yields_nothing = False  # a traced function that returns nothing: a run
        #                              yields None per piece (nn.Graph's step)
        # set by the builder of a traced step: runs one piece through the op actors in
        # recorded order
        self.replay: Callable[[list], None] | None = None
        self._current: tuple | None = None  # (scheduler, plan) of the run going on
        self._stragglers: Stragglers | None = None  # the last run's ledger (see join())
        self._measured: dict = {}  # actor name -> seconds per act, last run
        self._local = True  # plans are for this process's engine (else the
        #                     default is its floor: see run())

    def _set_outputs(
        self, sinks: list, picks: list, structure, yields_nothing: bool = False
    ) -> None:
        """Runs yield ``structure`` from ``picks`` of the sinks (a traced function's value);
        ``yields_nothing``: the function returns nothing (the caller yields None)."""
        self.sinks = [(a, a.name) for a in sinks]
        self._picks = (picks, structure)
        self.yields_nothing = yields_nothing

    # -- building --------------------------------------------------------------------------
    def _add(self, actor: Actor) -> Actor:
        for p in actor.inputs:
            if not isinstance(p, Actor) or p not in self.actors:
                raise TypeError(
                    f"actor {actor.name!r}: its inputs must be actors of this graph "
                    f"(what source/actor/op returned), got {p!r}"
                )
        self.actors.append(actor)
        self._names.add(actor.name)
        for p in actor.inputs:
            p.consumers.append(actor)
        self._plan = None
        return actor

    def _name(self, name, default: str) -> str:
        if name == COLLECTOR_NAME:
            raise ValueError(f"the name {name!r} is the run's own output; choose another")
        if name is not None:
            if name in self._names:
                raise ValueError(f"an actor named {name!r} already exists; names are unique")
            return str(name)
        base = default or "actor"
        n, cand = 0, base
        while cand in self._names:
            n += 1
            cand = f"{base}_{n}"
        return cand

    def source(
        self,
        source: Iterable[Any]
        | AsyncIterable[Any]
        | Callable[[], Iterable[Any] | AsyncIterable[Any]],
        out: SpecTree | None = None,
        name: str | None = None,
        resources: Mapping[str, int] | None = None,
        buffers: Buffers | None = None,
        inline: bool = False,
        time: SimTime | None = None,
        timeout: float | None = None,
        one_argument: bool = False,
    ) -> Actor:
        """An actor yielding the items of ``source`` (iterable, async iterable, or a
        zero-argument callable returning one). Each item is a piece: an array or tensor,
        or a tuple/list/dict of them. ``out``: its Spec (else piece 0 sizes it).
        ``timeout``: seconds one act may take before the run fails (as for ``actor``).
        ``one_argument``: it feeds a function of one argument, so an item ``(x,)`` is
        taken as ``x`` (a traced graph's inputs)."""
        spec = PieceSpec.from_user(out) if out is not None else None
        return self._add(
            SourceActor(
                self._name(name, "source"),
                source,
                buffers=buffers,
                resources=resources,
                inline=inline,
                time=time,
                out=spec,
                timeout=timeout,
                one_argument=one_argument,
            )
        )

    def input(
        self,
        out: SpecTree | None,
        name: str | None = None,
        buffers: Buffers | None = None,
        one_argument: bool = False,
    ) -> Actor:
        """A source whose items are given to ``run(feed=...)`` (``one_argument``: as for
        ``source``)."""
        spec = PieceSpec.from_user(out) if out is not None else None
        name = self._name(name or "input", "source")
        on = _device_of_spec(spec)
        if on is not None:  # its pieces are device tensors: stored on the device
            return self._add(
                DeviceSource(
                    name, None, on, fed=True, buffers=buffers, out=spec, one_argument=one_argument
                )
            )
        return self._add(
            SourceActor(name, None, fed=True, buffers=buffers, out=spec, one_argument=one_argument)
        )

    def actor(
        self,
        fn: Callable[..., Any],
        *inputs: Actor,
        out: SpecTree | None = None,
        name: str | None = None,
        resources: Mapping[str, int] | None = None,
        buffers: Buffers | None = None,
        inline: bool = False,
        time: SimTime | None = None,
        timeout: float | None = None,
        replicas: int = 1,
        processes: int | StageProcesses | None = None,
    ) -> Actor:
        """A Python stage: ``fn(*pieces) -> piece``, one argument per input, called on the
        actor's own thread (``inline=True``: on the scheduler's loop, for tiny functions);
        an ``async def`` one is awaited on the run's loop, several acts at once.
        Its inputs are read-only views of the producers' registers; its result is copied
        into its register. ``out``: its Spec (else piece 0 sizes it). ``time``: simulated
        extra seconds per act (float or ``f(piece)``), for experiments and tests.
        ``timeout``: seconds one act may take; past it the run fails with ActorError and
        the act is abandoned (it frees its registers when it returns). ``replicas``: threads
        the stage acts on at once (acts still leave in piece order; up to its registers).
        ``processes``: the stage acts in that many worker processes instead (an int >= 1,
        or a ``StageProcesses`` to share), spawned once and kept across runs until
        ``close()``; its registers are shared memory the workers write in place (only the
        input piece and the indices travel through pipes), its credits counted here as for
        any stage. ``fn`` (and what it reads) must pickle; it runs in the workers as
        pickled when a plan is made (sent again when ``fn`` is another object)."""
        spec = PieceSpec.from_user(out) if out is not None else None
        name = self._name(name, getattr(fn, "__name__", "stage"))
        self._check_inputs(name, inputs)
        on = placed_on(inputs)
        procs = owns = None
        if processes is not None:
            procs, owns = _stage_processes(processes, replicas, name)
            replicas = procs.n * procs.depth  # (threads waiting for the workers' acts)
            if on is not None:
                raise ValueError(
                    f"actor {name!r}: its inputs are on {on}; processes= is for "
                    f"stages on the host (copy after the stage instead)"
                )
        if on is not None:  # its inputs are on a device: it runs there
            if inline or time is not None or timeout is not None or resources:
                raise ValueError(
                    f"actor {name!r}: its inputs are on {on}, where a stage "
                    f"issues device work from the run's loop; inline=, time=, "
                    f"timeout= and resources= are for stages on the host"
                )
            return self._add(
                DeviceStage(
                    name, fn, list(inputs), on, buffers=buffers, out=spec, replicas=replicas
                )
            )
        return self._add(
            StageActor(
                name,
                fn,
                list(inputs),
                buffers=buffers,
                resources=resources,
                inline=inline,
                time=time,
                out=spec,
                timeout=timeout,
                replicas=replicas,
                procs=procs,
                owns_procs=bool(owns),
            )
        )

    def copy(
        self,
        src: Actor,
        device: str | Device,
        name: str | None = None,
        buffers: Buffers | None = None,
    ) -> Actor:
        """An actor copying each piece of ``src`` across the host boundary: to a device
        (``"cuda:0"``: host to device on the device's copy stream ``h2d``, into registers in
        the device's memory, under its budget ``memory={"cuda:0": ...}``), or from one to
        ``"cpu"`` (on ``d2h``). The stages reading a device copy run on the device: they
        get its registers as tensors there (read-only) and return tensors there. Each
        act ends when its copy completed on the device; with 2 registers (the default's)
        one piece's copy overlaps the next stage's work on the piece before.

        Raises DeviceError when ``src`` is on ``device``'s side already."""
        name = self._name(name, f"to_{device}".replace(":", "_"))
        self._check_inputs(name, [src])
        return self._add(CopyActor(name, src, device, buffers=buffers))

    @staticmethod
    def _check_inputs(name: str, inputs) -> None:
        for p in inputs:
            if not isinstance(p, Actor):
                raise TypeError(
                    f"actor {name!r}: its inputs must be actors of this graph "
                    f"(what source/actor/op returned), got {p!r}"
                )

    def op(
        self,
        fn: Callable[..., Any],
        *inputs: Actor,
        name: str | None = None,
        buffers: Buffers | None = None,
        inline: bool | None = None,
        time: SimTime | None = None,
        resources: Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> Actor:
        """A built-in op (or a function of tensors) as an actor: ``fn`` is traced on the
        inputs' specs once, and its kernels run straight into the actor's register each
        piece. ``kwargs`` go to ``fn`` (e.g. ``dim=1``)."""

        def build(specs):
            op_program = _OP_TRACER[0]
            if op_program is None:
                raise PlanError(
                    "g.op needs actorflow's tracing: import actorflow (or actorflow.tracing) first"
                )
            try:
                return op_program(fn, specs, kwargs)
            except TraceError as e:
                raise TraceError(
                    f"op actor {a.name!r}: {e} (g.op traces functions of "
                    f"actorflow tensors; for numpy code use g.actor)"
                ) from e
            except (ActorflowError, ValueError, TypeError, IndexError) as e:
                raise PlanError(
                    f"op actor {a.name!r} cannot run on inputs "
                    f"{', '.join(s.describe() for s in specs)}: "
                    f"{type(e).__name__}: {e}"
                ) from e

        on = placed_on([p for p in inputs if isinstance(p, Actor)])
        if on is not None:
            raise PlanError(
                f"g.op({getattr(fn, '__name__', fn)}): its inputs are on {on}, "
                f"where a traced op actor does not run yet; use g.actor(fn, ...) "
                f"(a stage on {on}: it gets and returns tensors there)"
            )
        a = OpActor(
            self._name(name, getattr(fn, "__name__", "op")),
            list(inputs),
            build=build,
            buffers=buffers,
            resources=resources,
            inline=inline,
            time=time,
        )
        return self._add(a)

    def op_program(
        self,
        program: Any,  # (a tracing.Program or DeviceSteps: a layer above, not named)
        *inputs: Actor,
        name: str | None = None,
        buffers: Buffers | None = None,
        inline: bool | None = None,
        time: SimTime | None = None,
        resources: Mapping[str, int] | None = None,
        state_reads: Iterable[str] = (),
        state_writes: Iterable[str] = (),
    ) -> Actor:
        """An op actor running ``program``, already compiled for these inputs (a
        ``tracing.Program``: what ``g.op`` would trace, an ``nn.Graph`` step), into its
        register each piece. ``name`` defaults to the program's (its ops' names).
        ``state_reads`` / ``state_writes``: the states it reads and the one it writes across
        pieces, kept in piece order (``gates.py``). On inputs whose registers are on a CUDA
        device, a program compiled for it (``tracing.device.DeviceSteps``) whose work the
        actor issues there (``DeviceOpActor``)."""
        name = self._name(name, program.name)
        self._check_inputs(name, inputs)
        on = placed_on(inputs)
        if on is None and hasattr(program, "submit"):
            raise DeviceError(
                f"op actor {name!r} runs {program.describe()}, whose registers "
                f"are on its device, but its inputs are on the host; copy them "
                f"there first: g.copy(x, {str(program.device)!r})"
            )
        a: OpActor
        if on is not None:  # its registers are on the device: it issues its
            a = DeviceOpActor(name, list(inputs), program, on, buffers=buffers)  # work there
        else:
            a = OpActor(
                name,
                list(inputs),
                program=program,
                buffers=buffers,
                resources=resources,
                inline=inline,
                time=time,
            )
        a.state_reads, a.state_writes = tuple(state_reads), tuple(state_writes)
        return self._add(a)

    def sink(self, node: Actor, name: str | None = None) -> Actor:
        """Marks ``node``'s output as the run's: ``run()`` yields a copy of each of its
        pieces (a dict by sink name when there are several sinks)."""
        if not isinstance(node, Actor) or node not in self.actors:
            raise TypeError(f"sink: expected an actor of this graph, got {node!r}")
        name = name or node.name
        if any(n == name for _, n in self.sinks):
            raise ValueError(f"sink: there is already a sink named {name!r}; give name=")
        self.sinks.append((node, name))
        self._plan = None
        return node

    @property
    def running(self) -> bool:
        """Whether a run of this graph has started and not ended yet."""
        return self._running

    # -- planning --------------------------------------------------------------------------
    def plan(self, feed: Iterable[Any] | None = None) -> Plan:
        """Sizes every register and checks the budgets; returns the Plan (print it for a
        table), or raises PlanError. A stage without ``out=`` is sized by computing piece 0
        here, kept as piece 0 of the next run."""
        self._wait_abandoned()
        with self._lock:
            if self._running:
                raise RuntimeError("plan(): this graph is running; plan it before or after")
            if self._plan is not None and feed is None:
                return self._plan
            return self._make_plan(feed, lazy=False)

    def _make_plan(self, feed, lazy: bool, whole: bool = False):
        for a in self.actors:  # (stages in worker processes: started, and their
            if getattr(a, "procs", None) is not None:  # functions sent, now)
                a.procs.prepare(a)
        default = self.buffers if self.buffers is not None or self._local else FLOOR
        self._plan = plan_graph(
            self.actors,
            self.sinks,
            self._picks,
            feed,
            lazy,
            default,
            MemoryBudget(self.memory),
            self.resources,
            share=self.share,
            measured=self._measured,
            whole=whole,
        )
        return self._plan

    def _tuned(self) -> bool:
        return self.buffers == "auto" or any(a.buffers == "auto" for a in self.actors)

    def _start_mode(self) -> str:
        """How a run without ``plan()`` first sizes the stages that need piece 0: "probe"
        (as ``plan()`` does: piece 0 computed before the run, every register planned at
        once; for ``buffers="auto"``, whose counts are weighed against each other, and
        ``share=True``), "whole" (piece 0 flows through the run first, and the registers
        are planned at once when every size is known, shared by lifetime where the budget
        needs it, as ``plan()`` would: with a budget and ``share="auto"``) or "lazy" (each
        stage's registers allocated the moment its piece 0 exists: nothing to share)."""
        if (
            self._tuned()
            or self.share is True
            or any(isinstance(a, DEVICE_ACTORS) for a in self.actors)
        ):
            return "probe"  # (device registers are allocated before the run)
        if self.share == "auto" and any(b is not None for b in self.memory.values()):
            return "whole"
        return "lazy"

    def _plans_first(self, feed) -> bool:
        """Whether the next run's start computes piece 0 before the run (what
        ``run_async`` does on a thread of its own, so that its loop runs on meanwhile)."""
        return not (self._plan is not None and feed is None) and self._start_mode() == "probe"

    # -- running ---------------------------------------------------------------------------
    def _start(self, feed):
        with self._lock:
            if self._running:
                raise RuntimeError("this graph is already running; wait for that run to end")
            self._running = True
        try:
            if feed is None and any(
                getattr(a, "fed", False) and a.source is None for a in self.actors
            ):
                raise PlanError("this graph reads its pieces from run(feed=...); pass feed=")
            if self._plan is not None and feed is None:
                plan = self._plan  # made by plan(): piece 0 was computed there
            else:
                mode = self._start_mode()
                plan = self._make_plan(feed, lazy=mode != "probe", whole=mode == "whole")
            self._plan = None  # the next run plans (and reads piece 0) again
            plan.allocate()
        except BaseException:
            self._running = False
            raise
        return plan

    def _unstart(self, plan) -> None:
        """A plan made for a run that never started (``run_async``'s caller went away while
        it was made): frees it, and the graph may run again."""
        try:
            plan.release()
        finally:
            for a in self.actors:
                if isinstance(a, SourceActor) and a.fed:
                    a.source = None
            self._running = False

    def _finish(self, plan, sched) -> None:
        """The run is over: frees the plan but what abandoned acts hold; records stats."""
        try:
            sched.stragglers.settle()
            self._last = RunStats(sched, plan)
            self._last_timeline = sched.timeline  # (af.testing.acts)
            if sched.trace_path is not None:
                try:
                    sched.timeline.write(sched.trace_path)
                except OSError as e:
                    raise OSError(
                        f"run(trace={str(sched.trace_path)!r}): the run ended "
                        f"({self._last.state}) but its timeline could not be "
                        f"written there: {e}; give a path in a folder you can "
                        f"write"
                    ) from e
                assert self._last.trace is not None  # (a run with a trace path records it)
                self._last.trace["write_s"] = sched.timeline.write_s
            if self._last.state == "finished":
                self._measured = {
                    n: r["compute_s"] / r["acts"]
                    for n, r in self._last.actors.items()
                    if r["acts"] and n != COLLECTOR_NAME
                }
            for a in self.actors:
                if isinstance(a, SourceActor) and a.fed:
                    a.source = None
        finally:
            self._current = None
            self._running = False
            observe.run_ended(self, sched)

    async def _drive(self, plan, sched) -> None:
        try:
            await sched.run()
        finally:
            self._finish(plan, sched)

    def _finish_unstarted(self, plan, sched, task) -> None:
        if task.cancelled() and not sched.finished:  # before its first step: nothing ran
            sched.let_go()
            self._finish(plan, sched)

    def join(self, timeout: float | None = None) -> bool:
        """Waits until the last run has ended and the acts it abandoned when it stopped
        have returned and freed their registers; False if ``timeout`` passed first. (Not
        from inside the loop over that run: it would wait on itself.)"""
        s = self._stragglers
        return True if s is None else s.wait(timeout)

    def _wait_abandoned(self) -> None:
        """Before a plan or a run: the last run's abandoned acts must have returned (they
        still use its actors' sources, caches and programs). A run still going is not
        waited for: the caller then says the graph is running."""
        if self._running:
            return
        while not self.join(loop_module.WAIT_WARN_S):
            loop_module.warn_waiting(self._stragglers)

    async def join_async(self) -> None:
        """``join()`` for async code."""
        if self._stragglers is not None:
            await self._stragglers.wait_async()

    def run(
        self,
        feed: Iterable[Any] | None = None,
        trace: TracePath | None = None,
        progress: Progress = False,
        engine: str | Engine | None = None,
    ) -> Iterator[Any]:
        """Runs the graph from plain code (on the graph loop thread); yields the outputs in
        piece order. ``break``, an actor's error (ActorError) or Ctrl-C stops it at once;
        acts running then are abandoned and free their registers when they return
        (``join()`` waits for that); everything else is freed before this returns.
        ``trace``: a path; the run's timeline is written there as Chrome trace JSON when
        it ends (``timeline.py``). ``progress``: True (or tqdm's arguments as a dict) shows
        a progress bar with pieces per second and the bottleneck (``progress.py``).
        ``engine``: None or "local" (this process), "ray" or an engine object
        (``af.distributed.RayEngine``): each stage in Ray actor processes."""
        if engine is not None and engine != "local":
            if isinstance(engine, str):
                if engine not in _ENGINES:
                    raise ValueError(
                        f"run(engine={engine!r}): the engines are 'local' and "
                        f"{', '.join(repr(k) for k in _ENGINES) or 'none else'}"
                    )
                runner: Engine = _ENGINES[engine]()
            else:
                runner = engine
            # the default's hand-off registers are for threads in this process: elsewhere
            # (processes, where a register is an object in flight) it is its floor, 2
            self._local = False
            try:
                return runner.run(self, feed=feed, trace=trace, progress=progress)
            finally:
                self._local = True
        return driving.run_blocking(self, feed, trace, progress)

    def run_async(
        self,
        feed: Iterable[Any] | None = None,
        trace: TracePath | None = None,
        progress: Progress = False,
    ) -> AsyncIterator[Any]:
        """Runs the graph on the running event loop; ``async for out in g.run_async()``.

        Cancelling the consuming task (while it waits here or in its own code), an error in
        an actor, or ``aclosing`` stops the run at once, as ``run()`` does on ``break``.
        ``trace``, ``progress``: as for ``run``."""
        return driving.run_async(self, feed, trace, progress)

    def close(self) -> None:
        """Ends the worker processes of this graph's stages (``processes=``); a DataLoader's
        are its own (``DataLoader.close``). They end by themselves when the graph is
        garbage collected, and at the interpreter's exit."""
        for a in self.actors:
            if getattr(a, "owns_procs", False):
                a.procs.close()

    def stats(self) -> RunStats:
        """Per actor of the last run (during a run: a live snapshot of it): acts, compute
        time, time waiting on input, credit and resources; memory planned and measured per
        device; whether it finished, was stopped or failed."""
        current = self._current
        if current is not None:
            return RunStats(*current)
        if self._last is None:
            raise RuntimeError("stats(): the graph has not run yet")
        return self._last


def _stage_processes(processes, replicas, name: str) -> tuple:
    """``(StageProcesses, made here)`` for ``actor(processes=...)``."""
    from ..sched.processes import StageProcesses

    if replicas != 1:
        raise ValueError(
            f"actor {name!r}: give replicas= (threads) or processes= (worker "
            f"processes), not both: processes={processes!r} acts in that many "
            f"processes at once already"
        )
    if isinstance(processes, StageProcesses):
        return processes, False
    return StageProcesses(processes, f"actor {name!r}"), True


def _device_of_spec(spec):
    """The device with its own memory (cuda) a declared layout's arrays are on, or None
    (the host's)."""
    devs = {s.device for s in spec.specs} if spec is not None else set()
    on = [d for d in devs if device_memory(d)]
    if on and len(devs) > 1:
        raise DeviceError(
            f"out={spec.describe()}: a register is on one device, and these "
            f"arrays are on {', '.join(sorted(map(str, devs)))}; give a source "
            f"per device, or copy the host arrays over (g.copy(src, {str(on[0])!r}))"
        )
    return on[0] if on else None
