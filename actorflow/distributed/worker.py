"""What runs inside a Ray actor process: one replica of a stage of an actor graph, or of a
group of cheap stages that share one process.

``Worker.act(name, first, *inputs)`` calls stage ``name`` on a batch of pieces (per input,
a list of numpy arrays read zero-copy from Ray's object store: read-only, as a local
stage's inputs are) and returns two objects: the outputs (stored in the object store by
Ray, where the consumers read them) and a small record of the act (its times, process and
node), which the coordinator on the driver waits for. ``AsyncWorker`` does the same for
groups with an ``async def`` stage: Ray runs its calls on the process's event loop, the
pieces of a batch at once. Nothing here imports Ray at module import: the coordinator
wraps the classes with ``ray.remote`` when a run starts.

A process loads its stages from the bytes the driver pickled for the run (``program``).
A process kept for the next run (``keep_workers=True``) loads that run's stages afresh
(``Worker.begin``): from the new bytes when they changed, else again from the bytes it
kept, so every run acts on what a new process would have unpickled, never on objects an
earlier run changed.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import socket
import time
import traceback
from typing import cast

from ..code_reads import set_shared
from ..eventloop import new_event_loop
from ..runtime.graph.actors import call_method
from ..runtime.graph.source import one_argument, source_words
from ..runtime.plan.spec import check_piece, flatten, unflatten


class Stage:
    """One stage as its process runs it: ``fn`` (a plain or ``async def`` function of
    pieces, or an ``OpCall``), ``spec``: its register's layout (from ``out=`` when
    ``declared``, else from piece 0), which every output is checked against, and ``time``:
    simulated extra seconds per act (slept), as ``g.actor(time=)``."""

    def __init__(self, name: str, fn, spec, declared: bool, sim=None):
        self.name, self.fn, self.spec, self.declared = name, fn, spec, declared
        self.sim = sim
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            call_method(fn)
        )

    def simulated(self, piece: int) -> float:
        t = self.sim
        return 0.0 if t is None else float(t(piece) if callable(t) else t)

    def check(self, value, piece: int):
        """The value with its leaves as arrays, as a local register holds them, checked
        as the local engine checks it (``check_piece``: same errors, same words)."""
        spec = self.spec
        return unflatten(
            spec.structure,
            check_piece(value, spec, f"actor {self.name!r} (piece {piece})", self.declared),
        )


class SourceStage:
    """A source read in a Ray actor process (placed, or in a group): opened afresh at
    piece 0 of each run (a zero-argument callable is called, an iterable iterated), then
    read ``batch`` pieces per call, each checked against its register's layout (``spec``)
    as the local engine checks it."""

    is_async = False
    sim = None

    def __init__(
        self,
        name: str,
        source,
        spec,
        declared: bool,
        fed: bool,
        batch: int,
        single_argument: bool = False,
    ):
        self.name, self.source, self.spec, self.declared = name, source, spec, declared
        self.fed, self.single_argument = fed, single_argument
        self.fn = source
        self.batch = batch
        self.items: Items | None = None  # Items of this run's iterator
        self.turn: asyncio.Condition | None = None  # (an async process: the calls' turns to read)
        self.at = 0  # the first piece of the next call (async process)

    def open(self) -> None:
        from ..runtime.graph.source import open_items

        self.at = 0
        self.close()
        self.items = Items(open_items(self.source, self.name))

    def close(self) -> None:
        """Closes this run's iterator (a generator's ``finally`` runs), if one is open."""
        items, self.items = self.items, None
        if items is not None:
            items.close()

    def check(self, value, piece: int):
        return source_piece(
            self.name, piece, value, self.spec, self.declared, self.fed, self.single_argument
        )


def source_piece(
    name: str,
    piece: int,
    value,
    spec,
    declared: bool,
    fed: bool = False,
    single_argument: bool = False,
):
    """A source's piece with its leaves as the arrays a register holds (a Python float is
    float32, a tensor its numpy data), checked as the local engine checks it
    (``check_piece``: same errors, same words). ``single_argument``: the source feeds a
    traced function of one input, whose items may be 1-tuples (``one_argument``)."""
    if single_argument:
        value = one_argument(value)
    return unflatten(
        spec.structure, check_piece(value, spec, source_words(name, piece, fed), declared)
    )


END = object()


class Items:
    """The next items of a sync or async iterator (``END`` after the last): from plain
    code (``next``: an async one is driven on a loop of its own) or awaited (``anext``)."""

    def __init__(self, it):
        self.it, self.loop = it, None

    def next(self):
        if hasattr(self.it, "__anext__"):
            if self.loop is None:
                self.loop = new_event_loop()
            try:
                return self.loop.run_until_complete(self.it.__anext__())
            except StopAsyncIteration:
                return END
        return next(self.it, END)

    async def anext(self):
        if hasattr(self.it, "__anext__"):
            try:
                return await self.it.__anext__()
            except StopAsyncIteration:
                return END
        return next(self.it, END)

    def close(self) -> None:
        """Closes the iterator (a sync generator, or an async one driven on a loop of its
        own) and that loop; an iterator's own cleanup that fails is ignored (its run is
        over)."""
        it = self.it
        try:
            if inspect.isasyncgen(it):
                if self.loop is not None:
                    self.loop.run_until_complete(it.aclose())
            elif hasattr(it, "close"):
                it.close()
        except Exception:  # noqa: BLE001 - a generator's own cleanup failed; run is over
            pass
        if self.loop is not None:
            self.loop.close()
            self.loop = None


class OpCall:
    """An op actor's traced program as a function of pieces: each call hands the program
    the pieces' arrays (``Program.run_new``: new output arrays its kernels write) and
    returns its outputs in the register's nesting."""

    def __init__(self, program):
        self.program = program
        self.__name__ = f"op {program.describe()}"

    def __call__(self, *pieces):
        outs = self.program.run_new([flatten(p)[0] for p in pieces])
        return unflatten(self.program.out_spec.structure, outs)


class Worker:
    """One Ray actor process: the stages it hosts, by name (one, or a group's), loaded
    from ``program``: their list as the driver pickled it for the run, ``(stream,
    buffers)`` (pickle protocol 5; the buffers, the arrays the stages hold, travel as
    numpy arrays, which Ray hands over zero-copy), named by ``digest``."""

    def __init__(self, program: tuple, digest: str):
        self.program, self.digest = program, digest
        self.stages: dict = {}
        self._load()
        self.pid = os.getpid()
        self.host = socket.gethostname()
        try:
            import ray

            self.node: str | None = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray (tests of the class itself)
            self.node = None

    def where(self) -> tuple:
        return self.pid, self.node, self.host

    def begin(self, digest: str, program: tuple | None = None) -> tuple:
        """A later run in this kept process: its stages loaded afresh, from ``program``
        (the run's, sent when its bytes differ from those kept) or from the bytes kept,
        which ``digest`` says are the run's. Returns ``where()``.

        Raises:
            RuntimeError: no ``program`` and the kept bytes are not the run's (the driver
                then starts a new process); an error unpickling the stages (a module the
                process cannot import...)."""
        if program is not None:
            self.program, self.digest = program, digest
        elif self.digest != digest:
            raise RuntimeError(
                f"this process keeps stages {self.digest[:12]}, the run's "
                f"are {digest[:12]}; send them"
            )
        self._load()
        return self.where()

    def _load(self) -> None:
        """The stages unpickled from ``program`` (new objects, as a new process has);
        the sources the last ones read are closed first."""
        old, self.stages = self.stages, {}
        for stage in old.values():
            if isinstance(stage, SourceStage):
                stage.close()
        stream, buffers = self.program
        stages, constants = pickle.loads(stream, buffers=buffers)
        for where in constants:  # (the driver's values of what the stages read)
            set_shared(*where)
        self.stages = {s.name: s for s in stages}

    def act(self, name: str, first: int, *ins):
        """Acts on a batch: ``ins`` has per input the list of its pieces ``first``,
        ``first + 1``, ...; returns their outputs (a list) and the act's record: per
        piece its start and end (wall-clock seconds), then the process and node."""
        stage = self.stages[name]
        out, times = [], []
        if isinstance(stage, SourceStage):
            return self._read(stage, first)
        for k, args in enumerate(zip(*ins, strict=False)):  # (the shortest input: its end)
            piece = first + k
            t0 = time.time()
            try:
                value = stage.check(stage.fn(*args), piece)
                sim = stage.simulated(piece)
                if sim > 0:
                    time.sleep(sim)
            except BaseException as e:  # noqa: BLE001 - carried to the driver as the cause
                raise self._failed(stage, piece, e) from None
            times.append((t0, time.time()))
            out.append(value)
        return out, (times, self.pid, self.node)

    def act_chain(self, names: list, first: int, *ins):
        """Acts for a chain of this process's stages on one batch (each reads the one
        before it): their outputs, then one record with per stage its pieces' times."""
        outs, per = [], []
        for name in names:
            out, (times, _, _) = self.act(name, first, *ins)
            outs.append(out)
            per.append(times)
            ins = (out,)
        return (*outs, (per, self.pid, self.node))

    def _read(self, src: SourceStage, first: int):
        """A source's act: its next ``batch`` pieces (fewer at its end)."""
        if first == 0:
            src.open()
        items = cast(Items, src.items)  # (opened at piece 0)
        out, times = [], []
        for piece in range(first, first + src.batch):
            t0 = time.time()
            try:
                value = items.next()
                if value is END:
                    break
                out.append(src.check(value, piece))
            except BaseException as e:  # noqa: BLE001 - carried to the driver as the cause
                raise self._failed(src, piece, e) from None
            times.append((t0, time.time()))
        return out, (times, self.pid, self.node)

    def _failed(self, stage: Stage | SourceStage, piece: int, e: BaseException) -> StageFailed:
        return StageFailed(stage.name, piece, self.where(), e, traceback.format_exc())


class AsyncWorker(Worker):
    """A Ray actor process hosting an ``async def`` stage (alone or in a group): its calls
    run on the process's event loop, several at once, and the pieces of one batch are
    awaited together (a plain stage of the group runs on the loop, one piece at a time)."""

    async def act(self, name: str, first: int, *ins):
        stage = self.stages[name]
        if isinstance(stage, SourceStage):
            return await self._aread(stage, first)

        async def one(k, args):
            piece = first + k
            t0 = time.time()
            try:
                value = stage.fn(*args)
                if inspect.isawaitable(value):
                    value = await value
                value = stage.check(value, piece)
                sim = stage.simulated(piece)
                if sim > 0:
                    await asyncio.sleep(sim)
            except BaseException as e:  # noqa: BLE001 - carried to the driver as the cause
                raise self._failed(stage, piece, e) from None
            return value, (t0, time.time())

        done = await asyncio.gather(
            *(one(k, args) for k, args in enumerate(zip(*ins, strict=False)))
        )
        return [v for v, _ in done], ([t for _, t in done], self.pid, self.node)

    async def _aread(self, src: SourceStage, first: int):
        """A source's act in an async process, whose calls run at once: each waits for its
        turn (the call before it read its batch), so pieces are read in order."""
        turn = src.turn
        if turn is None:
            turn = src.turn = asyncio.Condition()
        async with turn:
            await turn.wait_for(lambda: first == 0 or src.at == first)
            if first == 0:
                src.open()
            items = cast(Items, src.items)  # (opened at piece 0)
            out, times = [], []
            try:
                for piece in range(first, first + src.batch):
                    t0 = time.time()
                    try:
                        value = await items.anext()
                        if value is END:
                            break
                        out.append(src.check(value, piece))
                    except BaseException as e:  # noqa: BLE001 - carried to the driver
                        raise self._failed(src, piece, e) from None
                    times.append((t0, time.time()))
            finally:
                src.at = first + src.batch
                turn.notify_all()
        return out, (times, self.pid, self.node)


class StageFailed(Exception):
    """A stage raised inside its Ray actor: what the driver turns into ActorError (the
    original exception is kept when it pickles; its traceback always travels as text)."""

    def __init__(self, name, piece, where, original, tb: str):
        super().__init__(f"{name} failed on piece {piece}")
        self.name, self.piece, self.where, self.tb = name, piece, where, tb
        try:
            import pickle

            pickle.dumps(original)
            self.original = original
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            self.original = RuntimeError(f"{type(original).__name__}: {original}")

    def __reduce__(self):
        return (StageFailed, (self.name, self.piece, self.where, self.original, self.tb))
