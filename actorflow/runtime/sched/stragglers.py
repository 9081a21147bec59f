"""Acts still running when a run stops, and the memory they hold.

A run stops at once on an error, a cancel, a ``break`` or Ctrl-C: it does not wait for the
acts running then (a stage may take seconds, or never return). Those acts are abandoned:
each finishes on its own thread, its result is dropped, and only then is what it used
freed: its input registers, its output register, and an op actor's workspace. Everything
else is freed when the run ends. No register is ever freed, or handed to a later
allocation, while an act that holds it is running.

``Stragglers`` keeps that ledger for one run. The run files the acts that may still be
running with ``hold`` (per actor thread: every act sent to it and not seen to complete, since
which one runs is not known without a lock per act) before the plan is released; ``settle``
releases the plan except what is held; each thread calls ``release`` when it exits, right
after its running act returns. ``wait``/``wait_async`` block until the last one has.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter


class Stragglers:
    """The abandoned acts of one run (see the module doc). Thread-safe."""

    def __init__(self, plan):
        self.plan = plan
        self.lock = threading.Lock()
        self.acts: dict = {}  # token -> (actor, [piece], keys)
        self.keys: Counter = Counter()  # memory key -> acts holding it
        self.settled = False
        self._next = 0
        self._done = threading.Event()
        self._waiters: list = []  # (loop, future) of wait_async callers

    def hold(self, actor, jobs: list) -> int:
        """Files acts of ``actor`` that may still be running: ``jobs`` as ``[(piece, input
        registers, output register)]``. Returns the token its ``release`` gives back."""
        keys = []
        for _, regs, out_reg in jobs:
            keys += [r.key for r in regs if r.index >= 0]
            if out_reg is not None and out_reg.index >= 0:
                keys.append(out_reg.key)
        if getattr(actor, "program", None) is not None:
            keys += [(actor.name, "workspace"), (actor.name, "constants")]
        with self.lock:
            token = self._next
            self._next += 1
            self.acts[token] = (actor, sorted(p for p, _, _ in jobs), keys)
            self.keys.update(keys)
        return token

    def settle(self) -> None:
        """Releases the run's plan but what running acts hold; they free it as they return."""
        with self.lock:
            busy = {actor for actor, _, _ in self.acts.values()}
            self.plan.release(keep=set(self.keys), busy=busy)
            self.settled = True
            self._check_done()

    def release(self, token) -> None:
        """An abandoned act returned: frees what nothing else running holds now."""
        with self.lock:
            actor, _, keys = self.acts.pop(token)
            self.keys.subtract(keys)
            for k in keys:
                if k in self.keys and self.keys[k] <= 0:
                    del self.keys[k]
                    if self.settled:  # (before that, settle frees it with the rest)
                        self.plan.budget.free(k)
            if self.settled and all(a is not actor for a, _, _ in self.acts.values()):
                self.plan.release_actor(actor)
            self._check_done()

    def running(self) -> list:
        """``[(actor name, piece)]`` of the acts not known to have returned yet."""
        with self.lock:
            return [(a.name, p) for a, pieces, _ in self.acts.values() for p in pieces]

    def _check_done(self) -> None:
        if self.settled and not self.acts and not self._done.is_set():
            self._done.set()
            for loop, fut in self._waiters:
                try:
                    loop.call_soon_threadsafe(_resolve, fut)
                except RuntimeError:  # that loop is closed
                    pass
            self._waiters.clear()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until every abandoned act has returned; False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        with self.lock:
            if self._done.is_set():
                return
            fut = loop.create_future()
            self._waiters.append((loop, fut))
        await fut


def _resolve(fut) -> None:
    if not fut.done():
        fut.set_result(None)
