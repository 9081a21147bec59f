"""The emulated CUDA driver: a CPU model of the driver seam (``driver.py``) with CUDA's
semantics, so that everything above the seam runs in CI with no GPU. Selected by
``AF_CUDA=emu`` or ``driver.use_driver(EmuDriver)``.

It models ordering and memory, not SMs:

- each stream is a daemon worker thread running its commands in issue order;
- an event is recorded in a stream's order; another stream's ``wait`` on it blocks that
  stream's thread only, never the host (the wait's target is the latest record at the time
  the wait is issued, as ``cudaStreamWaitEvent`` takes it);
- copies run when the stream reaches them and read their source then: a host buffer changed
  before that shows the new value, as on a GPU;
- device memory is per-block numpy buffers counted against one limit, apart from host memory;
  an allocation past the limit raises ``OutOfMemoryError`` with the bytes asked, in use and
  the limit (CuPy's ``OutOfMemoryError`` is a MemoryError naming the same three);
- a kernel runs its numpy ``reference`` on the stream's thread (an op's numpy kernel, the
  form CuPy runs over cupy arrays, over ``cupylike.CupyLikeArray``s: what CuPy refuses
  fails here too); an exception becomes the
  stream's sticky ``KernelError``, raised by its next ``synchronize``/``query`` (and by an
  event recorded after it); later kernels and copies on that stream are skipped, events and
  callbacks still complete, so nobody waits forever;
- graph capture records the commands issued on a stream; a replay issues them again.

Options for tests: ``delay`` (each command sleeps a random time up to it first, drawn from a
``random.Random`` per stream seeded by ``seed`` and the stream's creation index: the same
seed draws the same delays), ``fail_kernel`` and ``fail_alloc`` (injected faults), and
``timeout`` (the longest any wait inside the emulator or a host ``synchronize`` without a
timeout of its own lasts before it raises).
"""

from __future__ import annotations

import queue
import random
import threading
import time

import numpy as np

from ...errors import DeviceError, KernelError, OutOfMemoryError
from .cupylike import CupyLikeArray
from .driver import (
    DeviceArray,
    DeviceMemory,
    Driver,
    Event,
    Graph,
    Kernel,
    MemoryInfo,
    PoolCount,
    Stream,
    check_copy,
    raise_sticky,
)

_ALIGN = 256  # cudaMalloc's alignment; the emulator's made-up addresses keep it
_WORK, _CONTROL = 0, 1  # a sticky error skips work (kernels, copies), never control


class EmuEvent(Event):
    """An event of the emulator. ``_recorded``: the records issued (numbered from 1); a
    record is reached when the stream it was issued on gets there, each on its own: a wait
    or ``then`` is for the record the event had when it was called, and a later record of
    the same event, reached first on a faster stream, does not satisfy it (as CUDA's
    ``cudaStreamWaitEvent`` waits for the work its record captured). ``_low``: every record
    up to it is reached; ``_ahead``: records past ``_low`` reached; ``_errors``: the sticky
    error of the recording stream at a record, where there was one."""

    __slots__ = ("_driver", "_recorded", "_low", "_ahead", "_errors", "_waiters")

    def __init__(self, driver: EmuDriver):
        self._driver = driver
        self._recorded = self._low = 0
        self._ahead: set = set()
        self._errors: dict = {}
        self._waiters: list = []  # (record number, fn) for then()

    def _bump(self) -> int:
        with self._driver._cv:
            self._recorded += 1
            return self._recorded

    def _reached(self, n: int) -> bool:
        """Whether record ``n`` was reached (the caller holds the driver's condition)."""
        return n <= self._low or n in self._ahead

    def _error_at(self, n: int):
        return self._errors.get(n)

    def _complete(self, n: int, error, stream: EmuStream | None = None) -> bool:
        """Record ``n`` is reached (``error``: the stream's sticky error then); ``stream``:
        the stream whose worker reached it, whose command count goes up with it, so that a
        ``then`` callback sees the stream done with it. Returns True (counted)."""
        cv = self._driver._cv
        with cv:
            if stream is not None:
                stream._done += 1
            if error is not None:
                self._errors[n] = error
            self._ahead.add(n)
            while self._low + 1 in self._ahead:
                self._low += 1
                self._ahead.discard(self._low)
            ready = [fn for k, fn in self._waiters if self._reached(k)]
            if ready:
                self._waiters = [(k, fn) for k, fn in self._waiters if not self._reached(k)]
            cv.notify_all()
        for fn in ready:
            fn()
        return True

    def query(self) -> bool:
        with self._driver._cv:
            n = self._recorded
            done = self._reached(n)
            err = self._error_at(n) if done else None
        if err is not None:
            raise_sticky(err)
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        d = self._driver
        with d._cv:
            n = self._recorded
            if not d._cv.wait_for(lambda: self._reached(n), d._limit(timeout)):
                raise DeviceError(
                    f"{d.device}: an event was not reached in "
                    f"{d._limit(timeout)} s: a stream is stuck or far behind"
                )
            err = self._error_at(n)
        if err is not None:
            raise_sticky(err)

    def then(self, fn) -> None:
        with self._driver._cv:
            n = self._recorded
            if not self._reached(n):
                self._waiters.append((n, fn))
                return
        fn()


class EmuGraph(Graph):
    """Captured commands: the functions that issue them again."""

    def __init__(self, makes: list):
        self._makes = makes

    def __len__(self) -> int:
        return len(self._makes)

    def launch(self, stream: EmuStream) -> None:
        for make in self._makes:
            stream._issue(make)


class EmuStream(Stream):
    """A stream of the emulator: a daemon thread running its commands in order."""

    def __init__(self, driver: EmuDriver, name: str, index: int):
        self.name = name
        self._driver = driver
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._issued = self._done = 0
        self._error: KernelError | None = None  # the sticky error: the first kernel fault
        self._capture: list | None = None
        self._closed: EmuEvent | None = None  # once closed: the event recorded last
        self._delay = driver.delay
        self._rng = random.Random(f"{driver.seed}:{index}") if driver.delay else None
        self.delays: list = []  # the delays drawn, in order (with delay= only)
        self._thread = threading.Thread(
            target=self._work, daemon=True, name=f"af-emu-{driver.device}-{name}"
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"EmuStream({self._driver.device}:{self.name})"

    # -- issuing ---------------------------------------------------------------------------
    def _issue(self, make) -> None:
        """``make()`` does the issue-time part of a command (an event's record number) and
        returns ``(kind, fn, what)``; captured, it is kept to be made again at each replay."""
        if self._capture is not None:
            self._capture.append(make)
            return
        if self._closed is not None:
            raise DeviceError(
                f"stream {self.name} of {self._driver.device} is closed (a fault "
                f"reset its device's streams): issue on a stream of the "
                f"driver's making"
            )
        cmd = make()
        with self._driver._cv:
            if self._driver._closed:
                raise DeviceError(f"{self._driver.device}: the driver is closed; make a new one")
            self._issued += 1
        self._q.put(cmd)

    def launch(self, kernel: Kernel, args: tuple, grid=None, block=None) -> None:
        ref = kernel.reference
        if ref is None:
            raise DeviceError(
                f"kernel {kernel.name!r} has no numpy reference: the CUDA "
                f"emulator runs a kernel's reference; give Kernel(reference=...)"
            )
        d = self._driver
        # an op's numpy kernel (no CUDA C source: what CuPy runs over cupy arrays) sees
        # arrays under CuPy's rules (cupylike.py); a generated kernel's reference, numpy views
        view = d._view if kernel.source or not d.strict else d._cupylike_view
        args = tuple(args)
        for a in args:
            if isinstance(a, DeviceArray):
                d._check_live(a, kernel.name)

        def run(stream):
            d._maybe_fail(kernel.name)
            ref(*[view(a) if isinstance(a, DeviceArray) else a for a in args])

        self._issue(lambda: (_WORK, run, kernel.name))

    def copy_h2d(self, dst: DeviceArray, src: np.ndarray) -> None:
        _same(dst, src, "copy_h2d")
        view = self._driver._view
        self._issue(
            lambda: (
                _WORK,
                lambda s: np.copyto(view(dst), src.reshape(dst.shape), casting="no"),
                "copy_h2d",
            )
        )

    def copy_d2h(self, dst: np.ndarray, src: DeviceArray) -> None:
        _same(src, dst, "copy_d2h")
        view = self._driver._view
        self._issue(
            lambda: (
                _WORK,
                lambda s: np.copyto(dst, view(src).reshape(dst.shape), casting="no"),
                "copy_d2h",
            )
        )

    def copy_d2d(self, dst: DeviceArray, src: DeviceArray) -> None:
        _same(dst, src, "copy_d2d")
        view = self._driver._view
        self._issue(
            lambda: (_WORK, lambda s: np.copyto(view(dst), view(src), casting="no"), "copy_d2d")
        )

    def record(self, event: EmuEvent | None = None) -> EmuEvent:
        ev = self._driver.event() if event is None else event
        last = self._closed
        if last is not None:  # closed: reached once its last record is
            n = ev._bump()
            last.then(lambda: ev._complete(n, self._error))
            return ev

        def make():
            n = ev._bump()
            return _CONTROL, lambda s: ev._complete(n, s._error, s), "record"

        self._issue(make)
        return ev

    def wait(self, event: EmuEvent, errors: bool = True) -> None:
        d = self._driver

        def make():
            with d._cv:
                n = event._recorded

            def run(s):
                with d._cv:
                    ok = d._cv.wait_for(lambda: event._reached(n), d.timeout)
                    err = event._error_at(n)
                if not ok:
                    err = KernelError.of(
                        "wait",
                        d.device,
                        DeviceError(
                            f"stream {s.name} waited {d.timeout} s for an event that no stream "
                            f"reached"
                        ),
                    )
                if err is not None and s._error is None and (errors or not ok):
                    s._error = err  # a fault before the record reaches its waiters

            return _CONTROL, run, "wait"

        self._issue(make)

    def add_callback(self, fn) -> None:
        def run(s):
            try:
                fn()
            except Exception as e:  # a host function must not kill the stream
                if s._error is None:
                    s._error = KernelError.of("host callback", self._driver.device, e)

        self._issue(lambda: (_CONTROL, run, "callback"))

    # -- waiting ---------------------------------------------------------------------------
    def query(self) -> bool:
        with self._driver._cv:
            done = self._done >= self._issued
        if self._error is not None:
            raise_sticky(self._error)
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        d = self._driver
        if self._capture is not None:
            raise DeviceError(
                f"stream {self.name} is capturing a graph: synchronizing it is "
                f"not allowed until end_capture()"
            )
        with d._cv:
            n = self._issued
            if not d._cv.wait_for(lambda: self._done >= n, d._limit(timeout)):
                raise DeviceError(
                    f"{d.device}: stream {self.name} did not finish its "
                    f"commands in {d._limit(timeout)} s"
                )
        if self._error is not None:
            raise_sticky(self._error)

    def close(self) -> None:
        d = self._driver
        with d._cv:
            if self._closed is not None or d._closed or self not in d._streams:
                return
            d._streams.remove(self)
        self._capture = None
        last = self.record()
        self._closed = last
        self._q.put(None)  # the thread ends after what was issued

    # -- capture -----------------------------------------------------------------------------
    def begin_capture(self) -> None:
        """Captures this stream's commands from now on. An event recorded in the capture is
        recorded again at each replay; a wait in it takes the record current at the replay.
        Other streams are not drawn into the capture (CUDA's fork and join in a capture are
        not modelled)."""
        if self._capture is not None:
            raise DeviceError(f"stream {self.name} is capturing a graph already")
        self._capture = []

    def end_capture(self) -> EmuGraph:
        if self._capture is None:
            raise DeviceError(f"stream {self.name} is not capturing: call begin_capture() first")
        makes, self._capture = self._capture, None
        return EmuGraph(makes)

    # -- the worker ----------------------------------------------------------------------------
    def _work(self) -> None:
        get, cv = self._q.get, self._driver._cv
        while True:
            cmd = get()
            if cmd is None:
                return
            kind, fn, what = cmd
            if self._rng is not None:
                t = self._rng.uniform(0.0, self._delay)
                self.delays.append(t)
                time.sleep(t)
            if kind == _CONTROL:
                if fn(self) is True:  # a record: counted as it completed
                    continue
            elif self._error is None:
                try:
                    fn(self)
                except Exception as e:
                    self._error = KernelError.of(what, self._driver.device, e)
            with cv:
                self._done += 1
                cv.notify_all()


def _same(dev: DeviceArray, host, op: str) -> None:
    dev.memory.driver._check_live(dev, op)
    if isinstance(host, DeviceArray):
        host.memory.driver._check_live(host, op)
    check_copy(dev, host, op)


class EmuDriver(Driver):
    """A CUDA device emulated on the CPU (see the module doc).

    Args: ``device`` ('cuda:N'), ``limit`` (the pool's byte limit, None: none),
    ``delay`` (seconds: each command first sleeps a random time up to it), ``seed`` (the
    delays' seed), ``timeout`` (seconds any wait lasts at most before it raises),
    ``strict`` (default True: an op's numpy kernel run as a reference form sees
    ``cupylike.CupyLikeArray``s, which refuse what CuPy refuses, so a kernel that could not
    run on a GPU fails here too; False: plain numpy views).
    """

    name = "emu"
    captures_allocations = True  # a replay runs each reference anew, on host memory

    def __init__(
        self,
        device: str = "cuda:0",
        limit: int | None = None,
        delay: float = 0.0,
        seed: int = 0,
        timeout: float = 60.0,
        strict: bool = True,
    ):
        self.device = str(device)
        self.strict = strict
        self.delay, self.seed, self.timeout = float(delay), seed, timeout
        self._cv = threading.Condition()  # guards counts and events; notified on completion
        self._pool = PoolCount(self.device, limit)
        self._mem_lock = self._pool.lock  # (the injected faults' lock too)
        self._next_ptr = 1 << 32
        self._streams: list = []
        self._closed = False
        self._kernel_faults: list = []  # [name or None, error, count]
        self._alloc_faults = 0

    def _limit(self, timeout):
        return self.timeout if timeout is None else timeout

    # -- streams and events ------------------------------------------------------------------
    def stream(self, name: str = "compute") -> EmuStream:
        with self._cv:
            if self._closed:
                raise DeviceError(f"{self.device}: the driver is closed; make a new one")
            s = EmuStream(self, name, len(self._streams))
            self._streams.append(s)
        return s

    def event(self) -> EmuEvent:
        return EmuEvent(self)

    def close(self, timeout: float = 5.0) -> None:
        """Stops every stream's thread once it has run what was issued (joined with
        ``timeout`` each); later use raises DeviceError."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            streams = list(self._streams)
        for s in streams:
            s._q.put(None)
        for s in streams:
            s._thread.join(timeout)

    # -- memory ------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> DeviceMemory:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"malloc: nbytes must be >= 0, got {nbytes}")
        pool = self._pool
        with pool.lock:
            if self._alloc_faults:
                self._alloc_faults -= 1
                raise OutOfMemoryError(
                    self.device,
                    nbytes,
                    pool.in_use,
                    pool.limit or 0,
                    "device memory (an injected fault)",
                )
            pool.check(nbytes)
            ptr = self._next_ptr
            self._next_ptr += max(-(-nbytes // _ALIGN), 1) * _ALIGN
            mem = DeviceMemory(self, ptr, nbytes, np.empty(nbytes, np.uint8))
            pool.add(mem)
        return mem

    def free(self, memory: DeviceMemory) -> None:
        self._pool.remove(memory)

    def pinned(self, shape, dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    def set_limit(self, nbytes: int | None) -> None:
        with self._pool.lock:
            self._pool.limit = nbytes

    def memory(self) -> MemoryInfo:
        return self._pool.info()

    def _check_live(self, a: DeviceArray, op: str) -> None:
        if not self._pool.live(a.memory):
            raise DeviceError(
                f"{op}: device memory at {a.memory.ptr:#x} is not allocated on "
                f"{self.device} (used after free, or another device's)"
            )

    @staticmethod
    def _view(a: DeviceArray) -> np.ndarray:
        return a.memory.handle[a.offset : a.offset + a.nbytes].view(a.dtype).reshape(a.shape)

    @classmethod
    def _cupylike_view(cls, a: DeviceArray) -> CupyLikeArray:
        return CupyLikeArray.of(cls._view(a), a.memory.handle, a.offset)

    # -- injected faults -----------------------------------------------------------------------
    def fail_kernel(
        self, name: str | None = None, error: Exception | None = None, count: int = 1
    ) -> None:
        """The next ``count`` runs of kernel ``name`` (any kernel if None) raise ``error``
        (a RuntimeError by default) on their stream instead of running."""
        err = error or RuntimeError(f"injected fault in kernel {name or '(any)'}")
        with self._mem_lock:
            self._kernel_faults.append([name, err, count])

    def fail_alloc(self, count: int = 1) -> None:
        """The next ``count`` allocations are refused with OutOfMemoryError."""
        with self._mem_lock:
            self._alloc_faults += count

    def _maybe_fail(self, name: str) -> None:
        faults = self._kernel_faults
        if not faults:
            return
        with self._mem_lock:
            for f in faults:
                if f[0] is None or f[0] == name:
                    f[2] -= 1
                    if not f[2]:
                        faults.remove(f)
                    err = f[1]
                    break
            else:
                return
        raise err
