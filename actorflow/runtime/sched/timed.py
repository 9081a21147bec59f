"""The actor scheduler's acts that end on the loop's time: an act past its ``timeout=``
(the run fails, the act is abandoned), and the acts of ``async def`` stages and async
sources (tasks on the run's loop, several at once, handed on in piece order).
``TimedActs`` is a component of the credit scheduler (``sched.timed``), handed the
scheduler; it owns the run's async tasks and what each holds."""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from typing import cast

from ...errors import ActorError
from ..observe.timeline import record, record_failed
from ..plan.registers import EOS
from .actor_runs import ActorRun, ActorThread


class TimedActs:
    """``tasks``: the async acts running (a run is not quiet while there are any);
    ``acts``: each task's ``(state, piece, regs, out_reg, timer)``; ``tokens``: the
    ``Stragglers`` token of each task abandoned when the run ended."""

    def __init__(self, sched):
        self.sched = sched
        self.tasks: set = set()
        self.acts: dict = {}
        self.tokens: dict = {}

    # -- timeouts --------------------------------------------------------------------------
    def time_act(self, st: ActorRun, piece: int) -> None:
        """Fails the run if this act (one at a time: acts of an actor with a timeout are
        not queued ahead) has not completed after ``timeout`` seconds."""
        st.timer = self.sched.loop.call_later(st.actor.timeout, self.timed_out, st, piece)

    def wait_act(self, st: ActorRun, piece: int) -> None:
        """(A serial run) a stage with ``timeout=`` acts on its thread, so that an act past
        its timeout can be abandoned, but the loop waits for it as for an inline act: the
        order of acts stays the seed's."""
        thread = cast(ActorThread, st.thread)  # (_dispatch started it)
        posted = cast(threading.Event, thread.posted)  # (a serial run's threads have one)
        if not posted.wait(st.actor.timeout):
            self.timed_out(st, piece)
            return
        posted.clear()
        self.sched.read_inbox()

    def timed_out(self, st: ActorRun, piece: int) -> None:
        st.timer = None
        sched = self.sched
        if sched.finished or sched.stopping:
            return
        t = st.actor.timeout
        e = TimeoutError(
            f"actor {st.actor.name!r} took longer than timeout={t:g} s on piece "
            f"{piece}; the act was abandoned (it frees its registers when it "
            f"returns)"
        )
        error = ActorError(st.actor.name, piece, e, "")
        error.__cause__ = e
        sched.stop(error)

    # -- async acts ------------------------------------------------------------------------
    def start(self, st: ActorRun, piece: int, regs: list, out_reg) -> None:
        """Starts an async act as a task on the run's loop (with its timer, one per act:
        an async stage's acts overlap)."""
        loop = self.sched.loop
        task = loop.create_task(self._act(st, piece, regs, out_reg))
        self.tasks.add(task)
        timer = None
        if st.actor.timeout is not None:
            timer = loop.call_later(st.actor.timeout, self.timed_out, st, piece)
        self.acts[task] = (st, piece, regs, out_reg, timer)
        task.add_done_callback(lambda t: self._done(t, st, piece, regs, out_reg))

    def cancel(self) -> None:
        """The run stops: cancels every async act (async sources awaiting their next item
        too)."""
        for task in list(self.tasks):
            task.cancel()

    def let_go(self, held) -> None:
        """The run is over: the async acts still running are abandoned to ``held`` (the
        run's ``Stragglers``), which frees what each holds once it ends."""
        for task, (st, piece, regs, out_reg, timer) in list(self.acts.items()):
            if timer is not None:
                timer.cancel()
            if not task.done():  # cancelled by stop(), or cancelled from outside
                self.tokens[task] = held.hold(st.actor, [(piece, regs, out_reg)])
                task.cancel()

    async def _act(self, st, piece, regs, out_reg):
        sched = self.sched
        t0 = time.perf_counter()
        try:
            actor = st.actor
            result = await actor.compute_async(
                piece, sched.inputs_of(st, regs), out_reg.arrays if out_reg is not None else None
            )
            delay = actor.sim_time(piece)
            if delay > 0:
                await (sched.clock or asyncio).sleep(delay)
            if sched.timeline is not None and result is not EOS:
                record(sched.timeline, st, piece, t0, time.perf_counter())
            return result, None, time.perf_counter() - t0
        except asyncio.CancelledError as e:
            if sched.stopping:
                raise  # the run cancelled it
            # the source raised CancelledError itself: an error, not end of stream
            return self._failed(st, piece, t0, e)
        except Exception as e:  # noqa: BLE001 - reported as ActorError
            return self._failed(st, piece, t0, e)

    def _failed(self, st, piece, t0, e):
        """An async act raised ``e``: recorded (a test's last acts, a trace) and returned
        as its error."""
        t1 = time.perf_counter()
        if self.sched.timeline is not None:
            record_failed(self.sched.timeline, st, piece, t0, t1, e)
        return None, (e, traceback.format_exc()), t1 - t0

    def _done(self, task, st, piece, regs, out_reg) -> None:
        """An async act ended, or was cancelled (perhaps before it started). Acts of an
        async stage overlap and may end out of order: each is handled once every earlier
        piece's is, so pieces leave in order."""
        self.tasks.discard(task)
        entry = self.acts.pop(task, None)
        if entry is not None and entry[4] is not None:
            entry[4].cancel()
        sched = self.sched
        token = self.tokens.pop(task, None)
        if token is not None:
            sched.stragglers.release(token)
        if sched.finished or sched.stopping:
            return
        if task.cancelled():  # cancelled from outside the run: not end of stream
            e = asyncio.CancelledError(
                f"the act of async actor {st.actor.name!r} on piece "
                f"{piece} was cancelled from outside the run"
            )
            result, err, dt = None, (e, ""), 0.0
        else:
            exc = task.exception()
            if exc is not None:
                result, err, dt = None, (exc, ""), 0.0
            else:
                result, err, dt = task.result()
        sched.completed(st, piece, regs, out_reg, result, err, dt)
