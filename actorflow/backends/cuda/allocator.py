"""The caching device allocator over a driver (``driver.py``): freed blocks are kept by size
and handed out again without going back to the driver, within a byte budget per device, and
reuse is safe across streams.

Stream safety (the ``record_stream`` pitfall of PyTorch and CuPy): work on a stream may still
be reading a block when the host frees it. A block is allocated for a stream; every other
stream that uses it is told with ``record_stream``. ``free`` records an event on each stream
that used the block, after everything issued there so far. A reuse on stream S then needs
nothing for S's own uses (S runs in order) and, for each other stream's event that has not
completed, makes S wait on it: a wait on the device, never on the host, so reuse costs no
round trip and no extra memory. The wait orders only (``errors=False``): a stream that
faulted still ends its uses before the reuse (on CUDA, work queued after a host function's
error still runs), and its fault is not handed to the reusing stream. A block given back to
the driver (to make room under the budget, or ``empty_cache``) first waits on the host for
its events.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ...errors import DeviceError, KernelError, OutOfMemoryError
from ..base import AllocatorStats

_ROUND = 512  # block sizes are multiples of this (CUDA's pools round too)


def _done(event) -> bool:
    """Whether ``event`` completed; a faulted stream's event has (its later work is skipped)."""
    try:
        return event.query()
    except KernelError:
        return True


def _rounded(nbytes: int) -> int:
    return max(-(-nbytes // _ROUND), 1) * _ROUND


@dataclass(frozen=True)
class CachingStats(AllocatorStats):
    """One device's caching allocator, in bytes and counts: ``AllocatorStats`` (``in_use``:
    blocks handed out, rounded sizes; ``cached``: freed blocks kept), and ``hits``:
    allocations served from the cache; ``mallocs``/``releases``: blocks taken from / given
    back to the driver; ``reuse_waits``: device-side waits a reuse on another stream
    needed."""

    hits: int
    mallocs: int
    releases: int
    reuse_waits: int


class Block:
    """Device memory handed out by a ``CachingAllocator``: ``nbytes`` (rounded) for
    ``stream``; ``array(shape, dtype, offset)`` views it."""

    __slots__ = ("memory", "nbytes", "stream", "streams", "events", "live")

    def __init__(self, memory, nbytes: int, stream):
        self.memory, self.nbytes, self.stream = memory, nbytes, stream
        self.streams: set = set()  # other streams that used it since it was handed out
        self.events: list = []  # (stream, event) recorded at free, pending reuse
        self.live = True

    def array(self, shape, dtype, offset: int = 0):
        return self.memory.array(shape, dtype, offset)

    def __repr__(self) -> str:
        return f"Block({self.nbytes} bytes at {self.memory.ptr:#x}, {self.stream.name})"


class CachingAllocator:
    """Blocks of one driver's device memory, cached by size, within ``budget`` bytes (None:
    the driver's limit only). Thread-safe.

    ``_skip_reuse_events`` (private, for tests only): free records no event and reuse waits
    for none, the bug this class exists to prevent; a test shows values go wrong with it.
    """

    _skip_reuse_events = False

    def __init__(self, driver, budget: int | None = None):
        self.driver = driver
        self.device = driver.device
        self.budget = budget
        self._lock = threading.Lock()
        self._cache: dict = {}  # rounded size -> [Block], last freed last
        self._in_use = self._peak = self._cached = 0
        self._allocs = self._frees = self._hits = self._mallocs = 0
        self._releases = self._waits = 0
        self._spare_events: list = []  # events whose record is settled, to record again

    # -- public face -----------------------------------------------------------------------
    def malloc(self, nbytes: int, stream, what: str = "") -> Block:
        """A block of at least ``nbytes`` for use on ``stream``. Raises OutOfMemoryError
        (bytes asked, in use, the budget) when the budget or the driver refuses it, after
        giving back every cached block."""
        size = _rounded(int(nbytes))
        with self._lock:
            if self.budget is not None and self._in_use + size > self.budget:
                raise OutOfMemoryError(
                    self.device,
                    size,
                    self._in_use,
                    self.budget,
                    what or "the CUDA caching allocator",
                )
            blocks = self._cache.get(size)
            if blocks:
                block = blocks.pop()
                self._cached -= size
                self._hits += 1
                self._handout(block, stream)
                return block
            if self.budget is not None and self._in_use + self._cached + size > self.budget:
                self._release_cached(self._in_use + self._cached + size - self.budget)
            self._account(size)
        try:
            memory = self._driver_malloc(size)
        except BaseException:
            with self._lock:
                self._in_use -= size
                self._allocs -= 1
            raise
        with self._lock:
            self._mallocs += 1
        block = Block(memory, size, stream)
        return block

    def record_stream(self, block: Block, stream) -> None:
        """Tells the allocator ``stream`` uses ``block`` (besides the stream it was made for):
        its reuse elsewhere will wait for what ``stream`` issued before the free."""
        if stream is not block.stream:
            block.streams.add(stream)

    def free(self, block: Block) -> None:
        """Gives ``block`` back to the cache: an event is recorded on each stream that used it,
        after everything issued there so far. Raises DeviceError for a block freed twice."""
        with self._lock:
            if not block.live:
                raise DeviceError(f"{self.device}: {block!r} freed twice")
            block.live = False
            if self.driver.closed:  # its memory went with the driver: nothing of it
                self._in_use -= block.nbytes  # is touched (its streams and events may be
                self._frees += 1  # gone: a tensor freed by the collector
                return  # after use_driver, seen on a GPU)
            if not self._skip_reuse_events:
                block.events = [(s, self._record(s)) for s in (block.stream, *block.streams)]
            block.streams = set()
            self._in_use -= block.nbytes
            self._frees += 1
            self._cache.setdefault(block.nbytes, []).append(block)
            self._cached += block.nbytes

    def empty_cache(self) -> None:
        """Gives every cached block back to the driver (after its streams passed their uses)."""
        with self._lock:
            self._release_cached(None)

    def set_budget(self, budget: int | None) -> None:
        with self._lock:
            self.budget = budget
            if budget is not None and self._in_use + self._cached > budget:
                self._release_cached(self._in_use + self._cached - budget)

    def stats(self) -> CachingStats:
        with self._lock:
            return CachingStats(
                self.device,
                self._in_use,
                self._peak,
                self._cached,
                self.budget,
                self._allocs,
                self._frees,
                self._hits,
                self._mallocs,
                self._releases,
                self._waits,
            )

    # -- internals (the caller holds the lock unless said) --------------------------------
    def _account(self, size: int) -> None:
        self._in_use += size
        self._allocs += 1
        if self._in_use > self._peak:
            self._peak = self._in_use

    def _handout(self, block: Block, stream) -> None:
        self._account(block.nbytes)
        for s, ev in block.events:
            if _done(ev):
                self._spare_events.append(ev)  # its record is reached: reusable
            elif s is not stream:  # the device waits; the host goes on. Order
                stream.wait(ev, errors=False)  # only: a fault there is not the reuser's
                self._waits += 1  # (an event still pending is not recorded
            #                       again: it is dropped with the wait's use)
        block.events = []
        block.stream, block.live = stream, True

    def _record(self, stream):
        ev = self._spare_events.pop() if self._spare_events else None
        return stream.record(ev)

    def _driver_malloc(self, size: int):
        # no lock held: on the driver's refusal, give back the cache and ask once more
        try:
            return self.driver.malloc(size)
        except OutOfMemoryError:
            with self._lock:
                if not self._cached:
                    raise
                self._release_cached(None)
            return self.driver.malloc(size)

    def _release_cached(self, need: int | None) -> None:
        """Gives cached blocks back to the driver until ``need`` bytes are
        freed (all when None), each after waiting on the host for its streams' uses."""
        freed = 0
        for size in list(self._cache):
            blocks = self._cache[size]
            while blocks and (need is None or freed < need):
                block = blocks.pop(0)
                for _, ev in block.events:
                    try:
                        ev.synchronize()
                    except KernelError:  # the stream faulted: its later work is skipped
                        pass
                    self._spare_events.append(ev)
                block.events = []
                self.driver.free(block.memory)
                self._cached -= size
                self._releases += 1
                freed += size
            if not blocks:
                del self._cache[size]
            if need is not None and freed >= need:
                return
