"""What happens when an act completes: the credit scheduler's half that hands registers
back, sends outputs on, sizes registers from piece 0, and passes end of stream along.
``CreditScheduler`` (``credit.py``) inherits it; every method runs on the scheduler's loop.
"""

from __future__ import annotations

import time
import traceback

from ...errors import ActorError
from ..graph.actors import Sized, read_piece
from .state_gates import gates_passed
from ..plan.registers import EOS, Register
from ..plan.sharing import bind_gates, untaken, went_home
from ..observe.timeline import delayed
from ..plan.spec import NOTHING
from .actor_runs import CREDIT, INPUT, ActorState


class Completion:
    """Mixin of CreditScheduler: completion, end of stream and the consumer's credits."""

    # -- completion ------------------------------------------------------------------------
    def read_inbox(self) -> None:
        """Completions posted by actor threads since the last wake-up, in order. (The flag is
        cleared before reading, so a completion appended after the last read wakes again.)"""
        self.inbox_woken = False
        if self.done is None or self.finished:
            return      # not set off on the loop yet (run() reads it then), or over
        inbox = self.inbox
        try:
            while inbox:
                delay, st, piece, regs, out_reg, result, err, dt = inbox.popleft()
                if delay is None:
                    self._piped(st, piece, regs, out_reg, result, err)
                elif delay > 0:
                    (self.clock or self.loop).call_later(delay, self.completed, st, piece,
                                                         regs, out_reg, result, err, dt + delay)
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
            delayed(self.timeline, st, piece)      # (an act with simulated time ends now)
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
        reg = Register(st.out, -1, result.leaves, spec.nbytes,
                       read_piece(result.leaves, spec))
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
                for st in self.states:
                    if st.share is not None:
                        st.share.homes[0] = 1   # (piece 0 used its own arrays: done)
            if not self.serial:
                self.pipe_late()
        for a in sized:
            sa = self.by_actor[a]
            pipe = sa.out.pipe
            while pipe is not None and sa.out.free:      # a piped actor's credits
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

    def _end(self, st: ActorState) -> None:
        """Passes end of stream on: closes the inputs (handing back what is queued), marks
        every consumer's input, and lets producers whose consumers are all closed stop."""
        if st.ended:
            return
        st.ended = True
        if st.share is not None:        # who waits on its bytes waits no more
            waiters = st.share.waiters
            while waiters:
                self.wake(waiters.pop())
        if st.actor in self.plan.pending:       # ended before piece 0: never sized, holds none
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
        if st.thread is not None:       # no act comes after the end: its threads may exit
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

    def collect(self, st: ActorState) -> None:
        """The run's output: copies each sink's piece out of its register the moment it
        arrives (so the register goes home at once, as the memory plan assumes), at most
        ``room`` pieces ahead of the caller, and delivers a piece once every sink's part
        of it is in, in piece order. Ends once a sink's end of stream leaves no piece to
        complete."""
        if self.plan.pending:                   # (a lazy plan sizes registers first)
            self._blocked(st, CREDIT)
            return
        actor, parts, n = st.actor, st.parts, len(st.ins)
        limit = st.next_piece + self.room
        ends = []
        for k, port in enumerate(st.ins):
            q = port.queue
            while q and q[0] is not EOS and q[0].piece < limit:
                reg = q.popleft()
                t0 = time.perf_counter()
                try:
                    value = actor.part(k, reg.arrays if st.raw else reg.view)
                except BaseException as e:  # noqa: BLE001 - as an act's error
                    error = ActorError(actor.name, reg.piece, e, traceback.format_exc())
                    error.__cause__ = e
                    self.stop(error)
                    return
                t1 = time.perf_counter()
                st.compute_s += t1 - t0
                if self.timeline is not None:
                    self.timeline.act(actor.name, reg.piece, t0, t1,
                                      (port.producer.actor.name,))
                slot = parts.get(reg.piece)
                if slot is None:
                    slot = parts[reg.piece] = [0, [None] * n]
                slot[0] += 1
                slot[1][k] = value
                st.got[k] += 1
                self._hand_back(reg)
            if q and q[0] is EOS:
                ends.append(k)
        while True:
            slot = parts.get(st.next_piece)
            if slot is None or slot[0] < n:
                break
            del parts[st.next_piece]
            st.next_piece += 1
            st.acts += 1
            self.room -= 1
            if st.cause is not None:
                st.waits[st.cause] += time.perf_counter() - st.since
                st.cause = None
            self.deliver(actor.assemble(slot[1]))
        if ends and not self.stopping and st.next_piece >= min(st.got[k] for k in ends):
            parts.clear()               # (parts of pieces a finished sink never sends)
            self._end(st)
            return
        if st.next_piece >= limit:
            self._blocked(st, CREDIT)
        elif not st.ended:
            self._blocked(st, INPUT)

    def credit_back(self, n: int = 1) -> None:
        """The consumer of ``run()`` took ``n`` outputs: the collector may deliver more.
        (A serial run counts them once the consumer has taken every output it was given:
        it takes no virtual time, and when its thread gets round to them changes nothing.)"""
        if self.finished:
            return
        if self.serial:
            self.taken += n
            if self.room + self.taken < self.room0:
                return
            n, self.taken = self.taken, 0
        self.room += n
        if self.collector is not None:
            self.wake(self.collector)
        try:
            self.drain()
            if self.clock is not None:
                self.clock.resume()
        except BaseException as e:  # noqa: BLE001 - as in completed()
            self._internal(e)

    def _held(self) -> bool:
        """(A serial run) virtual time stands still while acts are ready (a drain gave the
        loop a turn) or the caller is behind."""
        return bool(self.ready) or self._caller_behind()

    def _caller_behind(self) -> bool:
        """(A serial run) the caller has outputs it has not taken and handed back: the
        virtual clock stands still until it has (``credit_back``)."""
        return self.room < self.room0 and not (self.stopping or self.finished)

    def _wait_act(self, st: ActorState, piece: int) -> None:
        """(A serial run) a stage with ``timeout=`` acts on its thread, so that an act past
        its timeout can be abandoned, but the loop waits for it as for an inline act: the
        order of acts stays the seed's."""
        posted = st.thread.posted
        if not posted.wait(st.actor.timeout):
            self._timed_out(st, piece)
            return
        posted.clear()
        self.read_inbox()
