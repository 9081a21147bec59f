"""Grad mode, per thread: ``no_grad()``, ``enable_grad()``, ``set_grad_enabled(mode)``
(context managers, and decorators too), ``is_grad_enabled()``."""

from __future__ import annotations

import contextlib
import threading


class _Mode(threading.local):
    enabled = True


MODE = _Mode()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record what backward() needs."""
    return MODE.enabled


class set_grad_enabled(contextlib.ContextDecorator):
    """Turns gradient recording on or off on this thread: at once when called, and back to
    what it was at the end of a ``with`` block (or of a decorated function)."""

    def __init__(self, mode: bool):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled(mode): mode must be a bool, got "
                            f"{type(mode).__name__}")
        self.prev = MODE.enabled
        self.mode = mode
        MODE.enabled = mode

    def _recreate_cm(self):
        return _Set(self.mode)

    def __enter__(self):
        MODE.enabled = self.mode        # (prev: the mode when it was called)
        return self

    def __exit__(self, *exc):
        MODE.enabled = self.prev
        return False


class no_grad(contextlib.ContextDecorator):
    """Within the block (or the decorated function) ops record nothing for backward: what
    evaluation and optimizer steps run under."""

    def _recreate_cm(self):          # a decorated function gets its own, per call
        return type(self)()

    def __enter__(self):
        self.prev = MODE.enabled
        MODE.enabled = False
        return self

    def __exit__(self, *exc):
        MODE.enabled = self.prev
        return False


class enable_grad(contextlib.ContextDecorator):
    """Turns recording back on inside a ``no_grad`` block."""

    def _recreate_cm(self):
        return type(self)()

    def __enter__(self):
        self.prev = MODE.enabled
        MODE.enabled = True
        return self

    def __exit__(self, *exc):
        MODE.enabled = self.prev
        return False


class _Set(set_grad_enabled):
    """``set_grad_enabled`` as a decorator: sets the mode when the call starts, not when
    the function is decorated."""

    def __init__(self, mode: bool):
        self.mode = mode
        self.prev = MODE.enabled
