"""The one place event loops are made, for the VM's loop thread and the actor graphs' loop
thread (and the experiments): uvloop's when it is installed, asyncio's otherwise."""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
