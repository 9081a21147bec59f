"""The run's output: what the collector copies out of the sinks' registers, and the caller's
room for outputs it has not taken yet. ``RunOutput`` is a component of the credit
scheduler (``sched.output``), handed the scheduler; it runs on the scheduler's loop."""

from __future__ import annotations

import time
import traceback

from ...errors import ActorError
from ..plan.registers import EOS
from .actor_runs import CREDIT, INPUT


class RunOutput:
    """The collector's side of a run (``st``: the collector's ``ActorRun``, None when the
    graph has no sink) and the caller's: ``deliver(value)`` receives each output, at most
    ``room`` of them before ``credit_back()`` is called. ``serial`` (a test schedule): the
    caller's credits are applied once it has caught up (see ``credit_back``)."""

    def __init__(self, sched, st, deliver, room: int, serial: bool):
        self.sched = sched
        self.st = st
        self.deliver = deliver
        self.room = self.room0 = room
        self.taken = 0                  # (serial: credits back, applied once caught up)
        self.serial = serial
        # what collect() calls on every piece, bound once
        self._plan = sched.plan
        self._timeline = sched.timeline
        self._hand_back = sched._hand_back
        self._blocked = sched._blocked

    def collect(self) -> None:
        """The run's output: copies each sink's piece out of its register the moment it
        arrives (so the register goes home at once, as the memory plan assumes), at most
        ``room`` pieces ahead of the caller, and delivers a piece once every sink's part
        of it is in, in piece order. Ends once a sink's end of stream leaves no piece to
        complete."""
        st = self.st
        if self._plan.pending:                  # (a lazy plan sizes registers first)
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
            self.room -= 1
            if st.cause is not None:
                st.waits[st.cause] += time.perf_counter() - st.since
                st.cause = None
            self.deliver(actor.assemble(slot[1]))
        if ends and not self.sched.stopping and st.next_piece >= min(st.got[k] for k in ends):
            parts.clear()               # (parts of pieces a finished sink never sends)
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
        self.room += n
        if self.st is not None:
            sched.wake(self.st)
        try:
            sched.drain()
            if sched.clock is not None:
                sched.clock.resume()
        except BaseException as e:  # noqa: BLE001 - as in CreditScheduler.completed()
            sched._internal(e)

    def caller_behind(self) -> bool:
        """(A serial run) the caller has outputs it has not taken and handed back: the
        virtual clock stands still until it has (``credit_back``)."""
        return self.room < self.room0 and not (self.sched.stopping or self.sched.finished)

    def caller_waits(self) -> bool:
        """The caller is not what the run waits for: it has room for more outputs (a serial
        run: it took every output it was given)."""
        return self.room == self.room0 if self.serial else self.room > 0
