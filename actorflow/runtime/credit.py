"""The credit scheduler: runs a planned actor graph on an asyncio loop.

Everything is a message handled on the loop: "a register is ready" (queued on the consumer's
InPort), "a register came home" (back on the producer's free list: a credit), "a token was
released". Each message marks actors to re-check; ``_drain`` checks them, and an actor acts
when every input has its next register, it holds a free output register, and it can take all
of its resource tokens at once. Nothing polls and there is no task per piece:

- inline actors (tiny kernels, the collector) act right there on the loop;
- the others act on their own thread, fed through a queue; the loop may queue several acts
  ahead (each with its registers already taken), so a busy actor never waits for a round
  trip to the loop between pieces;
- async sources act as tasks awaiting the next item;
- ``time=`` adds simulated duration with ``loop.call_later``;
- an actor whose registers are not sized yet (a lazy plan) may act on piece 0 alone, with no
  credit: its result sizes and allocates its registers and travels in a one-off register.

Completion of an act hands its input registers back, sends its output register to every
consumer (or returns it at once when it has none), releases tokens and re-checks neighbours.
End of stream is queued after the last piece; an actor passes it on when it sees it (closing
its other inputs) once its acts are done, and the run ends when every actor has passed it on
and every register is home. An error or cancellation stops dispatch, waits for running acts,
frees every register and joins every thread.
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections import deque

from ..errors import ActorError
from .actor import Collector, Sized, SourceActor, read_piece
from .register import EOS, Register
from .spec import PieceSpec
from .state import CREDIT, INPUT, RESOURCE, ActorState, ActorThread
from .watchdog import stalled

class CreditScheduler:
    """Runs one planned graph once. ``deliver(value)`` receives the collector's outputs;
    ``room`` is how many it may deliver before ``credit_back()`` is called."""

    def __init__(self, plan, deliver, room: int, seed=None):
        self.plan = plan
        self.deliver = deliver
        self.room = room
        self.rng = random.Random(seed) if seed is not None else None
        self.states: list = []
        self.by_actor: dict = {}
        for actor in plan.actors:
            out = plan.ports.get(actor)
            if isinstance(actor, SourceActor) and actor.is_async:
                mode = "async"
            elif actor.inline:
                mode = "inline"
            elif actor.inline is None:        # an op actor sized by piece 0: decided then
                mode = "thread" if actor not in plan.pending else "undecided"
            else:
                mode = "thread"
            limit = 1 if (mode != "thread" or actor.resources or actor.time is not None) \
                else 1 << 30
            st = ActorState(actor, out, mode, limit)
            st.ins = plan.in_ports.get(actor, [])
            self.states.append(st)
            self.by_actor[actor] = st
        self.tokens = dict(plan.resources)
        self.token_waiters: dict = {name: set() for name in self.tokens}
        self.ready: deque = deque()
        self.draining = False
        self.stopping = False
        self.error = None
        self.loop = None
        self.done = None
        self.start_time = self.end_time = None
        self.threads: list = []
        self.pending_tasks: set = set()
        self._idle = None
        self.collector = next((st for st in self.states if isinstance(st.actor, Collector)), None)

    # -- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Runs to the end; raises ActorError (or CancelledError) after cleaning up."""
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.start_time = time.perf_counter()
        try:
            for st in self.states:
                self.wake(st)
            self.drain()                # the first acts start (and their threads with them)
            for st in self.states:      # the other threads start while those acts run
                if st.mode == "thread" and st.thread is None and not st.ended:
                    self._start_thread(st)
            await self.done
        except BaseException as e:
            if not self.stopping:
                self.stop(e if not isinstance(e, asyncio.CancelledError) else None)
            await self._wait_acts()
            raise
        finally:
            self.end_time = time.perf_counter()
            self._join_threads()
        if self.error is not None:
            raise self.error

    def _start_thread(self, st: ActorState) -> None:
        t = ActorThread(self, st)
        st.thread = t
        self.threads.append(t)
        t.thread.start()

    def stop(self, error: BaseException | None) -> None:
        """Stops dispatching; the run ends once running acts are done."""
        if self.stopping:
            return
        self.stopping = True
        if error is not None and self.error is None:
            self.error = error
        for task in list(self.pending_tasks):
            task.cancel()               # async sources awaiting their next item
        self._check_quiet()

    def _check_quiet(self) -> None:
        if self.done.done():
            return
        if self.stopping:
            if all(st.in_flight == 0 for st in self.states):
                self.done.set_result(None)
            return
        if all(st.ended and (st.out is None or st.out.home()) for st in self.states):
            self.done.set_result(None)
        elif not any(st.in_flight for st in self.states) and not self.pending_tasks:
            if self.collector is None or self.room > 0:      # (else the caller is behind)
                # nothing runs, nothing can start, and the caller is not what it waits for:
                # by construction this never happens; if it does, say why instead of hanging
                self.stop(stalled(self))

    async def _wait_acts(self) -> None:
        """After a stop: waits (shielded from a second cancel) until no act is running."""
        while any(st.in_flight for st in self.states):
            self._idle = self.loop.create_future()
            try:
                await asyncio.shield(self._idle)
            except asyncio.CancelledError:
                pass                    # keep waiting: threads must not outlive the run

    def _join_threads(self) -> None:
        for t in self.threads:
            t.queue.put(None)
        for t in self.threads:
            t.thread.join()
        self.threads.clear()
        for task in list(self.pending_tasks):
            task.cancel()

    # -- checking and acting ---------------------------------------------------------------
    def wake(self, st: ActorState) -> None:
        if not st.queued and not st.ended:
            st.queued = True
            self.ready.append(st)

    def drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        ready, rng = self.ready, self.rng
        try:
            while ready and not self.stopping:
                if rng is not None and len(ready) > 1:
                    ready.rotate(-rng.randrange(len(ready)))
                st = ready.popleft()
                st.queued = False
                self._try(st)
        finally:
            self.draining = False
        if not self.stopping:
            self._check_quiet()

    def _blocked(self, st: ActorState, cause: str) -> None:
        if st.in_flight == 0 and st.cause is None:
            st.cause, st.since = cause, time.perf_counter()

    def _try(self, st: ActorState) -> None:
        ins, out = st.ins, st.out
        while st.in_flight < st.max_in_flight and not st.ended:
            for p in ins:
                if not p.queue:
                    self._blocked(st, INPUT)
                    return
                if p.queue[0] is EOS:
                    if st.in_flight == 0:
                        self._end(st)
                    return
            sizing = False
            if out is not None:
                if not out.free:
                    if out.spec is None and st.next_piece == 0 and st.in_flight == 0:
                        sizing = True          # piece 0 sizes the registers (lazy plan)
                    else:
                        self._blocked(st, CREDIT)
                        return
            elif self.room <= 0 or self.plan.pending:   # the collector: the caller's credits
                self._blocked(st, CREDIT)
                return
            if st.tokens and not self._take_tokens(st):
                self._blocked(st, RESOURCE)
                return
            if st.cause is not None:
                st.waits[st.cause] += time.perf_counter() - st.since
                st.cause = None
            regs = [p.queue.popleft() for p in ins]
            out_reg = out.free.popleft() if out is not None and not sizing else None
            if out is None:
                self.room -= 1
            piece = st.next_piece
            st.next_piece += 1
            st.in_flight += 1
            self._dispatch(st, piece, regs, out_reg)

    def _take_tokens(self, st: ActorState) -> bool:
        tokens = self.tokens
        for name, n in st.tokens:
            if tokens[name] < n:
                for name2, _ in st.tokens:
                    self.token_waiters[name2].add(st)
                return False
        for name, n in st.tokens:
            tokens[name] -= n
        return True

    @staticmethod
    def inputs_of(st: ActorState, regs: list) -> list:
        """What the actor reads: raw arrays for op programs, pieces for Python stages."""
        if st.raw:
            return [reg.arrays for reg in regs]
        return [reg.view for reg in regs]

    def _dispatch(self, st: ActorState, piece: int, regs: list, out_reg) -> None:
        if st.first_act is None:
            st.first_act = time.perf_counter()
        if st.mode == "thread":
            if st.thread is None:
                self._start_thread(st)
            st.thread.queue.put((piece, regs, out_reg))
            return
        if st.mode == "async":
            task = self.loop.create_task(self._act_async(st, piece, out_reg))
            self.pending_tasks.add(task)
            task.add_done_callback(lambda t: self._async_done(t, st, piece, out_reg))
            return
        t0 = time.perf_counter()
        err = result = None
        delay = 0.0
        try:
            result = st.actor.compute(piece, self.inputs_of(st, regs),
                                      out_reg.arrays if out_reg is not None else None)
            delay = st.actor.sim_time(piece)
        except BaseException as e:  # noqa: BLE001 - reported as ActorError, as on a thread
            err = (e, traceback.format_exc())
        dt = time.perf_counter() - t0
        if delay > 0:
            self.loop.call_later(delay, self.completed, st, piece, regs, out_reg, result, err,
                                 dt + delay)
        else:
            self._complete(st, piece, regs, out_reg, result, err, dt)

    def completed_after(self, delay, st, piece, regs, out_reg, result, err, dt) -> None:
        """A thread's act finished; with ``time=`` it completes ``delay`` seconds later."""
        if delay > 0:
            self.loop.call_later(delay, self.completed, st, piece, regs, out_reg, result, err,
                                 dt + delay)
        else:
            self.completed(st, piece, regs, out_reg, result, err, dt)

    async def _act_async(self, st, piece, out_reg):
        t0 = time.perf_counter()
        try:
            result = await st.actor.compute_async(
                piece, out_reg.arrays if out_reg is not None else None)
            return result, None, time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported as ActorError
            return None, (e, traceback.format_exc()), time.perf_counter() - t0

    def _async_done(self, task, st, piece, out_reg) -> None:
        """An async source's act ended, or was cancelled (perhaps before it started)."""
        self.pending_tasks.discard(task)
        if task.cancelled():
            result, err, dt = EOS, None, 0.0
        else:
            exc = task.exception()
            if exc is not None:
                result, err, dt = None, (exc, ""), 0.0
            else:
                result, err, dt = task.result()
        self.completed(st, piece, [], out_reg, result, err, dt)

    # -- completion ------------------------------------------------------------------------
    def completed(self, st, piece, regs, out_reg, result, err, dt) -> None:
        """An act finished (called on the loop, from a thread's post or a timer)."""
        try:
            self._complete(st, piece, regs, out_reg, result, err, dt)
            self.drain()
        except BaseException as e:  # noqa: BLE001 - a callback must never leave a run hanging
            self._internal(e)

    def _internal(self, e: BaseException) -> None:
        """An error raised while handling a message (not inside an act): stop the run with
        it, so it reaches the caller instead of the loop's log."""
        self.draining = False
        self.stop(e)
        idle = self._idle
        if idle is not None and not idle.done() and all(s.in_flight == 0 for s in self.states):
            idle.set_result(None)

    def _complete(self, st, piece, regs, out_reg, result, err, dt) -> None:
        st.in_flight -= 1
        st.compute_s += dt
        st.last_act = time.perf_counter()
        for name, n in st.tokens:
            self.tokens[name] += n
            waiters = self.token_waiters[name]
            while waiters:
                self.wake(waiters.pop())
        for reg in regs:
            reg.pending -= 1
            if reg.pending == 0 and reg.index >= 0:      # (a one-off piece 0 is dropped)
                port = reg.owner
                port.free.append(reg)
                self.wake(self.by_actor[port.actor])
        if err is not None:
            e, tb = err
            error = ActorError(st.actor.name, piece, e, tb)
            error.__cause__ = e
            self.stop(error)
        elif result is EOS or (st.max_in_flight == 0 and st.out is not None):
            # a source ran out (acts it had queued after that are discarded), or the actor
            # was stopped because nobody reads it any more
            if out_reg is not None:
                st.out.free.append(out_reg)
            st.max_in_flight = 0
        elif type(result) is Sized:
            self._sized(st, piece, result)
        elif out_reg is not None:
            st.acts += 1
            self._send(st, out_reg, piece)
        else:                                      # the collector
            st.acts += 1
            self.deliver(result)
        if self.stopping:
            idle = self._idle
            if idle is not None and not idle.done() and \
                    all(s.in_flight == 0 for s in self.states):
                idle.set_result(None)
            self._check_quiet()
            return
        if st.max_in_flight == 0 and st.in_flight == 0 and not st.ended:
            self._end(st)
        self.wake(st)

    def _sized(self, st, piece, result) -> None:
        """Piece 0 of an actor planned lazily: allocate its registers (and those of op
        actors downstream that can now infer), then send piece 0 in a one-off register."""
        try:
            sized = self.plan.size(st.actor)
        except Exception as e:  # noqa: BLE001 - PlanError, or an op actor that cannot trace
            self.stop(e)
            return
        spec = st.actor.out_spec
        reg = Register(st.out, -1, result.leaves, spec.nbytes,
                       read_piece(result.leaves, spec))
        st.acts += 1
        self._send(st, reg, piece)
        for a in sized:
            sa = self.by_actor[a]
            if sa.mode == "undecided":
                a.inline = a.out_spec.nbytes <= (1 << 16) and a.program.workspace_bytes <= (1 << 16)
                if a.inline:
                    sa.mode = "inline"
                else:
                    sa.mode = "thread"
                    sa.max_in_flight = 1 if (a.resources or a.time is not None) else 1 << 30
            self.wake(sa)
        if not self.plan.pending and self.collector is not None:
            self.wake(self.collector)

    def _send(self, st, reg, piece) -> None:
        reg.piece = piece
        consumers = [p for p in st.out.consumers if not p.closed]
        if not consumers:
            if reg.index >= 0:
                st.out.free.append(reg)
            return
        reg.pending = len(consumers)
        for p in consumers:
            p.queue.append(reg)
            self.wake(self.by_actor[p.actor])

    def _hand_back(self, reg) -> None:
        reg.pending -= 1
        if reg.pending == 0 and reg.index >= 0:
            port = reg.owner
            port.free.append(reg)
            self.wake(self.by_actor[port.actor])

    def _end(self, st: ActorState) -> None:
        """Passes end of stream on: closes the inputs (handing back what is queued), marks
        every consumer's input, and lets producers whose consumers are all closed stop."""
        if st.ended:
            return
        st.ended = True
        if st.actor in self.plan.pending:       # ended before piece 0: never sized, holds none
            self.plan.pending.discard(st.actor)
            st.actor.out_spec = PieceSpec(None, [])
            if not self.plan.pending and self.collector is not None:
                self.wake(self.collector)
        if st.thread is not None:
            st.thread.queue.put(None)   # no act comes after the end: its thread may exit now
        for p in st.ins:
            self._close(p)
        if st.out is not None:
            for p in st.out.consumers:
                if not p.closed:
                    p.queue.append(EOS)
                    self.wake(self.by_actor[p.actor])

    def _close(self, port) -> None:
        port.closed = True
        while port.queue:
            reg = port.queue.popleft()
            if reg is not EOS:
                self._hand_back(reg)
        prod = self.by_actor[port.producer.actor]
        if not prod.ended and all(p.closed for p in port.producer.consumers):
            # nobody reads it any more: it stops at the next check, as if at end of stream
            prod.max_in_flight = 0
            if prod.in_flight == 0:
                self._end(prod)

    def credit_back(self, n: int = 1) -> None:
        """The consumer of ``run()`` took ``n`` outputs: the collector may deliver more."""
        self.room += n
        if self.collector is not None:
            self.wake(self.collector)
        try:
            self.drain()
        except BaseException as e:  # noqa: BLE001 - as in completed()
            self._internal(e)
