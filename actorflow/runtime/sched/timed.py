"""The actor scheduler's acts that end on the loop's time: an act past its ``timeout=``
(the run fails, the act is abandoned), and the acts of ``async def`` stages (tasks on the
run's loop, several at once, handed on in piece order). A mixin of ``CreditScheduler``,
as ``Completion`` is."""

from __future__ import annotations

import asyncio
import time
import traceback

from ...errors import ActorError
from ..plan.registers import EOS
from .actor_runs import ActorState
from ..observe.timeline import record, record_failed


class TimedActs:
    def _time_act(self, st: ActorState, piece: int) -> None:
        """Fails the run if this act (one at a time: acts of an actor with a timeout are
        not queued ahead) has not completed after ``timeout`` seconds."""
        st.timer = self.loop.call_later(st.actor.timeout, self._timed_out, st, piece)

    def _timed_out(self, st: ActorState, piece: int) -> None:
        st.timer = None
        if self.finished or self.stopping:
            return
        t = st.actor.timeout
        e = TimeoutError(f"actor {st.actor.name!r} took longer than timeout={t:g} s on piece "
                         f"{piece}; the act was abandoned (it frees its registers when it "
                         f"returns)")
        error = ActorError(st.actor.name, piece, e, "")
        error.__cause__ = e
        self.stop(error)

    async def _act_async(self, st, piece, regs, out_reg):
        t0 = time.perf_counter()
        try:
            actor = st.actor
            result = await actor.compute_async(
                piece, self.inputs_of(st, regs), out_reg.arrays if out_reg is not None else None)
            delay = actor.sim_time(piece)
            if delay > 0:
                await (self.clock or asyncio).sleep(delay)
            if self.timeline is not None and result is not EOS:
                record(self.timeline, st, piece, t0, time.perf_counter())
            return result, None, time.perf_counter() - t0
        except asyncio.CancelledError as e:
            if self.stopping:
                raise                   # the run cancelled it
            # the source raised CancelledError itself: an error, not end of stream
            return self._failed_async(st, piece, t0, e)
        except Exception as e:  # noqa: BLE001 - reported as ActorError
            return self._failed_async(st, piece, t0, e)

    def _failed_async(self, st, piece, t0, e):
        """An async act raised ``e``: recorded (a test's last acts, a trace) and returned
        as its error."""
        t1 = time.perf_counter()
        if self.timeline is not None:
            record_failed(self.timeline, st, piece, t0, t1, e)
        return None, (e, traceback.format_exc()), t1 - t0

    def _async_done(self, task, st, piece, regs, out_reg) -> None:
        """An async act ended, or was cancelled (perhaps before it started). Acts of an
        async stage overlap and may end out of order: each is handled once every earlier
        piece's is, so pieces leave in order."""
        self.pending_tasks.discard(task)
        entry = self.async_acts.pop(task, None)
        if entry is not None and entry[4] is not None:
            entry[4].cancel()
        token = self.async_tokens.pop(task, None)
        if token is not None:
            self.stragglers.release(token)
        if self.finished or self.stopping:
            return
        if task.cancelled():            # cancelled from outside the run: not end of stream
            e = asyncio.CancelledError(f"the act of async actor {st.actor.name!r} on piece "
                                       f"{piece} was cancelled from outside the run")
            result, err, dt = None, (e, ""), 0.0
        else:
            exc = task.exception()
            if exc is not None:
                result, err, dt = None, (exc, ""), 0.0
            else:
                result, err, dt = task.result()
        self.completed(st, piece, regs, out_reg, result, err, dt)
