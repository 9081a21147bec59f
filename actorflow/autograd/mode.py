"""Grad mode, per thread: ``no_grad()``, ``enable_grad()``, ``set_grad_enabled(mode)``
(context managers, and decorators too, of plain and generator functions), and
``is_grad_enabled()``."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast


class _Mode(threading.local):
    enabled = True


MODE = _Mode()

_F = TypeVar("_F", bound=Callable[..., Any])
_M = TypeVar("_M", bound="_GradMode")


def is_grad_enabled() -> bool:
    """Whether ops on this thread record what backward() needs."""
    return MODE.enabled


class _GradMode:
    """A context manager setting grad mode for its block, and restoring it after; as a
    decorator (``@af.no_grad()`` or bare ``@af.no_grad``), for every call of the function
    (each step of a generator function)."""

    mode = True

    def __new__(cls, *args: Any) -> Any:  # (bare as a decorator: the decorated function)
        if cls is not set_grad_enabled and len(args) == 1 and callable(args[0]):
            return cls()(args[0])  # used bare: @af.no_grad
        return super().__new__(cls)

    def __enter__(self: _M) -> _M:
        self.prev = MODE.enabled
        MODE.enabled = self.mode
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        MODE.enabled = self.prev
        return False

    def _fresh(self):
        return type(self)()

    def __call__(self, fn: _F) -> _F:
        mode = self.mode
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen(*args, **kwargs):
                it = fn(*args, **kwargs)
                value = None
                while True:
                    prev = MODE.enabled
                    MODE.enabled = mode
                    try:
                        item = it.send(value)
                    except StopIteration as e:
                        return e.value
                    finally:
                        MODE.enabled = prev
                    value = yield item

            return cast(_F, gen)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = MODE.enabled
            MODE.enabled = mode
            try:
                return fn(*args, **kwargs)
            finally:
                MODE.enabled = prev

        return cast(_F, wrapper)


class no_grad(_GradMode):
    """Within the block (or the decorated function) ops record nothing for backward: what
    evaluation and optimizer steps run under."""

    mode = False


class enable_grad(_GradMode):
    """Turns recording back on inside a ``no_grad`` block."""

    mode = True


class set_grad_enabled(_GradMode):
    """Turns gradient recording on or off on this thread: at once when called (as PyTorch's),
    back to what it was at the end of a ``with`` block; as a decorator, for each call of
    the function only."""

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(
                f"set_grad_enabled(mode): mode must be a bool, got {type(mode).__name__}"
            )
        self.mode = mode
        self.prev = MODE.enabled
        MODE.enabled = mode

    def __enter__(self: _M) -> _M:
        MODE.enabled = self.mode  # (prev: the mode when it was called)
        return self

    def __call__(self, fn: _F) -> _F:
        MODE.enabled = self.prev  # a decorator changes nothing until a call
        return super().__call__(fn)
