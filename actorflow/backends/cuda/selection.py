"""Which driver a CUDA device gets: the factory ``use_driver`` set (a test fixture hands in
the emulator), else the emulator when the environment has ``AF_CUDA=emu``, else the CuPy
driver (``cupy_driver.py``: AF_CUDA unset or ``cupy``), which refuses with a DeviceError
naming the install and ``AF_CUDA=emu`` when CuPy is missing or sees no such device. One
driver per device, made on first use. The seam itself is ``driver.py``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ...errors import DeviceError
from .. import forget_backends
from .driver import Driver

_FACTORY: list = [None]  # what use_driver set: a callable(device) -> Driver, or None
_DRIVERS: dict = {}
_LOCK = threading.Lock()


def use_driver(factory: Callable | None) -> Callable | None:
    """Makes ``factory(device) -> Driver`` the way CUDA devices get their driver (a test
    fixture hands in the emulator this way); None goes back to the default (``AF_CUDA``).
    Drivers made before are closed and forgotten, and so are the CUDA devices' backends
    (the next use makes one on the new driver, or refuses). Returns the previous factory."""
    with _LOCK:
        old, _FACTORY[0] = _FACTORY[0], factory
        drivers = list(_DRIVERS.values())
        _DRIVERS.clear()
    forget_backends("cuda")
    for d in drivers:
        d.close()
    return old


def driver_for(device) -> Driver:
    """The driver of CUDA device ``device`` (a Device or 'cuda:N'), made on first use: the
    factory ``use_driver`` set, else the emulator when the environment has ``AF_CUDA=emu``,
    else the CuPy driver. Raises DeviceError when that driver cannot be made."""
    key = str(device)
    d = _DRIVERS.get(key)
    if d is not None:
        return d
    with _LOCK:
        d = _DRIVERS.get(key)
        if d is None:
            d = _DRIVERS[key] = _make(key)
    return d


def _make(device: str) -> Driver:
    factory = _FACTORY[0]
    if factory is not None:
        return factory(device)
    choice = os.environ.get("AF_CUDA", "").strip().lower()
    if choice == "emu":
        from .emu import EmuDriver

        return EmuDriver(device)
    if choice not in ("", "cupy"):
        raise DeviceError(
            f"AF_CUDA={choice!r} names no CUDA driver: use AF_CUDA=emu for the "
            f"CPU emulator, or leave it unset (or AF_CUDA=cupy) for CuPy"
        )
    from .cupy_driver import CupyDriver

    return CupyDriver(device)
