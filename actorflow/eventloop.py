"""The one place event loops are made (uvloop's when it is installed, asyncio's otherwise),
and the one place a thread is started to run one: the VM's loop thread and the actor
graphs' loop thread (``start_loop_thread``), and how such a thread is stopped
(``stop_loop_thread``: at exit, before the interpreter finalizes, since a loop still running
in a daemon thread then can crash the process as a pending callback takes the GIL)."""

from __future__ import annotations

import asyncio
import threading


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def start_loop_thread(name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """Starts a daemon thread named ``name`` that runs a new event loop (``new_event_loop``)
    until the loop is stopped; returns ``(loop, thread)`` once the loop is running."""
    loop = new_event_loop()
    started = threading.Event()

    def main():
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        loop.run_forever()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    started.wait()
    return loop, thread


def stop_loop_thread(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, timeout: float
) -> None:
    """Stops ``loop`` (started by ``start_loop_thread``) and waits up to ``timeout`` seconds
    for its thread to end: an act still running on it past that is left to the daemon
    thread's fate."""
    if thread.is_alive():
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=timeout)
