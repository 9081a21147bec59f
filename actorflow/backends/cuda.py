"""The CUDA backend (CuPy streams), on the backend template of ``base.py``. CuPy is imported
here only, lazily, so that actorflow installs and runs without it. Not built yet: making a
CUDA device's backend says so, naming what to install or use instead."""

from __future__ import annotations

from ..errors import DeviceError
from .base import Allocator, Backend


class CudaBackend(Backend):
    def __init__(self, device):
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            raise DeviceError(
                f"device {device}: CuPy is not installed; install actorflow[cuda] "
                f"(or the CuPy wheel matching your CUDA version) to use CUDA devices") from e
        super().__init__(device)

    def _make_allocator(self) -> Allocator:
        raise DeviceError(f"device {self.device}: the CUDA backend is not implemented yet in "
                          f"this version of actorflow; use 'cpu' or 'null'")
