"""The run's output: what the collector copies out of the sinks' registers, and the caller's
room for outputs it has not taken yet. ``RunOutput`` is a component of the credit
scheduler (``sched.output``), handed the scheduler; it runs on the scheduler's loop, except
a *piped* output's deliveries (``hand_over``): see ``RunOutput``."""

from __future__ import annotations

import time
import traceback
from queue import SimpleQueue

from ...errors import ActorError
from ..plan.registers import EOS
from .actor_runs import CREDIT, INPUT


class RunOutput:
    """The collector's side of a run (``st``: the collector's ``ActorRun``, None when the
    graph has no sink) and the caller's: ``deliver(value)`` receives each output, at most
    ``room`` of them before ``credit_back()`` is called. ``serial`` (a test schedule): the
    caller's credits are applied once it has caught up (see ``credit_back``).

    A *piped* output (``pipes.pipe_actors``: a run from plain code, whose ``deliver`` is a
    ``SimpleQueue``'s put, with one sink made by a piped actor): that actor's thread copies
    each piece out and delivers it (``hand_over``), and the caller hands its credits back
    from its own thread (``caller_took``), so no piece goes through the loop. The loop
    still delivers what it was sent before (piece 0 of a stage sized by it); the thread
    delivers piece k once ``delivered == k``, so the two never overlap. The room is
    ``room0 - delivered + back + back_direct``: each count has one writer (``delivered``
    the loop, then the thread; ``back`` the loop; ``back_direct`` the caller)."""

    def __init__(self, sched, st, deliver, room: int, serial: bool):
        self.sched = sched
        self.st = st
        self.deliver = deliver
        self.room0 = room
        self.delivered = 0  # outputs delivered
        self.back = 0  # credits the caller handed back (on the loop)
        self.back_direct = 0  # ... from its own thread (a piped output)
        self.taken = 0  # (serial: credits back, applied once caught up)
        self.serial = serial
        self.from_threads = isinstance(getattr(deliver, "__self__", None), SimpleQueue)
        self.piped = False  # the last piped actor's thread delivers (pipes.py)
        self.woken: SimpleQueue = SimpleQueue()  # wakes that thread waiting for room
        self.waiting = False  # (it waits: whoever makes room puts on ``woken``)
        self.direct = False  # that thread delivered: the loop delivers no more
        # what collect() calls on every piece, bound once
        self._plan = sched.plan
        self._timeline = sched.timeline
        self._hand_back = sched._hand_back
        self._blocked = sched._blocked

    @property
    def room(self) -> int:
        """How many outputs may be delivered before the caller takes one."""
        return self.room0 - self.delivered + self.back + self.back_direct

    def collect(self) -> None:
        """The run's output: copies each sink's piece out of its register the moment it
        arrives (so the register goes home at once, as the memory plan assumes), at most
        ``room`` pieces ahead of the caller, and delivers a piece once every sink's part
        of it is in, in piece order. Ends once a sink's end of stream leaves no piece to
        complete."""
        st = self.st
        if self._plan.pending:  # (a lazy plan sizes registers first)
            self._blocked(st, CREDIT)
            return
        actor, parts, n = st.actor, st.parts, len(st.ins)
        limit = st.next_piece + self.room
        timeline, hand_back = self._timeline, self._hand_back
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
                    self.sched.stop(error)
                    return
                t1 = time.perf_counter()
                st.compute_s += t1 - t0
                if timeline is not None:
                    timeline.act(actor.name, reg.piece, t0, t1, (port.producer.actor.name,))
                slot = parts.get(reg.piece)
                if slot is None:
                    slot = parts[reg.piece] = [0, [None] * n]
                slot[0] += 1
                slot[1][k] = value
                st.got[k] += 1
                hand_back(reg)
            if q and q[0] is EOS:
                ends.append(k)
        while True:
            slot = parts.get(st.next_piece)
            if slot is None or slot[0] < n:
                break
            del parts[st.next_piece]
            st.next_piece += 1
            st.acts += 1
            if st.cause is not None:
                st.waits[st.cause] += time.perf_counter() - st.since
                st.cause = None
            self.deliver(actor.assemble(slot[1]))
            self.delivered += 1
            if self.waiting:  # (a piped output's thread waits for this one)
                self.woken.put(True)
        if ends and not self.sched.stopping and st.next_piece >= min(st.got[k] for k in ends):
            parts.clear()  # (parts of pieces a finished sink never sends)
            self.sched._end(st)
            return
        if st.next_piece >= limit:
            self._blocked(st, CREDIT)
        elif not st.ended:
            self._blocked(st, INPUT)

    def credit_back(self, n: int = 1) -> None:
        """The consumer of ``run()`` took ``n`` outputs: the collector may deliver more.
        (A serial run counts them once the consumer has taken every output it was given:
        it takes no virtual time, and when its thread gets round to them changes nothing.)"""
        sched = self.sched
        if sched.finished:
            return
        if self.serial:
            self.taken += n
            if self.room + self.taken < self.room0:
                return
            n, self.taken = self.taken, 0
        if n:
            self.back += n
        if self.st is not None:
            sched.wake(self.st)
        try:
            sched.drain()
            if sched.clock is not None:
                sched.clock.resume()
        except BaseException as e:  # noqa: BLE001 - as in CreditScheduler.completed()
            sched._internal(e)

    def caller_took(self, n: int) -> None:
        """(On the caller's thread, ``run()`` from plain code) the caller took ``n``
        outputs: a piped output's thread may deliver more at once; otherwise the loop is
        told (``credit_back``). Until the thread delivers, the loop is told too."""
        if self.piped:
            self.back_direct += n
            if self.waiting:
                self.woken.put(True)
            if self.direct:
                return
            n = 0  # (the loop may deliver yet: wake it)
        self.sched.loop.call_soon_threadsafe(self.credit_back, n)

    def hand_over(self, piece: int, reg, thread) -> bool:
        """(On the thread of the actor a piped output reads) copies piece ``piece`` out of
        ``reg`` and delivers it, once every earlier piece is delivered and the caller has
        room; the thread takes ``reg`` home after. False when the run stopped meanwhile or
        the copy failed (the error is posted to the loop, naming the collector)."""
        st = self.st
        if (
            self.delivered != piece
            or self.room0 - self.delivered + self.back + self.back_direct <= 0
        ):
            if not self._wait(piece, thread):
                return False
        actor, jobs = st.actor, thread.state.jobs
        with thread.claim:  # (filed, as the thread's act: a stop now leaves
            if thread.abandoned:  # ``reg`` held until the copy is done)
                return False
            jobs[piece] = ([], reg)
        t0 = time.perf_counter()
        try:
            value = actor.part(0, reg.arrays if st.raw else reg.view)
        except BaseException as e:  # noqa: BLE001 - as an act's error
            del jobs[piece]
            thread._post((None, st, piece, None, None, None, (e, traceback.format_exc()), 0.0))
            return False
        if thread.abandoned:  # the run stopped meanwhile: nobody takes it
            return False
        del jobs[piece]
        t1 = time.perf_counter()
        st.compute_s += t1 - t0
        if self._timeline is not None:
            self._timeline.act(actor.name, piece, t0, t1, (thread.state.actor.name,))
        if st.cause is not None:
            st.waits[st.cause] += t0 - st.since
        self.direct = True
        st.got[0] += 1
        st.next_piece = piece + 1
        st.acts += 1
        self.deliver(actor.assemble([value]))
        self.delivered = piece + 1
        st.cause, st.since = INPUT, t1
        return True

    def _wait(self, piece: int, thread) -> bool:
        """Waits until the loop delivered every piece before ``piece`` and the caller has
        room (counted as the collector's and the thread's credit wait)."""
        st, mine = self.st, thread.state
        t0 = time.perf_counter()
        if st.cause is not None and st.cause != CREDIT:
            st.waits[st.cause] += t0 - st.since
        st.cause, st.since = CREDIT, t0
        mine.cause, mine.since = CREDIT, t0  # (the stall detector sees it waiting)
        woken = self.woken
        try:
            while True:
                self.waiting = True
                if (
                    self.delivered == piece
                    and self.room0 - self.delivered + self.back + self.back_direct > 0
                ):
                    return True
                if woken.get() is None or thread.abandoned:
                    return False
        finally:
            self.waiting = False
            t1 = time.perf_counter()
            mine.waits[CREDIT] += t1 - t0
            mine.cause = None
            if thread.sched.timeline is not None and t1 > t0:
                thread.sched.timeline.wait(mine.actor.name, CREDIT, t0, t1)

    def caller_behind(self) -> bool:
        """(A serial run) the caller has outputs it has not taken and handed back: the
        virtual clock stands still until it has (``credit_back``)."""
        return self.room < self.room0 and not (self.sched.stopping or self.sched.finished)

    def caller_waits(self) -> bool:
        """The caller is not what the run waits for: it has room for more outputs (a serial
        run: it took every output it was given)."""
        return self.room == self.room0 if self.serial else self.room > 0
