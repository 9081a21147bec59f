"""The CUDA backend (CuPy streams). CuPy is imported here only, lazily, so that actorflow
installs and runs without it."""

from __future__ import annotations

from ..errors import DeviceError


class CudaBackend:
    def __init__(self, device):
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            raise DeviceError(
                f"device {device}: CuPy is not installed; install actorflow[cuda] "
                f"(or the CuPy wheel matching your CUDA version) to use CUDA devices") from e
        raise DeviceError(f"device {device}: the CUDA backend is not implemented yet in this "
                          f"version of actorflow; use 'cpu' or 'null'")
