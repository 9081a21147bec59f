"""Waiting for the VM: blocking and async waits on instructions, ``synchronize``, and the
kernel errors it reports. A mixin of the VM (its lock, loop thread and error queue)."""

from __future__ import annotations

import asyncio
import threading
import time

from ..errors import VMError
from .instruction import Instruction


class Waiting:
    def wait(self, instr: Instruction, timeout: float | None = None) -> None:
        """Blocks the calling thread until ``instr`` is done."""
        with self._lock:
            if instr.done:
                return
            if threading.current_thread() is self._thread:
                raise VMError("cannot wait for a result on the actorflow VM thread (inside a "
                              "kernel or a completion callback); wait from user code instead")
            ev = threading.Event()
            self._add_waiter(instr, ev.set)
        if not ev.wait(timeout):
            raise TimeoutError(f"timed out after {timeout} s waiting for {instr!r}")

    async def wait_async(self, instr: Instruction) -> None:
        """Awaits ``instr`` without blocking the running event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if instr.done:
                return
            fut = loop.create_future()
            waiter = lambda: loop.call_soon_threadsafe(_set_done, fut)  # noqa: E731
            self._add_waiter(instr, waiter)
        try:
            await fut
        finally:
            if not fut.done():                  # cancelled: forget this waiter
                with self._lock:
                    if instr.waiters and waiter in instr.waiters:
                        instr.waiters.remove(waiter)

    @staticmethod
    def _add_waiter(instr, fn) -> None:
        if instr.waiters is None:
            instr.waiters = [fn]
        else:
            instr.waiters.append(fn)

    def tails(self) -> list:
        """The last instruction issued on every stream that is not done yet."""
        from ..backends import loaded_backends
        out = []
        with self._lock:
            for backend in loaded_backends():
                for s in backend.streams():
                    t = s.tail
                    if t is not None and not t.done:
                        out.append(t)
        return out

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits (at most ``timeout`` seconds in all) for everything issued so far, then
        raises the first kernel error not yet reported (and forgets the rest)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.tails():
            self.wait(t, None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.collect_releases()
        self.raise_unreported()

    async def synchronize_async(self) -> None:
        for t in self.tails():
            await self.wait_async(t)
        self.collect_releases()
        self.raise_unreported()

    def raise_unreported(self) -> None:
        errs = []
        while self._errors:
            e = self._errors.popleft()
            if not e._reported:
                errs.append(e)
        if errs:
            for e in errs:
                e._reported = True
            raise errs[0].to_raise()



def _set_done(fut) -> None:
    if not fut.done():
        fut.set_result(None)
