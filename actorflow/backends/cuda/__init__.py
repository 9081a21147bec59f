"""The CUDA backend on ``base.py``'s template, over the driver seam (``driver.py``): a CUDA
device's driver comes from ``selection.driver_for`` (the emulator under ``AF_CUDA=emu`` or a
test's ``use_driver``, else the CuPy driver), and making the backend with no driver
selectable refuses with one message.

- Device memory: ``CudaAllocator`` counts bytes and enforces the device's budget as every
  allocator does (``af.lowlevel.set_memory_budget("cuda:0", ...)``), and takes its blocks
  from a ``CachingAllocator`` over the driver, so a block freed after use on a copy stream
  is reused on the compute stream only after an event recorded there. A tensor's
  ``blob.array`` is a ``CudaArray``: a typed view of one block, which the host never reads.
- Streams: each of the VM's streams on the device (``compute``, ``use_stream``'s) is one
  driver stream; copies across the host boundary run on two more, ``h2d`` and ``d2h``,
  joined to the stream that asked for them by events it waits on (on the device, never on
  the host). The VM's instructions on the device are issued by ``issue_on`` (a block is
  allocated for the stream that writes it) and ``end_issue`` (the streams that use a block
  are told to the caching allocator), and complete when an event recorded after them
  completes (``vm/scheduler.py``). A dead tensor's block is freed once its uses are issued
  (stream-ordered, as CUDA's allocators): the caching allocator's events keep its reuse
  after them.
- Copies: host to device copies the host data into a pinned staging buffer at issue (a
  private copy, so the source may change at once) which the copy's event keeps alive; device
  to host copies into a pinned staging buffer, which a host function on the ``d2h`` stream
  copies into a host tensor, or which ``numpy()`` hands out itself.
- A kernel fault is the driver stream's sticky error: the instruction fails with it, and
  the backend makes fresh driver streams (``reset``), so work issued later runs.
"""

from __future__ import annotations

import numpy as np

from ...errors import DeviceError
from ..base import Allocator, Backend
from .allocator import Block, CachingAllocator
from .selection import driver_for


class CudaArray:
    """A tensor's storage on a CUDA device: ``darray`` (a ``driver.DeviceArray``, what
    copies and kernels take) over ``block`` (the ``CachingAllocator``'s block, or a block of
    another library's memory taken by DLPack). ``lease``: set once exported by DLPack."""

    __slots__ = ("block", "darray", "shape", "dtype", "lease")

    def __init__(self, block, shape, dtype):
        self.block = block
        self.darray = block.array(shape, dtype)
        self.shape, self.dtype = self.darray.shape, self.darray.dtype
        self.lease = None

    def __repr__(self) -> str:
        return f"CudaArray({self.shape}, {self.dtype.name}, {self.block!r})"


class CudaAllocator(Allocator):
    """Counts and budgets a CUDA device's bytes (``base.Allocator``) and takes the memory
    from the device's ``CachingAllocator`` (which caches freed blocks, safely across
    streams): the base class's own cache and lock-free path are off."""

    cache_min_bytes = 0  # every allocation takes the counted path (no numpy fast path)
    cache_max_bytes = 0  # the CachingAllocator caches, not the base class

    def __init__(self, backend):
        super().__init__(str(backend.device))
        self.backend = backend

    def _alloc_array(self, shape, dtype, nbytes: int):
        b = self.backend
        stream = b.current or b.driver_stream(b.compute)  # the stream that writes it
        return CudaArray(b.caching().malloc(nbytes, stream), shape, dtype)

    _alloc_small = None  # never taken: cache_min_bytes is 0

    def free_many(self, blocks) -> None:
        blocks = list(blocks)
        super().free_many(blocks)
        caching = self.backend._caching  # (no driver lookup: freeing never fails)
        for array, _, owned in blocks:
            # not owned: exported by DLPack (its lease frees it) or another library's memory
            if owned and array is not None and array.block.memory.driver is caching.driver:
                try:
                    caching.free(array.block)
                except DeviceError:  # its driver was closed (use_driver): the
                    pass  # memory went with it

    def set_budget(self, budget: int | None) -> None:
        super().set_budget(budget)
        if budget is not None:
            self.backend.caching().empty_cache()  # cached blocks hold device memory too

    def empty_cache(self) -> None:
        self.backend.caching().empty_cache()

    def _copyin(self, dst: CudaArray, src) -> None:
        """Issues the copy of host ``src`` (any numpy array, views too) into ``dst``: into a
        pinned staging buffer now (a private copy: ``src`` may change at once), from there
        on the ``h2d`` stream; the issuing stream waits on an event after it."""
        b = self.backend
        d = b.driver()
        staging = d.pinned(dst.shape, dst.dtype)
        np.copyto(staging, np.broadcast_to(src, dst.shape), casting="unsafe")
        join, h2d = b.current, b.driver_stream(b.stream("h2d"))
        h2d.wait(join.record())  # dst may still be in use on the issuing stream
        h2d.copy_h2d(dst.darray, staging)
        b.caching().record_stream(dst.block, h2d)
        done = h2d.record()
        done.then(lambda: staging)  # keeps the staging buffer until the copy ran
        join.wait(done)

    def _copyout(self, src: CudaArray):
        """Issues the copy of ``src`` into a new pinned host buffer, which it returns: its
        values are there once the issuing stream's next event completes."""
        b = self.backend
        staging = b.driver().pinned(src.shape, src.dtype)
        self.copy_out_into(staging, src, None)
        return staging

    def copy_out_into(self, staging, src: CudaArray, dst) -> None:
        """Issues the copy of ``src`` into host ``staging`` on the ``d2h`` stream (after
        what the issuing stream issued before), then, when ``dst`` is given, a host function
        copying ``staging`` into ``dst``; the issuing stream waits on an event after them."""
        b = self.backend
        join, d2h = b.current, b.driver_stream(b.stream("d2h"))
        d2h.wait(join.record())
        d2h.copy_d2h(staging, src.darray)
        if dst is not None:
            d2h.add_callback(lambda: np.copyto(dst, staging.reshape(dst.shape)))
        b.caching().record_stream(src.block, d2h)
        join.wait(d2h.record())


class CudaBackend(Backend):
    """A CUDA device on its driver (see the module doc). ``host_memory`` is False: its
    arrays are device memory, which only copies and kernels on its streams touch."""

    simulated = True  # the host never runs its work inline: the driver does
    launches_ahead = True  # the driver orders it: dependents are issued ahead
    host_memory = False

    def __init__(self, device):
        try:
            driver_for(device)
        except DeviceError as e:
            raise DeviceError(
                f"{e}; or use 'cpu' to compute, or 'null' for shapes, memory and simulated "
                f"time without data"
            ) from None
        self._driver = None
        self._drv_streams: dict = {}
        self._caching = None
        self.current = None  # the driver stream of the instruction being issued (None
        #                      between issues: an allocation then is the compute stream's)
        super().__init__(device)

    def _make_allocator(self) -> Allocator:
        return CudaAllocator(self)

    # -- the driver, its streams and its memory ------------------------------------------
    def driver(self):
        """The device's driver; a new one (``use_driver``) gets fresh streams and memory."""
        d = driver_for(self.device)
        if d is not self._driver:
            self._driver = d
            self._drv_streams = {}
            self._caching = CachingAllocator(d)
        return d

    def caching(self) -> CachingAllocator:
        self.driver()
        return self._caching

    def driver_stream(self, stream):
        """The driver stream behind the VM's ``stream`` on this device (made on first use)."""
        self.driver()
        s = self._drv_streams.get(stream.name)
        if s is None:
            s = self._drv_streams[stream.name] = self._driver.stream(stream.name)
        return s

    def issue_on(self, stream):
        """Makes ``stream``'s driver stream the one this instruction's work is issued on
        (copies join it); returns it. The VM calls it on its loop thread before the work."""
        self.current = s = self.driver_stream(stream)
        return s

    def end_issue(self, *blob_lists) -> None:
        """The VM's issue of an instruction ends; its work uses the blobs in ``blob_lists``
        (none when it failed) on the current driver stream: the caching allocator learns
        that stream uses their blocks, so a block freed once its uses are issued (not
        completed) is reused on another stream only after an event recorded there."""
        s, caching = self.current, self._caching
        self.current = None
        for blobs in blob_lists:
            for b in blobs:
                a = b.array
                if a.__class__ is CudaArray:
                    caching.record_stream(a.block, s)

    def reset(self) -> None:
        """After a kernel fault (a driver stream's sticky error): work issued from now on
        goes to fresh driver streams; the old ones are closed (each stops once what was
        issued on it ran, so no fault leaves a driver stream or thread behind)."""
        old, self._drv_streams = self._drv_streams, {}
        for s in old.values():
            s.close()

    # -- DLPack ------------------------------------------------------------------------------
    def dlpack_device(self, what: str = "__dlpack_device__") -> tuple:
        """``(kDLCUDA, index)``. Raises DeviceError on a driver whose memory is not a GPU's
        (the emulator), naming the way through the host."""
        d = self.driver()
        if not d.dlpack:
            raise d._no_dlpack(what)
        return 2, self.device.index or 0

    def export(self, array: CudaArray):
        """``array`` (a tensor's whole storage, its writes done) for a DLPack consumer, no
        copy: the tensor's blob no longer owns the block (the caller marks it), a lease
        does, which both the storage and the consumer's view hold: the block goes back to
        the allocator once both are gone."""
        if array.lease is None:
            array.lease = _Lease(self.caching(), array.block)
        return self._driver.export(array.darray, array.lease)

    def adopt(self, obj) -> CudaArray:
        """Another library's CUDA memory (DLPack producer ``obj``) as storage, no copy; the
        producer's pending writes are ordered before the compute stream (DLPack's consumer
        stream), where ops run unless ``use_stream`` names another."""
        d = self.driver()
        if not d.dlpack:
            raise d._no_dlpack("from_dlpack")
        darray = d.adopt(obj, self.driver_stream(self.compute))
        return CudaArray(
            Block(darray.memory, darray.memory.nbytes, None), darray.shape, darray.dtype
        )

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits on the host for every driver stream (a test's helper; the VM waits on its
        instructions instead)."""
        for s in list(self._drv_streams.values()):
            s.synchronize(timeout)


class _Lease:
    """An exported block's owner: frees it to ``caching`` when the tensor's storage and
    every DLPack consumer of it are gone."""

    __slots__ = ("caching", "block")

    def __init__(self, caching, block):
        self.caching, self.block = caching, block

    def __del__(self):
        try:
            self.caching.free(self.block)
        except Exception:  # noqa: BLE001 - its driver was closed: the memory went with it
            pass
