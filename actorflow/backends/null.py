"""The null device: tensors have shapes, dtypes and counted bytes but no data; every kernel
takes a configurable simulated time. For deterministic scheduling tests and experiments.

Example::

    af.lowlevel.set_null_latency(0.001)                        # 1 ms per op
    af.lowlevel.set_null_latency(lambda op, nbytes: nbytes / 1e9)
"""

from __future__ import annotations

from .base import Allocator, Backend


class NullAllocator(Allocator):
    def _alloc_small(self, shape, dtype):
        return None

    def _alloc_array(self, shape, dtype, nbytes: int):
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


class NullBackend(Backend):
    simulated = True
    has_data = False

    def __init__(self, device):
        super().__init__(device)
        self.latency = 0.0

    def kernel_time(self, op: str, nbytes: int) -> float:
        """Seconds the op takes: ``latency`` or ``latency(op, output_bytes)``."""
        lat = self.latency
        return float(lat(op, nbytes)) if callable(lat) else lat

    def _make_allocator(self) -> Allocator:
        return NullAllocator(str(self.device))
