"""How a run of an ActorGraph is driven: ``run()`` from plain code (the run goes on the
graph loop thread and hands its outputs over a queue) and ``run_async()`` on the caller's
loop. Both stop the run at once when the consumer stops iterating, and free the plan."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from queue import SimpleQueue

from ..observe import hooks as observe
from ..observe.progress import ProgressBar, tqdm_class
from . import loop as loop_module
from .credit import CreditScheduler
from .loop import ConsumerWatch, graph_loop, on_graph_loop, refuse_on_graph_loop

_END = object()


class _Failed:
    def __init__(self, error):
        self.error = error


def new_run(g, plan, deliver, trace, progress) -> CreditScheduler:
    """The scheduler of a run of ``g``: the graph's seed, else a test schedule's
    (``observe.SCHEDULE``); watchers told it started; a progress bar when asked."""
    sch = observe.SCHEDULE
    seed = g.seed if g.seed is not None else sch.seed
    sched = CreditScheduler(plan, deliver, g.output_buffers, seed, trace, sch.serial, sch.keep_acts)
    if progress:
        try:
            ProgressBar(sched, progress)
        except BaseException:  # (tqdm refused its arguments): nothing ran; the
            sched.stopping = True  # plan is freed and the graph may run again
            sched.let_go()
            g._finish(plan, sched)
            raise
    observe.run_started(g, sched)
    return sched


def run_blocking(g, feed=None, trace=None, progress=False):
    """Runs the graph from plain code (on the graph loop thread); yields the outputs in
    piece order. ``break``, an actor's error (ActorError) or Ctrl-C stops it at once;
    acts running then are abandoned and free their registers when they return
    (``join()`` waits for that); everything else is freed before this returns.

    Every ``next()`` on the graph loop thread (an act there, advancing a run it did not
    start) is refused with RuntimeError, as the start is: waiting there for the next
    output would wait for this very thread; the run is stopped."""
    refuse_on_graph_loop()
    if progress:
        tqdm_class()  # (missing: said before the run starts)
    g._wait_abandoned()
    plan = g._start(feed)
    out = SimpleQueue()
    sched = new_run(g, plan, out.put, trace, progress)
    g._stragglers = sched.stragglers  # join() waits for this run from now
    g._current = (sched, plan)
    loop = graph_loop()

    async def main():
        try:
            await g._drive(plan, sched)
            out.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out.put(_Failed(e))

    done, finished = None, False
    owed, batch = 0, max(1, g.output_buffers // 2)
    try:
        sched.start_sources(loop)
        done = asyncio.run_coroutine_threadsafe(main(), loop)
        while True:
            item = out.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Failed):
                finished = True
                raise item.error
            owed += 1  # hand credits back in batches: fewer wake-ups
            if owed >= batch or out.empty():
                sched.output.caller_took(owed)
                owed = 0
            yield item
            refuse_on_graph_loop("a run started elsewhere was advanced (next())")
    finally:
        # (no return in here: it would swallow the error on its way out, a source that
        # failed to start or a Ctrl-C, and the caller's loop would just end)
        if done is None:  # stopped before the loop took the run
            sched.stopping = True
            sched.let_go()
            g._finish(plan, sched)
        else:
            _settle(loop, sched, done, finished)


_SETTLE_POLL_S = 0.05  # how often a wait for a run's end looks whether its loop still runs


def _settle(loop, sched, done, finished: bool) -> None:
    """After ``run_blocking``'s loop: stops the run if it did not finish, and waits until
    it ended and its memory is settled (on the graph loop, closed or refused there: it
    ends there once the act returns, unwaited); a second Ctrl-C while waiting is raised
    once that is done."""
    if not finished:
        loop.call_soon_threadsafe(sched.stop, None)
    interrupted = None
    while not on_graph_loop():
        try:
            done.result(timeout=_SETTLE_POLL_S)
            break
        except FutureTimeout:
            if not loop.is_running():  # (stopped at exit: nothing ends the run now; a
                break  # generator closed as the interpreter finalizes does not wait)
        except KeyboardInterrupt as e:  # a second Ctrl-C: clean up, then raise it
            interrupted = e
    if interrupted is not None:
        raise interrupted


def start_async(g, feed):
    """``g._start(feed)`` for ``run_async``, awaitable. A plan that computes piece 0 first
    (``ActorGraph._plans_first``) is made on a thread of its own, with the piece 0 of async
    sources and stages awaited on this loop, the run's (what they read may belong to it),
    so that the loop goes on meanwhile: it may be the graph loop, running the acts of
    another graph. If the caller stops waiting, a plan made after all is freed unused."""
    loop = asyncio.get_running_loop()
    made = loop.create_future()
    if not g._plans_first(feed):
        made.set_result(g._start(feed))
        return made

    def hand_over(plan, error):
        if made.cancelled():
            if plan is not None:
                g._unstart(plan)
        elif error is not None:
            made.set_exception(error)
        else:
            made.set_result(plan)

    def plan_it():
        plan = error = None
        try:
            with loop_module.planning_for(loop):
                plan = g._start(feed)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
            error = e
        try:
            loop.call_soon_threadsafe(hand_over, plan, error)
        except RuntimeError:  # the loop is closed: nobody takes the plan
            if plan is not None:
                g._unstart(plan)

    threading.Thread(target=plan_it, name="actorflow-plan", daemon=True).start()
    return made


async def run_async(g, feed=None, trace=None, progress=False):
    """Runs the graph on the running event loop; ``async for out in g.run_async()``.

    Cancelling the consuming task (while it waits here or in its own code), an error in
    an actor, or ``aclosing`` stops the run at once, as ``run()`` does on ``break``.
    Any running loop will do, the graph loop too: an ``async def`` stage of another run
    may iterate this one (its acts are tasks there, and nothing here blocks the loop)."""
    if progress:
        tqdm_class()
    if g._stragglers is not None and not g._stragglers.done() and not g._running:
        waiting = asyncio.ensure_future(g._stragglers.wait_async())
        try:
            while not (await asyncio.wait([waiting], timeout=loop_module.WAIT_WARN_S))[0]:
                loop_module.warn_waiting(g._stragglers)
        finally:
            waiting.cancel()
    plan = await start_async(g, feed)
    items: list = []
    waiter = [None]
    loop = asyncio.get_running_loop()

    def wake(*_):
        w = waiter[0]
        if w is not None and not w.done():
            w.set_result(None)

    def deliver(value):
        items.append(value)
        wake()

    sched = new_run(g, plan, deliver, trace, progress)
    g._stragglers = sched.stragglers
    g._current = (sched, plan)
    task = loop.create_task(g._drive(plan, sched))
    task.add_done_callback(wake)
    watch = ConsumerWatch(sched)
    try:
        while True:
            watch.follow(asyncio.current_task())
            if items:
                value = items.pop(0)
                sched.output.credit_back()
                yield value
                continue
            if task.done():
                task.result()  # raises ActorError if an actor failed
                if watch.stopped_run:
                    raise RuntimeError(
                        "this run was stopped when the task iterating it ended (it was "
                        "cancelled or failed while the generator waited at a piece); "
                        "iterate a run from one task to its end"
                    )
                return
            waiter[0] = loop.create_future()
            await waiter[0]
    finally:
        watch.follow(None)
        if task.done():
            g._finish_unstarted(plan, sched, task)
        else:
            sched.stop(None)  # the run task ends now and frees the plan
            try:
                await asyncio.shield(task)
            except BaseException:  # noqa: BLE001 - stopped on purpose; a second cancel
                pass  # leaves the task to finish (and free) on its own
