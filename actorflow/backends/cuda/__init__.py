"""The CUDA backend: not built yet. ``"cuda:N"`` parses as a device (so specs and plans can
name it), but making its backend, which the first tensor or register on it does, refuses with
one message whatever is installed: installing CuPy changes nothing yet. When it is built, it
goes on ``base.py``'s template with CuPy streams, CuPy imported here only, lazily."""

from __future__ import annotations

from ...errors import DeviceError
from ..base import Backend


class CudaBackend(Backend):
    def __init__(self, device):
        raise DeviceError(
            f"device {device}: the CUDA backend is not built yet in this version of actorflow "
            f"(installing CuPy does not change that); use 'cpu' to compute, or 'null' for "
            f"shapes, memory and simulated time without data")
