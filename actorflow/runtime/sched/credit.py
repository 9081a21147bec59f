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
  credit: its result sizes and allocates its registers and travels in a one-off register
  (a plan made whole, ``Plan.defer``: every actor does so, and the registers of all of them
  come at once when the last is sized, shared by lifetime where the budget needs it).

Completion of an act (``completed``, on the loop) hands its input registers back, sends its
output register to every consumer (or returns it at once when it has none), releases tokens
and re-checks neighbours. End of stream is queued after the last piece; an actor passes it on
when it sees it (closing its other inputs) once its acts are done, and the run ends when
every actor has passed it on and every register is home. An error or cancellation stops
dispatch, waits for running acts, frees every register and joins every thread.
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections import deque
from typing import cast

from ...errors import ActorError
from ..graph.actors import Collector, Sized, read_piece
from ..graph.source import SourceActor
from ..observe.hooks import VirtualClock
from ..observe.timeline import Timeline, delayed, record_act
from ..observe.watchdog import stalled
from ..plan.registers import EOS, Register
from ..plan.sharing import bind_gates, gate_open, taken, untaken, went_home
from ..plan.spec import NOTHING
from .actor_runs import CREDIT, INPUT, RESOURCE, ActorRun, ActorThread, make_actor_runs
from .output import RunOutput
from .pipes import PipedThread, abandon, pipe_actors, watch_pipes
from .state_gates import gates_open, gates_passed, make_gates
from .stragglers import Stragglers
from .timed import TimedActs

DRAIN_TURN = 4096  # ready actors tried in one turn of the loop before it gets one


class CreditScheduler:
    """Runs one planned graph once. ``deliver(value)`` receives the collector's outputs;
    ``room`` is how many it may deliver before ``output.credit_back()`` is called.

    One object holds what every message reads and writes (the actors' states, the ready
    queue, the tokens, the flags of a stop); its components own their own state and are
    handed the scheduler: ``output`` (``RunOutput``: the collector's copies out, the
    caller's room), ``timed`` (``TimedActs``: timeouts, the async acts' tasks),
    ``stragglers`` (acts a stop abandoned), ``timeline`` (what a trace records)."""

    def __init__(self, plan, deliver, room: int, seed=None, trace=None, serial=False, keep_acts=0):
        self.plan = plan
        self.rng = random.Random(seed) if seed is not None else None
        self.serial = serial  # a test schedule: see observe.py
        self.clock = VirtualClock(self._held) if serial else None
        self.actor_runs = make_actor_runs(plan, make_gates(plan.actors), serial)
        self.by_actor = {st.actor: st for st in self.actor_runs}
        self.tokens = dict(plan.resources)
        self.token_waiters: dict = {name: set() for name in self.tokens}
        self.ready: deque = deque()
        self.draining = False
        self.stopping = False
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # run() or start_sources() sets it
        self.done: asyncio.Future[None] | None = None  # set by run(): the run is over
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.threads: list = []
        self.finished = False  # run() returned: messages are ignored from now on
        self.stragglers = Stragglers(plan)
        self.inbox: deque = deque()  # completions posted by actor threads
        self.inbox_woken = False
        self.collector = next(
            (st for st in self.actor_runs if isinstance(st.actor, Collector)), None
        )
        self.live = (
            bind_gates(plan.sharing, self.by_actor) if plan.sharing is not None else None
        )  # the shared registers' bytes in use (sharing.py)
        self.deferred = plan.whole  # a plan made whole: registers come once all are sized
        self.trace_path = trace  # run(trace=...): where the timeline is written
        self.timeline = (
            Timeline(self.actor_runs, plan, 0 if trace else keep_acts)
            if trace or keep_acts
            else None
        )
        self.output = RunOutput(self, self.collector, deliver, room, serial)
        self._collect = self.output.collect  # (on every try of the collector)
        self.timed = TimedActs(self)
        if not serial and not self.deferred:
            pipe_actors(self.actor_runs, self.output)

    # -- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Runs to the end; raises ActorError (or CancelledError). A stop does not wait for
        the acts running then: they are abandoned to ``self.stragglers`` (see
        ``stragglers.py``), which the caller settles to free the plan."""
        loop = self.loop = asyncio.get_running_loop()
        done = self.done = loop.create_future()
        self.start_time = time.perf_counter()
        try:
            if self.stopping:  # stopped before the loop took the run over
                done.set_result(None)
            for st in self.actor_runs:
                self.wake(st)
            self.read_inbox()  # what the sources did already; the first acts start
            if any(st.piped for st in self.actor_runs):
                watch_pipes(self)  # (their waits never reach the loop: see pipes.py)
            for st in self.actor_runs:  # the other threads start while those acts run
                if st.mode == "thread" and st.thread is None and not st.ended:
                    self._start_thread(st)
            await done
        except BaseException as e:
            if not self.stopping:
                self.stop(e if not isinstance(e, asyncio.CancelledError) else None)
            raise
        finally:
            self.end_time = time.perf_counter()
            self.let_go()
        if self.error is not None:
            raise self.error

    def _start_thread(self, st: ActorRun) -> ActorThread:
        """The actor's thread, or its ``replicas`` threads sharing one queue of acts (the
        first of them, which is ``st.thread`` now)."""
        if st.piped:
            pt = PipedThread(self, st)
            st.thread = pt
            pt.thread.start()
            self.threads.append(pt)
            return pt
        t = ActorThread(self, st)
        st.thread = t
        group = [t] + [ActorThread(self, st, t.queue) for _ in range(st.actor.replicas - 1)]
        for r in group:
            r.thread.start()
            self.threads.append(r)
        return t

    def pipe_late(self) -> None:
        """A plan made whole has its registers now: the chains that may be piped
        (``pipe_actors``, which leaves out actors that share bytes) are piped from piece 1
        on. Each such actor acted on piece 0 through the loop and its thread is idle (no
        act is sent before an actor has registers): that thread exits and a piped one takes
        over, with what its input holds moved to its pipe."""
        pipe_actors(self.actor_runs, self.output)
        piped = [st for st in self.actor_runs if st.piped]
        now = time.perf_counter()
        for st in piped:
            if st.cause is not None:  # (its thread counts its own waits from now)
                st.waits[st.cause] += now - st.since
                st.cause = None
            for port in st.ins:  # (a source has none)
                while port.queue:
                    port.pipe.put(port.queue.popleft())
            old = st.thread
            if old is not None:
                self.threads.remove(old)
                old.queue.put(None)
                st.thread = None
            self._start_thread(st)
        if piped:
            watch_pipes(self)

    def start_sources(self, loop) -> None:
        """Starts the sources' threads and queues their first acts before the run is handed
        to ``loop`` (``run()`` calls it on the caller's thread, while nothing else touches
        the scheduler), so the first pieces need not wait for two thread hand-offs. The
        loop starts every other thread."""
        self.loop = loop
        for st in self.actor_runs:
            if st.mode == "thread" and isinstance(st.actor, SourceActor):
                self._start_thread(st)
                self._try(st)

    def stop(self, error: BaseException | None) -> None:
        """Stops dispatching and ends the run now; acts still running are abandoned."""
        if self.stopping:
            return
        self.stopping = True
        if error is not None and self.error is None:
            self.error = error
        self.timed.cancel()  # async acts, async sources awaiting their next item
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _check_quiet(self) -> None:
        done = cast("asyncio.Future[None]", self.done)  # drain() runs after run() set it
        if done.done() or self.stopping:
            return
        if all(st.ended and (st.out is None or st.out.home()) for st in self.actor_runs):
            done.set_result(None)
        elif not any(st.in_flight for st in self.actor_runs) and not self.timed.tasks:
            if self.collector is None or self.output.caller_waits():  # (else it is behind)
                # nothing runs, nothing can start, and the caller is not what it waits for:
                # by construction this never happens; if it does, say why instead of hanging
                self.stop(stalled(self))

    def let_go(self) -> None:
        """The run is over: no message is handled any more; every thread exits once its
        running act (if any) returns, which then frees what it held (``stragglers``)."""
        self.finished = True
        held = self.stragglers
        for t in self.threads:
            if isinstance(t, PipedThread):
                abandon(t, held)
                continue
            jobs = t.state.jobs
            if jobs:  # sent, not seen to complete: may be running now
                t.token = held.hold(t.state.actor, [(p, r, o) for p, (r, o) in jobs.items()])
            t.abandoned = True  # (after the token: see ActorThread)
            t.queue.put(None)
        for t in self.threads:
            if t.token is None:
                t.thread.join()  # nothing sent to it is running: it exits at once
        self.threads.clear()
        self.timed.let_go(held)

    # -- checking and acting ---------------------------------------------------------------
    def wake(self, st: ActorRun) -> None:
        if not st.queued and not st.ended:
            st.queued = True
            self.ready.append(st)

    def drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        ready, rng = self.ready, self.rng
        turn = DRAIN_TURN  # tries before the loop gets a turn (no run holds
        try:  # it forever: a stop, a timeout can come in)
            while ready and not self.stopping:
                turn -= 1
                if turn < 0:
                    cast(asyncio.AbstractEventLoop, self.loop).call_soon(self.drain)
                    return
                if rng is not None and len(ready) > 1:
                    ready.rotate(-rng.randrange(len(ready)))
                st = ready.popleft()
                st.queued = False
                self._try(st)
        finally:
            self.draining = False
        if self.clock is not None and self.clock.held and not self.output.caller_behind():
            self.clock.resume()  # (it held while acts were ready)
        if not self.stopping:
            self._check_quiet()

    def _blocked(self, st: ActorRun, cause: str) -> None:
        if st.in_flight == 0 and st.cause is None:
            st.cause, st.since = cause, time.perf_counter()

    def _try(self, st: ActorRun) -> None:
        if st is self.collector:
            self._collect()
            return
        if st.piped:  # its thread takes its own acts
            return
        ins, out = st.ins, st.out
        while st.in_flight < st.max_in_flight and not st.ended and not self.stopping:
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
                        sizing = True  # piece 0 sizes the registers (lazy plan)
                    else:
                        self._blocked(st, CREDIT)
                        return
                elif st.share is not None and not gate_open(st):
                    self._blocked(st, CREDIT)  # its bytes are not free yet
                    return
            if st.gates is not None and not gates_open(st):
                self._blocked(st, RESOURCE)  # state another piece has not passed yet
                return
            if st.tokens and not self._take_tokens(st):
                self._blocked(st, RESOURCE)
                return
            if st.cause is not None:
                now = time.perf_counter()
                st.waits[st.cause] += now - st.since
                if self.timeline is not None:  # (Timeline.wait, inlined)
                    self.timeline.records.append(
                        (1, st.actor.name, st.cause, st.since, now, (), None)
                    )
                st.cause = None
            regs = [p.queue.popleft() for p in ins]
            out_reg = out.free.popleft() if out is not None and not sizing else None
            if st.share is not None:
                taken(st, out_reg)
            piece = st.next_piece
            st.next_piece += 1
            st.in_flight += 1
            self._dispatch(st, piece, regs, out_reg)

    def _take_tokens(self, st: ActorRun) -> bool:
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
    def inputs_of(st: ActorRun, regs: list) -> list:
        """What the actor reads: raw arrays for op programs, pieces for Python stages."""
        if st.raw:
            return [reg.arrays for reg in regs]
        return [reg.view for reg in regs]

    def _dispatch(self, st: ActorRun, piece: int, regs: list, out_reg) -> None:
        if st.mode == "thread":
            thread = st.thread
            if thread is None:
                thread = self._start_thread(st)
            st.jobs[piece] = (regs, out_reg)
            thread.queue.put((piece, regs, out_reg))
            if self.serial:
                self.timed.wait_act(st, piece)
            elif st.actor.timeout is not None:
                self.timed.time_act(st, piece)
            return
        if st.mode == "async":
            self.timed.start(st, piece, regs, out_reg)
            return
        t0 = time.perf_counter()
        err = result = None
        delay = 0.0
        try:
            result = st.actor.compute(
                piece, self.inputs_of(st, regs), out_reg.arrays if out_reg is not None else None
            )
            delay = st.actor.sim_time(piece)
        except BaseException as e:  # noqa: BLE001 - reported as ActorError, as on a thread
            err = (e, traceback.format_exc())
        dt = time.perf_counter() - t0
        if self.timeline is not None and result is not EOS:
            record_act(self.timeline, st, piece, t0, t0 + dt, delay, err)
        if delay > 0:
            (self.clock or cast(asyncio.AbstractEventLoop, self.loop)).call_later(
                delay, self.completed, st, piece, regs, out_reg, result, err, dt + delay
            )
        elif st.ordered:  # (replicas acting serially: earlier pieces may
            self._in_order(st, piece, regs, out_reg, result, err, dt)  # still be timed)
        else:
            self._complete(st, piece, regs, out_reg, result, err, dt)

    # -- completion ------------------------------------------------------------------------
    def read_inbox(self) -> None:
        """Completions posted by actor threads since the last wake-up, in order. (The flag is
        cleared before reading, so a completion appended after the last read wakes again.)"""
        self.inbox_woken = False
        if self.done is None or self.finished:
            return  # not set off on the loop yet (run() reads it then), or over
        inbox = self.inbox
        try:
            while inbox:
                delay, st, piece, regs, out_reg, result, err, dt = inbox.popleft()
                if delay is None:
                    self._piped(st, piece, regs, out_reg, result, err)
                elif delay > 0:
                    (self.clock or cast(asyncio.AbstractEventLoop, self.loop)).call_later(
                        delay, self.completed, st, piece, regs, out_reg, result, err, dt + delay
                    )
                elif st.ordered:
                    self._in_order(st, piece, regs, out_reg, result, err, dt)
                else:
                    self._complete(st, piece, regs, out_reg, result, err, dt)
            self.drain()
        except BaseException as e:  # noqa: BLE001 - as in completed()
            self._internal(e)

    def completed(self, st, piece, regs, out_reg, result, err, dt) -> None:
        """An act finished (called on the loop, from a thread's post or a timer)."""
        if self.finished:
            return
        if self.timeline is not None and self.timeline.started:
            delayed(self.timeline, st, piece)  # (an act with simulated time ends now)
        try:
            if st.ordered:
                self._in_order(st, piece, regs, out_reg, result, err, dt)
            else:
                self._complete(st, piece, regs, out_reg, result, err, dt)
            self.drain()
        except BaseException as e:  # noqa: BLE001 - a callback must never leave a run hanging
            self._internal(e)

    def _in_order(self, st, piece, regs, out_reg, result, err, dt) -> None:
        """Acts that overlap (an async stage's, a replicated stage's) may end out of
        order: each is handled once every earlier piece's is, so pieces leave in order.
        (An error is handled at once: it stops the run.)"""
        if err is not None:
            self._complete(st, piece, regs, out_reg, result, err, dt)
            return
        st.early[piece] = (regs, out_reg, result, err, dt)
        while st.next_done in st.early and not self.stopping:
            p = st.next_done
            st.next_done += 1
            self._complete(st, p, *st.early.pop(p))

    def _piped(self, st, piece, reg, out_reg, result, err) -> None:
        """What a piped actor's thread left to the loop (``state.PipedThread``): an error,
        its end of stream, an input register to take home or an output to send on, piece
        0 that sizes its registers."""
        if err is not None:
            e, tb = err
            error = ActorError(st.actor.name, piece, e, tb)
            error.__cause__ = e
            self.stop(error)
            return
        if result is EOS:
            st.in_flight = 0
            self._end(st)
            return
        if reg is not None:
            self._hand_back(reg)
        if type(result) is Sized:
            self._sized(st, piece, result)
        elif out_reg is not None:
            self._send(st, out_reg, piece)

    def _internal(self, e: BaseException) -> None:
        """An error raised while handling a message (not inside an act): stop the run with
        it, so it reaches the caller instead of the loop's log."""
        self.draining = False
        self.stop(e)

    def _complete(self, st, piece, regs, out_reg, result, err, dt) -> None:
        st.in_flight -= 1
        if st.jobs:
            st.jobs.pop(piece, None)
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        st.compute_s += dt
        for name, n in st.tokens:
            self.tokens[name] += n
            waiters = self.token_waiters[name]
            while waiters:
                self.wake(waiters.pop())
        for reg in regs:
            self._hand_back(reg)
        if st.gates is not None and err is None and result is not EOS:
            gates_passed(st, self.wake)
        if err is not None:
            e, tb = err
            error = ActorError(st.actor.name, piece, e, tb)
            error.__cause__ = e
            self.stop(error)
        elif result is EOS or (st.max_in_flight == 0 and st.out is not None):
            # a source ran out (acts it had queued after that are discarded), or the actor
            # was stopped because nobody reads it any more
            if out_reg is not None:
                if st.share is not None:
                    untaken(st, out_reg)
                st.out.free.append(out_reg)
            st.max_in_flight = 0
        elif type(result) is Sized:
            self._sized(st, piece, result)
        else:
            st.acts += 1
            self._send(st, out_reg, piece)
        if self.stopping:
            return
        if st.max_in_flight == 0 and st.in_flight == 0 and not st.ended:
            self._end(st)
        self.wake(st)

    def _sized(self, st, piece, result) -> None:
        """Piece 0 of an actor planned lazily: allocate its registers (and those of op
        actors downstream that can now infer; in a plan made whole, every actor's once the
        last is sized), then send piece 0 in a one-off register."""
        try:
            sized = self.plan.size(st.actor)
        except Exception as e:  # noqa: BLE001 - PlanError, or an op actor that cannot trace
            self.stop(e)
            return
        spec = st.actor.out_spec
        reg = Register(st.out, -1, result.leaves, spec.nbytes, read_piece(result.leaves, spec))
        st.acts += 1
        self._send(st, reg, piece)
        self._allocated(sized)

    def _allocated(self, sized: list) -> None:
        """The registers of the ``sized`` actors exist now: their acts may go on (a plan
        made whole: every actor's, with the memory gates of those that share bytes and the
        pipes of the chains that may be piped, decided only now)."""
        if self.deferred and not self.plan.whole:
            self.deferred = False
            if self.plan.sharing is not None:
                self.live = bind_gates(self.plan.sharing, self.by_actor)
                for st in self.actor_runs:
                    if st.share is not None:
                        st.share.homes[0] = 1  # (piece 0 used its own arrays: done)
            if not self.serial:
                self.pipe_late()
        for a in sized:
            sa = self.by_actor[a]
            pipe = sa.out.pipe
            while pipe is not None and sa.out.free:  # a piped actor's credits
                pipe.put(sa.out.free.popleft())
            if sa.mode == "undecided" and not sa.ended:
                a.inline = a.small()
                if a.inline or self.serial:
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
                if st.out.pipe is not None:
                    st.out.pipe.put(reg)
                    return
                st.out.free.append(reg)
                if st.share is not None:
                    went_home(st, reg, self.wake)
            return
        reg.pending = len(consumers)
        for p in consumers:
            if p.pipe is not None:
                p.pipe.put(reg)
            else:
                p.queue.append(reg)
                self.wake(self.by_actor[p.actor])

    def _hand_back(self, reg) -> None:
        """A consumer is done with ``reg``: once all are, it is free (a credit) again. (A
        one-off piece-0 register, index -1, is dropped.)"""
        reg.pending -= 1
        if reg.pending == 0 and reg.index >= 0:
            port = reg.owner
            if port.pipe is not None:
                port.pipe.put(reg)
                return
            port.free.append(reg)
            st = self.by_actor[port.actor]
            if st.share is not None:
                went_home(st, reg, self.wake)
            self.wake(st)

    def _end(self, st: ActorRun) -> None:
        """Passes end of stream on: closes the inputs (handing back what is queued), marks
        every consumer's input, and lets producers whose consumers are all closed stop."""
        if st.ended:
            return
        st.ended = True
        if st.share is not None:  # who waits on its bytes waits no more
            waiters = st.share.waiters
            while waiters:
                self.wake(waiters.pop())
        if st.actor in self.plan.pending:  # ended before piece 0: never sized, holds none
            if st.actor.out_spec is None:
                st.actor.out_spec = NOTHING
            try:
                sized = self.plan.unpend(st.actor)
            except Exception as e:  # noqa: BLE001 - PlanError: the whole plan does not fit
                self.stop(e)
                return
            self._allocated(sized)
            if not self.plan.pending and self.collector is not None:
                self.wake(self.collector)
        if st.thread is not None:  # no act comes after the end: its threads may exit
            for _ in range(st.actor.replicas):
                st.thread.queue.put(None)
        for p in st.ins:
            self._close(p)
        if st.out is not None:
            for p in st.out.consumers:
                if p.pipe is not None:
                    p.pipe.put(EOS)
                elif not p.closed:
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

    def _held(self) -> bool:
        """(A serial run) virtual time stands still while acts are ready (a drain gave the
        loop a turn) or the caller is behind."""
        return bool(self.ready) or self.output.caller_behind()
