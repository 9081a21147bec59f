"""The thin template every backend fills: an Allocator with a byte budget and statistics,
and named Streams. Adding a device is adding a file in this folder (see cpu.py, null.py).

An allocator's public ``empty/adopt/free`` wrap the backend's ``_alloc/_free`` (and
``_copyin/_copyout`` for moving data across the host boundary).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import methodcaller

from ..errors import OutOfMemoryError

if sys.version_info >= (3, 11):
    from operator import call as _call
else:  # operator.call is new in 3.11; this calls its argument the same way
    _call = methodcaller("__call__")

_FOLD_AT = 4096
_POSITIVE = (0).__lt__
_RECLAIM: list = [None]


def on_memory_pressure(reclaim) -> None:
    """Sets what an allocator calls when a budget would be exceeded, before it refuses:
    ``reclaim()`` frees memory nothing can reach any more (the VM hands in its release of
    dead tensors; backends sit below it and never import it)."""
    _RECLAIM[0] = reclaim


_MAX_BYTES = sys.maxsize  # no array may hold more bytes (numpy indexes bytes with intp)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class AllocatorStats:
    """Bytes counted by one device's allocator (in use excludes cached free blocks)."""

    device: str
    in_use: int
    peak: int
    cached: int
    budget: int | None
    allocs: int
    frees: int


class Allocator:
    """Counts bytes per device, enforces an optional budget, and keeps a cache of large freed
    blocks so that steady-state loops do not page-fault fresh memory on every op.

    Subclasses implement ``_alloc(nbytes) -> block``, ``_free(block)`` and
    ``_view(block, shape, dtype) -> array``. Thread-safe.

    Small blocks with no budget set are counted without a lock: each allocation or free
    appends its signed size to ``log`` (an atomic deque append: +n allocates, -n frees;
    empty blocks are not logged), and the log is folded in order under the lock whenever
    exact numbers are needed, so in-use and peak stay exact.
    """

    cache_min_bytes = 1 << 20  # blocks at least this large are cached when freed
    cache_max_bytes = 1 << 30  # never cache more than this in all

    def __init__(self, device: str, budget: int | None = None):
        self.device = device
        self.budget = budget
        self._lock = threading.Lock()
        self._in_use = self._peak = self._cached = self._allocs = self._frees = 0
        self._cache: dict[int, list] = {}
        self.log: deque = deque()  # signed byte counts not yet folded into the totals

    # -- public face --------------------------------------------------------------------
    def empty(self, shape, dtype, nbytes: int, what: str = ""):
        """A new uninitialized array of ``shape`` and numpy ``dtype`` holding ``nbytes`` (None
        on data-less devices). Raises OutOfMemoryError if it would exceed the budget, if the
        system refuses it or if its size is impossible. However the allocation fails, its
        bytes are given back: the counts stay as they were."""
        if nbytes < self.cache_min_bytes and self.budget is None:
            log = self.log  # the common case: no lock (see class doc)
            if nbytes:
                log.append(nbytes)
            if len(log) > _FOLD_AT:
                self.fold()
            try:
                return self._alloc_small(shape, dtype)
            except BaseException as e:  # (a 0-byte shape numpy refuses, Ctrl-C...)
                with self._lock:
                    peak = self._peak
                    self._fold()  # apply this block's entry, then take it back
                    self._unreserve(nbytes, peak)
                raise self._refused(e, shape, dtype, nbytes, what) from None
        if nbytes > _MAX_BYTES:  # reserve nothing, whatever the budget
            raise self._impossible(shape, dtype, nbytes, what, "")
        block = None
        if self.budget is not None:
            self._fit(nbytes)
        with self._lock:
            peak = self._peak
            self._reserve(nbytes, what)
            if nbytes >= self.cache_min_bytes:
                blocks = self._cache.get(nbytes)
                if blocks:
                    block = blocks.pop()
                    self._cached -= nbytes
        if block is None:
            try:
                return self._alloc_array(shape, dtype, nbytes)
            except BaseException as e:  # refused, impossible, interrupted: give it back
                with self._lock:
                    self._unreserve(nbytes, peak)
                raise self._refused(e, shape, dtype, nbytes, what) from None
        return self._view(block, shape, dtype)

    def _refused(self, e: BaseException, shape, dtype, nbytes: int, what: str):
        """The error to raise for an allocation the backend failed with ``e`` (whose bytes
        were given back): OutOfMemoryError when the system refused or the size is impossible
        (numpy's ValueError/OverflowError), ``e`` itself otherwise."""
        if isinstance(e, OutOfMemoryError):
            return e
        if isinstance(e, MemoryError):
            return OutOfMemoryError(self.device, nbytes, self.stats().in_use, 0, what)
        if isinstance(e, (ValueError, OverflowError)):
            return self._impossible(shape, dtype, nbytes, what, f"; numpy: {e}")
        return e

    def _impossible(self, shape, dtype, nbytes: int, what: str, reason: str):
        name = getattr(dtype, "name", dtype)
        return OutOfMemoryError(
            self.device,
            nbytes,
            self.stats().in_use,
            self.budget or 0,
            what,
            f"a tensor of shape {tuple(shape)} and dtype {name}",
            reason,
        )

    def adopt(self, nbytes: int, what: str = "") -> None:
        """Counts ``nbytes`` of memory the allocator did not make (a zero-copy numpy array)."""
        if self.budget is not None:
            self._fit(nbytes)
        with self._lock:
            self._reserve(nbytes, what)

    def free(self, array, nbytes: int, owned: bool) -> None:
        """Gives back ``nbytes``; an ``owned`` large block goes to the cache for reuse."""
        self.free_many(((array, nbytes, owned),))

    def free_many(self, blocks) -> None:
        """``free`` for a list of ``(array, nbytes, owned)`` under one lock."""
        with self._lock:
            self._fold()
            for array, nbytes, owned in blocks:
                if not nbytes:
                    continue  # empty blocks are not counted
                self._in_use -= nbytes
                self._frees += 1
                if (
                    owned
                    and array is not None
                    and nbytes >= self.cache_min_bytes
                    and self._cached + nbytes <= self._cache_limit()
                ):
                    self._cache.setdefault(nbytes, []).append(self._block_of(array))
                    self._cached += nbytes

    fold_at = _FOLD_AT  # log entries that make whoever appends fold the log

    def fold(self) -> None:
        """Applies the lock-free log to the totals. Whoever appends to ``log`` (``empty``, a
        small array numpy allocated for a kernel, a freed small tensor) calls this once the
        log is longer than ``fold_at``, so it never grows without bound."""
        with self._lock:
            self._fold()

    def copy_in(self, dst, src) -> None:
        """Writes host data ``src`` (a numpy array) into the device array ``dst``."""
        self._copyin(dst, src)

    def copy_out(self, src):
        """A host (numpy) copy of the device array ``src``."""
        return self._copyout(src)

    def empty_cache(self) -> None:
        """Returns every cached block to the system."""
        with self._lock:
            self._drop_cache()

    def set_budget(self, budget: int | None) -> None:
        with self._lock:
            self._fold()
            self.budget = budget
            if budget is not None and self._in_use + self._cached > budget:
                self._drop_cache()

    def reset_peak(self) -> None:
        with self._lock:
            self._fold()
            self._peak = self._in_use

    def bytes_in_use(self) -> int:
        """``stats().in_use`` alone, for sampling it often (``af.profile``): ~0.4 us."""
        with self._lock:
            self._fold()
            return self._in_use

    def stats(self) -> AllocatorStats:
        with self._lock:
            self._fold()
            return AllocatorStats(
                self.device,
                self._in_use,
                self._peak,
                self._cached,
                self.budget,
                self._allocs,
                self._frees,
            )

    # -- internals ----------------------------------------------------------------------
    def _fit(self, nbytes: int) -> None:
        # Tensors that died but are not collected yet still count: collect them first.
        with self._lock:
            self._fold()
        reclaim = _RECLAIM[0]
        budget = self.budget
        assert budget is not None  # both callers check that a budget is set first
        if self._in_use + nbytes > budget and reclaim is not None:
            reclaim()

    def _fold(self) -> None:
        # caller holds the lock; applies the lock-free log in order. The entries are taken
        # one by one from the left (appenders may be adding on the right meanwhile) and
        # summed in C: this runs every ``fold_at`` small tensors made and freed.
        log = self.log
        n = len(log)
        if not n:
            return
        entries = list(map(_call, repeat(log.popleft, n)))
        allocs = sum(map(_POSITIVE, entries))  # (entries are never 0: see class doc)
        self._peak = max(self._peak, max(accumulate(entries, initial=self._in_use)))
        self._in_use += sum(entries)
        self._allocs += allocs
        self._frees += n - allocs

    def _reserve(self, nbytes: int, what: str) -> None:
        # caller holds the lock
        self._fold()
        budget = self.budget
        if budget is not None:
            if self._in_use + nbytes > budget:
                raise OutOfMemoryError(self.device, nbytes, self._in_use, budget, what)
            if self._in_use + self._cached + nbytes > budget:
                self._drop_cache()
        if nbytes:
            self._in_use += nbytes
            self._allocs += 1
            if self._in_use > self._peak:
                self._peak = self._in_use

    def _unreserve(self, nbytes: int, peak: int) -> None:
        # caller holds the lock: undoes _reserve after the system refused the memory
        if nbytes:
            self._in_use -= nbytes
            self._allocs -= 1
            self._peak = max(peak, self._in_use)

    def _cache_limit(self) -> int:
        if self.budget is None:
            return self.cache_max_bytes
        return min(self.cache_max_bytes, max(self.budget - self._in_use, 0))

    def _drop_cache(self) -> None:
        for blocks in self._cache.values():
            for b in blocks:
                self._free(b)
        self._cache.clear()
        self._cached = 0

    def _alloc_array(self, shape, dtype, nbytes: int):
        return self._view(self._alloc(nbytes), shape, dtype)

    def _alloc_small(self, shape, dtype):
        return self._alloc_array(shape, dtype, dtype.itemsize * _prod(shape))

    # -- backend hooks ------------------------------------------------------------------
    def _alloc(self, nbytes: int):
        raise NotImplementedError

    def _free(self, block) -> None:
        raise NotImplementedError

    def _view(self, block, shape, dtype):
        raise NotImplementedError

    def _block_of(self, array):
        raise NotImplementedError

    def _copyin(self, dst, src) -> None:
        raise NotImplementedError

    def _copyout(self, src):
        raise NotImplementedError


class NoDataAllocator(Allocator):
    """The allocator of a device without data (``Backend.has_data = False``): it counts
    bytes, budgets and peaks as any other, and every array it hands out is None."""

    def _alloc_array(self, shape, dtype, nbytes: int):
        return None

    def _alloc_small(self, shape, dtype):
        return None

    def _alloc(self, nbytes: int):
        return None

    def _free(self, block) -> None:
        pass

    def _view(self, block, shape, dtype):
        return None

    def _block_of(self, array):
        return None

    def _copyin(self, dst, src) -> None:
        pass

    def _copyout(self, src):
        return None


class Stream:
    """An in-order queue of instructions on one device: each instruction on a stream starts
    after the one issued before it on that stream completes. ``tail`` is the last issued;
    ``simulated`` and ``launches_ahead``: the backend's, read on every op call (one
    attribute here, not two through the backend)."""

    __slots__ = ("device", "backend", "name", "simulated", "launches_ahead", "tail", "__weakref__")

    def __init__(self, backend, name: str):
        self.device = backend.device
        self.backend = backend
        self.name = name
        self.simulated = backend.simulated
        self.launches_ahead = backend.launches_ahead
        self.tail = None

    def __repr__(self) -> str:
        return f"Stream({self.device}:{self.name})"


class Backend:
    """A device type's allocator and streams. The host never runs a ``simulated`` backend's
    work inline: without data (null), its kernels take ``latency`` seconds of simulated time
    instead of running; with data (cuda), its driver runs them and tells the VM when."""

    simulated = False
    has_data = True
    host_memory = True  # its arrays are numpy arrays the host reads (cuda: False)
    launches_ahead = False  # its driver orders its work (streams, events), so work that
    #                         depends on it may be issued before it completes (cuda;
    #                         vm/deps.py)

    def __init__(self, device):
        self.device = device
        self.allocator = self._make_allocator()
        self._streams: dict[str, Stream] = {}
        self.compute = self.stream("compute")

    def stream(self, name: str = "compute") -> Stream:
        """The stream called ``name`` on this device, made on first use."""
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = Stream(self, name)
        return s

    def streams(self) -> list:
        return list(self._streams.values())

    def _make_allocator(self) -> Allocator:
        raise NotImplementedError
