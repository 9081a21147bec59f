"""Backends, found by device type name: one file per device type (``device.KNOWN_TYPES``),
``backends/<type>.py`` defining ``<Type>Backend`` (``cpu.py``: ``CpuBackend``)."""

from __future__ import annotations

import importlib
import threading

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
            mod = importlib.import_module(f"{__name__}.{device.type}")
            cls = getattr(mod, f"{device.type.capitalize()}Backend")
            b = _BACKENDS[device] = cls(device)
            device.backend = b
    return b


def forget_backends(device_type: str) -> None:
    """Forgets the backends of every device of ``device_type``: the next use of such a device
    makes a new one (what switching CUDA drivers does, ``cuda.selection.use_driver``).
    Tensors made before keep the backend they were made on."""
    with _LOCK:
        for dev in [d for d in _BACKENDS if d.type == device_type]:
            del _BACKENDS[dev]
            dev.backend = None


def loaded_backends() -> list:
    return list(_BACKENDS.values())
