"""The null device: tensors have shapes, dtypes and counted bytes but no data; every kernel
takes a configurable simulated time. For deterministic scheduling tests and experiments.
Each index (``"null"``, ``"null:1"``...) is a device with its own allocator and budget; the
latency is one setting for all of them.

Example::

    af.lowlevel.set_null_latency(0.001)                        # 1 ms per op
    af.lowlevel.set_null_latency(lambda op, nbytes: nbytes / 1e9)
"""

from __future__ import annotations

from .base import Allocator, Backend, NoDataAllocator

_LATENCY: list = [0.0]  # shared by every null device


class NullBackend(Backend):
    simulated = True
    has_data = False

    @property
    def latency(self):
        """Seconds per kernel, or ``f(op, output_bytes)``: the same on every null device."""
        return _LATENCY[0]

    @latency.setter
    def latency(self, value) -> None:
        _LATENCY[0] = value

    def kernel_time(self, op: str, nbytes: int) -> float:
        """Seconds the op takes: ``latency`` or ``latency(op, output_bytes)``."""
        lat = self.latency
        return float(lat(op, nbytes)) if callable(lat) else lat

    def _make_allocator(self) -> Allocator:
        return NoDataAllocator(str(self.device))
