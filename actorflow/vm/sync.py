"""Waiting for the VM: blocking and async waits on instructions, ``synchronize``, and the
kernel errors it reports. A mixin of the VM (its lock, loop thread and error queue)."""

from __future__ import annotations

import asyncio
import threading
import time

from ..errors import VMError
from .instruction import Instruction
from .opcall import kernel_error

# Kernel errors kept between two synchronize calls. Further ones are only counted: a loop
# of failing ops whose outputs nobody reads must not grow memory without bound.
MAX_KEPT_ERRORS = 100


class Dropped:
    """The kernel errors past ``MAX_KEPT_ERRORS`` since the last synchronize: a count (less
    those reported since, by reading a tensor they poisoned) and the latest one."""
    __slots__ = ("count", "last", "lock")

    def __init__(self, lock):
        self.count = 0
        self.last = None
        self.lock = lock          # the VM's error lock

    def reported_one(self) -> None:
        with self.lock:
            self.count -= 1


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

    def synchronize_quietly(self) -> None:
        """Waits for everything issued so far; kernel errors stay for the next sync point."""
        for t in self.tails():
            self.wait(t)

    async def synchronize_async(self) -> None:
        for t in self.tails():
            await self.wait_async(t)
        self.collect_releases()
        self.raise_unreported()

    # -- kernel errors (called by the VM, from any thread, on the error path only) --------
    def _kernel_error(self, instr, e, intact: bool = False):
        # instr: anything with .name and .stream. The traceback is kept as text only: its
        # frames hold the kernel's arguments, which would pin their memory for as long as
        # the error lives (on the poisoned blobs, the stream's last instruction...).
        # intact: the op wrote nothing (deps.wrote_nothing); _fail only notes it then.
        # An interrupt (Ctrl-C, SystemExit: not an Exception) is raised to the caller where
        # it happened; the error made of it only poisons what the kernel was writing (its
        # values are unknown) and is never raised again by synchronize().
        err = kernel_error(instr.name, instr.stream.device, e, intact)
        if err is e:
            return err
        self._any_error = True
        if isinstance(e, Exception):
            self.keep_error(err)      # (its own lock: callers may hold the VM's)
        else:
            err._reported = True      # the caller is raising the interrupt itself
        return err

    def keep_error(self, err) -> None:
        """Keeps ``err`` for the next synchronize, or counts it once ``MAX_KEPT_ERRORS`` are
        kept (errors already reported on a read make room first)."""
        with self._errors_lock:
            errors = self._errors
            if len(errors) >= MAX_KEPT_ERRORS:
                kept = [e for e in errors if not e._reported]
                if len(kept) < len(errors):
                    errors.clear()
                    errors.extend(kept)
            if len(errors) < MAX_KEPT_ERRORS:
                errors.append(err)
                return
            dropped = self._dropped
            dropped.count += 1
            dropped.last = err
            err._dropped_in = dropped

    def unreported_errors(self) -> int:
        """Kernel errors not raised to the user yet, kept or only counted."""
        with self._errors_lock:
            return sum(1 for e in self._errors if not e._reported) + self._dropped.count

    def raise_unreported(self) -> None:
        """Raises the first kernel error not reported yet (its ``more_errors`` and
        ``dropped_errors`` count the others) and forgets them all."""
        with self._errors_lock:
            errs = [e for e in self._errors if not e._reported]
            self._errors.clear()
            dropped, self._dropped = self._dropped, Dropped(self._errors_lock)
        for e in errs:
            e._reported = True
        n = dropped.count
        if errs:
            raise errs[0].to_raise(len(errs) - 1 + n, n, MAX_KEPT_ERRORS)
        if n > 0:           # every kept error was reported on a read: the latest dropped one
            raise dropped.last.to_raise(n - 1, n - 1, MAX_KEPT_ERRORS)



def _set_done(fut) -> None:
    if not fut.done():
        fut.set_result(None)
