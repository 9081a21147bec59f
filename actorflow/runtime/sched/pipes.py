"""Piped thread stages: a chain of plain thread stages passes pieces from thread to thread.

An act of a thread stage normally goes through the scheduler's loop twice: the loop sends
it to the thread, and the thread posts its completion back. For a *piped* actor the loop
does neither: its thread takes its own acts (the next register from its producer, then a
free register of its own, its credit), hands the input register back and sends its output
on, straight to the neighbour's queue where that neighbour is piped too, else through the
loop's inbox. The source feeding a piped stage is piped too (its thread writes its
registers and hands them on), and so is the run's output when ``run()`` is iterated from
plain code and its one sink comes from a piped actor: that actor's thread copies each
piece out and delivers it (``RunOutput.hand_over``), with the caller's credits handed back
from the caller's thread. The registers, the credits and back-pressure are the same; the
loop still allocates every register, handles errors, end of stream and stopping, and
counts acts and waits per actor, but a chain from source to output sized up front passes
no piece through it.

Which actors are piped (``pipe_actors``): in a graph fed by one source (so every actor
sees the same end of stream and none stops early), a plain thread stage with one input
and one consumer that acts one piece at a time, with no tokens, state gates, shared
bytes, simulated time or timeout; and such a source whose consumer is piped.
"""

from __future__ import annotations

import threading
import time
import traceback
from queue import SimpleQueue

from ..graph.actors import Collector, Sized
from ..graph.source import SourceActor
from ..observe.timeline import record, record_failed
from ..observe.watchdog import stalled
from ..plan.registers import EOS
from .actor_runs import CREDIT, INPUT, ActorRun, ActorThread


def _pipeable(st) -> bool:
    """A plain actor on a thread of its own, one act at a time, with one consumer and
    nothing else the loop keeps for it (tokens, state gates, shared bytes, simulated time,
    a timeout)."""
    a = st.actor
    return (
        st.mode == "thread"
        and not st.ended
        and not isinstance(a, Collector)
        and a.replicas == 1
        and not st.tokens
        and st.gates is None
        and st.share is None
        and a.time is None
        and a.timeout is None
        and st.out is not None
        and len(st.out.consumers) == 1
    )


def _pipe(st) -> None:
    st.piped = True
    st.in_flight = 1  # acting, as far as the loop knows, until its end
    st.out.pipe = SimpleQueue()
    while st.out.free:
        st.out.pipe.put(st.out.free.popleft())


def pipe_actors(states: list, output=None) -> None:
    """Marks the piped actors of a run and gives their ports queues: an OutPort's ``pipe``
    holds its free registers, an InPort's ``pipe`` what its producer sent. The source is
    piped when its consumer is (its thread writes its registers and hands them on); the
    run's ``output`` is piped (``RunOutput.hand_over``) when it may be delivered from any
    thread and its one sink is made by a piped actor."""
    # (a stage with no inputs is a source too, one that never ends by itself)
    if sum(1 for st in states if not st.ins and not isinstance(st.actor, Collector)) != 1:
        return
    for st in states:
        if len(st.ins) == 1 and not isinstance(st.actor, SourceActor) and _pipeable(st):
            _pipe(st)
            st.ins[0].pipe = SimpleQueue()
    for st in states:
        if (
            isinstance(st.actor, SourceActor)
            and not st.ins
            and _pipeable(st)
            and st.out.consumers[0].pipe is not None
        ):
            _pipe(st)
    c = None if output is None else output.st
    if (
        c is not None
        and output.from_threads
        and not c.ended
        and len(c.ins) == 1
        and c.ins[0].producer.pipe is not None
    ):
        output.piped = True


WATCH_S = 0.5  # how often a run with piped actors looks for a stall


def watch_pipes(sched, last=None) -> None:
    """The stall detector for runs with piped actors. A piped thread waits on its queues,
    not on the loop, so the loop's own check (nothing in flight after a message) never
    sees it idle. Every ``WATCH_S`` the loop looks: if every actor has ended or waits (a
    piped one blocked on an empty queue, the others idle), nothing is queued for the loop,
    and no act happened since the last look, the run is stalled (by construction it never
    is; if it is, it stops with the DeadlockError instead of hanging)."""
    if sched.finished or sched.stopping or sched.done is None or sched.done.done():
        return
    states = sched.actor_runs
    progress = tuple(st.acts for st in states)
    quiet = (
        not sched.inbox
        and not sched.ready
        and not sched.timed.tasks
        and (sched.collector is None or sched.output.room > 0)
        and all(
            st.ended or (st.cause is not None if st.piped else st.in_flight == 0) for st in states
        )
    )
    if quiet and progress == last:
        sched.stop(stalled(sched))
        return
    sched.loop.call_later(WATCH_S, watch_pipes, sched, progress if quiet else None)


def abandon(t, held) -> None:
    """The run stopped: files the act a piped thread runs (if any) with the Stragglers,
    marks it abandoned, and wakes it wherever it waits."""
    with t.claim:  # its act is filed, or it never starts
        jobs = dict(t.state.jobs)
        if jobs:
            t.token = held.hold(t.state.actor, [(p, r, o) for p, (r, o) in jobs.items()])
        t.abandoned = True
    t.queue.put(None)
    t.state.out.pipe.put(None)
    if t.output is not None:
        t.output.woken.put(None)


class PipedThread(ActorThread):
    """The thread of a piped actor (see the module's doc): takes the next register from
    its input's queue (a source: none), then a credit from its OutPort's, acts, and passes
    both on (the last of a chain feeding a piped output delivers the piece itself, and
    takes its register home). Its act is filed in ``state.jobs`` while it runs; ``claim``
    orders that against the run's stop (``abandon`` reads the jobs and marks the thread
    abandoned under it), so an act either is filed and abandoned, or never starts."""

    def __init__(self, sched, state: ActorRun):
        super().__init__(sched, state, state.ins[0].pipe if state.ins else None)
        self.claim = threading.Lock()  # (its queue: registers, EOS, or None)
        out = sched.output
        self.output = (
            out if out.piped and state.out.consumers[0].actor is out.st.actor else None
        )  # it delivers the run's output

    def _acts(self) -> None:
        st = self.state
        actor, out = st.actor, st.out
        inq = self.queue if st.ins else None  # None: a source, no input
        free = out.pipe
        back = st.ins[0].producer.pipe if st.ins else None  # None: the loop takes them home
        fwd = out.consumers[0].pipe  # None: the loop sends the output on
        fwd_name = out.consumers[0].actor.name
        output = self.output
        waits, raw, clock, claim = st.waits, st.raw, time.perf_counter, self.claim
        name = actor.name
        reg = None
        while True:
            t0 = clock()
            if inq is not None:
                st.cause, st.since = INPUT, t0  # (a stop's stats count the wait under way)
                reg = inq.get()
                if reg is None or self.abandoned:
                    return
                if reg is EOS:
                    waits[INPUT] += clock() - t0
                    st.cause = None
                    self._post((None, st, None, None, None, EOS, None, 0.0))
                    return
            t1 = clock()
            waits[INPUT] += t1 - t0
            st.cause, st.since = CREDIT, t1
            out_reg = None
            if out.spec is not None or st.next_piece:  # (else piece 0 sizes its registers;
                out_reg = free.get()  # the loop then hands them over)
                if out_reg is None or self.abandoned:
                    return
            t2 = clock()
            waits[CREDIT] += t2 - t1
            st.cause = None
            if out_reg is not None:
                out_reg.at = name  # (where each register is: see Register.at)
            piece = st.next_piece
            with claim:
                if self.abandoned:
                    return
                st.jobs[piece] = ([reg] if reg is not None else [], out_reg)
            err = result = None
            try:
                result = actor.compute(
                    piece,
                    [] if reg is None else [reg.arrays if raw else reg.view],
                    out_reg.arrays if out_reg is not None else None,
                )
            except BaseException as e:  # noqa: BLE001 - reported as ActorError on the loop
                err = (e, traceback.format_exc())
            if self.abandoned:  # the run stopped meanwhile: drop the result
                return
            t3 = clock()
            del st.jobs[piece]
            if result is EOS:  # a source ran out
                if out_reg is not None:
                    out_reg.at = None
                    free.put(out_reg)
                self._post((None, st, None, None, None, EOS, None, 0.0))
                return
            st.compute_s += t3 - t2
            tl = self.sched.timeline
            if tl is not None:
                if t1 > t0:
                    tl.wait(name, INPUT, t0, t1)
                if t2 > t1:
                    tl.wait(name, CREDIT, t1, t2)
                if err is None:
                    record(tl, st, piece, t2, t3)
                else:
                    record_failed(tl, st, piece, t2, t3, err[0])
            st.next_piece = piece + 1
            if err is not None:
                self._post((None, st, piece, reg, out_reg, None, err, 0.0))
                return
            loop_in = loop_out = None
            if reg is not None and reg.index >= 0:
                if back is not None:
                    reg.at = None
                    back.put(reg)
                else:
                    loop_in = reg
            if out_reg is not None:
                st.acts += 1
                if fwd is not None:
                    out_reg.piece = piece
                    out_reg.at = fwd_name
                    fwd.put(out_reg)
                elif output is not None:
                    out_reg.piece = piece
                    if not output.hand_over(piece, out_reg, self):
                        return
                    out_reg.at = None
                    free.put(out_reg)
                else:
                    loop_out = out_reg
            if loop_in is not None or loop_out is not None or type(result) is Sized:
                if not self._post((None, st, piece, loop_in, loop_out, result, None, 0.0)):
                    return
