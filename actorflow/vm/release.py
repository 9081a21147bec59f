"""Releasing the memory of dead tensors: a blob whose last tensor is gone is queued on
``tensor.blob.RELEASED``; the VM collects the queue at the next submit or dispatch (and the
allocators call it under memory pressure), freeing idle blobs at once and the others with a
RELEASE instruction ordered after their last pending use (on a launch-ahead device, on a
stream of releases of its own: in the compute stream's order it would wait for everything
issued before it, where it needs only its blob's uses issued, see ``deps.py``)."""

from __future__ import annotations

import threading

from ..tensor.blob import RELEASED
from .deps import issued_uses
from .instruction import RELEASE, Instruction

RELEASES = "releases"  # the stream of RELEASEs on a launch-ahead device


def _release(instr) -> None:
    for b in instr.muts:
        b.free()


def collect(vm, submit_pending: bool = True) -> bool:
    """Frees blobs whose last tensor is gone: now if nothing is pending on them (or, on a
    launch-ahead device, every pending use is issued there: ``deps.issued_uses``), else
    with a RELEASE instruction that runs after their last pending use. Returns whether
    there was anything to collect. Most small blobs never come here (``Blob.release``
    frees them at once); the rest are collected at the next submit or dispatch, so large
    blocks go back to the cache while they are still in the CPU's cache.

    ``submit_pending=False`` (the allocator's reclaim, which may run under the VM lock)
    frees only what is idle and leaves the rest queued."""
    if not RELEASED or _COLLECTING.on:
        return False  # (a RELEASE submitted below collects: this loop goes on)
    _COLLECTING.on = True
    try:
        return _collect(vm, submit_pending)
    finally:
        _COLLECTING.on = False


class _Collecting(threading.local):
    on = False  # this thread is inside collect


_COLLECTING = _Collecting()


def _collect(vm, submit_pending: bool) -> bool:
    frees: dict = {}
    pending = []
    while RELEASED:
        try:
            blob = RELEASED.popleft()
        except IndexError:
            break
        if blob.released:
            continue
        if (
            (blob.last_write is None and blob.reads is None)
            or blob.idle()
            or (not blob.backend.host_memory and issued_uses(blob))
        ):
            if blob.allocated:
                frees.setdefault(blob.backend.allocator, []).append(blob.detach())
            else:
                blob.released = True
        elif submit_pending:
            stream = blob.backend.compute
            if stream.launches_ahead:
                stream = blob.backend.stream(RELEASES)
            vm.submit(Instruction(RELEASE, "release", stream, (), (blob,), _release, None))
        else:
            pending.append(blob)
    RELEASED.extend(pending)
    for allocator, blocks in frees.items():
        allocator.free_many(blocks)
    return True
