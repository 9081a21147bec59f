"""Where actor graphs run: the process-wide graph loop thread that ``run()`` drives graphs
on, and what a run does around its consumer (``run_async``'s watch on the consuming task,
the warning while a next run waits for acts the last one abandoned)."""

from __future__ import annotations

import asyncio
import threading
import warnings

from ..eventloop import new_event_loop

_GRAPH_LOOP: list = []
_GRAPH_THREAD: list = []
_GRAPH_LOOP_LOCK = threading.Lock()


def graph_loop():
    """The event loop (uvloop when installed) on which ``run()`` drives actor graphs: one
    thread for the process, started on first use, like the VM's."""
    with _GRAPH_LOOP_LOCK:
        if not _GRAPH_LOOP:
            loop = new_event_loop()
            started = threading.Event()

            def main():
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            t = threading.Thread(target=main, name="actorflow-graphs", daemon=True)
            t.start()
            started.wait()
            _GRAPH_THREAD.append(t)
            _GRAPH_LOOP.append(loop)
        return _GRAPH_LOOP[0]


def refuse_on_graph_loop() -> None:
    """Raises if the caller is the graph loop thread: a run started there would wait for a
    loop that is busy waiting for it."""
    if _GRAPH_THREAD and threading.current_thread() is _GRAPH_THREAD[0]:
        raise RuntimeError(
            "run() was called on the thread that drives actor graphs (from an inline actor, "
            "inline=True, or a callback of a run): it would wait for a loop that is busy "
            "waiting for it. Make that actor a thread stage (inline=False), or iterate "
            "run_async() from async code")


def run_on_graph_loop(coro):
    """Awaits ``coro`` on the graph loop from plain code and returns its result: how
    ``plan()`` computes piece 0 of an async source or stage."""
    try:
        refuse_on_graph_loop()
    except RuntimeError:
        coro.close()
        raise
    return asyncio.run_coroutine_threadsafe(coro, graph_loop()).result()


WAIT_WARN_S = 10.0


def warn_waiting(stragglers) -> None:
    acts = ", ".join(f"{name!r} on piece {p}" for name, p in stragglers.running())
    if not acts:
        return                  # they returned just now
    warnings.warn(f"this graph's next run is waiting for acts its last run abandoned when "
                  f"it stopped, still running: {acts}", RuntimeWarning, stacklevel=3)


class ConsumerWatch:
    """Stops a ``run_async`` run when the task iterating it is cancelled or fails while the
    generator is suspended at ``yield`` (a cancel that landed in the consumer's own code):
    the run's registers and threads are not kept until the generator is garbage-collected.
    A task that ends normally stops nothing (``wait_for(gen.__anext__(), t)`` and a task per
    item each end after taking their piece)."""

    def __init__(self, sched):
        self.sched = sched
        self.task = None
        self.stopped_run = False

    def follow(self, task) -> None:
        if task is self.task:
            return
        if self.task is not None:
            self.task.remove_done_callback(self._ended)
        self.task = task
        if task is not None:
            task.add_done_callback(self._ended)

    def _ended(self, task) -> None:
        self.task = None
        if task.cancelled() or task.exception() is not None:
            self.stopped_run = True
            self.sched.stop(None)
