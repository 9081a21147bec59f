"""The VM: accepts instructions from any thread and runs them on an asyncio event loop.

- Ordering comes from ``deps.record`` (operands and stream order); nothing polls: kernel
  completion arrives on the loop through ``call_soon_threadsafe`` (CPU worker futures) or
  ``call_later`` (the null device's simulated time).
- An instruction whose predecessors are all done when it is issued, and whose cost is tiny,
  runs inline on the issuing thread: a thread hop would cost more than the kernel.
- Everything else goes to the ready queue; the loop is woken once per batch of submissions,
  runs tiny kernels itself and sends larger ones to CPU worker threads, splitting large
  elementwise kernels across cores.
- ``submit`` blocks the caller while ``max_in_flight`` instructions are unfinished.
- A failing kernel poisons the blobs it writes; the error surfaces at the next sync point.
  Two exceptions (``deps.py``): an op call that ran whole and raised InvalidInputError (it
  checks its inputs before writing) leaves the blobs it both reads and writes as they were,
  with the error only noted on them (reported once, at their next read or synchronize);
  and an op call that overwrites a poisoned blob entirely, without reading it, clears it.
- While ``af.profile()`` is on, ``profiler`` (``profiler.py``) sees every kernel issued, run
  inline or cut into slices; off, it is None and costs one test per instruction.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import threading
from collections import deque
from time import perf_counter

from ..backends.base import on_memory_pressure
from ..eventloop import new_event_loop
from ..tensor.blob import RELEASED
from .deps import error_to_run, first_error, record, settled, wrote_nothing
from .fusion import Fusing
from .instruction import OP_CALL, RELEASE, Instruction, Named as _Named
from .release import collect
from .sync import Dropped, Waiting
from .workers import Countdown, Workers


class VM(Waiting, Fusing):
    """The virtual machine. One per process: ``actorflow.vm.get_vm()``."""

    def __init__(self, workers: int | None = None):
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._ready: deque = deque()
        self._wake_pending = False
        self._draining = False               # inside _drain (loop thread only)
        self._loop = None
        self._thread = None
        self._pool = None
        self.workers = workers or os.cpu_count() or 1
        self.max_in_flight = 40_000
        self._rng = None                    # test hook: seeded random dispatch order
        self.inline_max_cost = 1 << 16      # elements touched; below this run without a hop
        self.parallel_min_cost = 1 << 18     # elementwise kernels above this are split
        self.loop_share = 0.6                # of a split kernel, run by the loop thread
        self.issued = self.completed = 0    # through submit
        self.inlined = 0                    # through run_inline (issued and completed at once)
        self.fused = self.fused_runs = 0    # op calls run as members of runs, and the runs
        self.elided = 0                     # intermediates of runs that never got memory
        self._blocked = 0
        self._errors: deque = deque()       # kernel errors since the last synchronize: the
        self._errors_lock = threading.Lock()  # first MAX_KEPT_ERRORS, the rest only counted
        self._dropped = Dropped(self._errors_lock)
        self._any_error = False             # until a kernel fails, skip the poison checks
        self._max_delay = 0.0               # test hook: random delay before each kernel
        self.profiler = None                # while af.profile() is on: its Recorder (profiler.py)

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

    def run_inline(self, stream, consts: tuple, muts: tuple, cost: int, name: str, fn, args) -> bool:
        """The fast path of ``submit``: if nothing the work touches is pending (every write
        of ``consts``, every use of ``muts``, the stream's last instruction), runs
        ``fn(args)`` now and returns True; else returns False and the caller submits an
        Instruction. A finished instruction constrains no later one, so running it here
        leaves no dependence record behind: the ordering is the same as ``submit``'s."""
        if cost > self._inline_limit or stream.simulated:
            return False
        if RELEASED:
            self.collect_releases()
        with self._lock:
            if not settled(stream, consts, muts):
                return False
            err = error_to_run(consts, muts, args) if self._any_error else None
            if self.profiler is not None:
                fn = self.profiler.inline(name, stream, consts, muts, fn)
            if err is None:
                try:
                    fn(args)
                except Exception as e:  # noqa: BLE001 - surfaced at the next sync point
                    err = self._kernel_error(_Named(name, stream), e,
                                             wrote_nothing(e, muts, args))
                except BaseException as e:  # Ctrl-C: poison the outputs, then let it go
                    err = self._kernel_error(_Named(name, stream), e)
                    for b in muts:
                        b.error = err
                        b.last_write = b.reads = None
                    self.inlined += 1
                    raise
            if err is not None:
                for b in muts:
                    b.error = err
            self.inlined += 1          # counted as issued and completed too (see stats)
        return True

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
        err = (error_to_run(instr.consts, instr.muts, instr.args if instr.kind == OP_CALL
                            else None)
               if self._any_error and instr.kind != RELEASE else None)
        if err is None:
            try:
                instr.run(instr)
            except Exception as e:  # noqa: BLE001 - surfaced at the next sync point
                err = self._kernel_error(instr, e, instr.kind == OP_CALL
                                         and wrote_nothing(e, instr.muts, instr.args))
            except BaseException as e:  # Ctrl-C on an inline kernel: fail it, then let it go
                self._fail(instr, self._kernel_error(instr, e))
                raise
        if err is not None:
            self._fail(instr, err)

    @staticmethod
    def _fail(instr, err) -> None:
        instr.error = err
        for b in instr.muts:
            b.error = err

    def _complete(self, instr: Instruction) -> None:
        # caller holds the lock
        instr.done = True
        self.completed += 1
        for d in instr.dependents:
            d.pending -= 1
            if d.pending == 0 and not d.done:     # (done: a member of the same run)
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
        started = threading.Event()

        def main():
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(started.set)
            self._loop.run_forever()

        self._loop = new_event_loop()
        self._pool = Workers(self.workers)
        self._thread = threading.Thread(target=main, name="actorflow-vm", daemon=True)
        self._thread.start()
        started.wait()

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
            if RELEASED:          # return dead blocks to the cache while they are still hot
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
                    self._loop.call_later(self._rng.uniform(0.0, self._max_delay),
                                          self._dispatch_guarded, instr, True)
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
            nbytes = sum(b.nbytes for b in instr.muts)
            delay = stream.backend.kernel_time(instr.name, nbytes)
            if not delay >= 0:
                raise ValueError(f"the null device's latency for '{instr.name}' is {delay!r}; "
                                 f"set_null_latency needs seconds >= 0")
            self._execute(instr)
            self._loop.call_later(delay, self._finish_simulated, instr, perf_counter() + delay)
            return
        if not force_pool and instr.cost <= self._inline_max_cost:
            self._execute(instr)
            self._finish(instr)
            return
        pieces = None
        if instr.split is not None and instr.cost >= self.parallel_min_cost:
            if instr.next is not None and self._dispatch_run(instr):
                return
            if self.workers > 1:
                pieces = self._split(instr)
        if pieces is None:
            self._pool.submit(self._execute_then_finish, instr)
            return
        if not pieces:                       # the split failed (the error is recorded)
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

    def _execute_then_finish(self, instr) -> None:
        # on a worker: run, then hand completion to the loop
        self._execute(instr)
        self._loop.call_soon_threadsafe(self._finish, instr)

    def _run_piece(self, instr, piece, countdown, on_loop: bool) -> None:
        try:
            piece()
        except BaseException as e:  # noqa: BLE001 - surfaced at the next sync point
            with countdown.lock:    # one error per op: slices failing at once raced here
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

    def set_test_hooks(self, seed: int | None = None, max_delay: float = 0.0) -> None:
        """With a seed: every instruction goes through the loop, ready ones are dispatched in
        a seeded random order after a random delay of up to ``max_delay`` seconds, and CPU
        kernels all run on worker threads. ``seed=None`` restores normal dispatch."""
        self.synchronize_quietly()
        with self._lock:
            self._rng = None if seed is None else random.Random(seed)
            self._max_delay = float(max_delay)
            self.inline_max_cost = self._inline_max_cost      # (the limit follows the hook)

    def stats(self) -> dict:
        with self._lock:
            return {"issued": self.issued + self.inlined,
                    "completed": self.completed + self.inlined,
                    "in_flight": self.issued - self.completed, "inlined": self.inlined,
                    "fused": self.fused, "fused_runs": self.fused_runs, "elided": self.elided,
                    "unreported_errors": self.unreported_errors()}

    def shutdown(self) -> None:
        """Stops the loop thread and the CPU workers (at exit)."""
        loop, thread, pool = self._loop, self._thread, self._pool
        if loop is None:
            return
        try:
            self.synchronize_quietly()
        except Exception:  # noqa: BLE001
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        pool.shutdown()
        self._loop = self._thread = self._pool = None


_VM = VM()
atexit.register(_VM.shutdown)
on_memory_pressure(lambda: _VM.collect_releases(submit_pending=False))


def get_vm() -> VM:
    return _VM
