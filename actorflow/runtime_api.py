"""Process-wide waiting: ``synchronize`` and ``synchronize_async``."""

from __future__ import annotations

from .vm import get_vm


def synchronize(timeout: float | None = None) -> None:
    """Waits until every instruction issued so far has run, then raises the first kernel
    error that no sync point has reported yet (later ones are dropped).

    Example: ``y = af.relu(x); af.synchronize()``.
    """
    get_vm().synchronize(timeout)


async def synchronize_async() -> None:
    """``synchronize`` for coroutines: awaits without blocking the running event loop."""
    await get_vm().synchronize_async()
