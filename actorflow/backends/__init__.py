"""Backends, found by device type name: one file per device type."""

from __future__ import annotations

import importlib
import threading

_MODULES = {"cpu": ("cpu", "CpuBackend"), "null": ("null", "NullBackend"),
            "cuda": ("cuda", "CudaBackend")}
_BACKENDS: dict = {}
_LOCK = threading.Lock()


def get_backend(device):
    """The backend object for a Device, created (and its module imported) on first use."""
    b = device.backend
    if b is not None:
        return b
    with _LOCK:
        b = _BACKENDS.get(device)
        if b is None:
            module, cls = _MODULES[device.type]
            mod = importlib.import_module(f"{__name__}.{module}")
            b = _BACKENDS[device] = getattr(mod, cls)(device)
            device.backend = b
    return b


def loaded_backends() -> list:
    return list(_BACKENDS.values())
