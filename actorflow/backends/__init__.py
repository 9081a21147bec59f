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


def loaded_backends() -> list:
    return list(_BACKENDS.values())
