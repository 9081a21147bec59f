"""The actors of a graph: what each one computes for one piece.

An actor reads the arrays of its input registers and writes its output register. The
scheduler (``credit.py``) decides when it may act; this file only says what acting means:

- ``SourceActor`` (``source.py``) takes the next item of an iterable (or async iterable);
- ``StageActor`` calls a Python function of pieces and copies its result in;
- ``OpActor`` runs a program of built-in op kernels straight into the register;
- ``Collector`` copies what the sinks receive out to the caller of ``run()``.
"""

from __future__ import annotations

import inspect
from typing import cast

import numpy as np

from ...device import device as as_device
from ...tensor.meta import strided
from ..plan.registers import RegisterArrays
from ..plan.spec import (
    NOTHING,
    PieceSpec,
    check_piece,
    flatten,
    none_is_fine,
    own_copy,
    refuse_awaitable,
    refuse_device_tensor,
    unflatten,
)
from ..sched.loop import run_on_graph_loop
from .checks import (
    check_buffers,
    check_replicas,
    check_resources,
    check_time,
    check_timeout,
    seconds,
)

CPU = as_device("cpu")


class Sized:
    """What an act returns when it computed piece 0 before the actor's registers existed
    (the run sizes them from it): the piece's arrays."""

    __slots__ = ("leaves",)

    def __init__(self, leaves: list):
        self.leaves = leaves


class Actor:
    """Common state of every actor. ``inputs`` are the upstream actors, one per input."""

    kind = "stage"

    def __init__(
        self,
        name: str,
        inputs: list,
        buffers: int | None = None,
        resources: dict | None = None,
        inline: bool | None = False,
        time=None,
        out: PieceSpec | None = None,
        timeout=None,
        replicas: int = 1,
    ):
        self.name = name
        self.replicas = check_replicas(replicas, name, inline, timeout)
        self.timeout = check_timeout(timeout, inline, name)  # seconds per act, or None
        self.inputs = list(inputs)  # upstream actors
        self.buffers = (
            check_buffers(buffers, f"actor {name!r}") if buffers is not None else None
        )  # None: the graph's default
        self.resources = check_resources(resources, name)
        self.inline = inline  # act on the scheduler's loop, not a thread (None: an op
        # actor's, decided by its register size when planned)
        self.time = check_time(time, name)  # simulated seconds per act (float or f(piece))
        self.out_spec = out  # PieceSpec once known
        self.declared = out is not None  # the user gave out=
        self.cached: dict = {}  # piece -> output leaves computed while planning
        self.probe_s = None  # seconds piece 0 took while planning
        self.sized_as = None  # (layout, bytes per device) a run sized it by
        self.state_reads: tuple = ()  # state names read / written across pieces
        self.state_writes: tuple = ()  # (gates.py: kept in piece order)
        self.consumers: list = []  # actors reading this one

    # -- what one act does -------------------------------------------------------------
    def compute(self, piece: int, ins: list, outs: list):
        """Computes ``piece`` from ``ins`` (per input: the piece as the actor reads it)
        into ``outs`` (the output register's arrays). Returns EOS when there is no such
        piece (sources), or the value to deliver (the collector)."""
        raise NotImplementedError

    def probe(self, ins: list) -> list:
        """Computes piece 0 on real inputs while planning; returns the output leaves."""
        raise NotImplementedError

    def needs_probe(self) -> bool:
        return self.out_spec is None

    def infer(self) -> None:
        """Sets ``out_spec`` from the inputs' specs when the actor can without running."""

    def sim_time(self, piece: int) -> float:
        t = self.time
        if t is None:
            return 0.0
        if not callable(t):
            return t
        return seconds(t(piece), f"actor {self.name!r}: time= returned", f" for piece {piece}")

    def _copy_cached(self, piece, outs) -> bool:
        leaves = self.cached.pop(piece, None)
        if leaves is None:
            return False
        for d, v in zip(outs, leaves, strict=True):
            if d is not None:
                np.copyto(d, v, casting="no")
        return True

    def _store(self, value, outs, what: str) -> None:
        spec = cast(PieceSpec, self.out_spec)  # (sized: it has registers)
        if type(value) is np.ndarray and spec.structure == 0:  # the common case,
            s = spec.specs[0]  # inline (every act)
            if value.shape == s.shape and value.dtype == s.dtype.np:
                if outs[0] is not None:
                    np.copyto(outs[0], value)
                return
        for d, v in zip(outs, check_piece(value, spec, what, self.declared), strict=True):
            if d is not None:
                np.copyto(d, v, casting="no")

    def _put(self, value, outs, what: str):
        """Stores ``value`` in the output register; with no register yet (the run sizes
        this actor from piece 0), returns it as ``Sized`` instead."""
        if outs is None:
            return Sized(self._checked_leaves(value, what))
        self._store(value, outs, what)
        return None

    def _checked_leaves(self, value, what: str) -> list:
        """Leaves of a probed output, checked against a declared spec (if any)."""
        if value is None and none_is_fine(self.out_spec, what):
            return [None] * len(cast(PieceSpec, self.out_spec).specs)  # (fine: not None)
        refuse_awaitable(value, what)
        leaves, structure = flatten(value)
        dev = self._device()
        for i, x in enumerate(leaves):
            refuse_device_tensor(x, dev or CPU, f"{what} (array {i})")
        got = PieceSpec.of(value, what, dev)
        if self.out_spec is None:
            self.out_spec = got
        else:
            check_piece(value, self.out_spec, what, self.declared)
        # copies: piece 0 outlives the act (it sizes the registers, then travels on its own),
        # and what a stage returns may be a view of its input register or a reused buffer
        return [own_copy(x, what) for x in leaves]

    def _device(self):
        if self.out_spec is not None and self.out_spec.specs:
            return self.out_spec.specs[0].device
        return None

    def describe(self) -> str:
        return self.kind

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def is_async_function(fn) -> bool:
    """``async def`` functions (also partials of them, and objects whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isroutine(fn) and inspect.iscoroutinefunction(call_method(fn))
    )


def call_method(fn):
    """What calling object ``fn`` runs: its ``__call__`` attribute (None where it has
    none), to ask whether that is an async function or an async generator."""
    return getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not a test


def read_piece(arrays: list, spec: PieceSpec):
    """A producer's register as its consumer reads it: read-only views in its structure
    (a device register's tensors as they are: see ``device_acts.py``)."""
    views = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            a = a.view()
            a.flags.writeable = False
        views.append(a)
    return unflatten(spec.structure, views)


class StageActor(Actor):
    """Calls ``fn(*pieces)``: one argument per input, arrays in, arrays out. An ``async
    def`` function is awaited on the run's loop instead of called on a thread, several acts
    at once (up to its registers: each act holds one). ``procs``: its worker processes
    (``sched/processes.py``), its replica threads handing each act to one of them, which
    writes the piece into the register (a shared block) itself; ``owns_procs``: the
    actor made them (closed with its graph), else they are a DataLoader's."""

    def __init__(self, name, fn, inputs, procs=None, owns_procs=False, **kw):
        super().__init__(name, inputs, **kw)
        self.procs, self.owns_procs = procs, owns_procs
        if not callable(fn):
            raise TypeError(
                f"actor {name!r}: expected a function of pieces, got {type(fn).__name__}"
            )
        if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(call_method(fn)):
            raise TypeError(
                f"actor {name!r}: {getattr(fn, '__name__', fn)!r} is an async generator "
                f"function, which yields many items; a stage gives one piece per input piece. "
                f"Write the stage as 'async def' with 'return', or make the generator a "
                f"source (g.source(fn), or the first entry of a Pipeline)"
            )
        self.fn = fn
        self.is_async = is_async_function(fn)
        if procs is not None and (self.is_async or self.inline):
            raise ValueError(
                f"actor {name!r}: processes= runs a plain function in worker "
                f"processes; an async def or inline stage acts on the run's "
                f"loop: drop {'inline=True' if self.inline else 'processes='}"
            )
        if self.is_async and self.replicas > 1:
            raise ValueError(
                f"actor {name!r}: replicas= is for stages on threads; an async "
                f"def stage already has as many acts in flight as registers "
                f"(buffers=)"
            )

    def probe(self, ins):
        if self.procs is not None:  # computed and checked by a worker, in shared memory
            return self.procs.first(self, 0, ins)
        if self.is_async:  # piece 0 while planning: awaited on the graph loop
            value = run_on_graph_loop(self._call_async(ins))
        else:
            value = self._call(ins)
        return self._checked_leaves(value, f"actor {self.name!r} (piece 0)")

    def compute(self, piece, ins, outs):
        if outs is not None and self.cached and self._copy_cached(piece, outs):
            return None
        if self.procs is not None:
            if type(outs) is RegisterArrays:  # written in place by a worker process
                self.procs.act(piece, ins, outs)
                return None
            if outs is None:  # piece 0 sizes the registers: a worker
                return Sized(self.procs.first(self, piece, ins))  # computes it too
        value = self._call(ins)
        if outs is not None and type(value) is np.ndarray and self.out_spec.structure == 0:
            s = self.out_spec.specs[0]  # the common case, checked inline
            if value.shape == s.shape and value.dtype == s.dtype.np:
                if outs[0] is not None:
                    np.copyto(outs[0], value)
                return None
        return self._put(value, outs, f"actor {self.name!r} (piece {piece})")

    async def compute_async(self, piece, ins, outs):
        if outs is not None and self._copy_cached(piece, outs):
            return None
        value = await self._call_async(ins)
        return self._put(value, outs, f"actor {self.name!r} (piece {piece})")

    def _call(self, ins):
        try:
            return self.fn(*ins)
        except ValueError as e:
            self._read_only(e)
            raise

    async def _call_async(self, ins):
        try:
            return await self.fn(*ins)
        except ValueError as e:
            self._read_only(e)
            raise

    def _read_only(self, e: ValueError) -> None:
        if "read-only" in str(e):
            raise ValueError(
                f"{e}: actor {self.name!r} wrote into an input, and its inputs "
                f"are read-only views of the producers' registers (other actors "
                f"read them too); copy what you change (x = x.copy()) or write "
                f"into a new array"
            ) from e

    def describe(self) -> str:
        kind = "async stage" if self.is_async else "stage"
        return f"{kind} {getattr(self.fn, '__name__', type(self.fn).__name__)}"


class OpActor(Actor):
    """Runs ``program`` (built-in op kernels, see ``actorflow.tracing``) into its register:
    one already compiled (``program``, what ``ActorGraph.op_program`` makes), or one that
    ``build`` makes from the input specs when each plan is made (``ActorGraph.op``, which
    traces a function). Exactly one of the two is given."""

    kind = "op"

    def __init__(self, name, inputs, build=None, program=None, **kw):
        if (build is None) == (program is None):
            raise TypeError(
                f"op actor {name!r}: give either build= (a function of the input "
                f"specs that makes the program) or program= (a compiled one)"
            )
        super().__init__(name, inputs, **kw)
        self.build = build  # f([PieceSpec per input]) -> program, or None
        self.compiled = program  # the program given, used by every plan
        self.inline_given = self.inline  # None: decided from the register size when planned
        self.program = program

    def infer(self):
        specs = [a.out_spec for a in self.inputs]
        if any(s is None or s is NOTHING for s in specs):
            return  # not known yet, or an input ends before piece 0
        if self.program is None:
            self.program = self.compiled if self.build is None else self.build(specs)
        if self.out_spec is None:
            self.out_spec = self.program.out_spec

    def needs_probe(self):
        return False

    def small(self) -> bool:
        """Tiny enough to act on the scheduler's loop: a thread hop would cost more."""
        spec = cast(PieceSpec, self.out_spec)  # (asked once the plan inferred it)
        return spec.nbytes <= (1 << 16) and self.program.workspace_bytes <= (1 << 16)

    def probe(self, ins):
        self.infer()
        return self.program.run_new(ins)

    def compute(self, piece, ins, outs):
        if outs is None:  # piece 0 before any register exists (Plan.defer)
            return Sized(self.probe(ins))
        if self._copy_cached(piece, outs):
            return None
        self.program.run(outs, ins)
        return None

    def describe(self) -> str:
        return f"op {self.program.describe() if self.program else '?'}"


COLLECTOR_NAME = "(output)"  # reserved: no user actor can collide with it in the stats


class Collector(Actor):
    """The run's output: copies the sinks' pieces out of their registers (as one value, or a
    dict by sink name when there are several) and hands them to the consumer of ``run()``."""

    kind = "output"

    def __init__(self, sinks: list, names: list, picks=None, structure=None):
        super().__init__(COLLECTOR_NAME, list(sinks), inline=True)
        self.names = names
        self.picks = picks  # [(input k, array j, view meta)]: a traced output
        self.structure = structure
        self.raw = picks is not None

    def needs_probe(self):
        return False

    def compute(self, piece, ins, outs):
        return self.assemble([self.part(k, x) for k, x in enumerate(ins)])

    def part(self, k: int, x):
        """A copy of what sink ``k``'s register holds (the run copies each part out as
        soon as it arrives, so the register goes home at once)."""
        if self.picks is not None:  # one copy per output picked (two views of
            return {
                i: np.array(strided(x[j], meta))  # one array are two outputs)
                for i, (kk, j, meta) in enumerate(self.picks)
                if kk == k
            }
        return _copy_out(x)

    def assemble(self, parts: list):
        """The run's output of one piece, from every sink's part."""
        if self.picks is not None:
            leaves = [parts[k][i] for i, (k, _, _) in enumerate(self.picks)]
            return unflatten(self.structure, leaves)
        if len(parts) == 1:
            return parts[0]
        return dict(zip(self.names, parts, strict=True))


def _copy_out(piece):
    leaves, structure = flatten(piece)
    return unflatten(
        structure,
        [
            None if a is None else np.array(a) if isinstance(a, np.ndarray) else a.clone()
            for a in leaves
        ],
    )  # (a device register's
    #    tensor: a copy there)
