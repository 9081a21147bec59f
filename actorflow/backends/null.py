"""The null device: tensors have shapes, dtypes and counted bytes but no data; every kernel
takes a configurable simulated time. For deterministic scheduling tests and experiments.

Example::

    af.lowlevel.set_null_latency(0.001)                        # 1 ms per op
    af.lowlevel.set_null_latency(lambda op, nbytes: nbytes / 1e9)
"""

from __future__ import annotations

from .base import Allocator, Backend, NoDataAllocator


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
        return NoDataAllocator(str(self.device))
