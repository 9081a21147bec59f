"""The ranks of a placement: who holds each part of a global tensor and runs the ops on it.

A ``Ranks`` object is what the global interpreter and boxing talk to, one method per thing
a rank does: run an op on its parts (``call``), take a view of a part (``view``), receive a
copy of another rank's part (``move``), receive a tensor from this process (``put``) and
give one back (``get``). A part is whatever the kind of ranks keeps for it; ``meta(part)``
is its local metadata.

``InlineRanks``: every rank's parts are tensors of this process, on the placement's device
type (``cpu``; ``null:r`` / ``cuda:r`` for rank r of those types), and every op runs
through the eager interpreter like any other call. It is exact and simple, and what the
tests compare the other kinds with; it computes the ranks one after another.

``ProcessRanks``: every rank is a kept worker process on this machine (``workers.py``), so
the ranks compute at the same time on the machine's cores. A part is a ``Part`` handle here
(its rank, an id, its local meta) for a tensor the worker holds. Commands go down each
worker's pipe in order and in batches, without waiting: a call's output metas are worked
out here (the op's ``infer`` on the local metas; views on a stand-in), so only what needs
the worker's answer waits for it: ``get``, the meta of an output whose shape depends on
values, and errors, which a worker keeps on the parts it could not make and which are
raised here (the same type, the same words) when such a part is read. Moves go between the
workers through shared memory. A worker that dies is an ``ActorError`` naming the placement,
the rank and the exit code at the next use of the placement; the others are shut down, and
the placement gets new workers the next time. Which kind ``ranks_of`` makes: ``use_ranks``.

``HeldRanks`` is what process ranks and Ray ranks (``ray_ranks.RayRanks``: each rank a Ray
actor) share, the controller's side; they differ only in how commands and parts travel.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, NoReturn

import numpy as np

from ..backends import get_backend
from ..device import Device, device
from ..eager.interpreter import apply, current_stream, read, resolve, transfer
from ..errors import ActorError, DeviceError
from ..ops import get as op_def
from ..runtime.sched.processes import (
    RemoteTraceback,
    WorkerDied,
    _context,
    _signal_name,
    _stop_all,
)
from ..sbp import Placement
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import TensorMeta, contiguous_meta, numel
from ..vm.scheduler import get_vm
from . import workers as W

_COPY = op_def("copy")
NO_ATTRS: dict = {}
VIEWS = W.VIEWS  # the views a rank takes of its parts, by name


class Ranks:
    """The interface (see the module doc)."""

    placement: Placement
    size: int
    kind: str = ""

    def device(self, rank: int) -> Device:
        raise NotImplementedError

    def meta(self, part: Any) -> Any:
        raise NotImplementedError

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        raise NotImplementedError

    def view(self, rank: int, name: str, part: Any, *args: Any) -> Any:
        raise NotImplementedError

    def move(self, part: Any, src: int, dst: int) -> Any:
        raise NotImplementedError

    def put(self, rank: int, impl: Any) -> Any:
        raise NotImplementedError

    def get(self, rank: int, part: Any) -> Any:
        raise NotImplementedError


class InlineRanks(Ranks):
    kind = "inline"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self.size = placement.size
        t = placement.type
        try:
            self._devices = [
                device(t) if t == "cpu" else device(f"{t}:{r}") for r in placement.ranks
            ]
        except DeviceError as e:
            raise DeviceError(f"{placement}: {e}") from None

    def device(self, rank: int) -> Device:
        return self._devices[rank]

    def meta(self, part: Any) -> Any:
        if part.meta.shape is None:
            resolve(part)
        return part.meta

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        if outs is not None:
            apply(op, ins, attrs, None, outs)
            return outs
        return apply(op, ins, attrs, self._devices[rank] if not ins else None)

    def view(self, rank: int, name: str, part: Any, *args: Any) -> Any:
        return VIEWS[name](part, *args)

    def move(self, part: Any, src: int, dst: int) -> Any:
        return self._copy(part, self._devices[dst])

    def put(self, rank: int, impl: Any) -> Any:
        return self._copy(impl, self._devices[rank])

    def get(self, rank: int, part: Any) -> Any:
        return self._copy(part, device("cpu"))

    @staticmethod
    def _copy(impl: Any, dev: Device) -> Any:
        if impl.meta.device is dev:
            return apply(_COPY, [impl], NO_ATTRS)[0]
        if get_backend(dev).host_memory and impl.blob.backend.host_memory:
            return apply(_COPY, [impl], NO_ATTRS, device=dev)[0]
        return transfer(impl, dev)  # across the host boundary


MAX_RANKS = 64  # worker processes of one placement at most (each pair joined by a pipe)
BATCH = 64  # commands kept for a worker before they are sent whatever comes next
FLUSH_BYTES = 1 << 20  # bytes of work (outputs, moves, puts) kept before they are sent:
#                        tiny ops go in batches (one write per worker for many), large
#                        ones at once (the workers start while the next ones are issued)


class Part:
    """A rank's part held by its worker process: the rank, its id there, its local meta
    (None until known for an output whose shape depends on values) and dtype. When it is
    collected (on any thread, even at the interpreter's exit) its id is queued for the
    worker to drop with the next batch."""

    __slots__ = ("rank", "id", "meta", "dtype", "_drops")

    def __init__(self, rank: int, id: int, meta: Any, dtype: Any, drops: deque) -> None:
        self.rank, self.id, self.meta, self.dtype, self._drops = rank, id, meta, dtype, drops

    def __repr__(self) -> str:
        shape = None if self.meta is None else self.meta.shape
        return f"Part(rank={self.rank}, id={self.id}, shape={shape}, dtype={self.dtype})"

    def __del__(self) -> None:
        try:
            self._drops.append((self.rank, self.id))  # (atomic: no lock taken here)
        except Exception:  # noqa: BLE001, S110 - at the interpreter's exit
            pass


class _Worker:
    """One rank's process and this side of its pipe."""

    def __init__(self, ctx: Any, rank: int, size: int, peers: dict, threads: int) -> None:
        here, there = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=W.worker_main,
            args=(there, rank, size, peers, threads),
            daemon=True,
            name=f"actorflow-rank-{rank}",
        )
        self.process.start()
        there.close()
        self.conn = here

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exit_code(self) -> int | None:
        self.process.join(2.0)
        return self.process.exitcode

    def stop(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        p = self.process
        p.join(2.0)
        if p.exitcode is None:
            p.kill()
            p.join(2.0)


_STAND_IN: list = []  # a blob for the stand-ins views are worked out on (no memory)


def _stand_in(meta: TensorMeta) -> TensorImpl:
    if not _STAND_IN:
        cpu = device("cpu")
        _STAND_IN.append(Blob(cpu, get_backend(cpu), 0))
    return TensorImpl(meta, _STAND_IN[0])


class HeldRanks(Ranks):
    """The controller's side of ranks whose parts are held elsewhere (a kept worker process
    per rank: ``ProcessRanks``; a Ray actor per rank: ``ray_ranks.RayRanks``): ``Part``
    handles with ids and the local metas worked out here (an op's ``infer``, views on a
    stand-in), commands kept per rank and sent in batches without waiting, the parts
    collected here dropped there, the errors a rank kept on parts raised at their read, a
    rank gone an ``ActorError`` naming it. What differs is the transport: how the batches,
    puts, moves and answers travel (``_start``, ``_flush``, ``_request``, ``_stop``,
    ``_find_dead``, ``move``, ``put``, ``get``)."""

    words = "held ranks"  # what the kind is called in messages
    members = "ranks"  # and what its ranks are
    replays = False  # whether its ranks replay step programs (programs.py)
    _collectives = 0  # collectives issued (the same number on every rank)
    _rec: Any = None  # the step being recorded (a programs.Recording), told every command

    def __init__(self, placement: Placement, threads: int | None = None) -> None:
        self.placement = placement
        self.size = k = placement.size
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 1) // k)
        self._dev = device("cpu")
        self._pending: list = [[] for _ in range(k)]
        self._drops: deque = deque()
        self._forget: deque = deque()  # step programs to forget (programs.py)
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._refs: dict = {}
        self._work = 0  # bytes of work kept (not sent yet)
        self._holding = 0  # (``held``: commands kept until a flush, whatever their count)
        self._made = self._gone = 0  # parts handed out, and dropped since (live_parts)
        self._failed: tuple | None = None  # (ActorError's arguments) once a rank died
        self.closed = False

    # -- the transport ---------------------------------------------------------------------

    def _started(self) -> bool:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def _request(self, rank: int, cmd: tuple) -> tuple:
        """Sends everything kept, then ``cmd`` to ``rank``; returns its answer (a kept
        error raised here)."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Ends the ranks (their parts are gone)."""
        raise NotImplementedError

    def _find_dead(self) -> None:
        """A rank said another ended: that one's error."""
        raise NotImplementedError

    # -- the ranks -------------------------------------------------------------------------

    def _live(self) -> None:
        if self._failed is not None:
            raise _rank_error(*self._failed)
        if self.closed:
            raise DeviceError(
                f"the {self.words} of {self.placement!r} were closed (close()); its global "
                f"tensors are gone with them: make new ones (the placement starts new "
                f"{self.members})"
            )
        if not self._started():
            self._start()

    def _fail(self, rank: int, error: BaseException) -> NoReturn:
        """Ends the ranks with ``error`` of rank ``rank``: raised now as the ActorError
        naming the rank and the placement, and again at every later use."""
        self._failed = (f"rank {rank} of {self.placement!r}", None, error)
        self._shutdown()
        raise _rank_error(*self._failed)

    def _shutdown(self) -> None:
        self.closed = True
        if _GROUPS.get((self.kind, self.placement)) is self:
            del _GROUPS[(self.kind, self.placement)]
        self._stop()

    def close(self) -> None:
        """Ends the ranks (their parts are gone; the placement starts new ones when used
        again)."""
        with self._lock:
            self._shutdown()

    # -- commands --------------------------------------------------------------------------

    def _issue(self, rank: int, cmd: tuple) -> None:
        self._pending[rank].append(cmd)

    def _after(self, rank: int, work: int) -> None:
        """Sends what is kept once ``FLUSH_BYTES`` of work or a batch of ``BATCH``
        commands is; anything that waits for a rank sends it all first."""
        self._work += work
        if self._holding:
            return
        if self._work >= FLUSH_BYTES or len(self._pending[rank]) >= BATCH:
            self._flush()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within it the commands issued are kept until a flush, however many (so a caller
        that issues a few commands that go together, all or none, can take back those
        kept: ``unissue``); the lock is held throughout."""
        with self._lock:
            self._holding += 1
            try:
                yield
            finally:
                self._holding -= 1

    def _raise(self, err: bytes) -> None:
        words, tb, data = pickle.loads(err)
        try:
            error = pickle.loads(data)
        except Exception:  # noqa: BLE001 - pickled there, not loadable here: its words
            error = RuntimeError(words)
        if isinstance(error, W.PeerGone):
            self._find_dead()
        error.__cause__ = RemoteTraceback(tb)
        raise error

    def _ref(self, op: Any) -> Any:
        ref = self._refs.get(op)
        if ref is None:
            try:
                ref = op.name if op_def(op.name) is op else op
            except KeyError:
                ref = op
            self._refs[op] = ref
        return ref

    def _part(self, rank: int, meta: Any, dtype: Any) -> Part:
        self._made += 1
        return Part(rank, next(self._ids), meta, dtype, self._drops)

    def live_parts(self) -> int:
        """How many parts handles of this process still name (made, not dropped)."""
        with self._lock:
            return self._made - self._gone - len(self._drops)

    # -- the interface ---------------------------------------------------------------------

    def device(self, rank: int) -> Device:
        return self._dev

    def meta(self, part: Any) -> Any:
        if part.meta is None:
            with self._lock:
                self._live()
                _, shape, strides, offset = self._request(part.rank, (W.META, part.id))
                part.meta = TensorMeta(shape, part.dtype, self._dev, strides, offset)
        return part.meta

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        with self._lock:
            self._live()
            ref = self._ref(op)
            in_ids = [p.id for p in ins]
            if outs is not None:
                self._issue(rank, (W.CALL, ref, in_ids, attrs, [o.id for o in outs], None, True))
                self._after(rank, sum(_nbytes(o.meta) for o in outs))
                return outs
            metas = [self.meta(p) for p in ins]
            made = [
                self._part(
                    rank, None if shape is None else contiguous_meta(shape, dtype, self._dev), dtype
                )
                for shape, dtype in op.infer(metas, attrs)
            ]
            dev = None if ins else self._dev
            self._issue(rank, (W.CALL, ref, in_ids, attrs, [p.id for p in made], dev, False))
            self._after(rank, sum(_nbytes(p.meta) for p in made))
            return made

    def view(self, rank: int, name: str, part: Any, *args: Any) -> Any:
        with self._lock:
            self._live()
            m = VIEWS[name](_stand_in(self.meta(part)), *args).meta
            out = self._part(rank, m._replace(device=self._dev), m.dtype)
            self._issue(rank, (W.VIEW, name, part.id, args, out.id))
            self._after(rank, 0)
            return out

    def call_fn(self, rank: int, fn: Any, args: tuple, dtypes: Sequence[Any]) -> list:
        """Has rank ``rank`` run ``fn(executor, *args, out_ids)`` (a module-level function,
        pickled by reference: ``workers.RUN``) after the commands sent before; returns the
        parts it makes, one per dtype of ``dtypes`` (their shapes known once read), each
        holding the error ``fn`` raised, if any."""
        with self._lock:
            self._live()
            made = [self._part(rank, None, dt) for dt in dtypes]
            self._issue(rank, (W.RUN, fn, args, [p.id for p in made]))
            self._after(rank, 0)
            return made

    def read(self, rank: int, part: Any) -> np.ndarray:
        """The part's values as a writable host array of its storage dtype (C-contiguous),
        once its work is done there (its error raised here)."""
        raise NotImplementedError

    def get(self, rank: int, part: Any) -> Any:
        return W.adopt(self.read(rank, part), part.dtype)

    @property
    def lock(self) -> threading.RLock:
        """Held while commands are kept and sent: a caller holding the locks of several
        ranks sends its commands to them with nothing of another thread's in between."""
        return self._lock

    def unissue(self, rank: int, part: Any) -> bool:
        """Takes back the ``RUN`` that makes ``part`` where it is kept and not sent yet
        (whether it was)."""
        with self._lock:
            cmds = self._pending[rank]
            for k, cmd in enumerate(cmds):
                if cmd[0] == W.RUN and part.id in cmd[3]:
                    del cmds[k]
                    return True
            return False

    def flush(self) -> None:
        """Sends every command kept so far (without waiting for any answer)."""
        with self._lock:
            self._live()
            self._flush()

    def synchronize(self) -> None:
        """Waits until every worker has run every command sent so far."""
        with self._lock:
            self._live()
            self._flush()
            for r in range(self.size):
                self._request(r, (W.PING,))


class ProcessRanks(HeldRanks):
    """Each rank a kept worker process (see the module doc), started at the first use and
    ended by ``close()``, garbage collection or the interpreter's exit. ``threads``: the
    CPU threads of each worker (its eager runtime's, and BLAS's where threadpoolctl is
    installed; default: this machine's cores shared among the ranks). ``pids``: the
    workers' process ids."""

    kind = "processes"
    words = "process ranks"
    members = "workers"
    replays = True

    def __init__(self, placement: Placement, threads: int | None = None) -> None:
        if placement.type != "cpu":
            raise DeviceError(
                f"{placement!r}: process ranks run placements of type 'cpu' (each rank a "
                f"worker process on this machine); use af.parallel.use_ranks('inline') for "
                f"placements of type {placement.type!r}"
            )
        if placement.size > MAX_RANKS:
            raise DeviceError(
                f"{placement!r}: process ranks start one worker process per rank, and "
                f"{placement.size} is more than {MAX_RANKS}; use fewer ranks, or "
                f"af.parallel.use_ranks('inline')"
            )
        super().__init__(placement, threads)
        k = self.size
        self._workers: list = []
        self._payloads: list = [[] for _ in range(k)]
        self._put: tuple = (None, None, -2)  # the tensor put last, its payload, the rank
        self._fds: list = []  # memfds of puts, closed once sent
        self._downs: list = [None] * k  # per worker, the channel down to it (W.Channel)
        self._ups: list = [None] * k  # and its channel up, mapped here
        self._asked = 0  # requests made (answers carry their number)
        self._early: dict = {}  # asked (``ask``) -> its answer, once read (None before)
        self._busy: list = [{} for _ in range(k)]  # per worker: mark -> until when (busy())
        self._marks = itertools.count(1)
        self.sent = 0  # bytes down the pipes
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    # -- the workers -----------------------------------------------------------------------

    @property
    def pids(self) -> list:
        return [w.pid for w in self._workers]

    def _started(self) -> bool:
        return bool(self._workers)

    def _start(self) -> None:
        ctx = _context()
        k = self.size
        peers: list = [{} for _ in range(k)]
        for i in range(k):
            for j in range(i + 1, k):
                a, b = ctx.Pipe(duplex=True)
                peers[i][j], peers[j][i] = a, b
        try:
            for r in range(k):
                self._workers.append(_Worker(ctx, r, k, peers[r], self.threads))
                for c in peers[r].values():  # (the worker has its ends now)
                    c.close()
                peers[r] = {}
        except BaseException:
            _stop_all(self._workers)
            raise
        finally:
            for p in peers:
                for c in p.values():
                    c.close()

    def _died(self, rank: int) -> None:
        """Rank ``rank``'s worker ended: the placement's ranks are shut down and the error
        raised (and again at every later use)."""
        codes = {
            r: w.exit_code()
            for r, w in enumerate(self._workers)
            if r == rank or not w.process.is_alive()
        }
        for r, c in codes.items():  # (the one that failed rather than one that ended after)
            if c not in (0, None):
                rank = r
                break
        w, code = self._workers[rank], codes[rank]
        how = f"exit code {code}"
        if code is not None and code < 0:
            how += f" (killed by {_signal_name(-code)})"
        elif code == 1:
            how += (
                " (an error in the worker, its traceback printed above; one as it starts "
                "is often a main module that runs its work when imported: put that under "
                "if __name__ == '__main__':)"
            )
        original = WorkerDied(
            f"its worker process (pid {w.pid}) ended: "
            f"{how}; the global tensors on the placement are lost (its other workers were "
            f"shut down); the next use of the placement starts new workers"
        )
        self._fail(rank, original)

    def _find_dead(self) -> None:
        """A worker said another ended: that one's error (once the OS says it ended)."""
        sentinels = [w.process.sentinel for w in self._workers]
        ended = wait(sentinels, timeout=2.0)
        for r, s in enumerate(sentinels):
            if s in ended:
                self._died(r)

    def _stop(self) -> None:
        self._unput()
        self._close_fds()
        for ch in self._downs + self._ups:
            if ch is not None:
                ch.close()
        self._downs = [None] * self.size
        self._ups = [None] * self.size
        self._finalizer()

    # -- commands --------------------------------------------------------------------------

    def _issue(self, rank: int, cmd: tuple, payload: Any = None) -> None:
        self._pending[rank].append(cmd)
        if payload is not None:
            self._payloads[rank].append(payload)
        if self._rec is not None:
            self._rec.issued(rank, cmd)

    def _flush(self) -> None:
        self._work = 0
        drops = self._drops
        while drops:
            r, i = drops.popleft()
            self._gone += 1
            self._pending[r].append((W.DROP, [i]))
            if self._rec is not None:
                self._rec.dropped.add(i)
        while self._forget:
            pid = self._forget.popleft()
            for cmds in self._pending:
                cmds.append((W.DEFINE, pid, None, None))
        for r, w in enumerate(self._workers):
            cmds = self._pending[r]
            if not cmds:
                continue
            pays = self._payloads[r]
            self._pending[r], self._payloads[r] = [], []
            data = _pickled(cmds)
            try:
                w.conn.send_bytes(data)
                for p in pays:
                    if type(p) is tuple:  # ("fd", descriptor)
                        send_handle(w.conn, p[1], w.pid)
                    else:
                        w.conn.send_bytes(p)
            except (OSError, EOFError):
                self._close_fds()
                self._died(r)
            except BaseException as e:  # (Ctrl-C in a send: the pipe is out of step)
                self._failed = (f"rank {r} of {self.placement!r}", None, e)
                self._shutdown()
                raise
            self.sent += len(data)
        self._close_fds()

    def _unput(self) -> None:
        """Forgets the tensor put last (its memfd closed once sent)."""
        payload = self._put[1]
        if type(payload) is tuple:
            self._fds.append(payload[1])
        self._put = (None, None, -2)

    def _close_fds(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def _request(self, rank: int, cmd: tuple, raw: bool = False) -> tuple:
        """Sends everything kept, then ``cmd`` to ``rank``, and returns its answer (with
        ``raw``: ending with the part's array); a kept error is raised here."""
        self._asked += 1
        self._issue(rank, (*cmd, self._asked))
        self._unput()  # (a scatter is over by now: its memfd is not kept past this send)
        self._flush()
        return self._answer(rank, self._asked, raw)

    def ask(self, rank: int, part: Any) -> int:
        """Asks for the part's values without waiting (sent with the next commands): the
        worker answers once the commands before are run, and ``answer(rank, token)``
        returns them (its error raised there), whatever was asked or sent since."""
        with self._lock:
            self._live()
            self._asked += 1
            self._early[self._asked] = None
            self._issue(rank, (W.GET, part.id, self._asked))
            return self._asked

    def answer(self, rank: int, token: int) -> np.ndarray:
        """The values ``ask`` asked for (waiting for them)."""
        with self._lock:
            self._live()
            self._unput()
            self._flush()
            return self._answer(rank, token, True)[-1]

    def forget(self, token: int) -> None:
        """An ``ask`` whose answer is not wanted any more (let go of when it comes)."""
        with self._lock:
            self._early.pop(token, None)

    def _answer(self, rank: int, want: int, raw: bool) -> tuple:
        """Rank ``rank``'s answer to request ``want``: answers to asks that come first are
        kept (read whole now: a part in the channel up is overwritten by the next
        answer), answers to requests given up on let go."""
        reply = self._early.pop(want, None)
        while reply is None:
            n, *got = self._recv(rank)
            if n == want:
                reply = self._reply(rank, tuple(got), raw)
            elif n in self._early:
                self._early[n] = self._reply(rank, tuple(got), True)
            elif got[0] == "fd":  # (an answer to a request given up on: its memfd closed)
                os.close(recv_handle(self._workers[rank].conn))
            elif got[0] == "up" and got[-1]:  # (and a new channel up: mapped)
                self._map_up(rank, tuple(got))
        if reply[0] == "error":
            self._raise(reply[1])
        return reply

    def _reply(self, rank: int, reply: tuple, raw: bool) -> tuple:
        """An answer as ``_request`` returns it (with ``raw``: the part's array read, out
        of the channel up or the memfd that follows it); an error as it came."""
        if reply[0] == "error" or not raw:
            return reply
        if reply[0] == "data":
            a = reply[1]
            return reply[:1] + (a if a.flags.writeable else a.copy(),)
        if reply[0] == "up":
            _, dt, shape, _, _, new = reply
            if new:
                self._map_up(rank, reply)
            return reply + (self._ups[rank].read(W.HEADER, dt, shape),)
        _, dt, shape, n = reply
        try:
            fd = recv_handle(self._workers[rank].conn)
        except (OSError, EOFError):
            self._died(rank)
        return reply + (W.mapped_part(fd, n, dt, shape),)

    def _map_up(self, rank: int, reply: tuple) -> None:
        """Maps the worker's new channel up, whose descriptor follows its answer."""
        try:
            fd = recv_handle(self._workers[rank].conn)
        except (OSError, EOFError):
            self._died(rank)
        old = self._ups[rank]
        if old is not None:
            old.close()
        self._ups[rank] = W.Channel.mapped(fd, reply[4], reply[3])

    def busy(self, rank: int, seconds: float) -> int:
        """Rank ``rank``'s worker runs a command that may take up to ``seconds`` (a
        pipeline's batch in its stages' workers): until ``idle(rank, mark)`` with the mark
        returned, an answer of that worker is waited for the rest of that time plus
        ``AF_RANKS_WAIT_S`` before the ranks are given up."""
        mark = next(self._marks)
        self._busy[rank][mark] = time.monotonic() + seconds
        return mark

    def idle(self, rank: int, mark: int) -> None:
        """The command ``busy`` marked is over (its answer read, or given up on)."""
        self._busy[rank].pop(mark, None)

    def _recv(self, rank: int) -> tuple:
        w = self._workers[rank]
        until = max(self._busy[rank].values(), default=0.0)
        wait_s = W.WAIT_S + max(0.0, until - time.monotonic())
        ready = W.wait_up_to([w.conn, w.process.sentinel], wait_s)
        if w.conn in ready:
            try:
                return pickle.loads(w.conn.recv_bytes())
            except (OSError, EOFError):
                pass
        elif not ready:
            self._fail(rank, TimeoutError(f"no answer from the worker within {wait_s:g} s"))
        self._died(rank)
        raise AssertionError("unreachable")

    # -- the interface ---------------------------------------------------------------------

    def move(self, part: Any, src: int, dst: int) -> Any:
        with self._lock:
            self._live()
            m = self.meta(part)
            if src == dst:
                return self.call(dst, _COPY, [part], NO_ATTRS)[0]
            out = self._part(dst, contiguous_meta(m.shape, m.dtype, self._dev), m.dtype)
            self._issue(src, (W.SEND, part.id, dst, out.id))
            self._issue(dst, (W.RECV, src, out.id, m.dtype))
            self._after(dst, _nbytes(m))
            return out

    def put(self, rank: int, impl: Any) -> Any:
        """Small tensors go down the pipe; larger ones through the worker's channel down
        (``W.Channel``), or, where it is full or they are larger than ``W.CHANNEL_MAX``,
        written once into a memfd whose descriptor goes to every rank they are put on."""
        with self._lock:
            self._live()
            m = impl.meta
            nbytes = _nbytes(m)
            if W.INLINE < nbytes <= W.CHANNEL_MAX:
                out = self._put_down(rank, impl, nbytes)
                if out is not None:
                    return out
            held, payload, last = self._put
            if held is not impl or rank != last + 1:  # (read once for the ranks in turn)
                self._unput()
                src = impl if impl.blob.backend.host_memory else transfer(impl, device("cpu"))
                if nbytes > W.INLINE:
                    payload = ("fd", W.write_into(_read_now, src, nbytes)[0])
                else:
                    a = _read_now(src, lambda x: np.array(x, copy=True, order="C"), "to_global")
                    payload = a.reshape(-1).view(np.uint8).data if nbytes else None
            self._put = (impl, payload, rank)
            if rank == self.size - 1:
                self._unput()
            out = self._part(rank, contiguous_meta(m.shape, m.dtype, self._dev), m.dtype)
            in_fd = int(nbytes > W.INLINE)
            cmd = (W.PUT, out.id, m.dtype, tuple(m.shape), nbytes, in_fd, None)
            self._issue(rank, cmd, payload)
            self._after(rank, nbytes)
            return out

    def _put_down(self, rank: int, impl: Any, nbytes: int) -> Any:
        """``put`` through the worker's channel down: None where the worker has not
        consumed enough of it yet (the caller puts it in a memfd of its own)."""
        ch = self._downs[rank]
        where = ch.place(nbytes) if ch is not None else None
        if where is None:
            if ch is not None and 4 * nbytes <= ch.cap - W.HEADER:
                return None  # (the worker is behind)
            # (the worker keeps its map of the old one until a PUT names the new one)
            ch = self._downs[rank] = W.Channel.grown(ch, nbytes)
            where = ch.place(nbytes)
            assert where is not None
        self._unput()
        start, end = where
        src = impl if impl.blob.backend.host_memory else transfer(impl, device("cpu"))
        _read_now(src, lambda a: ch.write(a, start), "to_global")
        fd = ch.descriptor()
        payload = None
        if fd is not None:
            self._fds.append(fd)  # (closed once sent)
            payload = ("fd", fd)
        m = impl.meta
        out = self._part(rank, contiguous_meta(m.shape, m.dtype, self._dev), m.dtype)
        where = (ch.gen, ch.cap, start, end)
        cmd = (W.PUT, out.id, m.dtype, tuple(m.shape), nbytes, 2 if fd is None else 3, where)
        self._issue(rank, cmd, payload)
        self._after(rank, nbytes)
        return out

    def read(self, rank: int, part: Any) -> np.ndarray:
        with self._lock:
            self._live()
            return self._request(rank, (W.GET, part.id), raw=True)[-1]

    # -- collectives (boxing calls them where a Ranks has them) ---------------------------

    def all_reduce(self, parts: list) -> list:
        """P -> B: every rank's part summed in rank order on every rank (the same bits as
        the moves and adds of boxing's generic path), each part written once into shared
        memory every other rank reads (``workers.collect``)."""
        return self._collective(parts, ("sum",), None)

    def all_gather(self, parts: list, dim: int) -> list:
        """S(dim) -> B: every rank's part joined along ``dim`` in rank order on every rank."""
        shape = list(self.meta(parts[0]).shape)
        shape[dim] = sum(self.meta(p).shape[dim] for p in parts)
        return self._collective(parts, ("cat", dim), tuple(shape))

    def reduce_scatter(self, parts: list, dim: int) -> list:
        """P -> S(dim): rank r's slice along ``dim`` of every part summed in rank order."""
        return self._sliced(parts, ("sum", dim))

    def all_to_all(self, parts: list, src: int, dst: int) -> list:
        """S(src) -> S(dst): rank r's slice along ``dst`` of every part joined along
        ``src`` in rank order."""
        return self._sliced(parts, ("cat", src, dst))

    def _collective(self, parts: list, how: tuple, shape: tuple | None) -> list:
        with self._lock:
            self._live()
            m = self.meta(parts[0])
            shape = tuple(m.shape) if shape is None else shape
            self._collectives += 1
            seq = self._collectives
            outs = []
            for r, p in enumerate(parts):
                out = self._part(r, contiguous_meta(shape, m.dtype, self._dev), m.dtype)
                self._issue(r, (W.COLLECT, how, p.id, out.id, seq, m.dtype))
                outs.append(out)
            self._after(0, sum(_nbytes(self.meta(p)) for p in parts))
            return outs

    def _sliced(self, parts: list, how: tuple) -> list:
        """A reduce-scatter (``("sum", j)``) or an all-to-all (``("cat", i, j)``): each
        rank's command names its own slice along j (the outputs' shapes differ)."""
        from ..sbp import split_sizes, split_starts

        with self._lock:
            self._live()
            metas = [self.meta(p) for p in parts]
            j, n = how[-1], metas[0].shape[how[-1]]
            starts, sizes = split_starts(n, self.size), split_sizes(n, self.size)
            self._collectives += 1
            seq = self._collectives
            outs = []
            for r, p in enumerate(parts):
                shape = list(metas[r].shape)
                shape[j] = sizes[r]
                if how[0] == "cat":
                    shape[how[1]] = sum(m.shape[how[1]] for m in metas)
                dtype = metas[r].dtype
                out = self._part(r, contiguous_meta(tuple(shape), dtype, self._dev), dtype)
                mine = (*how[:-1], (j, starts[r], sizes[r]))
                self._issue(r, (W.COLLECT, mine, p.id, out.id, seq, dtype))
                outs.append(out)
            self._after(0, sum(_nbytes(m) for m in metas))
            return outs


def _read_now(impl: Any, fn: Any, name: str) -> Any:
    """``fn`` over a host tensor's values to put them: here and now where nothing is
    pending on them (a put waits for them anyway: a hop to a pool thread of the runtime
    and back would only add its latency, long while the workers keep the cores busy), as
    one of the runtime's inline calls (under its lock, so a write another thread issues
    is ordered before or after it, never during), else through ``read`` once the work
    writing them is done."""
    blob = impl.blob
    if blob.backend.host_memory and blob.allocated and impl.meta.shape is not None:
        got: list = []

        def run(_: Any) -> None:
            try:
                got.append((True, fn(impl.array())))
            except BaseException as e:  # noqa: BLE001 - raised here, below
                got.append((False, e))

        stream = current_stream(blob.backend)
        if get_vm().run_inline(stream, (blob,), (), 0, name, run, None) and got:
            ok, value = got[0]
            if not ok:
                raise value
            return value
    return read(impl, fn, name)


def _rank_error(actor: str, piece: None, original: BaseException) -> ActorError:
    """The ActorError of a rank's worker (``actor``: the rank and its placement), in the
    words of ranks rather than of an actor graph's run."""
    err = ActorError(actor, piece, original)
    Exception.__init__(err, f"{actor}: {type(original).__name__}: {original}")
    err.__cause__ = original
    return err


def _nbytes(m: Any) -> int:
    """A part's bytes (a shape still unknown counts as large: its meta is asked for
    soon, and the worker should have started)."""
    if m is None or m.shape is None:
        return FLUSH_BYTES
    return numel(m.shape) * m.dtype.itemsize


def _pickled(cmds: list) -> bytes:
    """A batch of commands pickled; a command whose arguments do not pickle is replaced by
    one that leaves its outputs holding the error (raised when they are read)."""
    try:
        return pickle.dumps(cmds, protocol=5)
    except Exception:  # noqa: BLE001 - found command by command below
        pass
    fixed = []
    for c in cmds:
        try:
            pickle.dumps(c, protocol=5)
            fixed.append(c)
        except Exception as e:  # noqa: BLE001 - kept on the outputs
            what = f"op {getattr(c[1], 'name', c[1])!r}" if c[0] == W.CALL else f"{c[1]}()"
            if c[0] == W.RUN:
                what = f"{getattr(c[1], '__qualname__', c[1])}()"
            outs = W.made_by(c)
            err = TypeError(
                f"{what} on process ranks: its arguments do not pickle "
                f"({type(e).__name__}: {e}), and a worker process needs them pickled; use "
                f"af.parallel.use_ranks('inline') for it"
            )
            fixed.append((W.POISON, outs, W.error_bytes(err)))
    return pickle.dumps(fixed, protocol=5)


_GROUPS: dict = {}
# the kind of ranks a placement gets (use_ranks): "inline" (this process) or "processes"
KIND = ["inline"]
KINDS: dict = {"inline": InlineRanks, "processes": ProcessRanks}


_HERE = threading.local()  # this thread's kind of ranks while ``ranks_here`` says one


def ranks_of(placement: Placement) -> Ranks:
    """The ranks running ``placement`` in the current world (made once per placement, and
    again after they were closed)."""
    kind = getattr(_HERE, "kind", None) or KIND[0]
    key = (kind, placement)
    g = _GROUPS.get(key)
    if g is None:
        g = _GROUPS[key] = KINDS[kind](placement)
    return g


class ranks_here:
    """``use_ranks`` for the calling thread only, for the block (what the library itself
    uses: another thread's choice, or the process's, is left as it is)."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(
                f"ranks_here: kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
            )
        self.kind = kind

    def __enter__(self) -> ranks_here:
        self.before = getattr(_HERE, "kind", None)
        _HERE.kind = self.kind
        return self

    def __exit__(self, *exc: Any) -> None:
        _HERE.kind = self.before


class use_ranks:
    """Which kind of ranks a placement runs on from now: ``"inline"`` (the default: every
    rank's parts in this process, computed one rank after another), ``"processes"``
    (each rank a kept worker process, computing in parallel) or ``"ray"`` (each rank a Ray
    actor, on this machine or spread over a Ray cluster's nodes: ``ray_ranks``). A plain
    call sets it; as a context manager, the kind before comes back at the end of the
    block. Global tensors keep the ranks they were made on (conversions within their
    placement too); an op on tensors of one placement held by different ranks brings them
    onto one (the largest's, through this process), so a backward after the block stays on
    the process ranks.

    Example: ``with af.parallel.use_ranks("processes"): ...``"""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(
                f"use_ranks: kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
            )
        self.kind, self.before = kind, KIND[0]
        KIND[0] = kind

    def __enter__(self) -> use_ranks:
        return self

    def __exit__(self, *exc: Any) -> None:
        KIND[0] = self.before
