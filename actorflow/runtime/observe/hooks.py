"""Who watches runs, and the test schedule: the hooks that ``actorflow.testing`` and the
progress bars use, kept out of the scheduler's path.

- ``watch(w)``: ``w.started(g, sched)`` is called as each run of an actor graph starts
  (before its first act) and ``w.ended(g, sched)`` once it is over and its stats are made.
  ``running()`` lists the runs in progress (what ``wait_all_actors_blocked`` looks at).
- ``SCHEDULE``: what a test schedule sets for every run that does not say otherwise: a
  ``seed`` for the order in which ready actors are tried, ``serial`` (every plain stage acts
  on the loop, one act at a time, and simulated time (``time=``) runs on a virtual clock:
  the order of acts is then a function of the seed alone), and ``keep_acts`` (the last acts
  of each run are kept in memory, to be printed when a test fails).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class Schedule:
    __slots__ = ("seed", "serial", "keep_acts")

    def __init__(self):
        self.seed = None
        self.serial = False
        self.keep_acts = 0


SCHEDULE = Schedule()
_WATCHERS: list = []
_RUNNING: dict = {}  # sched -> graph, for runs in progress


def watch(watcher) -> None:
    if watcher not in _WATCHERS:
        _WATCHERS.append(watcher)


def unwatch(watcher) -> None:
    if watcher in _WATCHERS:
        _WATCHERS.remove(watcher)


def running() -> list:
    """``[(graph, sched)]`` of the runs in progress, oldest first."""
    return [(g, s) for s, g in list(_RUNNING.items())]


def run_started(g, sched) -> None:
    _RUNNING[sched] = g
    for w in list(_WATCHERS):
        w.started(g, sched)


def run_ended(g, sched) -> None:
    _RUNNING.pop(sched, None)
    for w in list(_WATCHERS):
        w.ended(g, sched)


class VirtualClock:
    """Simulated time for a serial run: ``call_later`` files the callback at the virtual
    time ``now + delay``; the earliest one due runs at the loop's next turn, and the clock
    jumps to its time. Virtual time moves only by those jumps, never with the real clock,
    so the order in which simulated acts end depends on their times alone (ties: the order
    they were filed in), and a run of simulated seconds takes no real seconds.

    ``hold()`` (optional) is True while time must stand still: the caller of ``run()``
    has not taken every output it was given yet (it takes no virtual time; were the clock
    to move meanwhile, when its thread got round to them would change the order of acts).
    ``resume()`` goes on once it has; ``held`` says the clock waits for that."""

    def __init__(self, hold=None):
        self.now = 0.0
        self.heap: list = []
        self.count = itertools.count()
        self.armed = False
        self.loop = None
        self.hold = hold
        self.held = False

    def call_later(self, delay: float, callback, *args):
        heapq.heappush(self.heap, (self.now + delay, next(self.count), callback, args))
        if not self.armed:
            self.armed = True
            self.loop = asyncio.get_running_loop() if self.loop is None else self.loop
            self.loop.call_soon(self._fire)

    def _fire(self) -> None:
        self.armed = False
        if not self.heap:
            return
        if self.hold is not None and self.hold():
            self.held = True  # (resume() goes on)
            return
        when, _, callback, args = heapq.heappop(self.heap)
        self.now = max(self.now, when)
        if self.heap:
            self.armed = True
            self.loop.call_soon(self._fire)
        callback(*args)

    async def sleep(self, delay: float) -> None:
        fut = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        self.call_later(delay, wake)
        await fut

    def resume(self) -> None:
        """Time may move again (``hold()`` turned False)."""
        if self.held:
            self.held = False
            if self.heap and not self.armed:
                self.armed = True
                self.loop.call_soon(self._fire)

    def clear(self) -> None:
        self.heap.clear()
