"""A stage's worker processes (``ActorGraph.actor(processes=k)``, ``DataLoader(workers=k,
processes=True)``): ``k`` processes, spawned once and kept across runs (PyTorch's
``persistent_workers``) until ``close()``, garbage collection or the interpreter's exit.

The credit scheduler stays in this process and decides, as for any stage, when the stage
acts and which register it writes: the stage's threads (``DEPTH`` per worker) each hand an
act to a worker (a small message: piece, register index, the input piece) and wait for its
answer; a worker has up to ``DEPTH`` acts in its pipe, so it starts the next one without
waiting for this process. The stage's registers are a ``SharedBlock``
(``plan/registers.py``) that every worker maps, so the worker writes the piece once, in
place, checked with ``check_piece`` as a local act's is, and the next actor reads it there:
no array crosses a pipe but the input piece (a DataLoader's indices). Piece 0 of a stage
sized by it is computed by a worker too, into a block of its own that this process maps.
A worker that dies fails the act (``WorkerDied``, which the run reports as ``ActorError``
naming the stage, the piece and the exit code) and is replaced at its next act.

What a worker runs is the stage's function pickled (cloudpickle when installed, as Ray
does, else pickle) when a plan is made, with the constants it reads
(``code_reads.shared_constants``: its module's globals, its class's attributes, which the
worker's own import of the module would otherwise give as the file has them), sent again
only when it is another object or those changed. A
function that does not pickle is refused then, with ``PlanError``. Processes start with
``forkserver`` where the platform has it, else ``spawn``: both safe with the threads of this
process (the graph loop, actor threads), unlike ``fork``. The fork server is one process,
started once with actorflow imported (the preload), from which each worker is forked: a
worker starts in tens of milliseconds instead of the second a fresh interpreter importing
actorflow takes."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import traceback
import weakref
from multiprocessing import get_context
from multiprocessing.reduction import recv_handle, send_handle
from queue import SimpleQueue

from ...code_reads import ModelReads, set_shared, shared_constants
from ...errors import PlanError
from ..plan.registers import SharedBlock, mapped

FN, MAP, ACT, FIRST = 0, 1, 2, 3  # what a message to a worker carries
PRELOAD = ["actorflow.runtime.sched.processes"]  # (the fork server imports actorflow)
DEPTH = 2  # acts sent to a worker at once: the next is in its pipe
#            when it ends one, so it never waits for this process
#            (whose threads may wait for the interpreter lock)
JOIN_S = 2.0  # how long close() waits for a worker before killing it


class OwnsProcesses:
    """What owns worker processes (a graph, a Pipeline, a DataLoader): ``close()`` ends
    them, and so does the end of a ``with`` block over it."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WorkerDied(RuntimeError):
    """A stage's worker process ended while computing a piece: its exit code says how
    (negative: the signal that killed it)."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process (the ``__cause__`` of the error
    re-raised here, so that the run's ActorError shows where it happened)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f"\n(in the worker process)\n{self.tb}"


def dumps(fn) -> bytes:
    """``fn`` as a worker loads it: by cloudpickle when installed (functions of
    ``__main__``, lambdas, closures by value), else by pickle."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(fn, protocol=5)
    return cloudpickle.dumps(fn, protocol=5)


def _same(a, b) -> bool:
    return (
        type(a) is tuple
        and type(b) is tuple
        and len(a) == len(b)
        and all(x is y for x, y in zip(a, b, strict=True))
        or a is b
    )


def function_key(fn):
    """What tells whether a worker's copy of ``fn`` is still the one to run: ``fn`` itself,
    or for a bound method whose object says what it computes with (``process_key()``, a
    tuple of objects: a DataLoader's dataset and collate function), those."""
    owner = getattr(fn, "__self__", None)
    key = getattr(owner, "process_key", None)
    return (getattr(fn, "__func__", fn),) + tuple(key()) if key is not None else fn


class _Worker:
    """One worker process and this side of its pipe, with what it holds: the version of
    the function it loaded and the shared blocks it mapped."""

    def __init__(self, ctx):
        here, there = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=worker_main, args=(there,), daemon=True, name="actorflow-stage-worker"
        )
        self.process.start()
        there.close()
        self.conn = here
        self.fn_version = 0
        self.blocks: set = set()
        self.dead = False
        self.sending = threading.Lock()  # one message at a time into the pipe
        self.turn = threading.Condition()  # answers come in the order acts were sent:
        self.sent_acts = self.answered = 0  # each act's thread reads its own in turn

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self):
        """The process's exit code once it ended (waits a moment for the OS to say)."""
        self.process.join(JOIN_S)
        return self.process.exitcode

    def stop(self) -> None:
        """Ends the process: its pipe closed (it exits at the end of its act), then, if it
        does not, killed."""
        try:
            self.conn.close()
        except OSError:
            pass
        p = self.process
        p.join(JOIN_S)
        if p.exitcode is None:
            p.kill()
            p.join(JOIN_S)


def _stop_all(workers: list) -> None:
    """Every worker's pipe closed first (they end together), then each waited for."""
    for w in workers:
        try:
            w.conn.close()
        except OSError:
            pass
    for w in list(workers):
        w.stop()
    workers.clear()


class StageProcesses:
    """The ``n`` worker processes of a stage (or of a DataLoader, shared by the graphs
    that read it), started at the first plan that needs them and kept until ``close()``.

    ``pids``: the processes' ids; ``spawned``: processes started so far (a dead one is
    replaced); ``sent`` / ``received``: bytes through the pipes (messages, not arrays)."""

    def __init__(self, n: int, name: str = "stage"):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 32:
            raise ValueError(f"{name}: processes must be an int from 1 to 32, got {n!r}")
        self.n, self.name, self.depth = n, name, DEPTH
        self.workers: list = []
        self.idle: SimpleQueue = SimpleQueue()  # indices of workers not acting now
        self.lock = threading.Lock()
        self.fn_key: tuple = (None, None)
        self.fn_bytes = b""
        self.fn_version = 0
        self.spawned = 0
        self.sent = self.received = 0
        self.live: dict = {}  # block id -> SharedBlock of a run going on
        self.closed = False
        self._ctx = _context()
        self._finalizer = weakref.finalize(self, _stop_all, self.workers)

    @property
    def pids(self) -> list:
        return [w.pid for w in self.workers]

    def prepare(self, actor) -> None:
        """Before a plan of ``actor`` (a stage on these processes): its function pickled
        if it is not the one the workers hold, and the processes started (a dead one
        replaced). Raises PlanError when the function does not pickle or the processes
        were closed."""
        if self.closed:
            raise PlanError(
                f"actor {actor.name!r}: its worker processes were closed "
                f"(close()); make a new graph or loader to run it again"
            )
        constants = shared_constants(ModelReads(functions=[actor.fn]))
        key = (function_key(actor.fn), [(*c[:4], type(c[4]), repr(c[4])) for c in constants])
        if not (_same(key[0], self.fn_key[0]) and key[1] == self.fn_key[1]):
            try:
                data = dumps((actor.fn, constants))
            except Exception as e:  # noqa: BLE001 - named with the stage and the fix
                raise PlanError(
                    f"actor {actor.name!r}: processes= runs its function in worker processes, "
                    f"which need it pickled, and it does not pickle ({type(e).__name__}: {e}); "
                    f"define it (and what it reads) at module level, leave out what cannot "
                    f"cross a process (locks, open files, generators, sockets), or run the "
                    f"stage on threads (replicas=) instead"
                ) from e
            with self.lock:
                self.fn_key, self.fn_bytes = key, data
                self.fn_version += 1
        with self.lock:
            for i, w in enumerate(self.workers):
                if w.dead or not w.process.is_alive():
                    self._replace(i)
            while len(self.workers) < self.n:
                self.workers.append(_Worker(self._ctx))
                self.spawned += 1
                for _ in range(DEPTH):
                    self.idle.put(len(self.workers) - 1)

    def _replace(self, i: int) -> _Worker:
        """A new process in place of worker ``i`` (dead), under ``self.lock``."""
        self.workers[i].stop()
        self.workers[i] = w = _Worker(self._ctx)
        self.spawned += 1
        return w

    def registers(self, actor, buffers: int) -> list:
        """The ``buffers`` registers of ``actor``'s output, in a new shared block (kept
        for the run: ``release``)."""
        block = SharedBlock(actor.out_spec, buffers, f"actor {actor.name!r}")
        block.stage = (actor.name, actor.out_spec, actor.declared)
        with self.lock:
            self.live[block.id] = block
        return block.registers

    def release(self, registers) -> None:
        """The run that held these registers is over."""
        for arrays in registers:
            block = getattr(arrays, "block", None)
            if block is not None:
                with self.lock:  # (_bring sends the descriptor under it)
                    self.live.pop(block.id, None)
                    block.release()

    def act(self, piece: int, ins: list, outs) -> None:
        """Piece ``piece`` computed by a worker from ``ins`` (the input pieces) into the
        shared register ``outs``. Raises what the function raised there (its traceback as
        the cause), or WorkerDied when the worker died computing it (an act queued behind
        that one in its pipe is sent again, to the process that takes its place)."""
        msg = pickle.dumps((ACT, piece, outs.block.id, outs.index, ins), protocol=5)
        _raise_error(self._answer(piece, msg, outs.block, outs.block.stage[0]))

    def first(self, actor, piece: int, ins: list) -> list:
        """Piece ``piece`` computed by a worker before ``actor``'s registers exist (piece
        0 sizes them): the worker checks it (against ``out=`` if declared) and writes it
        into a shared block of its own, which this process maps. Returns the piece's
        arrays (views of that block), having set ``actor.out_spec`` if it was unknown."""
        spec = actor.out_spec if actor.declared else None
        msg = pickle.dumps((FIRST, piece, ins, actor.name, spec), protocol=5)
        reply = self._answer(piece, msg, None, actor.name, first=True)
        if not isinstance(reply, tuple):
            _raise_error(reply)
        layout, size, spec, fd = reply
        try:
            arrays = mapped(fd, size, [layout])[0]
        finally:
            os.close(fd)
        if actor.out_spec is None:
            actor.out_spec = spec
        return list(arrays)

    def _answer(self, piece: int, msg: bytes, block, name: str, first: bool = False):
        """The worker's answer to ``msg``, sent again when the worker it went to died
        before starting it."""
        while True:
            reply = self._round_trip(piece, msg, block, name, first)
            if reply is not None:
                return reply

    def _round_trip(self, piece: int, msg: bytes, block, name: str, first: bool):
        """``msg`` (an act) sent to a worker, and its answer; None when an act sent before
        it found the worker dead (this one never started). ``first``: an act on piece 0
        before the registers exist, answered, when it succeeds, with ``(layout, size,
        spec, fd)`` of the worker's block."""
        i = self.idle.get()
        w = self.workers[i]
        try:
            with self.lock:
                if w.dead:
                    w = self._replace(i)
            with w.sending:
                try:
                    if not self._bring(w, block):
                        return b""  # (a stopped run's act: its block is gone)
                    w.conn.send_bytes(msg)
                except (EOFError, OSError):
                    raise
                except BaseException:
                    w.dead = True  # (a message half sent: the pipe is out of step)
                    raise
                self.sent += len(msg)
                ticket = w.sent_acts
                w.sent_acts += 1
            with w.turn:  # (answers come in the order of the acts)
                while w.answered != ticket:
                    w.turn.wait()
                try:
                    if w.dead:
                        return None
                    try:
                        reply = w.conn.recv_bytes()
                        if first and reply[:1] != b"":
                            got = pickle.loads(reply)
                            if got[0] == "first":
                                reply = got[1:] + (recv_handle(w.conn),)
                    except (EOFError, OSError):
                        w.dead = True  # (before the next act's turn: it is resent)
                        raise
                finally:
                    w.answered += 1
                    w.turn.notify_all()
            self.received += len(reply) if type(reply) is bytes else 0
            return reply
        except (EOFError, OSError) as e:
            w.dead = True
            code = w.exit_code()
            how = f"exit code {code}" + (
                f" (killed by {_signal_name(-code)})" if code is not None and code < 0 else ""
            )
            raise WorkerDied(
                f"the worker process (pid {w.pid}) of stage {name!r} "
                f"died while computing piece {piece}: {how}; a new process "
                f"takes its place at the next act"
            ) from e
        finally:
            self.idle.put(i)

    def _bring(self, w: _Worker, block) -> bool:
        """What ``w`` needs before an act on ``block``: the function, the block mapped
        (its descriptor passed over the pipe); blocks of runs that ended unmapped. False
        when ``block`` was released already: an act of a run that stopped (nothing reads
        what it would write), not sent."""
        if w.fn_version != self.fn_version:
            with self.lock:
                data, version = self.fn_bytes, self.fn_version
            msg = pickle.dumps((FN, data), protocol=5)
            w.conn.send_bytes(msg)
            self.sent += len(msg)
            w.fn_version = version
        if block is not None and block.id not in w.blocks:
            with self.lock:  # (release() closes the descriptor under it)
                if block.id not in self.live or block.fd is None:
                    return False
                drop = [b for b in w.blocks if b not in self.live]
                name, spec, declared = block.stage
                msg = pickle.dumps(
                    (MAP, block.id, block.size, block.layout, name, spec, declared, drop),
                    protocol=5,
                )
                w.conn.send_bytes(msg)
                self.sent += len(msg)
                send_handle(w.conn, block.fd, w.pid)
            w.blocks.difference_update(drop)
            w.blocks.add(block.id)
        return True

    def close(self) -> None:
        """Ends the processes (each finishes the act it runs, if any)."""
        self.closed = True
        with self.lock:
            self._finalizer()


def _raise_error(reply: bytes) -> None:
    """An act's answer: b"" (done), or the error it raised there, raised here with the
    worker's traceback as its cause."""
    if reply:
        words, tb, data = pickle.loads(reply)
        try:
            error = pickle.loads(data)
        except Exception:  # noqa: BLE001 - pickled there, not loadable here: its words
            error = RuntimeError(words)
        error.__cause__ = RemoteTraceback(tb)
        raise error


def _context():
    """The start method's context: forkserver (preloading actorflow), else spawn."""
    try:
        ctx = get_context("forkserver")
    except ValueError:  # (a platform without it)
        return get_context("spawn")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _signal_name(n: int) -> str:
    try:
        return f"signal {n}, {signal.Signals(n).name}"
    except ValueError:
        return f"signal {n}"


# -- in the worker process -----------------------------------------------------------------


def worker_main(conn) -> None:
    """A worker's loop: loads the function (FN), maps shared blocks (MAP), computes pieces
    into them (ACT), answering each act with b"" or the pickled error, or piece 0 into a
    block of its own (FIRST: answered with its layout, then its descriptor). Ends when the
    pipe closes (its stage's processes were closed, or this process's parent is gone)."""
    import numpy as np

    from ..plan.spec import PieceSpec, check_piece, flatten, unflatten

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the parent's to handle)
    fn = None
    blocks: dict = {}  # block id -> its registers, mapped
    stages: dict = {}  # block id -> (name, spec, declared) of the stage writing it

    def call(ins):
        leaves, structure = flatten(ins)
        for a in leaves:  # read-only, as a local stage's inputs
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        return fn(*unflatten(structure, leaves))

    def store(into, leaves):
        for d, v in zip(into, leaves, strict=True):
            if d is not None:
                np.copyto(d, v, casting="no")

    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind == FN:
            try:
                fn, constants = pickle.loads(msg[1])
                for where in constants:  # (this process's values of what fn reads)
                    set_shared(*where)
            except BaseException as e:  # noqa: BLE001 - said at each act, with the fix
                fn = _unloadable(e, traceback.format_exc())
        elif kind == MAP:
            _, bid, size, layout, name, spec, declared, drop = msg
            for b in drop:
                blocks.pop(b, None)
                stages.pop(b, None)
            fd = recv_handle(conn)
            try:
                blocks[bid] = mapped(fd, size, layout)
            finally:
                os.close(fd)
            stages[bid] = (name, spec, declared)
        elif kind == ACT:
            _, piece, bid, index, ins = msg
            try:
                name, spec, declared = stages[bid]
                store(
                    blocks[bid][index],
                    check_piece(call(ins), spec, f"actor {name!r} (piece {piece})", declared),
                )
                reply = b""
            except BaseException as e:  # noqa: BLE001 - handed to the parent's act
                reply = _error_reply(e)
            conn.send_bytes(reply)
        else:  # FIRST: before the registers exist
            _, piece, ins, name, spec = msg
            block = None
            try:
                what = f"actor {name!r} (piece {piece})"
                value = call(ins)
                declared = spec is not None
                if not declared:
                    spec = PieceSpec.of(value, what)
                leaves = check_piece(value, spec, what, declared)
                block = SharedBlock(spec, 1, what)
                store(block.registers[0], leaves)
                reply = pickle.dumps(("first", block.layout[0], block.size, spec), protocol=5)
            except BaseException as e:  # noqa: BLE001 - handed to the parent's act
                reply = _error_reply(e)
                if block is not None:  # (an error reply has no descriptor)
                    block.release()
                    block = None
            conn.send_bytes(reply)
            if block is not None:
                assert block.fd is not None  # (released only after this send)
                send_handle(conn, block.fd, os.getppid())
                block.release()  # (this side's arrays go with block)


def _unloadable(e: BaseException, tb: str):
    """What a worker runs when the stage's function did not load there: raises why."""

    def fn(*_):
        raise RuntimeError(
            f"the stage's function, pickled in the parent process, does not "
            f"load in its worker process ({type(e).__name__}: {e}): a worker "
            f"imports the modules it was pickled by reference from; make "
            f"them importable there (installed, or on sys.path before the "
            f"first plan) or define the function in __main__\n{tb}"
        )

    return fn


def _error_reply(e: BaseException) -> bytes:
    """An act's error as the parent re-raises it: its words, its traceback, and the error
    pickled (b"" when it does not pickle: the parent raises its words instead)."""
    try:
        data = pickle.dumps(e, protocol=5)
    except Exception:  # noqa: BLE001 - an error that does not pickle
        data = b""
    return pickle.dumps((f"{type(e).__name__}: {e}", traceback.format_exc(), data), protocol=5)
