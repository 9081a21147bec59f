"""The driver seam: everything CUDA-specific sits behind this one small interface, so that the
backend above it runs on a GPU (the CuPy driver) and on a CPU model with CUDA's semantics
(``emu.py``, the emulator CI runs on) alike. Nothing above the seam imports CuPy or the
emulator: it asks ``selection.driver_for(device)``.

The interface, in CUDA's terms:

- ``Stream``: an in-order queue of commands, non-blocking (it never waits for the default
  stream). Commands: ``launch`` (a kernel), ``copy_h2d`` / ``copy_d2h`` / ``copy_d2d``
  (asynchronous: a copy reads its source when the stream reaches it, so a source must stay
  alive and unchanged until an event recorded after the copy has completed), ``record`` /
  ``wait`` (events; ``errors=False`` orders only), ``add_callback`` (a host function run
  when the stream reaches it), ``close``.
  ``synchronize`` and ``query`` raise the stream's sticky error, a kernel's fault.
- ``Event``: recorded in a stream's order; another stream's ``wait`` on it blocks that stream
  only, never the host; ``query``, ``synchronize``, and ``then(fn)``: ``fn()`` called on a
  driver thread once the latest record has completed (the caller turns it into
  ``loop.call_soon_threadsafe``: completion reaches asyncio without polling).
- Device memory (``malloc``/``free``) from a pool with a byte limit: an allocation past it
  raises ``OutOfMemoryError`` naming the bytes asked, in use and the limit. ``DeviceArray``
  is a typed view of a block, what kernels and copies take.
- Pinned host buffers (``pinned``), the sources and targets of truly asynchronous copies.
- Graph capture (``Stream.begin_capture`` / ``end_capture``): the commands issued on a
  stream are recorded instead of run; ``Graph.launch(stream)`` replays them.

A ``Kernel`` carries both halves a kernel has: its CUDA C ``source`` and ``name`` (what the
CuPy driver compiles) and its numpy ``reference`` (what the emulator runs, and what tests
check the compiled kernel against).
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DeviceError, KernelError, OutOfMemoryError


@dataclass(frozen=True, eq=False)
class Kernel:
    """A kernel: ``name`` and CUDA C ``source`` for a compiled driver, ``reference(*args)``
    the numpy function with the same effect for the emulator (it takes the launch's
    arguments, device arrays as numpy arrays, and writes its outputs in place).
    ``grid(*args) -> (grid, block)``, when given, sizes a launch that names none.
    ``params``: the launch parameters of ``source`` (``kernels.KernelSource.params``: what
    a compiled driver packs each argument as); ``entry``: the ``extern "C"`` function of
    ``source`` when it is not ``name`` (a generated kernel is named by its op, for
    messages and injected faults)."""

    name: str
    reference: Callable | None = None
    source: str = ""
    grid: Callable | None = None
    params: tuple = ()
    entry: str = ""

    def __repr__(self) -> str:
        return f"Kernel({self.name})"


@dataclass(frozen=True, eq=False)
class DeviceMemory:
    """One block of device memory from a driver's pool: ``nbytes`` at address ``ptr``
    (a real address on a GPU, a made-up aligned one on the emulator). ``handle`` is the
    driver's own object for it."""

    driver: Driver
    ptr: int
    nbytes: int
    handle: Any = field(default=None, repr=False)  # of a type each driver picks

    def array(self, shape, dtype, offset: int = 0) -> DeviceArray:
        """A typed view of this block: ``shape`` of ``dtype`` from byte ``offset``.
        Raises ValueError when it does not fit in the block."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        n = dtype.itemsize
        for s in shape:
            n *= s
        if offset < 0 or offset + n > self.nbytes:
            raise ValueError(
                f"a {shape} {dtype.name} view at byte {offset} needs {offset + n} "
                f"bytes; the block at {self.ptr:#x} has {self.nbytes}"
            )
        return DeviceArray(self, offset, shape, dtype)


@dataclass(frozen=True, eq=False)
class DeviceArray:
    """A contiguous typed view of device memory: what copies and kernels take."""

    memory: DeviceMemory
    offset: int
    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        return self.memory.ptr + self.offset


def raise_sticky(err: BaseException):
    """Raises a stream's sticky error: a KernelError as the kind of fault it keeps."""
    raise (err.to_raise() if isinstance(err, KernelError) else err)


def check_copy(dev: DeviceArray, other, op: str) -> None:
    """A copy's two sides must have the same bytes and dtype. Raises ValueError naming both."""
    if dev.nbytes != other.nbytes or dev.dtype != other.dtype:
        raise ValueError(
            f"{op}: the device array is {dev.shape} {dev.dtype.name} "
            f"({dev.nbytes} bytes), the other side {tuple(other.shape)} "
            f"{other.dtype.name} ({other.nbytes} bytes); they must match"
        )


class PoolCount:
    """A driver's count of its device memory: the live blocks by address, the bytes in use,
    the peak and the limit, under ``lock``. ``take`` refuses past the limit with
    ``OutOfMemoryError`` (the bytes asked, in use and the limit: CuPy's names the same
    three)."""

    def __init__(self, device: str, limit: int | None = None):
        self.device, self.limit = device, limit
        self.lock = threading.Lock()
        self.blocks: dict = {}  # ptr -> (DeviceMemory, the driver's own object)
        self.in_use = self.peak = 0

    def check(self, nbytes: int) -> None:
        """Raises OutOfMemoryError when ``nbytes`` more would pass the limit (hold ``lock``)."""
        limit = self.limit
        if limit is not None and self.in_use + nbytes > limit:
            raise OutOfMemoryError(
                self.device,
                nbytes,
                self.in_use,
                limit,
                f"device memory ({nbytes:,} bytes asked, {self.in_use:,} in use, limit {limit:,})",
            )

    def add(self, mem: DeviceMemory, own=None) -> None:
        """Counts block ``mem`` (``own``: what keeps it allocated; hold ``lock``)."""
        self.blocks[mem.ptr] = (mem, own)
        self.in_use += mem.nbytes
        self.peak = max(self.peak, self.in_use)

    def remove(self, mem: DeviceMemory):
        """Forgets block ``mem``; returns its ``own``. Raises DeviceError for a block not
        allocated (freed twice, or another driver's)."""
        with self.lock:
            entry = self.blocks.get(mem.ptr)
            if entry is None or entry[0] is not mem:
                raise DeviceError(
                    f"{self.device}: free of a block at {mem.ptr:#x} that is "
                    f"not allocated (freed twice, or another driver's)"
                )
            del self.blocks[mem.ptr]
            self.in_use -= mem.nbytes
            return entry[1]

    def live(self, mem: DeviceMemory) -> bool:
        entry = self.blocks.get(mem.ptr)
        return entry is not None and entry[0] is mem

    def info(self) -> MemoryInfo:
        with self.lock:
            return MemoryInfo(self.device, self.in_use, self.peak, self.limit)


@dataclass(frozen=True)
class MemoryInfo:
    """A driver pool's bytes: ``in_use`` (allocated, not freed), ``peak``, ``limit`` (None:
    the device's own size)."""

    device: str
    in_use: int
    peak: int
    limit: int | None


class Event(ABC):
    """A marker in a stream's order (see the module doc)."""

    @abstractmethod
    def query(self) -> bool:
        """True once the latest record has completed (or if never recorded)."""

    @abstractmethod
    def synchronize(self, timeout: float | None = None) -> None:
        """Blocks the host until the latest record has completed; raises the recording
        stream's sticky error if it had one then."""

    @abstractmethod
    def then(self, fn: Callable[[], None]) -> None:
        """Calls ``fn()`` once the latest record has completed (at once if it has), on a
        driver thread: ``fn`` must be quick and thread-safe."""


class Graph(ABC):
    """A stream's commands captured by ``begin_capture``/``end_capture``."""

    @abstractmethod
    def launch(self, stream: Stream) -> None:
        """Replays the captured commands on ``stream``, in their order."""


class Stream(ABC):
    """A non-blocking, in-order command queue on one device (see the module doc)."""

    name: str

    @abstractmethod
    def launch(self, kernel: Kernel, args: tuple, grid=None, block=None) -> None:
        """Runs ``kernel`` over ``args`` (DeviceArrays and numbers) in this stream's order."""

    @abstractmethod
    def copy_h2d(self, dst: DeviceArray, src: np.ndarray) -> None:
        """Copies host ``src`` into ``dst`` when the stream gets there (``src`` is read
        then: keep it alive and unchanged until an event recorded after this completes)."""

    @abstractmethod
    def copy_d2h(self, dst: np.ndarray, src: DeviceArray) -> None:
        """Copies ``src`` into host ``dst`` when the stream gets there."""

    @abstractmethod
    def copy_d2d(self, dst: DeviceArray, src: DeviceArray) -> None:
        """Copies ``src`` into ``dst`` on the device, in this stream's order."""

    @abstractmethod
    def record(self, event: Event | None = None) -> Event:
        """Records ``event`` (a new one if None) here; returns it."""

    @abstractmethod
    def wait(self, event: Event, errors: bool = True) -> None:
        """Makes this stream's later commands wait for ``event``'s latest record. The host
        does not wait. ``errors``: a sticky error the recording stream had at the record
        becomes this stream's too (a dependency: work computed from faulted work must not
        run); False orders only (the allocator's reuse waits: a block's next user waits for
        its last uses, never takes on their faults)."""

    @abstractmethod
    def add_callback(self, fn: Callable[[], None]) -> None:
        """Calls ``fn()`` on a driver thread when the stream gets there (a host function)."""

    @abstractmethod
    def query(self) -> bool:
        """True when every command issued so far has completed; raises the sticky error."""

    @abstractmethod
    def synchronize(self, timeout: float | None = None) -> None:
        """Blocks the host until every command issued so far has completed; raises the
        stream's sticky error (a ``KernelError`` naming the kernel) if one failed."""

    @abstractmethod
    def close(self) -> None:
        """Stops the stream once the commands issued so far have run (its driver forgets it;
        its thread, where it has one, ends). Later work on it (kernels, copies, waits, host
        functions, capture) raises DeviceError; ``record`` still works, and marks the end of
        what was issued (an event completes, with the stream's sticky error, once all of it
        ran). Closing twice is a no-op."""

    @abstractmethod
    def begin_capture(self) -> None:
        """Commands issued on this stream from now on are captured, not run."""

    @abstractmethod
    def end_capture(self) -> Graph:
        """Ends the capture; returns the captured commands as a Graph. Raises DeviceError
        when a command could not be captured (it did not run, and the stream is not
        faulted: the caller may issue the same commands uncaptured)."""


class Driver(ABC):
    """One CUDA device behind the seam: its streams, events, memory pool and host buffers.
    ``closed``: ``close()`` was called (``use_driver`` closes the drivers it replaces);
    nothing may touch its streams or events after that (the allocator drops its blocks)."""

    name: str = "?"
    device: str
    _closed = False

    @property
    def closed(self) -> bool:
        return bool(self._closed)

    @abstractmethod
    def stream(self, name: str = "compute") -> Stream:
        """A new non-blocking stream (``name`` is for messages and traces)."""

    @abstractmethod
    def event(self) -> Event:
        """A new event, never recorded."""

    @abstractmethod
    def malloc(self, nbytes: int) -> DeviceMemory:
        """``nbytes`` of device memory from the pool. Raises OutOfMemoryError (bytes asked,
        in use and the limit) when the pool's limit or the device refuses it."""

    @abstractmethod
    def free(self, memory: DeviceMemory) -> None:
        """Gives a block back to the pool. Work already issued that uses it still runs on
        it: reusing it before that work completes is the caller's race (``allocator.py``
        keeps its blocks safe across streams)."""

    @abstractmethod
    def pinned(self, shape, dtype) -> np.ndarray:
        """A page-locked host buffer (a numpy array) for asynchronous copies."""

    @abstractmethod
    def set_limit(self, nbytes: int | None) -> None:
        """Sets the pool's byte limit (None: no limit but the device's)."""

    @abstractmethod
    def memory(self) -> MemoryInfo:
        """The pool's bytes."""

    _streams: list  # every stream made, in order

    # Whether a graph capture on this driver may hold a launch of a kernel's numpy
    # ``reference`` (the reference form): the emulator runs it anew at each replay, on host
    # memory; on a GPU its numpy-over-device-array calls may allocate temporaries during
    # the capture, which a shared pool would hand out again once the capture ends (a replay
    # would write into memory in use), so CuPy's capture takes them from a pool the graph
    # keeps. A capture on a driver without it holds compiled kernels and copies only.
    captures_allocations: bool = False

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits for every stream of this driver; raises the first sticky error."""
        for s in list(self._streams):
            s.synchronize(timeout)

    def close(self) -> None:  # noqa: B027 - a no-op by default, not abstract
        """Releases the driver's threads and memory (a no-op where there are none)."""

    # -- DLPack: device memory shared with other libraries, without a copy -----------------
    dlpack = False  # whether its memory is a GPU's, which DLPack consumers can read

    def _no_dlpack(self, what: str) -> DeviceError:
        return DeviceError(
            f"{what}: {self.device} runs on the {self.name} driver, whose device memory is "
            f"not a GPU's: no DLPack consumer could read it as CUDA memory. Go through the "
            f"host: t.to('cpu') exports a cpu tensor (kDLCPU), and a host array comes in "
            f"with af.tensor(...) (or af.from_dlpack(x) of a cpu array, then .to(...))"
        )

    def export(self, array: DeviceArray, owner) -> object:
        """An object with ``__dlpack__``/``__dlpack_device__`` viewing ``array`` without a
        copy, which keeps ``owner`` alive while a consumer holds it. Raises DeviceError
        where the memory is not a GPU's (the emulator)."""
        raise self._no_dlpack("__dlpack__")

    def adopt(self, obj, stream: Stream | None = None) -> DeviceArray:
        """The device memory of DLPack producer ``obj`` (a CuPy or torch CUDA tensor on
        this device), without a copy: a DeviceArray whose block keeps ``obj``'s memory
        alive; never freed to this driver's pool. ``stream``: the stream that reads it
        first (DLPack's consumer stream): the producer's pending writes are ordered before
        that stream's later commands. Raises DeviceError where the memory is not a GPU's
        (the emulator), or for a producer on another device or not contiguous."""
        raise self._no_dlpack("from_dlpack")
