"""The CUDA driver on CuPy: the driver seam (``driver.py``) on a real GPU. Selected when
``AF_CUDA`` is unset or ``cupy``; CuPy (the ``cuda`` extra: ``cupy-cuda12x``) is imported
here only, on the first driver made.

In CUDA's terms:

- a ``Stream`` is a ``cupy.cuda.Stream(non_blocking=True)``; an ``Event`` a
  ``cupy.cuda.Event`` without timing, recorded and waited on (``cudaStreamWaitEvent``) in
  the streams' order, never the host's;
- device memory comes from a ``cupy.cuda.MemoryPool`` of the device, with the driver's own
  byte count and limit: past it, actorflow's ``OutOfMemoryError`` with the bytes asked, in
  use and the limit, as the emulator raises it (CuPy's own ``OutOfMemoryError``, the device
  refusing after CuPy gave back its cached blocks and tried again, becomes the same). The
  limit counts the bytes allocated and not freed, never CuPy's cached chunks: the pool's
  own ``set_limit`` is not used, since it counts those too (a chunk split for a smaller
  block stays whole in it), and would refuse what the limit allows;
- pinned host buffers are ``cupyx.empty_pinned``; copies are ``cudaMemcpyAsync`` on the
  stream (h2d, d2h, d2d), reading their source when the stream gets there;
- a ``Kernel`` with CUDA C ``source`` (the generated kernels, ``kernels.py``) is compiled once
  per source (``cupy.RawKernel``, cached by the source's SHA-256) and launched with
  grid-stride sizing: 256 threads a block, as many blocks as the elements need up to 32 per
  SM, its arguments as ``Kernel.params`` lists them (device arrays as pointers, numbers as
  the numpy scalars the caller packed). A ``Kernel`` with only a numpy ``reference`` runs it
  on cupy arrays viewing the device arrays (numpy's functions dispatch to CuPy through
  ``__array_ufunc__``/``__array_function__``: matmul reaches cuBLAS, sums CuPy's
  reductions), inside ``with stream:``, around that synchronous call only;
- a launch that raises makes the stream's error sticky (a ``KernelError`` naming the
  kernel), as in the emulator: later kernels and copies issued there are skipped, events
  recorded after it raise it; so does a host function (``add_callback``) that raises,
  which is how a generated integer division's zero flag fails the op (``vm/opcall.py``);
- ``Event.then(fn)``: a waiter thread per stream synchronizes on the stream's events in
  record order and calls ``fn`` after each. Chosen over ``stream.launch_host_func`` because
  issue 12 measured both on an H100 to asyncio's ``call_soon_threadsafe``: the host function
  57-77 us, the waiter thread 33-44 us (a host function also runs on CUDA's own callback
  thread, which blocks the stream behind it while ``fn`` runs);
- graph capture is ``stream.begin_capture()``/``end_capture()`` (relaxed mode);
  ``Graph.launch(stream)`` replays it. A capture's CuPy allocations (reference launches'
  temporaries) come from a pool of its own that the graph keeps, so no replay writes into
  memory CuPy handed out again; a command that cannot be captured (a reference that
  synchronizes, say) fails ``end_capture`` with DeviceError and leaves the stream
  unfaulted, for the caller to run it uncaptured.

The seam's tests (tests/test_cuda_driver.py) run it when CuPy sees a device
(``pytest -m gpu``; ``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import gc
import hashlib
import queue
import threading

import numpy as np

from ...errors import DeviceError, KernelError, OutOfMemoryError
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

THREADS = 256  # threads per block of a generated kernel's launch
BLOCKS_PER_SM = 32  # the grid's cap, per SM (the kernels stride over the rest)
EMULATOR = "set AF_CUDA=emu to run CUDA devices on the CPU emulator"
INSTALL = f"pip install 'actorflow[cuda]' (CuPy for CUDA 12: cupy-cuda12x), or {EMULATOR}"


def _cupy(device: str):
    """CuPy, imported on first use. Raises DeviceError naming the install and the
    emulator when it is missing or cannot load."""
    try:
        import cupy
    except ImportError as e:
        raise DeviceError(
            f"device {device}: the CuPy driver needs CuPy, which is not installed ({e}): {INSTALL}"
        ) from None
    return cupy


def _index(device: str) -> int:
    d = str(device)
    try:
        return int(d.split(":", 1)[1]) if ":" in d else 0
    except ValueError:
        raise DeviceError(f"{d!r} is not a CUDA device; name it 'cuda:N'") from None


class CupyEvent(Event):
    """A ``cupy.cuda.Event``; ``_stream`` and ``_seq``: the stream and the count of
    commands issued there at its latest record (a sticky error set before it is its)."""

    __slots__ = ("_driver", "_ev", "_stream", "_seq")

    def __init__(self, driver: CupyDriver):
        self._driver = driver
        with driver._dev:
            self._ev = driver._cp.cuda.Event(disable_timing=True)
        self._stream: CupyStream | None = None
        self._seq = 0

    def _error(self):
        """The sticky error before the record (asked once the event completed)."""
        s = self._stream
        return None if s is None else s._error_before(self._seq, settled=True)

    def query(self) -> bool:
        if self._stream is None:
            return True
        try:
            done = self._ev.done
        except Exception as e:  # noqa: BLE001 - a device fault: CUDA's sticky error
            raise self._stream._device_fault(e) from None
        err = self._error() if done else None
        if err is not None:
            raise_sticky(err)
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        s = self._stream
        if s is None:
            return
        if timeout is None:
            try:
                self._ev.synchronize()
            except Exception as e:  # noqa: BLE001
                raise s._device_fault(e) from None
        else:
            done = threading.Event()
            s._wait_then(self._ev, done.set)
            if not done.wait(timeout):
                raise DeviceError(
                    f"{self._driver.device}: an event was not reached in "
                    f"{timeout} s: a stream is stuck or far behind"
                )
        err = self._error()
        if err is not None:
            raise_sticky(err)

    def then(self, fn) -> None:
        s = self._stream
        if s is None:
            fn()
            return
        s._wait_then(self._ev, fn)


class CupyGraph(Graph):
    """A captured ``cupy.cuda.graph.Graph``, with the memory pool its reference launches'
    temporaries came from during the capture (``pool``): the graph writes into those blocks
    at each replay, so the pool lives as long as the graph and serves nothing else."""

    def __init__(self, graph, pool=None):
        self._graph = graph
        self._pool = pool

    def launch(self, stream: CupyStream) -> None:
        with stream._driver._dev:
            self._graph.launch(stream._s)


class CupyStream(Stream):
    """A non-blocking ``cupy.cuda.Stream`` of the driver's device."""

    def __init__(self, driver: CupyDriver, name: str, cuda_stream=None):
        self.name = name
        self._driver = driver
        cp = driver._cp
        if cuda_stream is not None:  # a retired stream's, its work done (_retire)
            self._s = cuda_stream
        else:
            with driver._dev:
                self._s = cp.cuda.Stream(non_blocking=True)
        self._seq = 0  # commands issued
        self._errors: list = []  # (seq, error): the sticky error and when
        self._links: list = []  # (seq, stream, its seq): waits that pass faults on
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._capturing = False
        self._capture: tuple | None = None  # (pool, its allocator's context, first error)
        self._closed = False

    def __repr__(self) -> str:
        return f"CupyStream({self._driver.device}:{self.name})"

    # -- sticky errors ---------------------------------------------------------------------
    def _own_error(self, seq: int):
        """``(seq, error)`` of this stream's own first sticky error up to ``seq``, or None
        (not the errors its waits pass on: ``_error_before``)."""
        with self._lock:
            return next(((at, err) for at, err in self._errors if at <= seq), None)

    def _error_before(self, seq: int, settled: bool = False, seen: dict | None = None):
        """The sticky error of the commands up to ``seq``: this stream's own, else one
        passed on by a wait (``_links``, looked up now: a source stream's host function
        may set its error after the wait was issued, before the waited event completes).
        ``settled``: the commands up to ``seq`` completed, so the links up to there are
        final: their errors become this stream's own and the links are dropped (a long run
        keeps no list of every wait). ``seen``: per stream, the latest seq this lookup found
        clean, so that streams waiting on each other over and over have each wait looked at
        once (else the lookup grows exponentially with the waits)."""
        if seen is None:
            seen = {}
        clean = seen.get(id(self), -1)
        if seq <= clean:
            return None
        own = self._own_error(seq)
        with self._lock:
            links = [link for link in self._links if clean < link[0] <= seq]
        found = own
        for at, src, src_seq in links:  # in issue order; each names an earlier time
            if found is not None and found[0] <= at:
                break
            err = src._error_before(src_seq, settled, seen)
            if err is not None:
                found = (at, err)
                break
        if settled and links:
            with self._lock:
                if found is not None and found is not own:
                    self._errors.append(found)
                    self._errors.sort(key=lambda e: e[0])
                self._links = [link for link in self._links if link[0] > seq]
        if found is None:
            seen[id(self)] = seq
            return None
        return found[1]

    def _fail(self, what: str, e: BaseException) -> None:
        err = e if isinstance(e, KernelError) else KernelError.of(what, self._driver.device, e)
        with self._lock:
            if not self._errors:
                self._errors.append((self._seq, err))

    def _broken(self) -> bool:
        return bool(self._errors)

    def _device_fault(self, e: BaseException) -> KernelError:
        """A CUDA error seen at a query or a synchronize (an illegal address, a launch
        failure): it is the device's, sticky for every stream; kept as this stream's."""
        self._fail(f"a kernel on stream {self.name}", e)
        return self._errors[0][1].to_raise()

    def _open(self) -> None:
        if self._closed:
            raise DeviceError(
                f"stream {self.name} of {self._driver.device} is closed (a fault "
                f"reset its device's streams): issue on a stream of the "
                f"driver's making"
            )

    def _next(self) -> None:
        self._open()
        with self._lock:
            self._seq += 1

    # -- commands ------------------------------------------------------------------------------
    def launch(self, kernel: Kernel, args: tuple, grid=None, block=None) -> None:
        self._next()
        if self._broken():
            return
        d = self._driver
        try:
            if kernel.source:
                fn = d._compiled(kernel)
                launch_args = tuple(d._arg(a) for a in args)
                if grid is None:
                    grid, block = d._grid(kernel, args)
                with d._dev, self._s:  # the launch's stream is the current one
                    fn(
                        (grid,) if isinstance(grid, int) else grid,
                        (block,) if isinstance(block, int) else block,
                        launch_args,
                    )
                return
            if kernel.reference is None:
                raise DeviceError(
                    f"kernel {kernel.name!r} has neither CUDA C source nor a numpy reference to run"
                )
            views = [d._view(a) if isinstance(a, DeviceArray) else a for a in args]
            with d._dev, self._s:  # a synchronous call: nothing awaits inside
                kernel.reference(*views)
        except Exception as e:  # noqa: BLE001 - the stream's sticky error
            self._issue_failed(kernel.name, e)

    def _issue_failed(self, what: str, e: BaseException) -> None:
        """A command that raised as it was issued: the stream's sticky error, or, while the
        stream captures, the capture's (``end_capture`` raises it; nothing ran, so the
        stream is not faulted: a reference that synchronizes or copies from host memory
        cannot be captured, and the caller runs it uncaptured)."""
        cap = self._capture
        if self._capturing and cap is not None:
            if cap[2] is None:
                self._capture = (cap[0], cap[1], f"{what}: {type(e).__name__}: {e}")
            return
        self._fail(what, e)

    def _memcpy(self, dst_ptr: int, src_ptr: int, nbytes: int, kind: int, what: str) -> None:
        self._next()
        if self._broken() or not nbytes:
            return
        d = self._driver
        try:
            with d._dev:
                d._cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, self._s.ptr)
        except Exception as e:  # noqa: BLE001
            self._issue_failed(what, e)

    def copy_h2d(self, dst: DeviceArray, src: np.ndarray) -> None:
        check_copy(dst, src, "copy_h2d")
        self._memcpy(
            dst.ptr,
            _host_ptr(src, "copy_h2d"),
            dst.nbytes,
            self._driver._rt.memcpyHostToDevice,
            "copy_h2d",
        )

    def copy_d2h(self, dst: np.ndarray, src: DeviceArray) -> None:
        check_copy(src, dst, "copy_d2h")
        self._memcpy(
            _host_ptr(dst, "copy_d2h"),
            src.ptr,
            src.nbytes,
            self._driver._rt.memcpyDeviceToHost,
            "copy_d2h",
        )

    def copy_d2d(self, dst: DeviceArray, src: DeviceArray) -> None:
        check_copy(dst, src, "copy_d2d")
        self._memcpy(
            dst.ptr, src.ptr, dst.nbytes, self._driver._rt.memcpyDeviceToDevice, "copy_d2d"
        )

    def record(self, event: CupyEvent | None = None) -> CupyEvent:
        ev = self._driver.event() if event is None else event
        with self._driver._dev:
            ev._ev.record(self._s)
        ev._stream, ev._seq = self, self._seq
        return ev

    def wait(self, event: CupyEvent, errors: bool = True) -> None:
        src = event._stream
        if src is None:
            return
        self._next()  # the wait is a command: an event recorded
        #               before it does not see what it passes on
        if errors and src is not self:
            known = src._own_error(event._seq)  # a fault the source has already: this
            with self._lock:  # stream's now, so its later work is skipped;
                if known is not None:  # one set later (a host function) is looked
                    if not self._errors:  # up when asked (_links, _error_before)
                        self._errors.append((self._seq, known[1]))
                else:
                    self._links.append((self._seq, src, event._seq))
        with self._driver._dev:
            self._s.wait_event(event._ev)

    def add_callback(self, fn) -> None:
        """A host function (``cudaLaunchHostFunc``): the stream waits for it, and a graph
        capture holds it. ``fn`` runs on CUDA's callback thread, where no CUDA call is
        allowed: it must touch host memory only (the callers copy pinned buffers or read a
        flag), and the garbage collector is paused while it runs, since collecting a cupy
        object there would free device memory or destroy an event (``_no_collection``)."""
        self._next()
        seq = self._seq

        def run(_):
            _no_collection(True)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a host function must not kill CUDA's thread
                err = (
                    e
                    if isinstance(e, KernelError)
                    else KernelError.of("host callback", self._driver.device, e)
                )
                with self._lock:
                    self._errors.append((seq, err))
                    self._errors.sort(key=lambda item: item[0])
            finally:
                _no_collection(False)

        with self._driver._dev:
            self._s.launch_host_func(run, None)

    # -- waiting ---------------------------------------------------------------------------
    def query(self) -> bool:
        seq = self._seq
        try:
            done = self._s.done
        except Exception as e:  # noqa: BLE001
            raise self._device_fault(e) from None
        err = self._error_before(seq, settled=done)
        if err is not None:
            raise_sticky(err)
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        if self._capturing:
            raise DeviceError(
                f"stream {self.name} is capturing a graph: synchronizing it is "
                f"not allowed until end_capture()"
            )
        self.record().synchronize(timeout)

    def _wait_then(self, ev, fn) -> None:
        """Calls ``fn`` once cupy event ``ev`` completed, on this stream's waiter thread
        (started on first use), or once closed on the driver's (``_late``)."""
        with self._lock:
            if not self._closed:
                q = self._queue
                if q is None:
                    q = self._queue = queue.SimpleQueue()
                    threading.Thread(
                        target=_wait_loop,
                        args=(q,),
                        daemon=True,
                        name=f"af-cupy-{self._driver.device}-{self.name}",
                    ).start()
                q.put((self, ev, fn))
                return
        self._driver._late().put((self, ev, fn))

    def close(self) -> None:
        d = self._driver
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._queue is not None:
                self._queue.put(None)  # its thread ends after what was queued
        self._capturing = False
        with d._lock:
            try:
                d._streams.remove(self)
            except ValueError:
                pass
            d._retired.append(self)

    # -- capture ------------------------------------------------------------------------------
    def begin_capture(self) -> None:
        """Captures this stream's commands from now on (CUDA's relaxed mode). The CuPy
        allocations of this thread until ``end_capture`` (a reference launch's temporaries:
        a matmul's result, a reduction's workspace) come from a memory pool of the
        capture's own, kept by the graph: CuPy's shared pool would hand a temporary freed
        during the capture to someone else, and every replay would write into it."""
        self._open()
        if self._capturing:
            raise DeviceError(f"stream {self.name} is capturing a graph already")
        cp = self._driver._cp
        with self._driver._dev:
            pool = cp.cuda.MemoryPool()
            self._s.begin_capture()
        allocating = cp.cuda.using_allocator(pool.malloc)  # (this thread's allocations)
        allocating.__enter__()
        self._capture = (pool, allocating, None)
        self._capturing = True

    def end_capture(self) -> CupyGraph:
        """The captured graph; raises DeviceError, the stream leaving capture and not
        faulted, when a command could not be captured (``_issue_failed``)."""
        if not self._capturing:
            raise DeviceError(f"stream {self.name} is not capturing: call begin_capture() first")
        self._capturing = False
        cap, self._capture = self._capture, None
        assert cap is not None  # (set with _capturing)
        pool, allocating, failed = cap
        allocating.__exit__(None, None, None)
        try:
            with self._driver._dev:
                graph = self._s.end_capture()
        except Exception as e:  # noqa: BLE001 - an invalidated capture: its reason is the text
            failed = failed or f"{type(e).__name__}: {e}"
            graph = None
        if failed is not None:
            raise DeviceError(
                f"stream {self.name} of {self._driver.device}: the capture failed "
                f"({failed}); run these commands uncaptured"
            )
        return CupyGraph(graph, pool)


def _wait_loop(q: queue.SimpleQueue) -> None:
    """A waiter thread: synchronizes on each ``(stream, cupy event, fn)`` in turn, then
    calls ``fn``; ends at None."""
    while True:
        item = q.get()
        if item is None:
            return
        s, ev, fn = item
        try:
            ev.synchronize()
        except Exception as e:  # noqa: BLE001 - a device fault: fn's query raises it
            s._fail(f"a kernel on stream {s.name}", e)
        try:
            fn()
        except Exception:  # noqa: BLE001 - fn's own error is its caller's to report
            pass


_GC_LOCK = threading.Lock()
_GC_PAUSE = [0, False]  # host functions running now; whether collection was on


def _no_collection(pause: bool) -> None:
    """Pauses automatic garbage collection while host functions run (counted: several
    streams' host functions may overlap), and turns it back on after the last one if it
    was on before."""
    with _GC_LOCK:
        if pause:
            if _GC_PAUSE[0] == 0:
                _GC_PAUSE[1] = gc.isenabled()
                gc.disable()
            _GC_PAUSE[0] += 1
        else:
            _GC_PAUSE[0] -= 1
            if _GC_PAUSE[0] == 0 and _GC_PAUSE[1]:
                gc.enable()


def _host_ptr(a: np.ndarray, op: str) -> int:
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{op}: the host array must be C-contiguous (a copy reads or writes "
            f"its bytes in order); pass np.ascontiguousarray(...) and keep it "
            f"alive until the copy's event completes"
        )
    return a.ctypes.data


class CupyDriver(Driver):
    """CUDA device ``device`` ('cuda:N') on CuPy (see the module doc).

    Args: ``device``, ``limit`` (the pool's byte limit; None: the device's memory).
    Raises DeviceError when CuPy is missing or sees no such device (naming the install and
    ``AF_CUDA=emu``)."""

    name = "cupy"
    captures_allocations = True  # a capture's temporaries from a pool of its own

    def __init__(self, device: str = "cuda:0", limit: int | None = None):
        self.device = str(device)
        cp = self._cp = _cupy(self.device)
        self._rt = cp.cuda.runtime
        index = _index(self.device)
        try:
            count = self._rt.getDeviceCount()
        except Exception as e:  # noqa: BLE001 - no driver, no device: the reason is the text
            raise DeviceError(
                f"device {self.device}: CuPy sees no CUDA device "
                f"({type(e).__name__}: {e}); on a machine with a GPU check "
                f"its driver, else {EMULATOR}"
            ) from None
        if not 0 <= index < count:
            raise DeviceError(
                f"device {self.device}: CuPy sees {count} CUDA device(s) "
                f"(cuda:0 to cuda:{count - 1}); name one of those, or set "
                f"AF_CUDA=emu for the CPU emulator"
            )
        self.index = index
        self._dev = cp.cuda.Device(index)
        with self._dev:
            self._pool = cp.cuda.MemoryPool()
            self._sms = self._rt.getDeviceProperties(index)["multiProcessorCount"]
        self._count = PoolCount(self.device)  # blocks -> their cupy MemoryPointer
        self._streams: list = []
        self._retired: list = []  # closed streams: kept until their CUDA stream
        #                           is reused (_reusable), never destroyed
        self._kernels: dict = {}  # Kernel -> RawKernel (the launch's fast path)
        self._by_source: dict = {}  # SHA-256 of a source -> RawKernel
        self._late_q: queue.SimpleQueue | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.set_limit(limit)

    # -- streams and events ------------------------------------------------------------------
    def stream(self, name: str = "compute") -> CupyStream:
        """A new stream, on the CUDA stream of a closed one whose work is done where there
        is one (see ``_retired``)."""
        if self._closed:
            raise DeviceError(f"{self.device}: the driver is closed; make a new one")
        s = CupyStream(self, name, self._reusable())
        with self._lock:
            self._streams.append(s)
        return s

    def _reusable(self):
        """The CUDA stream of a closed stream whose commands all ran, taken off
        ``_retired``; None when there is none. (A closed stream stays referenced by the
        driver until then: blocks freed later still record on it, and a CUDA stream
        destroyed by the garbage collector under them crashed the process on a GPU, when a
        collected tensor handed its block back after its stream's last reference went.)"""
        with self._lock:
            for i, old in enumerate(self._retired):
                try:
                    done = old._s.done
                except Exception:  # noqa: BLE001 - a faulted context: not reused
                    continue
                if done:
                    del self._retired[i]
                    return old._s
        return None

    def event(self) -> CupyEvent:
        return CupyEvent(self)

    def _late(self) -> queue.SimpleQueue:
        """The queue of the waiter thread for closed streams' events (one per driver,
        started on first use)."""
        with self._lock:
            if self._late_q is None:
                self._late_q = queue.SimpleQueue()
                threading.Thread(
                    target=_wait_loop,
                    args=(self._late_q,),
                    daemon=True,
                    name=f"af-cupy-{self.device}-closed",
                ).start()
            return self._late_q

    def close(self) -> None:
        """Stops the streams' waiter threads once they have run what was queued; later use
        raises DeviceError. Memory goes back to the pool as its blocks are freed."""
        if self._closed:
            return
        self._closed = True
        for s in list(self._streams):
            s.close()
        with self._lock:
            if self._late_q is not None:
                self._late_q.put(None)

    # -- memory ------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> DeviceMemory:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"malloc: nbytes must be >= 0, got {nbytes}")
        count = self._count
        with count.lock:
            count.check(nbytes)
            try:
                with self._dev:
                    mp = self._pool.malloc(max(nbytes, 1))
            except self._cp.cuda.memory.OutOfMemoryError as e:
                raise OutOfMemoryError(
                    self.device,
                    nbytes,
                    count.in_use,
                    count.limit or 0,
                    f"device memory, refused by the device ({nbytes:,} "
                    f"bytes asked, {count.in_use:,} in use: {e})",
                ) from None
            mem = DeviceMemory(self, mp.ptr, nbytes)
            count.add(mem, mp)
        return mem

    def free(self, memory: DeviceMemory) -> None:
        self._count.remove(memory)  # the MemoryPointer dropped: back to CuPy's pool

    def pinned(self, shape, dtype) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(shape, dtype)

    def set_limit(self, nbytes: int | None) -> None:
        with self._count.lock:  # (not the pool's set_limit: see the module doc)
            self._count.limit = nbytes

    def memory(self) -> MemoryInfo:
        return self._count.info()

    # -- kernels -----------------------------------------------------------------------------
    def _compiled(self, kernel: Kernel):
        """``kernel``'s RawKernel: compiled once per source (NVRTC, through CuPy, on the
        first launch), found by the Kernel object first, by the source's hash after."""
        fn = self._kernels.get(kernel)
        if fn is None:
            key = hashlib.sha256(kernel.source.encode()).hexdigest()
            fn = self._by_source.get(key)
            if fn is None:
                with self._dev:
                    fn = self._cp.RawKernel(
                        kernel.source, kernel.entry or kernel.name, options=("--std=c++17",)
                    )
                self._by_source[key] = fn
            self._kernels[kernel] = fn
        return fn

    def _arg(self, a):
        """A launch argument as CuPy passes it: a device array as a cupy array (its
        pointer), a number as given (the caller packs numpy scalars of the parameter's
        dtype: ``KernelSource.params``)."""
        return self._view(a) if isinstance(a, DeviceArray) else a

    def _grid(self, kernel: Kernel, args: tuple):
        """Grid-stride sizing: the element count (the ``n`` parameter) over 256 threads a
        block, capped at 32 blocks per SM; at least one block."""
        n = 0
        for (_, kind, _), a in zip(kernel.params, args, strict=False):  # one to one
            if kind == "n":
                n = int(a)
        return max(1, min(-(-n // THREADS), self._sms * BLOCKS_PER_SM)), THREADS

    def _view(self, a: DeviceArray):
        """A cupy array over device array ``a`` (no copy; it keeps ``a``'s block alive)."""
        cp = self._cp
        mem = cp.cuda.UnownedMemory(a.ptr, a.nbytes, a.memory, self.index)
        return cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0))

    # -- DLPack ------------------------------------------------------------------------------
    dlpack = True

    def export(self, array: DeviceArray, owner):
        """A cupy array over ``array`` (its ``__dlpack__`` is CuPy's), whose memory object
        keeps ``owner`` alive."""
        cp = self._cp
        mem = cp.cuda.UnownedMemory(array.ptr, array.nbytes, owner, self.index)
        return cp.ndarray(array.shape, array.dtype, cp.cuda.MemoryPointer(mem, 0))

    def adopt(self, obj, stream: CupyStream | None = None) -> DeviceArray:
        """``obj``'s memory through ``cupy.from_dlpack`` (no copy). CuPy hands its current
        stream to the producer's ``__dlpack__(stream=...)``, which orders its pending writes
        before it: ``stream`` is made current for the import (else CuPy's current one)."""
        with self._dev:
            if stream is None:
                x = self._cp.from_dlpack(obj)
            else:
                with stream._s:
                    x = self._cp.from_dlpack(obj)
        if x.device.id != self.index:
            raise DeviceError(f"from_dlpack: the array is on cuda:{x.device.id}, not {self.device}")
        if not x.flags.c_contiguous:
            raise DeviceError(
                f"from_dlpack: a {x.shape} array with strides {x.strides} is "
                f"not C-contiguous; make it so first (.contiguous() in torch, "
                f"cupy.ascontiguousarray in CuPy)"
            )
        return DeviceMemory(self, x.data.ptr, x.nbytes, x).array(x.shape, x.dtype)
