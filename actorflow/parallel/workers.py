"""The worker side of process ranks (``ranks.ProcessRanks``): one kept process per rank of a
placement, holding that rank's parts of global tensors and running the ops on them with
its own eager runtime.

A worker keeps ``id -> TensorImpl`` (its parts) and reads its commands from its pipe in
order, in batches (``CALL``: an op through the eager interpreter, ``VIEW``, ``PUT``: a part
from the controlling process, ``SEND``/``RECV``: a part moved to or from another rank,
``DROP``: parts the controller no longer holds, ``COLLECT``: this rank's share of a
collective, ``DEFINE``/``REPLAY``: a step program kept, then run over new inputs
(``programs.py``), ``RUN``: a function of a higher layer, pickled by reference, run with the
rank's ``Executor`` (what it keeps there it keeps in ``Executor.kept`` under the id of a
part it made, forgotten when that part is dropped: a pipeline stage's module and the
autograd graphs of its micro-batches, ``nn/pipeline_ranks.py``),
``GET``/``META``/``PING``: the only commands answered). A reader thread takes
what the other ranks send, on one pipe per rank, so that no rank's send waits for this
one's work.

A command that raises leaves its outputs holding the error (pickled, with its traceback):
a command reading such a part passes the error on to its outputs, a ``SEND`` of one sends
the error instead of data, and ``GET``/``META`` answer with it, so the controller raises
it (the same type, the same words) when the part is read; other parts are not affected.
Kernel errors (an index out of bounds) surface in the worker's eager runtime when the part
is read there: at a ``GET``, ``META`` or ``SEND``.

A move: the source reads its part (waiting for its work), writes it into a fresh shared
memory file (``memfd``: it has no name, so nothing is ever left in ``/dev/shm``) and sends
its descriptor to the destination (small parts go inline in the message); the
destination's ``RECV`` waits for it, with a timeout, and maps it (copy on write) as the
new part's memory. A part sent to several ranks (an all-gather's, an all-reduce's) is
written once: its memfd is kept until it went to every other rank, the part is dropped, or
any part is written in place. A source that ends before sending fails the ``RECV`` at once
(its pipe closes).

A collective (all-reduce, all-gather, reduce-scatter, all-to-all: ``collect``): every rank
writes its part once into a buffer of its own kept for collectives (``_Outbox``: a ring of
memfds, mapped once by every rank, so no fresh file, no page faults, no copy on write), tells
the others, and reads theirs where they wrote them: all ranks write at the same time, and
each combines every rank's part (or its slice of it) in rank order with the same kernels
as boxing's moves and ops would, so every rank holds inline ranks' bits. A rank's buffer is
written again once every other rank said it is done reading it. A part holding an error
gives every rank's output that error; a rank that ends fails the others' collective at
once.

``AF_RANKS_TRACE=<prefix>`` in the environment (set before the workers start) makes each
worker write the times of its commands to ``<prefix>.<rank>`` (``_Tracer``)."""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, cast

import numpy as np

from ..tensor import views
from ..tensor.meta import numel

CALL, VIEW, PUT, SEND, RECV, DROP, GET, META, PING, POISON, COLLECT, DEFINE, REPLAY, RUN = range(14)
INLINE = 1 << 16  # parts up to this many bytes move inside the message, larger in a memfd
# parts between the controller and a worker up to this many bytes go through a buffer kept
# for it (``Channel``), larger ones in a memfd of their own
CHANNEL_MAX = 16 << 20
HEADER = 64  # a channel's first bytes: what the worker has consumed of it (int64)
# how long a RECV waits for its source, and the controller for an answer, before the ranks
# are given up (AF_RANKS_WAIT_S in the environment: a longer wait for reads behind long
# queued work)
WAIT_S = float(os.environ.get("AF_RANKS_WAIT_S", "300"))
VIEWS = {  # the views a rank takes of its parts, by name
    "view": views.view,
    "permute": views.permute,
    "unsqueeze": views.unsqueeze,
    "squeeze": views.squeeze,
    "expand": views.expand,
    "basic_index": views.basic_index,
}


class PeerGone(RuntimeError):
    """The worker of another rank ended before it sent a part this rank waited for."""


def wait_up_to(conns: list, seconds: float) -> list:
    """``multiprocessing.connection.wait`` for up to ``seconds``, in spans under its limit
    (a wait's timeout is at most about 24 days)."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        ready = wait(conns, timeout=max(0.0, min(left, 1e6)))
        if ready or left <= 1e6:
            return ready


def error_bytes(e: BaseException) -> bytes:
    """An error as a worker keeps and answers it: its words, its traceback, the error
    pickled (b"" when it does not pickle)."""
    try:
        data = pickle.dumps(e, protocol=5)
    except Exception:  # noqa: BLE001 - an error that does not pickle: its words
        data = b""
    return pickle.dumps((f"{type(e).__name__}: {e}", traceback.format_exc(), data), protocol=5)


def adopt(array: np.ndarray, dtype: Any) -> Any:
    """A cpu TensorImpl whose storage is ``array`` (C-contiguous, the storage dtype)."""
    from ..device import device
    from ..tensor.impl import TensorImpl

    impl = TensorImpl.new(tuple(array.shape), dtype, device("cpu"))
    blob = impl.blob
    blob.backend.allocator.adopt(array.nbytes, "process ranks")
    blob.array, blob.owned, blob.allocated = array, False, True
    return impl


def _nbytes(impl: Any) -> int:
    """A part's bytes (its shape known: it was made here)."""
    return numel(impl.meta.shape) * impl.meta.dtype.itemsize


def contiguous_bytes(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array (a copy only where it is not one)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def memfd_of(nbytes: int, name: str = "actorflow-part") -> tuple[int, mmap.mmap]:
    """A fresh shared memory file of ``nbytes`` and a writable map of it, its pages
    faulted in at once where the platform can. A ``memfd`` has no name, so nothing is ever
    left in ``/dev/shm``; where there is none, a shared memory block unlinked at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # (not Linux)
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(create=True, size=max(nbytes, 1))
        try:
            fd = os.dup(shm._fd)  # type: ignore[attr-defined]
        finally:
            shm.close()
            shm.unlink()
    try:
        os.ftruncate(fd, nbytes)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return fd, mmap.mmap(fd, nbytes, flags=flags)
    except BaseException:
        os.close(fd)
        raise


def write_into(read: Any, impl: Any, nbytes: int) -> tuple[int, str, tuple]:
    """``impl``'s values (once its work is done: ``read`` is the eager runtime's) written
    into a fresh memfd: returns its descriptor (the caller closes it), the storage dtype
    and the shape."""
    fd, mm = memfd_of(nbytes)
    try:
        with mm:

            def write(a: np.ndarray) -> tuple:
                np.copyto(np.ndarray(a.shape, a.dtype, buffer=mm), a)
                return a.dtype.str, tuple(a.shape)

            dt, shape = read(impl, write, "process ranks")
    except BaseException:
        os.close(fd)
        raise
    return fd, dt, shape


class Channel:
    """A shared memory buffer kept between the controller and one worker, mapped once by
    both (no fresh file, no page faults, no copy on write per part): the parts up to
    ``CHANNEL_MAX`` bytes that the controller puts on the worker (``down``) or reads from
    it (``up``) are copied through it, once on each side. ``gen`` numbers the buffers of a
    direction (a larger one is made when a part does not fit; the reader maps it when told
    its number with the descriptor).

    Down (the controller writes): a ring. The worker copies each PUT's bytes out when it
    runs the PUT and then writes, in the header, the ring position it consumed up to; the
    controller writes a part only where every byte it overwrites was consumed (else the
    part goes in a memfd of its own), so it never waits for the worker. Up (the worker
    writes): one part at a time: a GET's answer is written at the start and copied out by
    the controller before it sends anything more to that worker (a request holds the ranks'
    lock until its answer is copied)."""

    def __init__(self, cap: int, gen: int) -> None:
        self.cap, self.gen = cap, gen
        self.fd, self.mm = memfd_of(cap, "actorflow-channel")
        self.produced = 0  # (down) ring bytes handed out, a count that only grows
        # (down) the worker's count
        self.consumed: Any = np.frombuffer(self.mm, np.int64, 1, 0)
        self.fresh = True  # its descriptor not sent yet

    @classmethod
    def grown(cls, old: Channel | None, nbytes: int) -> Channel:
        """A new channel for parts of ``nbytes`` (room for 4 of them, at least twice the
        old one, whose map here it closes; the next number)."""
        cap = max(HEADER + 4 * (-(-nbytes // 64) * 64), 1 << 20)
        if old is None:
            return cls(cap, 1)
        old.close()
        return cls(max(cap, 2 * old.cap), old.gen + 1)

    @classmethod
    def mapped(cls, fd: int, cap: int, gen: int) -> Channel:
        """The other side's map of a channel whose descriptor came down the pipe."""
        self = cls.__new__(cls)
        self.cap, self.gen, self.fd = cap, gen, -1
        try:
            self.mm = mmap.mmap(fd, cap, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.produced, self.fresh = 0, False
        self.consumed = np.frombuffer(self.mm, np.int64, 1, 0)
        return self

    def place(self, nbytes: int) -> tuple | None:
        """(down) Where a part of ``nbytes`` goes: ``(start, end)``, the byte offset of its
        bytes and the count the worker writes once it copied them out; None where the
        ring holds bytes not consumed yet there."""
        area = self.cap - HEADER
        size = -(-nbytes // 64) * 64
        pos = self.produced % area
        skip = area - pos if pos + size > area else 0  # (a part is never cut in two)
        start = self.produced + skip  # (counted as the worker counts: bytes of every lap)
        end = start + size
        # the bytes it overwrites (those of one lap before) must be consumed, but for those
        # of the tail it skips now, which hold no part (a tail skipped a lap before counts
        # as consumed once the part after it is: conservative)
        if size > area or int(self.consumed[0]) < min(end - area, self.produced):
            return None
        self.produced = end
        return (HEADER + start % area, end)

    def write(self, a: np.ndarray, start: int) -> None:
        np.copyto(np.ndarray(a.shape, a.dtype, buffer=self.mm, offset=start), a)

    def read(self, start: int, dt: Any, shape: tuple) -> np.ndarray:
        """A copy of the part at ``start`` (the buffer is written again later)."""
        return np.ndarray(shape, np.dtype(dt), buffer=self.mm, offset=start).copy()

    def descriptor(self) -> int | None:
        """Its descriptor, the first time (to be sent with the part that uses it; the caller
        closes it once sent), else None."""
        if not self.fresh:
            return None
        self.fresh = False
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.consumed = None  # (its view of the map, before the map closes)
        try:
            self.mm.close()
        except BufferError:  # (a view still open: closed when collected)
            pass


_FENCE = threading.Lock()


def _libc_mmap() -> Any:
    """libc's mmap and munmap through ctypes (None where they cannot be loaded)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC: list = []


def mapped_part(fd: int, nbytes: int, dt: Any, shape: tuple) -> np.ndarray:
    """An array over what a memfd holds, private to it (copy on write: other ranks may map
    the same file); closes ``fd``. The map is made by libc's mmap, which keeps no
    descriptor (Python's mmap keeps one for as long as the map lives, and many parts
    living long would run the descriptors out), and unmapped when the array is collected;
    without it, a copy."""
    if not _LIBC:
        _LIBC.append(_libc_mmap())
    libc = _LIBC[0]
    try:
        if libc is not None:
            import ctypes

            prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE
            addr = libc.mmap(None, nbytes, prot, flags, fd, 0)
            if addr is not None and addr != ctypes.c_void_p(-1).value:
                buf = (ctypes.c_char * nbytes).from_address(addr)
                weakref.finalize(buf, libc.munmap, addr, nbytes)
                return np.frombuffer(memoryview(buf), np.dtype(dt)).reshape(shape)
        out = np.empty(shape, np.dtype(dt))
        with mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ) as mm:
            view = np.ndarray(shape, np.dtype(dt), buffer=mm)
            np.copyto(out, view)
            del view  # (before the map closes)
        return out
    finally:
        os.close(fd)


class _Inbox:
    """What the other ranks sent this one: token -> (header, payload), and the ranks whose
    pipes closed. A token: the id of a moved part (``SEND``/``RECV``), ``("c", seq, rank)``
    a rank's part in collective ``seq``, ``("a", seq, rank)`` its ack of ours."""

    def __init__(self) -> None:
        self.items: dict = {}
        self.gone: set = set()
        self.cond = threading.Condition()

    def put(self, token: Any, item: Any) -> None:
        with self.cond:
            self.items[token] = item
            self.cond.notify_all()

    def lost(self, rank: int) -> None:
        with self.cond:
            self.gone.add(rank)
            self.cond.notify_all()

    def take(self, token: Any, src: int, timeout: float) -> Any:
        with self.cond:
            ok = self.cond.wait_for(
                lambda: token in self.items or src in self.gone, timeout=timeout
            )
            if token in self.items:
                return self.items.pop(token)
        if ok:
            raise PeerGone(f"the worker of rank {src} ended before it sent its part")
        raise TimeoutError(f"rank {src} did not send its part within {timeout:.0f} s")


def _peer_reader(peers: dict, inbox: _Inbox) -> None:
    """Takes the parts the other ranks send this one into ``inbox`` as they arrive (so that
    no rank's send ever waits for this one's work); a rank whose pipe closes is lost."""
    watched = {c: r for r, c in peers.items()}
    while watched:
        for got in wait(list(watched)):
            c = cast(Connection, got)
            src = watched[c]
            try:
                header = pickle.loads(c.recv_bytes())
                fd = header[1] == "fd" or (header[1] == "shm" and header[-1])
                payload = recv_handle(c) if fd else None
            except (EOFError, OSError):
                del watched[c]
                inbox.lost(src)
                continue
            inbox.put(header[0], (header, payload))


class _Outbox:
    """This rank's shared buffers for collectives (``COLLECT``): a ring of ``SLOTS`` memfds,
    each mapped here once (its pages stay, so a collective's write is a plain copy, with no
    fresh file, no page faults) and by every other rank once (the descriptor goes with the
    first message that uses it). Collective ``seq`` writes slot ``seq % SLOTS``, after
    every other rank said it was done reading the slot's last use (its ack)."""

    SLOTS = 2

    def __init__(self, rank: int, peers: dict, inbox: _Inbox) -> None:
        self.rank, self.peers, self.inbox = rank, peers, inbox
        self.slots: list = [None] * self.SLOTS  # [fd (-1 once every rank has it), map,
        #    capacity, generation, seq of the use not yet acked (or None), ranks told]
        self.gens = itertools.count(1)

    def write(self, read: Any, impl: Any, nbytes: int, seq: int) -> tuple:
        """``impl``'s values written into slot ``seq % SLOTS``: returns (slot, its entry,
        the storage dtype, the shape)."""
        i = seq % self.SLOTS
        e = self.slots[i]
        if e is not None and e[4] is not None:  # (the other ranks still read it?)
            for s in self.peers:
                self.inbox.take(("a", e[4], s), s, WAIT_S)
            e[4] = None
        if e is None or e[2] < nbytes:
            if e is not None:
                e[1].close()
                if e[0] >= 0:
                    os.close(e[0])
                self.slots[i] = None
            cap = max(nbytes, 1 << 20)
            fd, mm = memfd_of(cap, "actorflow-collective")
            e = self.slots[i] = [fd, mm, cap, next(self.gens), None, set()]
        mm = e[1]

        def write(a: np.ndarray) -> tuple:
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=mm), a)
            return a.dtype.str, tuple(a.shape)

        dt, shape = read(impl, write, "process ranks")
        return i, e, dt, shape


def _batch(conn) -> list | None:
    """The next batch of commands from the controller, each PUT with its payload (what
    follows the batch in the pipe: its bytes, or its memfd's descriptor); None once the
    pipe closed. The whole batch is read before any of it runs: so the controller, which
    sends every command of a move (to both ranks) before it waits on anything, never
    waits on a worker that waits on it."""
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return None
    try:
        batch = pickle.loads(data)
    except BaseException:  # (nothing after it could be read in step)
        traceback.print_exc()
        print(
            "actorflow: a rank's worker could not load its commands (an op or attribute "
            "pickled by reference to a module it cannot import?); it ends",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
    out = []
    for cmd in batch:
        if cmd[0] == PUT:
            if cmd[5] in (1, 3):  # (in a memfd, or a channel new to it: its descriptor)
                cmd = cmd + (recv_handle(conn),)
            elif cmd[5] == 2:  # (in the channel)
                cmd = cmd + (None,)
            else:
                buf = bytearray(cmd[4])
                if cmd[4]:
                    conn.recv_bytes_into(buf)
                cmd = cmd + (buf,)
        out.append(cmd)
    return out


def limit_threads(threads: int | None) -> None:
    """A rank's BLAS threads (where threadpoolctl is installed)."""
    if threads:
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(threads)
        except ImportError:
            pass


class Executor:
    """A rank's parts (``id -> TensorImpl``) and the commands every kind of rank runs
    alike: ``CALL``, ``VIEW``, ``DROP``, ``META``, ``POISON`` (``run``), with the errors
    kept on the parts a command could not make (``poisoned``: id -> ``error_bytes``).
    How parts come in and go out (``PUT``, ``SEND``/``RECV``, ``GET``, ``PING``) is the
    transport's: a worker process's pipes, a Ray actor's calls. ``threads``: the eager
    runtime's CPU threads."""

    def __init__(self, threads: int | None = None) -> None:
        from ..eager.interpreter import apply, read, resolve
        from ..ops import get as op_def
        from ..tensor.meta import contiguous_strides
        from ..vm.scheduler import get_vm

        self.apply, self.read, self.resolve = apply, read, resolve
        self._op_def, self._strides = op_def, contiguous_strides
        self.copy = op_def("copy")
        self.vm = get_vm()
        if threads and self.vm._loop is None:  # (the runtime's CPU threads: this rank's share)
            self.vm.workers = threads
        if threads == 1:  # (one thread: every kernel on the spot, in command order; a hop
            #              to a pool thread and back per op only added latency: measured,
            #              a data-parallel step over 2 such ranks 46.8 -> 40.8-42.5 ms)
            self.vm.inline_max_cost = 1 << 62
        self.parts: dict = {}
        self.poisoned: dict = {}  # id -> the error (error_bytes) its part holds instead
        self.ops: dict = {}
        self.kept: dict = {}  # what RUN's functions keep, by the id of a part they made

    def op_of(self, ref: Any) -> Any:
        if isinstance(ref, str):
            op = self.ops.get(ref)
            if op is None:
                op = self.ops[ref] = self._op_def(ref)
            return op
        return ref

    def fail(self, ids: Any, err: bytes) -> None:
        for i in ids:
            self.parts.pop(i, None)
            self.poisoned[i] = err

    def inputs(self, ids: Any) -> Any:
        """The parts of ``ids``, or the error the first poisoned one holds (bytes)."""
        poisoned = self.poisoned
        for i in ids:
            err = poisoned.get(i)
            if err is not None:
                return err
        parts = self.parts
        return [parts[i] for i in ids]

    def host_array(self, impl: Any) -> np.ndarray:
        """The part's values (its storage dtype), C-contiguous, once its work is done."""
        return self.read(impl, lambda a: np.array(a, copy=True, order="C"), "process ranks")

    def call(self, cmd: tuple) -> None:
        _, ref, in_ids, attrs, out_ids, dev, inplace = cmd
        ins = self.inputs(in_ids + out_ids if inplace else in_ids)
        if isinstance(ins, bytes):
            return self.fail(out_ids, ins)
        apply = self.apply
        try:
            op = self.op_of(ref)
            if inplace:
                apply(op, ins[: len(in_ids)], attrs, None, ins[len(in_ids) :])
                return None
            outs = apply(op, ins, attrs, dev)
            for i, o in zip(out_ids, outs, strict=True):
                m = o.meta
                if m.shape is not None and (m.offset != 0 or m.strides != self._strides(m.shape)):
                    o = apply(self.copy, [o], {})[0]  # (the controller's meta: contiguous)
                self.parts[i] = o
        except BaseException as e:  # noqa: BLE001 - kept on the outputs
            self.fail(out_ids, error_bytes(e))
        return None

    def view(self, cmd: tuple) -> None:
        _, name, in_id, args, out_id = cmd
        ins = self.inputs([in_id])
        if isinstance(ins, bytes):
            return self.fail([out_id], ins)
        try:
            self.parts[out_id] = VIEWS[name](ins[0], *args)
        except BaseException as e:  # noqa: BLE001
            self.fail([out_id], error_bytes(e))
        return None

    def run_fn(self, cmd: tuple) -> None:
        """``RUN``: ``fn(executor, *args, out_ids)``; an error it raises is kept on the
        parts ``out_ids`` (which it makes: ``parts[i] = impl``)."""
        _, fn, args, out_ids = cmd
        try:
            fn(self, *args, out_ids)
        except BaseException as e:  # noqa: BLE001 - kept on the outputs
            self.fail(out_ids, error_bytes(e))

    def drop(self, ids: Any) -> None:
        kept = self.kept
        for i in ids:
            self.parts.pop(i, None)
            self.poisoned.pop(i, None)
            if kept:  # (what a RUN kept under a part's id goes with it, closed)
                close = getattr(kept.pop(i, None), "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - let go of either way
                        pass

    def meta(self, i: int) -> tuple:
        """``META``'s answer: ("ok", shape, strides, offset) or ("error", error_bytes)."""
        ins = self.inputs([i])
        if isinstance(ins, bytes):
            return ("error", ins)
        try:
            impl = ins[0]
            if impl.meta.shape is None:
                self.resolve(impl)
            m = impl.meta
            return ("ok", m.shape, m.strides, m.offset)
        except BaseException as e:  # noqa: BLE001
            return ("error", error_bytes(e))

    def run(self, cmd: tuple) -> bool:
        """Runs a command every kind of rank runs alike (False for one it does not: the
        transport's; META's answer is the transport's to give: ``meta``)."""
        kind = cmd[0]
        if kind == CALL:
            self.call(cmd)
        elif kind == VIEW:
            self.view(cmd)
        elif kind == DROP:
            self.drop(cmd[1])
        elif kind == POISON:
            self.fail(cmd[1], cmd[2])
        elif kind == RUN:
            self.run_fn(cmd)
        else:
            return False
        return True


def worker_main(conn, rank: int, size: int, peers: dict, threads: int | None) -> None:
    """A rank's worker: runs the commands of its pipe (see the module doc) until the pipe
    closes. ``threads``: its BLAS threads (where threadpoolctl is installed) and its eager
    runtime's CPU threads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the controller's)
    limit_threads(threads)
    ex = Executor(threads)
    read, vm, parts, poisoned = ex.read, ex.vm, ex.parts, ex.poisoned
    inputs, fail, host_array = ex.inputs, ex.fail, ex.host_array
    inbox = _Inbox()
    if peers:
        threading.Thread(target=_peer_reader, args=(peers, inbox), daemon=True).start()
    apply, add, cat = ex.apply, ex._op_def("add"), ex._op_def("cat")
    outbox = _Outbox(rank, peers, inbox)
    trace = _tracer(rank)
    seen: dict = {}  # (rank, slot) -> (generation, the map) of other ranks' outboxes

    down: list = [None]  # the controller's channel to this worker (Channel)
    up: list = [None]  # this worker's channel to the controller
    sent: dict = {}  # id -> [memfd, dtype, shape, sends left] of a part being sent to
    # the other ranks: written once, mapped by each; closed after the last

    def unsend(i: int) -> None:
        entry = sent.pop(i, None)
        if entry is not None:
            os.close(entry[0])

    asked = [0]  # the number of the request being answered (the controller skips
    #              answers to requests it gave up on, e.g. interrupted by Ctrl-C)

    def answer(obj) -> None:
        conn.send_bytes(pickle.dumps((asked[0], *obj), protocol=5))

    def tell(dst: int, header: tuple, fd: int | None = None) -> None:
        try:
            peers[dst].send_bytes(pickle.dumps(header, protocol=5))
            if fd is not None:
                send_handle(peers[dst], fd, 0)
        except OSError:
            pass  # (that rank's worker ended: the controller is told by its pipe)

    def collect(cmd) -> None:
        """A collective (see ``_Outbox``): this rank's part written once where every other
        rank reads it, and every rank's part combined here in rank order (the same kernels
        as the moves and ops boxing would issue, so every rank, and inline ranks, hold the
        same bits): ``("sum",)`` an all-reduce, ``("cat", dim)`` an all-gather; with a
        last item ``(j, start, size)``, this rank's slice along ``j`` of every part is
        summed (a reduce-scatter) or joined (an all-to-all) instead of the whole parts."""
        _, how, in_id, out_id, seq, dtype = cmd
        ins = inputs([in_id])
        errs: dict = {}  # rank -> the error its part holds (the lowest rank's is kept)
        mine: tuple = ()
        if isinstance(ins, bytes):
            errs[rank] = ins
        else:
            impl = ins[0]
            try:
                nbytes = _nbytes(impl)
                if nbytes <= INLINE:
                    mine = ("data", host_array(impl))
                else:
                    i, e, dt, shape = outbox.write(read, impl, nbytes, seq)
                    mine = ("shm", i, e, dt, shape, nbytes)
            except BaseException as x:  # noqa: BLE001 - every rank's output holds it
                errs[rank] = error_bytes(x)
        if trace is not None:
            trace.note("written")
        token = ("c", seq, rank)
        for dst in peers:
            if rank in errs:
                tell(dst, (token, "error", errs[rank]))
            elif mine[0] == "data":
                tell(dst, (token, "data", mine[1]))
            else:
                _, i, e, dt, shape, nbytes = mine
                new = dst not in e[5]
                e[5].add(dst)
                tell(
                    dst,
                    (token, "shm", i, e[3], e[2], dt, shape, nbytes, new),
                    e[0] if new else None,
                )
        if mine and mine[0] == "shm":
            e = mine[2]
            e[4] = seq  # (written again only once every rank acked this use)
            if e[0] >= 0:  # (every other rank has it now: no descriptor kept)
                os.close(e[0])
                e[0] = -1
        got: dict = {}
        read_from = []
        for s in peers:
            try:
                header, fd = inbox.take(("c", seq, s), s, WAIT_S)
            except BaseException as x:  # noqa: BLE001
                errs[s] = error_bytes(x)
                continue
            if header[1] == "error":
                errs[s] = header[2]
            elif header[1] == "data":
                got[s] = header[2]
            else:
                _, _, i, gen, cap, dt, shape, nbytes, _ = header
                if fd is not None:
                    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # (at once)
                    seen[(s, i)] = (gen, mmap.mmap(fd, cap, flags=flags, prot=mmap.PROT_READ))
                    os.close(fd)
                mm = seen[(s, i)][1]
                read_from.append(s)
                count = nbytes // np.dtype(dt).itemsize
                got[s] = np.frombuffer(mm, np.dtype(dt), count).reshape(shape)
        if trace is not None:
            trace.note("got the others'")
        try:
            if errs:
                return fail([out_id], errs[min(errs)])
            try:
                pieces = [impl if s == rank else adopt(got[s], dtype) for s in range(size)]
                if len(how) == (2 if how[0] == "sum" else 3):  # (a slice of each)
                    j, start, n = how[-1]
                    key = (slice(None),) * j + (slice(start, start + n),)
                    pieces = [views.basic_index(p, key) for p in pieces]
                if how[0] == "sum":
                    acc = pieces[0]
                    for p in pieces[1:]:
                        acc = apply(add, [acc, p], {})[0]
                else:
                    acc = apply(cat, pieces, {"dim": how[1], "dtype": dtype})[0]
                read(acc, lambda a: None, "process ranks")  # (done with the other ranks'
                #                                             buffers before the acks)
                if trace is not None:
                    trace.note("combined")
                parts[out_id] = acc
            except BaseException as x:  # noqa: BLE001
                fail([out_id], error_bytes(x))
        finally:
            got.clear()
            pieces = []
            for s in read_from:
                tell(s, (("a", seq, rank), "ack"))

    def run(cmd) -> None:
        kind = cmd[0]
        if kind == CALL:
            if cmd[6]:
                for i in list(sent):  # (a part written: its copy is out of date)
                    unsend(i)
            ex.call(cmd)
        elif kind == VIEW:
            ex.view(cmd)
        elif kind == PUT:
            _, out_id, dtype, shape, nbytes, how, where, buf = cmd
            if how >= 2:  # (through the channel down)
                gen, cap, start, end = where
                if down[0] is None or down[0].gen != gen:
                    if down[0] is not None:
                        down[0].close()
                    down[0] = Channel.mapped(buf, cap, gen)
                ch = down[0]
                try:
                    arr = ch.read(start, dtype.np, shape)
                finally:
                    with _FENCE:  # (the copy's loads done before the count is seen, on
                        pass  #     CPUs that would reorder them: a lock is a full barrier)
                    ch.consumed[0] = end  # (those bytes may be written again)
            elif how:  # (one file for every rank it is put on)
                arr = mapped_part(buf, nbytes, dtype.np, shape)
            else:
                arr = np.frombuffer(buf, dtype.np).reshape(shape)
            parts[out_id] = adopt(arr, dtype)
        elif kind == SEND:
            _, in_id, dst, token = cmd
            peer = peers[dst]
            ins = inputs([in_id])
            try:
                if isinstance(ins, bytes):
                    return peer.send_bytes(pickle.dumps((token, "error", ins), protocol=5))
                try:
                    impl = ins[0]
                    nbytes = _nbytes(impl)
                    if nbytes <= INLINE:
                        a = host_array(impl)
                    elif in_id not in sent:
                        sent[in_id] = [*write_into(read, impl, nbytes), size - 1]
                except BaseException as e:  # noqa: BLE001 - the destination's part holds it
                    err = error_bytes(e)
                    return peer.send_bytes(pickle.dumps((token, "error", err), protocol=5))
                if nbytes <= INLINE:
                    return peer.send_bytes(pickle.dumps((token, "data", a), protocol=5))
                entry = sent[in_id]
                fd, dt, shape, _ = entry
                try:
                    peer.send_bytes(pickle.dumps((token, "fd", dt, shape, nbytes), protocol=5))
                    send_handle(peer, fd, 0)
                finally:
                    entry[3] -= 1
                    if entry[3] <= 0:
                        unsend(in_id)
            except OSError:
                pass  # (the destination's worker ended: the controller is told by its pipe)
        elif kind == RECV:
            _, src, token, dtype = cmd
            try:
                header, fd = inbox.take(token, src, WAIT_S)
                if header[1] == "error":
                    return fail([token], header[2])
                if header[1] == "data":
                    a = header[2]
                    parts[token] = adopt(a if a.flags.writeable else a.copy(), dtype)
                    return
                _, _, dt, shape, nbytes = header
                parts[token] = adopt(mapped_part(fd, nbytes, dt, shape), dtype)
            except BaseException as e:  # noqa: BLE001
                fail([token], error_bytes(e))
        elif kind == DROP:
            ex.drop(cmd[1])
            for i in cmd[1]:
                unsend(i)
        elif kind == GET:
            ins = inputs([cmd[1]])
            if isinstance(ins, bytes):
                return answer(("error", ins))
            impl = ins[0]
            try:
                nbytes = _nbytes(impl)
                if INLINE < nbytes <= CHANNEL_MAX:  # (through the channel up)
                    ch = up[0]
                    if ch is None or ch.cap - HEADER < nbytes:
                        ch = up[0] = Channel.grown(ch, nbytes)

                    def write(a: np.ndarray) -> tuple:
                        ch.write(a, HEADER)
                        return a.dtype.str, tuple(a.shape)

                    dt, shape = read(impl, write, "process ranks")
                elif nbytes > INLINE:
                    fd, dt, shape = write_into(read, impl, nbytes)
                else:
                    a = host_array(impl)
            except BaseException as e:  # noqa: BLE001 - answered
                return answer(("error", error_bytes(e)))
            if INLINE < nbytes <= CHANNEL_MAX:
                fd = ch.descriptor()
                answer(("up", dt, shape, ch.gen, ch.cap, fd is not None))
                if fd is not None:
                    try:
                        send_handle(conn, fd, 0)
                    finally:
                        os.close(fd)
                return
            if nbytes > INLINE:
                try:
                    answer(("fd", dt, shape, nbytes))
                    send_handle(conn, fd, 0)
                finally:
                    os.close(fd)
                return
            answer(("data", a))  # (one message: the array pickled in it)
        elif kind == META:
            answer(ex.meta(cmd[1]))
        elif kind == PING:  # (kernel errors stay on the parts they poisoned)
            vm.synchronize_quietly()
            answer(("ok", len(parts) + len(poisoned)))
        elif kind == POISON:
            fail(cmd[1], cmd[2])
        elif kind == COLLECT:
            collect(cmd)
        elif kind == RUN:
            ex.run_fn(cmd)

    programs: dict = {}  # a step program's id -> (its commands, the parts dropped after each)

    def execute(cmd) -> None:
        """Runs ``cmd``; an error is kept on what it makes (a request's is its answer);
        raises OSError/EOFError only when the controller is gone."""
        if cmd[0] in (GET, META, PING):
            asked[0] = cmd[-1]
        try:
            if trace is None:
                run(cmd)
            else:
                trace.start()
                run(cmd)
                if trace.sync:  # (its kernels' time in its line)
                    vm.synchronize_quietly()
                trace.end(cmd)
        except (OSError, EOFError):
            raise
        except BaseException as e:  # noqa: BLE001 - an internal error: kept, not fatal
            err = error_bytes(e)
            if cmd[0] in (GET, META, PING):
                answer(("error", err))
            else:
                fail(made_by(cmd), err)

    def replay(cmd) -> None:
        """``REPLAY``: a step program's commands with this replay's ids, each part the step
        makes dropped after its last use (the outputs kept: the controller holds them)."""
        _, pid, ins, base, seq_base = cmd
        cmds, frees = programs[pid]
        part = replay_ids(ins, base)
        seq = seq_base.__add__
        for c, free in zip(cmds, frees, strict=True):
            execute(map_ids(c, part, seq))
            if free:
                ids = [part(i) for i in free]
                ex.drop(ids)
                for i in ids:
                    unsend(i)

    while True:
        batch = _batch(conn)
        if batch is None:
            return  # (the controller closed the pipe, or is gone)
        if trace is not None:
            trace.batch(len(batch))
        try:
            for cmd in batch:
                kind = cmd[0]
                if kind == DEFINE:
                    if cmd[2] is None:
                        programs.pop(cmd[1], None)
                    else:
                        programs[cmd[1]] = (cmd[2], cmd[3])
                elif kind == REPLAY:
                    replay(cmd)
                else:
                    execute(cmd)
        except (OSError, EOFError):
            return  # the controller is gone (its pipe: the answers of GET, META, PING)


NAMES = (
    "CALL",
    "VIEW",
    "PUT",
    "SEND",
    "RECV",
    "DROP",
    "GET",
    "META",
    "PING",
    "POISON",
    "COLLECT",
    "DEFINE",
    "REPLAY",
    "RUN",
)


def map_ids(cmd: tuple, f: Any, g: Any) -> tuple:
    """``cmd`` (a command a step program holds: CALL, VIEW, SEND, RECV, COLLECT) with each
    part id ``i`` in it ``f(i)`` and a collective's sequence number ``s`` ``g(s)``."""
    kind = cmd[0]
    if kind == CALL:
        _, ref, in_ids, attrs, out_ids, dev, inplace = cmd
        return (CALL, ref, [f(i) for i in in_ids], attrs, [f(i) for i in out_ids], dev, inplace)
    if kind == VIEW:
        return (VIEW, cmd[1], f(cmd[2]), cmd[3], f(cmd[4]))
    if kind == SEND:
        return (SEND, f(cmd[1]), cmd[2], f(cmd[3]))
    if kind == RECV:
        return (RECV, cmd[1], f(cmd[2]), cmd[3])
    if kind == COLLECT:
        return (COLLECT, cmd[1], f(cmd[2]), f(cmd[3]), g(cmd[4]), cmd[5])
    raise ValueError(f"a step program holds no {NAMES[kind]} command")


def ids_of(cmd: tuple) -> list:
    """The part ids a step program's command names (see ``map_ids``)."""
    out: list = []
    map_ids(cmd, out.append, lambda s: s)
    return out


def replay_ids(ins: Any, base: int) -> Any:
    """The part id one replay of a step program (``DEFINE``; ``programs.py``) gives each
    id its commands name: a negative id ``-1 - p`` names the replay's input ``p``
    (``ins``) for p below their count, else the ``p - len(ins)``-th part the step makes,
    whose id is ``base`` plus that; other ids (parameters, state) are the parts' own."""
    n = len(ins)

    def part(i: int) -> int:
        if i >= 0:
            return i
        p = -1 - i
        return ins[p] if p < n else base + p - n

    return part


class _Tracer:
    """Per-command timestamps of a worker, written to ``<prefix>.<rank>`` (one line a
    command: its start and end in ms since the worker started, what it was), where the
    environment has ``AF_RANKS_TRACE=<prefix>``: where the time of process ranks goes. A
    worker finding that file made by another worker of the same rank number (another
    placement's: pipeline stages each hold a one-rank placement) writes
    ``<prefix>.<rank>.<pid>`` instead (as does every worker when a file of an earlier run
    is still there: remove old traces first). The first line gives the worker's start on the
    system's monotonic clock (ms), which lays ranks' lines side by side. With
    ``AF_RANKS_TRACE_SYNC=1`` too, each command is waited for before the next one (a line
    then holds its kernels' time; the rank computes nothing behind its commands)."""

    def __init__(self, prefix: str, rank: int) -> None:
        import time

        self.clock = time.perf_counter
        self.t0 = self.clock()
        self.t = self.t0
        pid = os.getpid()
        try:  # (the file kept for the process)
            self.file = open(f"{prefix}.{rank}", "x", buffering=1 << 16)  # noqa: SIM115
        except FileExistsError:
            self.file = open(f"{prefix}.{rank}.{pid}", "w", buffering=1 << 16)  # noqa: SIM115
        self.file.write(f"# rank {rank}, pid {pid}, started at {self.t0 * 1e3:.3f} ms\n")
        self.sync = bool(os.environ.get("AF_RANKS_TRACE_SYNC"))

    def batch(self, n: int) -> None:
        self.file.write(f"{(self.clock() - self.t0) * 1e3:10.3f} batch of {n}\n")

    def note(self, what: str) -> None:
        """A point within the command running."""
        self.file.write(f"{(self.clock() - self.t) * 1e3:21.3f} {what}\n")

    def start(self) -> None:
        self.t = self.clock()

    def end(self, cmd: tuple) -> None:
        t = self.clock()
        what = NAMES[cmd[0]]
        if cmd[0] == CALL:
            what += f" {getattr(cmd[1], 'name', cmd[1])} {cmd[2]} -> {cmd[4]}"
        elif cmd[0] in (SEND, RECV):
            what += f" {cmd[1:3]}"
        elif cmd[0] == VIEW:
            what += f" {cmd[1]}"
        start, took = (self.t - self.t0) * 1e3, (t - self.t) * 1e3
        self.file.write(f"{start:10.3f} {took:8.3f} {what}\n")
        self.file.flush()


def _tracer(rank: int) -> _Tracer | None:
    prefix = os.environ.get("AF_RANKS_TRACE")
    return _Tracer(prefix, rank) if prefix else None


def made_by(cmd: tuple) -> list:
    """The ids of the parts a command makes (or writes)."""
    kind = cmd[0]
    if kind == CALL:
        return list(cmd[4])
    if kind == VIEW:
        return [cmd[4]]
    if kind in (PUT, POISON):
        return [cmd[1]] if kind == PUT else list(cmd[1])
    if kind == RECV:
        return [cmd[2]]
    if kind == COLLECT:
        return [cmd[3]]
    if kind == RUN:
        return list(cmd[3])
    return []
