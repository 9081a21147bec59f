"""Where actor graphs run: the process-wide graph loop thread that ``run()`` drives graphs
on, and what a run does around its consumer (``run_async``'s watch on the consuming task,
the warning while a next run waits for acts the last one abandoned)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import warnings

from ...eventloop import start_loop_thread, stop_loop_thread

_GRAPH_LOOP: list = []
_GRAPH_THREAD: list = []
_GRAPH_LOOP_LOCK = threading.Lock()
_AT_EXIT = {"registered": False, "ran": False}  # (the graph loop's atexit handler)


def graph_loop():
    """The event loop (uvloop when installed) on which ``run()`` drives actor graphs: one
    thread for the process, started on first use, like the VM's; stopped at exit (a later
    use, from an atexit handler that runs after actorflow's, is refused)."""
    with _GRAPH_LOOP_LOCK:
        if not _GRAPH_LOOP:
            if _AT_EXIT["ran"]:
                raise RuntimeError(
                    "an actor graph was run after actorflow stopped its graph loop at exit "
                    "(from an atexit handler registered before actorflow was imported, or "
                    "a finalizer run at exit): run graphs before the interpreter exits, or "
                    "register that handler after importing actorflow"
                )
            loop, thread = start_loop_thread("actorflow-graphs")
            _GRAPH_THREAD.append(thread)
            _GRAPH_LOOP.append(loop)
            if not _AT_EXIT["registered"]:  # (once: runs before the VM's, registered later)
                _AT_EXIT["registered"] = True
                atexit.register(_at_exit)
        return _GRAPH_LOOP[0]


def _at_exit() -> None:
    with _GRAPH_LOOP_LOCK:
        _AT_EXIT["ran"] = True
    _stop_graph_loop()


def _stop_graph_loop() -> None:
    """Stops the graph loop's thread (at exit: a uvloop loop left running in a daemon
    thread while the interpreter finalizes can crash the process when a callback fires);
    a run still waiting on it gives up waiting (``driving._settle``)."""
    with _GRAPH_LOOP_LOCK:
        if not _GRAPH_LOOP:
            return
        loop, thread = _GRAPH_LOOP.pop(), _GRAPH_THREAD.pop()
    stop_loop_thread(loop, thread, timeout=5)


def on_graph_loop() -> bool:
    """Is the caller the graph loop's thread (an inline act, an async act, a callback of
    a run driven by ``run()``)?"""
    threads = _GRAPH_THREAD[:1]  # (a copy: the list may be emptied meanwhile)
    return bool(threads) and threading.current_thread() is threads[0]


def refuse_on_graph_loop(what: str = "run() was called") -> None:
    """Raises if the caller is the graph loop thread: ``run()`` started (or a run's
    ``next()`` called) there would block that thread waiting for a run that needs it to
    go on."""
    if on_graph_loop():
        raise RuntimeError(
            f"{what} on the thread that drives actor graphs (from an act on the "
            "graph loop: an inline actor (inline=True), an async def stage or source, or a "
            "callback of a run): it blocks until the run ends, and that run needs this "
            "thread to go on. From an async def stage, iterate the other graph with "
            "'async for out in g.run_async()'; from a plain stage, make it a thread stage "
            "(drop inline=True; under a test's serial schedule, af_seed or "
            "af.testing.seeded, plain stages act on the loop too: seeded(n, serial=False))"
        )


_PLANNING = threading.local()  # .loop: where a plan made on this thread for a
#                                run_async run awaits async actors' piece 0


@contextlib.contextmanager
def planning_for(loop):
    """On this thread, ``run_on_graph_loop`` awaits on ``loop`` (the loop of the
    ``run_async`` run being planned) instead of the graph loop."""
    _PLANNING.loop = loop
    try:
        yield
    finally:
        _PLANNING.loop = None


def run_on_graph_loop(coro):
    """Awaits ``coro`` from plain code and returns its result: how a plan computes piece
    0 of an async source or stage. On the graph loop; for a ``run_async`` run, on its own
    loop (``planning_for``)."""
    loop = getattr(_PLANNING, "loop", None)
    if loop is None:
        if on_graph_loop():
            coro.close()
            raise RuntimeError(
                "plan() was called on the thread that drives actor graphs (from an act on "
                "the graph loop): it computes piece 0 of an async source or stage by "
                "awaiting it on that loop, which would wait for this very act. Give those "
                "actors out=af.Spec(...), call plan() from plain code, or iterate "
                "'async for out in g.run_async()' (it plans without blocking the loop)"
            )
        loop = graph_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


WAIT_WARN_S = 10.0


def warn_waiting(stragglers) -> None:
    acts = ", ".join(f"{name!r} on piece {p}" for name, p in stragglers.running())
    if not acts:
        return  # they returned just now
    warnings.warn(
        f"this graph's next run is waiting for acts its last run abandoned when "
        f"it stopped, still running: {acts}",
        RuntimeWarning,
        stacklevel=3,
    )


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
