"""The CPU backend: numpy arrays, kernels on worker threads (numpy releases the GIL)."""

from __future__ import annotations

import numpy as np

from .base import Allocator, Backend

_U8 = np.dtype(np.uint8)


class CpuAllocator(Allocator):
    _alloc_small = staticmethod(np.empty)  # small blocks: numpy's own allocator

    def _alloc_array(self, shape, dtype, nbytes: int):
        if nbytes < self.cache_min_bytes:  # small: numpy's own allocator is fastest
            return np.empty(shape, dtype)
        return self._view(self._alloc(nbytes), shape, dtype)

    def _alloc(self, nbytes: int):
        return np.empty(nbytes, _U8)

    def _free(self, block) -> None:
        pass  # the array's refcount returns the memory

    def _view(self, block, shape, dtype):
        return block.view(dtype).reshape(shape)

    def _block_of(self, array):
        return array.reshape(-1).view(_U8)

    def _copyin(self, dst, src) -> None:
        np.copyto(dst, src, casting="unsafe")

    def _copyout(self, src):
        return np.array(src, copy=True)


class CpuBackend(Backend):
    def _make_allocator(self) -> Allocator:
        return CpuAllocator(str(self.device))
