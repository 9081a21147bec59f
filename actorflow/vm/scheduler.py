"""The VM: accepts instructions from any thread and runs them on an asyncio event loop.

- Ordering comes from ``deps.record`` (operands and stream order); nothing polls: kernel
  completion arrives on the loop through ``call_soon_threadsafe`` (CPU worker futures, and
  a CUDA device's driver events: ``Event.then``, see ``_dispatch_device``) or
  ``call_later`` (the null device's simulated time).
- An instruction whose predecessors are all done when it is issued, and whose cost is tiny,
  runs inline on the issuing thread: a thread hop would cost more than the kernel.
- Everything else goes to the ready queue; the loop is woken once per batch of submissions,
  runs tiny kernels itself and sends larger ones to CPU worker threads, splitting large
  elementwise kernels across cores.
- On a device whose driver orders the work (cuda, ``Stream.launches_ahead``), an instruction
  is issued on its driver stream as soon as its predecessors on the device are issued
  there, not completed, where the stream or the device's memory links them (a link through
  host memory waits for the completion: ``deps.py``; ``_dispatch_device``): a chain of
  dependent ops is queued on the device while the first still runs, and a dependency across
  streams is a wait on an event, on the device. It still completes after its predecessors
  (``_settle_device``), so waits and ``synchronize`` see the same order as on the CPU. A
  dead blob's block is freed once its uses are issued, stream-ordered: the caching allocator
  reuses it only after them. A kernel fault fails the work issued after it on its driver
  stream (or waiting on its events) with the first error.
- ``submit`` blocks the caller while ``max_in_flight`` instructions are unfinished (issued
  ahead on a device counts as unfinished).
- A failing kernel poisons the blobs it writes; the error surfaces at the next sync point.
  Two exceptions (``deps.py``): an op call that ran whole and raised InvalidInputError (it
  checks its inputs before writing) leaves the blobs it both reads and writes as they were,
  with the error only noted on them (reported once, at their next read or synchronize);
  and an op call that overwrites a poisoned blob entirely, without reading it, clears it.
- ``wait`` and ``synchronize`` wait on its instructions under its lock; the kernel errors a
  sync point raises are kept by its ``errors`` (``sync.py``). Runs of elementwise op calls
  are formed by its ``runs`` (``runs.py``) and complete here (``_finish_run``); on a
  device (cuda), a run is issued as one launch of a generated kernel (``_issue_run``) and
  its members complete as device instructions do.
- While ``af.profile()`` is on, ``profiler`` (``profiler.py``) sees every kernel issued, run
  inline or cut into slices; off, it is None and costs one test per instruction.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import threading
import time
import weakref
from collections import deque
from functools import partial
from time import perf_counter
from typing import Any

from numpy import ndarray as _ND

from ..backends.base import on_memory_pressure
from ..errors import KernelError, VMError
from ..eventloop import start_loop_thread, stop_loop_thread
from ..tensor.blob import RELEASED, Blob
from .deps import (
    RAN_ON_FAILED,
    error_to_run,
    failed_before,
    first_error,
    launched,
    record,
    settled,
    wrote_nothing,
)
from .instruction import OP_CALL, OUTPUTS, RELEASE, Instruction
from .instruction import Named as _Named
from .opcall import ZeroCheck, allocate, as_fresh, call_fresh, device_call_op, kernel_error, run_op
from .release import collect
from .run_cuts import ELEMENTWISE
from .runs import Runs
from .sync import KeptErrors
from .workers import Countdown, Workers

# the VM's loop, its thread and its workers before they are made (typed as made: see VM)
_NOT_STARTED: Any = None


class VM:
    """The virtual machine. One per process: ``actorflow.vm.get_vm()``. Its components
    own their own state: ``errors`` (the kernel errors kept for the next synchronize,
    ``sync.py``), ``runs`` (runs of elementwise op calls, ``runs.py``), the CPU workers."""

    def __init__(self, workers: int | None = None):
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._ready: deque = deque()
        self._wake_pending = False
        self._draining = False  # inside _drain (loop thread only)
        # made on the first wake (_start_loop), None before it and after close: typed as
        # made, for the code that runs once they are
        self._loop: asyncio.AbstractEventLoop = _NOT_STARTED
        self._thread: threading.Thread = _NOT_STARTED
        self._pool: Workers = _NOT_STARTED
        self.workers = workers or os.cpu_count() or 1
        self.max_in_flight = 40_000
        self._rng: random.Random | None = None  # test hook: seeded random dispatch order
        self.inline_max_cost = 1 << 16  # elements touched; below this run without a hop
        self.parallel_min_cost = 1 << 18  # elementwise kernels above this are split
        self.loop_share = 0.6  # of a split kernel, run by the loop thread
        self.issued = self.completed = 0  # through submit
        self.inlined = 0  # through run_inline (issued and completed at once)
        self.runs = Runs(self)  # runs of elementwise op calls (runs.py)
        self._blocked = 0
        self.errors = KeptErrors()  # kernel errors since the last synchronize
        # until a blob is poisoned, skip the poison checks; poisoned blobs alive by id, so
        # the checks stop again once none is (``_forget_errors``)
        self._any_error = False
        self._poisoned: dict = {}
        self._poison_lock = threading.Lock()
        self._max_delay = 0.0  # test hook: random delay before each kernel
        # while af.profile() is on: its Recorder (Any: profiler.py imports this module)
        self.profiler: Any = None
        self.device_waits = 0  # waits on another driver stream's event (devices)
        self._gated: list = []  # (device instr, fault) whose predecessor completed
        self._faults: dict = {}  # a driver's fault (its exception) -> its KernelError
        self._device_queue: deque = deque()  # (instr, event) completed, for the loop
        self._device_wake = False  # a _device_completions call is pending

    # -- submission ---------------------------------------------------------------------
    def submit(self, instr: Instruction) -> None:
        """Issues ``instr``: it runs once its predecessors are done, in stream order."""
        if RELEASED:
            self.collect_releases()
        with self._lock:
            if self.issued - self.completed >= self.max_in_flight:
                self._wait_for_room()
            self.issued += 1
            if self.profiler is not None:
                self.profiler.issue(instr)
            if record(instr):
                return
            if instr.cost > self._inline_limit or instr.stream.simulated:
                self._ready.append(instr)
                if not self._wake_pending:
                    self._wake()
                return
            # Inline: a tiny kernel with nothing to wait for runs here and now, under the
            # lock (kernels never call back into the VM). Nothing issued can depend on it
            # yet except through this lock, so completing it readies nothing.
            self._execute(instr)
            self._complete(instr)

    def run_inline(
        self, stream, consts: tuple, muts: tuple, cost: int, name: str, fn, args
    ) -> bool:
        """The fast path of ``submit``: if nothing the work touches is pending (every write
        of ``consts``, every use of ``muts``, the stream's last instruction), runs
        ``fn(args)`` now and returns True; else returns False and the caller submits an
        Instruction. A finished instruction constrains no later one, so running it here
        leaves no dependence record behind: the ordering is the same as ``submit``'s."""
        if cost > self._inline_limit or stream.simulated:
            return False
        if RELEASED:
            self.collect_releases()
        lock = self._lock
        lock.acquire()  # (not ``with``: this runs once per op, and ``with`` costs more)
        try:
            if not settled(stream, consts, muts):
                return False
            if self._any_error and not self._poisoned:
                self._forget_errors()
            err = error_to_run(consts, muts, args) if self._any_error else None
            if self.profiler is not None:
                fn = self.profiler.inline(name, stream, consts, muts, fn)
            if err is None:
                try:
                    fn(args)
                except BaseException as e:
                    self._inline_failed(name, stream, muts, args, e)
            else:
                self._poison(muts, err)
            self.inlined += 1  # counted as issued and completed too (see stats)
        finally:
            lock.release()
        return True

    def run_fresh(
        self, stream, x, y, out, cost: int, name: str, fresh, attrs, dtype, alloc
    ) -> bool:
        """``run_inline`` of ``opcall.call_fresh`` for an op call on ``x`` (and ``y`` where
        not None) making one fresh output blob ``out`` (no record yet: nothing can be pending
        on it): the same checks and the same call (``deps.settled``, ``opcall.fresh_into``),
        unrolled for one or two inputs. Returns False where the call must be submitted
        instead."""
        if (
            RELEASED
            or self._any_error
            or self.profiler is not None
            or cost > self._inline_limit
            or stream.simulated
        ):
            if self._any_error and not self._poisoned:
                self._forget_errors()
            ins: tuple
            consts: tuple
            if y is None:
                ins, consts = (x,), (x.blob,)
            else:
                ins, consts = (x, y), (x.blob, y.blob)
            return self.run_inline(
                stream,
                consts,
                (out,),
                cost,
                name,
                call_fresh,
                (fresh, ins, out, attrs, dtype, alloc),
            )
        lock = self._lock
        lock.acquire()
        try:
            if self._any_error:  # (an input poisoned since the look above: submitted,
                return False  # the poison passes on there)
            t = stream.tail
            if t is not None and not t.done:
                return False
            b = x.blob
            w = b.last_write
            if w is not None and not w.done:
                return False
            a = b.array if x.base is None else x.array()
            if y is None:
                arrays = [a]
            else:
                b = y.blob
                w = b.last_write
                if w is not None and not w.done:
                    return False
                arrays = [a, b.array if y.base is None else y.array()]
            try:
                r = fresh(arrays, attrs, dtype)
                if (
                    r.__class__ is not _ND
                    or r.dtype is not dtype
                    or (r.ndim > 1 and not r.flags.c_contiguous)
                ):
                    r = as_fresh(r, dtype)
            except BaseException as e:
                self._inline_failed(name, stream, (out,), None, e)
            else:
                out.array = r
                out.allocated = True
                n = out.nbytes
                if n:
                    log = alloc.log
                    log.append(n)
                    if len(log) > alloc.fold_at:
                        alloc.fold()
            self.inlined += 1
        finally:
            lock.release()
        return True

    def _inline_failed(self, name: str, stream, muts: tuple, args, e: BaseException) -> None:
        """An inline call raised ``e`` (caller holds the lock): its outputs are poisoned and
        the error kept for the next sync point; an interrupt (not an ``Exception``) is counted
        and raised on (the caller is raising it already)."""
        if isinstance(e, Exception):
            err = self._kernel_error(_Named(name, stream), e, wrote_nothing(e, muts, args))
            self._poison(muts, err)
            return
        err = self._kernel_error(_Named(name, stream), e)
        self._poison(muts, err)
        for b in muts:
            b.last_write = b.reads = None
        self.inlined += 1
        raise e

    def _wait_for_room(self) -> None:
        # caller holds the lock; the loop thread never blocks here
        if threading.current_thread() is self._thread:
            return
        self._blocked += 1
        low = self.max_in_flight * 3 // 4
        while self.issued - self.completed > low:
            self._room.wait()
        self._blocked -= 1

    def collect_releases(self, submit_pending: bool = True) -> bool:
        """Frees blobs whose last tensor is gone (see ``release.collect``)."""
        return collect(self, submit_pending)

    # -- execution ----------------------------------------------------------------------
    def _execute(self, instr: Instruction) -> None:
        """Runs the instruction's work on the current thread, turning failures into a
        KernelError that poisons the blobs it writes (see the module doc)."""
        err = (
            error_to_run(instr.consts, instr.muts, instr.args if instr.kind == OP_CALL else None)
            if self._any_error and instr.kind != RELEASE
            else None
        )
        if err is None:
            try:
                instr.run(instr)
            except Exception as e:  # noqa: BLE001 - surfaced at the next sync point
                err = self._kernel_error(
                    instr, e, instr.kind == OP_CALL and wrote_nothing(e, instr.muts, instr.args)
                )
            except BaseException as e:  # Ctrl-C on an inline kernel: fail it, then let it go
                self._fail(instr, self._kernel_error(instr, e))
                raise
        if err is not None:
            self._fail(instr, err)

    def _fail(self, instr, err) -> None:
        instr.error = err
        self._poison(instr.muts, err)

    def _poison(self, blobs, err) -> None:
        """Gives each blob the error ``err`` (from any thread): the poison checks are on
        while one of them lives with it (``_forget_errors``)."""
        poisoned = self._poisoned
        with self._poison_lock:
            self._any_error = True
            for b in blobs:
                b.error = err
                k = id(b)
                poisoned[k] = weakref.ref(b, partial(_forget, poisoned, k))

    def _forget_errors(self, scan: bool = False) -> None:
        """Turns the poison checks off again once no blob given an error is alive
        (``scan``: or alive with its error cleared since, overwritten whole, or released,
        its tensor gone while an instruction, the stream's last, still holds it: looked at
        one by one, at a synchronize). ``_poison`` sets the flag under the same lock, so a
        blob poisoned meanwhile keeps it on."""
        poisoned = self._poisoned
        if scan and poisoned:
            with self._poison_lock:
                # (a copy in one C call: a blob dying meanwhile, on any thread or in the
                # garbage collector, takes its entry out through its weakref's callback)
                for k, r in poisoned.copy().items():
                    b = r()
                    if b is None or b.error is None or b.released:
                        if poisoned.get(k) is r:
                            poisoned.pop(k, None)
        if not poisoned:
            with self._poison_lock:
                if not poisoned:
                    self._any_error = False

    def _complete(self, instr: Instruction) -> None:
        # caller holds the lock
        instr.done = True
        self.completed += 1
        for d in instr.dependents:
            d.pending -= 1
            if d.pending == 0 and not d.done:  # (done: a member of the same run)
                self._ready.append(d)
        instr.dependents = []
        instr.next = None
        instr.args = instr.run = instr.split = None
        instr.consts = instr.muts = instr.mut2 = ()
        if self._blocked:
            self._room.notify_all()
        if instr.waiters:
            waiters, instr.waiters = instr.waiters, None
            for w in waiters:
                try:
                    w()
                except Exception:  # noqa: BLE001 - a waiter's loop closed; others go on
                    pass

    # -- the event loop -----------------------------------------------------------------
    def _wake(self) -> None:
        # caller holds the lock
        self._wake_pending = True
        if self._loop is None:
            self._start_loop()
        self._loop.call_soon_threadsafe(self._drain)

    def _start_loop(self) -> None:
        self._pool = Workers(self.workers)
        self._loop, self._thread = start_loop_thread("actorflow-vm")

    def _drain(self) -> None:
        """On the loop: dispatches every ready instruction (those it readies too). Kernels
        finished while draining only complete; this loop picks up what they make ready, so
        a long dependent chain never recurses."""
        if self._draining:
            return
        self._draining = True
        try:
            self._drain_loop()
        finally:
            self._draining = False
        if RELEASED:
            self.collect_releases()

    def _drain_loop(self) -> None:
        lock = self._lock
        while True:
            if RELEASED:  # return dead blocks to the cache while they are still hot
                self.collect_releases()
            with lock:
                self._wake_pending = False
                if not self._ready:
                    break
                batch = list(self._ready)
                self._ready.clear()
            if self._rng is not None:
                self._rng.shuffle(batch)
                for instr in batch:
                    self._loop.call_later(
                        self._rng.uniform(0.0, self._max_delay), self._dispatch_guarded, instr, True
                    )
                continue
            for instr in batch:
                self._dispatch_guarded(instr, False)

    def _dispatch_guarded(self, instr: Instruction, force_pool: bool) -> None:
        try:
            self._dispatch(instr, force_pool)
        except Exception as e:  # noqa: BLE001 - e.g. a null latency function that raised
            if not instr.done:
                self._fail(instr, self._kernel_error(instr, e))
                self._finish(instr)

    def _dispatch(self, instr: Instruction, force_pool: bool) -> None:
        stream = instr.stream
        if stream.simulated:
            if stream.launches_ahead:  # a device whose driver runs the work
                self._dispatch_device(instr)
                return
            nbytes = sum(b.nbytes for b in instr.muts)
            delay = stream.backend.kernel_time(instr.name, nbytes)
            if not delay >= 0:
                raise ValueError(
                    f"the null device's latency for '{instr.name}' is {delay!r}; "
                    f"set_null_latency needs seconds >= 0"
                )
            self._execute(instr)
            self._loop.call_later(delay, self._finish_simulated, instr, perf_counter() + delay)
            return
        if not force_pool and instr.cost <= self._inline_max_cost:
            self._execute(instr)
            self._finish(instr)
            return
        pieces = None
        if instr.split is not None and instr.cost >= self.parallel_min_cost:
            if instr.next is not None and self.runs.dispatch(instr):
                return
            if self.workers > 1:
                pieces = self._split(instr)
        if pieces is None:
            self._pool.submit(self._execute_then_finish, instr)
            return
        if not pieces:  # the split failed (the error is recorded)
            self._finish(instr)
            return
        # Workers take all slices but the first, which the loop thread runs itself while
        # they do (one thread hop fewer); the last slice to finish completes the op.
        countdown = Countdown(len(pieces))
        for piece in pieces[1:]:
            self._pool.submit(self._run_piece, instr, piece, countdown, False)
        if force_pool:
            self._pool.submit(self._run_piece, instr, pieces[0], countdown, False)
        else:
            self._run_piece(instr, pieces[0], countdown, True)

    def _dispatch_device(self, instr: Instruction) -> None:
        """On the loop: issues ``instr``'s work on its driver stream (a CUDA device's) once
        every predecessor on the same device is issued there (``deps.py``): first a wait on
        the event of each one issued on another driver stream (on the device: the host goes
        on), then the work, then an event recorded after it, which releases the dependents
        on the device (``deps.launched``) at once. Its completion reaches the loop when that
        event completes: the driver's ``Event.then`` hands it over (``call_soon_threadsafe``,
        no polling; ``_finish_device``). The backend learns which driver stream used which
        blocks (``end_issue``). A RELEASE frees its blob when every use is issued: the
        caching allocator orders the block's reuse after them on the device (``deps.py``).
        Copies across the host boundary are joined to the stream by events it waits on, on
        the device. An elementwise op call with calls queued behind it may lead a run, issued
        as one launch (``runs.device_run``, ``_issue_run``); a member of a run issued
        already is skipped here."""
        if instr.done or instr.issued is not None:
            return  # a member of a run, issued with it
        if instr.split is ELEMENTWISE and instr.next is not None:
            run = self.runs.device_run(instr)
            if run is not None:
                self._issue_run(*run)
                return
        if instr.kind == RELEASE:
            self._execute(instr)
            with self._lock:
                instr.issued = (None, None)  # nothing on a driver stream
                launched(instr, self._ready)
            self._settle_device(instr, None)  # completes after the uses
            return
        ev: Any = None  # (the driver's Event, once issued)
        dstream: Any = None
        backend = instr.stream.backend
        try:
            dstream = backend.issue_on(instr.stream)
            if instr.after:
                self._join(instr, dstream)
            if instr.run is run_op:  # (profiled, its wrapper runs the device's op call)
                instr.run = _run_on_device
            self._execute(instr)
            if instr.error is None:
                ev = dstream.record()
        except Exception as e:  # noqa: BLE001 - e.g. the driver closed: surfaced at a sync
            if instr.error is None:
                self._fail(instr, self._kernel_error(instr, e))
        backend.end_issue(*(() if instr.error is not None else (instr.consts, instr.muts)))
        if instr.error is not None:  # nothing was issued to wait for
            self._settle_device(instr, None)
            return
        # the work is on the stream: the host's tensors go now, so that a dead one's block is
        # freed (stream-ordered) while the work is still queued, not at its completion
        instr.args = instr.run = None
        with self._lock:
            instr.issued = (dstream, ev)
            launched(instr, self._ready)
            more = bool(self._ready) and not self._wake_pending
        ev.then(partial(self._device_done, instr, ev))
        if more:
            self._drain()

    def _issue_run(self, members: list, writers: list, launch, keys: list) -> None:
        """On the loop: issues a run of device op calls (``runs.device_run``) as
        ``dispatch_device`` issues one, with ``launch`` (one generated kernel) for all their
        work: ``keys`` name its operands' memory (a blob, or a view's ``(blob, meta)``), the
        outputs of ``writers`` first, allocated here (the other members' outputs are dead
        intermediates: no memory). Every member is issued at once, with the one
        event recorded after the launch, and completes in issue order when it completes;
        a fault (or an issue that failed) fails every member with the one error, named
        after the run's ops (the launch's name, which the head takes)."""
        head = members[0]
        backend = head.stream.backend
        ev: Any = None  # (the driver's Event, once issued)
        dstream: Any = None
        err: KernelError | None = None
        try:
            dstream = backend.issue_on(head.stream)
            for m in members:
                if m.after:
                    self._join(m, dstream)
            for m in writers:
                allocate(m.args[OUTPUTS], m.name)
            arrays = []
            for k in keys:
                b = k if k.__class__ is Blob else k[0]
                arrays.append(b.array.darray)
            launch.issue(dstream, arrays)
            ev = dstream.record()
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: surfaced at a sync
            err = self._kernel_error(_Named(launch.name, head.stream), e)
        if err is None:
            backend.end_issue(*[blobs for m in members for blobs in (m.consts, m.muts)])
        else:
            backend.end_issue()
            dstream = None  # nothing was issued to wait for
        head.name = launch.name  # a fault on the device is the run's: named after its ops
        for m in members:
            m.args = m.run = None
            if err is not None:
                self._fail(m, err)
        with self._lock:
            for m in members:
                m.issued = (dstream, ev)
            for m in members:
                launched(m, self._ready)
            more = bool(self._ready) and not self._wake_pending
        if err is not None:
            for m in members:
                self._settle_device(m, None)  # each after its predecessors
            return
        for m in members:
            ev.then(partial(self._device_done, m, ev))
        if more:
            self._drain()

    def _join(self, instr, dstream) -> None:
        # the device waits for each predecessor still running on another driver stream
        # (the same driver stream runs in order; a completed one needs nothing, nor a
        # RELEASE: it has no work on a stream)
        for p in instr.after:
            if not p.done:  # (device work completes on the loop: no race)
                issued = p.issued
                if issued is not None and issued[1] is not None and issued[0] is not dstream:
                    dstream.wait(issued[1])
                    self.device_waits += 1

    def _finish_device(self, instr: Instruction, ev) -> None:
        # on the loop, once the event after the instruction's work completed: the driver
        # stream's sticky error (a kernel fault) fails it as a CPU kernel's exception would
        try:
            ev.query()
            fault = None
        except Exception as e:  # noqa: BLE001 - surfaced at the next sync point
            fault = e
        check = instr.result
        if check.__class__ is ZeroCheck:  # an eager integer division's zero flag: only
            instr.result = None  # this op fails (and what reads its outputs)
            if fault is None and instr.error is None:
                zero = check.error()
                if zero is not None:
                    self._fail(instr, self._kernel_error(instr, zero))
        self._settle_device(instr, fault)

    def _device_done(self, instr, ev) -> None:
        # on a driver thread, when ``ev`` completed: queue it for the loop, waking the loop
        # only when no wake-up is pending (a stream that runs far behind its issue completes
        # work in bursts; one hop carries the burst). The loop clears the flag before it
        # takes the queue, so an entry added after it looked always finds the flag clear.
        self._device_queue.append((instr, ev))
        if not self._device_wake:
            self._device_wake = True
            self._loop.call_soon_threadsafe(self._device_completions)

    def _device_completions(self) -> None:
        # on the loop: every device instruction whose event completed, in that order
        self._device_wake = False
        q = self._device_queue
        while q:
            instr, ev = q.popleft()
            self._finish_device(instr, ev)

    def _settle_device(self, instr: Instruction, fault) -> None:
        """Completes device ``instr`` (its event completed with ``fault``, the driver's
        error or None) once every predecessor it was issued ahead of has completed, and then
        the ones that were waiting for it to. The poison rules: an instruction whose
        predecessor in ``after`` failed after it was issued, poisoning a blob it reads or
        writes, fails with that error whatever its own work did (``deps.failed_before``);
        and a fault is sticky on its
        driver stream, and a stream that waits on an event recorded after it inherits it, so
        the work issued there after the faulting kernel never runs; each such instruction
        fails with the first error, the faulting kernel's (``_fault_error``), poisoning what
        it writes, and work issued from then on goes to fresh driver streams (the backend's
        ``reset``)."""
        todo = [(instr, fault)]
        while todo:
            instr, fault = todo.pop()
            gate = None
            for p in instr.after or ():
                if not p.done:
                    gate = p
                    break
            if gate is not None:  # completes once that one has (a waiter)
                with self._lock:
                    self._add_waiter(gate, partial(self._gated.append, (instr, fault)))
                continue
            if fault is None:
                if instr.error is None and instr.kind != RELEASE:
                    err = failed_before(instr)
                    if err is not None:
                        self._fail(instr, err)
                        instr.result = RAN_ON_FAILED
            else:
                if instr.error is None:
                    self._fail(instr, self._fault_error(instr, fault))
                dstream = instr.issued[0] if instr.issued is not None else None
                backend = instr.stream.backend
                if dstream is not None and backend.driver_stream(instr.stream) is dstream:
                    backend.reset()
            with self._lock:
                instr.after = instr.issued = None
                self._complete(instr)
                if self._gated:
                    todo += self._gated
                    self._gated.clear()
                more = bool(self._ready) and not self._wake_pending
            if more:
                self._drain()

    def _fault_error(self, instr, fault):
        """The error a device fault fails ``instr`` with: the first error, made once per
        fault. The same fault (the driver's sticky error: one exception object) seen again,
        or a predecessor it was issued after that failed by one, gives that error; else a
        new one, named after ``instr`` (the kernel that faulted)."""
        orig = getattr(fault, "original", fault)
        err = self._faults.get(orig)
        if err is not None:
            return err
        known = self._faults.values()
        for p in instr.after or ():
            if p.error is not None and p.error in known:
                return p.error
        err = self._kernel_error(instr, orig)
        if len(self._faults) >= 64:
            del self._faults[next(iter(self._faults))]
        self._faults[orig] = err
        return err

    def _execute_then_finish(self, instr) -> None:
        # on a worker: run, then hand completion to the loop
        self._execute(instr)
        self._loop.call_soon_threadsafe(self._finish, instr)

    def _run_piece(self, instr, piece, countdown, on_loop: bool) -> None:
        try:
            piece()
        except BaseException as e:  # noqa: BLE001 - surfaced at the next sync point
            with countdown.lock:  # one error per op: slices failing at once raced here
                if instr.error is None:
                    self._fail(instr, self._kernel_error(instr, e))
        if countdown.finish_one():
            if on_loop:
                self._finish(instr)
            else:
                self._loop.call_soon_threadsafe(self._finish, instr)

    def _split(self, instr):
        if self._any_error and first_error(instr) is not None:
            return None
        try:
            pieces = instr.split(instr, self.workers, self.loop_share)
            return pieces if self.profiler is None else self.profiler.pieces(instr, pieces)
        except BaseException as e:  # noqa: BLE001 - e.g. out of memory while allocating
            self._fail(instr, self._kernel_error(instr, e))
            return []

    def _finish_simulated(self, instr, end: float) -> None:
        # uvloop's timers count whole milliseconds from a cached loop time, so one may fire
        # up to 1 ms early: a simulated kernel ends once its latency has passed, not before
        left = end - perf_counter()
        if left > 0:
            self._loop.call_later(left, self._finish_simulated, instr, end)
        else:
            self._finish(instr)

    def _finish(self, instr: Instruction) -> None:
        with self._lock:
            self._complete(instr)
            more = bool(self._ready) and not self._wake_pending
        if more:
            self._drain()

    def _finish_run(self, members: list) -> None:
        """On the loop, once every slice of a run (``runs.py``) is done: a member whose
        input was poisoned by a member that failed fails too (as it would have run alone),
        releases free their blobs, and the members complete in issue order."""
        for m in members:
            if m.kind == RELEASE:
                self._execute(m)
            elif self._any_error and m.error is None:
                err = first_error(m)
                if err is not None:
                    self._fail(m, err)
        with self._lock:
            for m in members:
                m.done = True  # so completing one never readies another
            for m in members:
                self._complete(m)
            more = bool(self._ready) and not self._wake_pending
        if more:
            self._drain()

    # -- waiting -------------------------------------------------------------------------
    def wait(self, instr: Instruction, timeout: float | None = None) -> None:
        """Blocks the calling thread until ``instr`` is done."""
        with self._lock:
            if instr.done:
                return
            if threading.current_thread() is self._thread:
                raise VMError(
                    "cannot wait for a result on the actorflow VM thread (inside a "
                    "kernel or a completion callback); wait from user code instead"
                )
            ev = threading.Event()
            self._add_waiter(instr, ev.set)
        if not ev.wait(timeout):
            raise TimeoutError(f"timed out after {timeout} s waiting for {instr!r}")

    async def wait_async(self, instr: Instruction) -> None:
        """Awaits ``instr`` without blocking the running event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if instr.done:
                return
            fut = loop.create_future()
            waiter = lambda: loop.call_soon_threadsafe(_set_done, fut)  # noqa: E731
            self._add_waiter(instr, waiter)
        try:
            await fut
        finally:
            if not fut.done():  # cancelled: forget this waiter
                with self._lock:
                    if instr.waiters and waiter in instr.waiters:
                        instr.waiters.remove(waiter)

    @staticmethod
    def _add_waiter(instr, fn) -> None:
        if instr.waiters is None:
            instr.waiters = [fn]
        else:
            instr.waiters.append(fn)

    def tails(self) -> list:
        """The last instruction issued on every stream that is not done yet."""
        from ..backends import loaded_backends

        out = []
        with self._lock:
            for backend in loaded_backends():
                for s in backend.streams():
                    t = s.tail
                    if t is not None and not t.done:
                        out.append(t)
        return out

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits (at most ``timeout`` seconds in all) for everything issued so far, then
        raises the first kernel error not yet reported (and forgets the rest)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.tails():
            self.wait(t, None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.collect_releases()
        if self._any_error:
            self._forget_errors(scan=True)
        self.errors.raise_unreported()

    def synchronize_quietly(self) -> None:
        """Waits for everything issued so far; kernel errors stay for the next sync point."""
        for t in self.tails():
            self.wait(t)

    async def synchronize_async(self) -> None:
        for t in self.tails():
            await self.wait_async(t)
        self.collect_releases()
        self.errors.raise_unreported()

    # -- kernel errors (from any thread, on the error path only) ------------------------
    def _kernel_error(self, instr, e, intact: bool = False):
        # instr: anything with .name and .stream. The traceback is kept as text only: its
        # frames hold the kernel's arguments, which would pin their memory for as long as
        # the error lives (on the poisoned blobs, the stream's last instruction...).
        # intact: the op wrote nothing (deps.wrote_nothing); _fail only notes it then.
        # An interrupt (Ctrl-C, SystemExit: not an Exception) is raised to the caller where
        # it happened; the error made of it only poisons what the kernel was writing (its
        # values are unknown) and is never raised again by synchronize().
        err = kernel_error(instr.name, instr.stream.device, e, intact)
        if err is e:
            return err
        self._any_error = True
        if isinstance(e, Exception):
            self.errors.keep(err)  # (its own lock: callers may hold the VM's)
        else:
            err._reported = True  # the caller is raising the interrupt itself
        return err

    # -- test hooks and settings --------------------------------------------------------
    @property
    def inline_max_cost(self) -> int:
        """Instructions touching at most this many elements run on the spot, without a hop
        to the loop (-1: never)."""
        return self._inline_max_cost

    @inline_max_cost.setter
    def inline_max_cost(self, value: int) -> None:
        self._inline_max_cost = value
        # what submit and run_inline compare with: one check for both the setting and the
        # random-dispatch test hook, which sends everything through the loop
        self._inline_limit = value if self._rng is None else -1

    @property
    def fuse_max(self) -> int:
        """Members per run of elementwise op calls; 0 turns runs off (``runs.fuse_max``)."""
        return self.runs.fuse_max

    @fuse_max.setter
    def fuse_max(self, value: int) -> None:
        self.runs.fuse_max = value

    @property
    def fusion_tile_bytes(self) -> int:
        """Bytes of one output tile a worker computes at a time in a run
        (``runs.tile_bytes``)."""
        return self.runs.tile_bytes

    @fusion_tile_bytes.setter
    def fusion_tile_bytes(self, value: int) -> None:
        self.runs.tile_bytes = value

    def set_test_hooks(self, seed: int | None = None, max_delay: float = 0.0) -> None:
        """With a seed: every instruction goes through the loop, ready ones are dispatched in
        a seeded random order after a random delay of up to ``max_delay`` seconds, and CPU
        kernels all run on worker threads. ``seed=None`` restores normal dispatch."""
        self.synchronize_quietly()
        with self._lock:
            self._rng = None if seed is None else random.Random(seed)
            self._max_delay = float(max_delay)
            self.inline_max_cost = self._inline_max_cost  # (the limit follows the hook)

    def stats(self) -> dict:
        with self._lock:
            return {
                "issued": self.issued + self.inlined,
                "completed": self.completed + self.inlined,
                "in_flight": self.issued - self.completed,
                "inlined": self.inlined,
                "fused": self.runs.ops,
                "fused_runs": self.runs.count,
                "elided": self.runs.elided,
                "unreported_errors": self.errors.unreported(),
            }

    def shutdown(self) -> None:
        """Stops the loop thread and the CPU workers (at exit)."""
        loop, thread, pool = self._loop, self._thread, self._pool
        if loop is None:
            return
        try:
            self.synchronize_quietly()
        except Exception:  # noqa: BLE001
            pass
        stop_loop_thread(loop, thread, timeout=5)
        pool.shutdown()
        self._loop = self._thread = self._pool = _NOT_STARTED


def _run_on_device(instr) -> None:
    instr.result = device_call_op(instr.args, instr.stream.backend.current)


def _set_done(fut) -> None:
    if not fut.done():
        fut.set_result(None)


_VM = VM()
atexit.register(_VM.shutdown)
on_memory_pressure(lambda: _VM.collect_releases(submit_pending=False))


def get_vm() -> VM:
    return _VM


def _forget(poisoned: dict, key: int, ref) -> None:
    # a poisoned blob died (weakref callback, any thread)
    if poisoned.get(key) is ref:
        poisoned.pop(key, None)
