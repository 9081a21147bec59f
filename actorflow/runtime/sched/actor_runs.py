"""An actor's part of one run (``ActorRun``: its pieces, acts and waits), and the thread
an actor acts on. "State" in the runtime means what is read and written across pieces
(``state_gates.py``); what an actor keeps during one run is its ``ActorRun``."""

from __future__ import annotations

import threading
import time
import traceback
from queue import SimpleQueue

from ..graph.actors import OpActor
from ..graph.source import SourceActor
from ..observe.timeline import record_act
from ..plan.registers import EOS

INPUT, CREDIT, RESOURCE = "input", "credit", "resource"


class ActorRun:
    """One actor's part of one run: where its pieces are, its acts and its waits."""

    __slots__ = (
        "actor",
        "ins",
        "out",
        "next_piece",
        "in_flight",
        "max_in_flight",
        "mode",
        "ended",
        "queued",
        "thread",
        "raw",
        "acts",
        "compute_s",
        "waits",
        "cause",
        "since",
        "tokens",
        "jobs",
        "timer",
        "early",
        "next_done",
        "ordered",
        "gates",
        "share",
        "parts",
        "got",
        "piped",
        "in_names",
    )

    def __init__(self, actor, out, mode: str, max_in_flight: int):
        self.actor = actor
        self.ins: list = []  # InPorts
        self.out = out  # OutPort or None
        self.next_piece = 0
        self.in_flight = 0
        self.max_in_flight = max_in_flight
        self.mode = mode  # "inline" | "thread" | "async" (tasks on the loop)
        self.ended = False  # end of stream passed on
        self.queued = False  # in the scheduler's ready list
        self.thread: ActorThread | None = None
        self.raw = isinstance(actor, OpActor) or getattr(actor, "raw", False)
        self.acts = 0
        self.compute_s = 0.0
        self.waits = {INPUT: 0.0, CREDIT: 0.0, RESOURCE: 0.0}
        self.cause: str | None = None  # why it is idle now, and since when
        self.since = 0.0
        self.tokens = tuple(actor.resources.items())
        self.jobs: dict = {}  # piece -> (regs, out_reg) of acts sent to its thread
        self.timer = None  # the timeout of the act running (actors with timeout=)
        self.early: dict = {}  # acts done before an earlier piece's (async acts,
        self.next_done = 0  # replicas): by piece; the piece handled next
        self.ordered = mode == "async" or actor.replicas > 1
        self.gates = None  # (state gates read, written): see gates.py
        self.share = None  # its MemoryGate when its registers share memory
        self.parts: dict = {}  # the collector: piece -> [count, sinks' parts]
        self.got: list = [0] * len(getattr(actor, "inputs", ()))  # parts per sink
        self.piped = False  # its thread takes its own acts (PipedThread)
        self.in_names = tuple(p.name for p in getattr(actor, "inputs", ()))  # (traces)


def make_actor_runs(plan, gates: dict, serial: bool = False) -> list:
    """The run state of each actor of ``plan``, with how it acts: ``inline`` on the loop,
    on its own ``thread``, ``async`` (tasks on the loop), or ``undecided`` (an op actor
    sized by piece 0: decided then). ``serial`` (a test schedule): every plain stage acts
    inline, one act at a time (one with ``timeout=`` on its thread, waited for)."""
    states = []
    for actor in plan.actors:
        if getattr(actor, "is_async", False):
            mode = "async"  # an async source, or an async def stage
        elif actor.inline or serial and actor.inline is not None and actor.timeout is None:
            mode = "inline"  # (serial: an act with timeout= needs its thread to
            # be abandoned; the loop waits for it there)
        elif actor.inline is None:  # an op actor: by its size, or piece 0's
            mode = "undecided" if actor in plan.pending else "inline" if serial else "thread"
        else:
            mode = "thread"
        if mode == "async":  # a stage's acts overlap (each holds a register); a
            limit = (
                1
                if isinstance(actor, SourceActor)
                else getattr(  # source's cannot,
                    actor, "acts_at_once", 1 << 30
                )
            )  # nor a device step's (its state)
        else:  # (each replica of a stage: one act at a time)
            limit = (
                actor.replicas
                if (
                    mode != "thread"
                    or actor.resources
                    or actor.time is not None
                    or actor.timeout is not None
                )
                else 1 << 30
            )
        st = ActorRun(actor, plan.ports.get(actor), mode, limit)
        st.ins = plan.in_ports.get(actor, [])
        st.gates = gates.get(actor)
        states.append(st)
    return states


class ActorThread:
    """The thread an actor acts on: runs queued acts in order, posts each completion.

    When the run stops, the scheduler files every act it dispatched here and has not seen
    complete with the run's ``Stragglers`` (``token``), then marks the thread ``abandoned``
    and queues its end. The thread starts no further act; one running then finishes and
    its result is dropped; the thread exits and gives the token back, which frees what
    those acts held. (No lock per act: the token is set before ``abandoned``, and the GIL
    orders the two stores, so the thread sees the token whenever it sees the mark.)"""

    def __init__(self, sched, state: ActorRun, queue=None):
        self.queue: SimpleQueue = SimpleQueue() if queue is None else queue  # (replicas
        # of a stage share one queue: each act goes to whichever is free)
        self.sched = sched
        self.state = state
        self.abandoned = False
        self.token = None  # the Stragglers' hold on acts not seen to complete
        self.posted = threading.Event() if sched.serial else None  # (a serial run waits
        # for each act of its thread: TimedActs.wait_act)
        self.thread = threading.Thread(
            target=self._main, name=f"actorflow-{state.actor.name}", daemon=True
        )

    def _main(self) -> None:
        try:
            self._acts()
        finally:
            if self.token is not None:  # the run is over: free what its acts here held
                self.sched.stragglers.release(self.token)

    def _post(self, item) -> bool:
        """Hands ``item`` (a completion) to the loop's inbox; one wake-up for all the
        completions posted meanwhile. False when the loop is closed (the run is over)."""
        sched = self.sched
        sched.inbox.append(item)
        if not sched.inbox_woken:
            sched.inbox_woken = True
            try:
                sched.loop.call_soon_threadsafe(sched.read_inbox)
            except RuntimeError:  # the loop is closed: the run was torn down
                return False
        return True

    def _acts(self) -> None:
        q, sched, st = self.queue, self.sched, self.state
        actor = st.actor
        while True:
            job = q.get()
            if job is None or self.abandoned:
                return
            piece, regs, out_reg = job
            t0 = time.perf_counter()
            err = result = None
            delay = 0.0
            try:
                result = actor.compute(
                    piece,
                    sched.inputs_of(st, regs),
                    out_reg.arrays if out_reg is not None else None,
                )
                delay = actor.sim_time(piece)
            except BaseException as e:  # noqa: BLE001 - reported as ActorError on the loop
                err = (e, traceback.format_exc())
            dt = time.perf_counter() - t0
            if self.abandoned:  # the run stopped meanwhile: drop the result
                return
            if sched.timeline is not None and result is not EOS:
                record_act(sched.timeline, st, piece, t0, t0 + dt, delay, err)
            if not self._post((delay, st, piece, regs, out_reg, result, err, dt)):
                return
            if self.posted is not None:
                self.posted.set()
