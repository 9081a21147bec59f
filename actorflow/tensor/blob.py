"""Blob: a tensor's storage on a device and its dependence record for the VM.

``last_write`` is the last instruction issued that writes the blob and ``reads`` the
instructions issued since then that read it; the VM orders new instructions after them.
``error`` is set when the instruction that should have written the blob failed.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

# Blobs whose last owning tensor is gone and that TensorImpl.__del__ could not free at once.
# It only appends here (atomic, safe from any thread and from inside the garbage collector);
# the VM frees them at its next step.
RELEASED: deque = deque()
_SMALL = 1 << 20  # blobs this large are queued so the allocator can cache them
_PIN_LOCK = threading.Lock()


class Blob:
    __slots__ = (
        "device",
        "backend",
        "nbytes",
        "array",
        "owned",
        "allocated",
        "last_write",
        "reads",
        "error",
        "released",
        "version",
        "pins",
        "orphaned",
        "__weakref__",
    )  # (the VM tracks poisoned blobs by weak reference)
    traced = False  # a placeholder recorded by a tracer: it never holds data

    def __init__(self, device, backend, nbytes: int):
        self.device = device
        self.backend = backend
        self.nbytes = nbytes
        self.owned = True  # allocated by our allocator (may be cached when freed)
        # (chained: one blob per op call is made)
        # array: numpy array (cpu), None until allocated or on the null device;
        # reads: reads issued since last_write (None: none)
        self.array: Any = None  # (the backend's: see above)
        self.last_write = self.reads = self.error = None
        # orphaned: its owning tensor is gone while pinned: freed at unpin
        self.allocated = self.released = self.orphaned = False
        # version: in-place writes seen by autograd (saved tensors check it);
        # pins: holders besides its tensors (autograd's saved outputs)
        self.version = self.pins = 0

    def pin(self) -> None:
        """Keeps the storage past its owning tensor (see ``unpin``)."""
        with _PIN_LOCK:
            self.pins += 1

    def unpin(self) -> None:
        """Drops a pin; the last one frees storage whose owning tensor is gone already."""
        with _PIN_LOCK:
            self.pins -= 1
            free = self.pins == 0 and self.orphaned
            if free:
                self.orphaned = False
        if free:
            RELEASED.append(self)

    def orphan(self) -> bool:
        """Its owning tensor is gone: True if a pin keeps it (freed at the last unpin)."""
        with _PIN_LOCK:
            if self.pins:
                self.orphaned = True
                return True
        return False

    def idle(self) -> bool:
        """True when no issued instruction that touches this blob is still pending."""
        w = self.last_write
        if w is not None and not w.done:
            return False
        if self.reads:
            for r in self.reads:
                if not r.done:
                    return False
        return True

    def free(self) -> None:
        """Returns the storage to the allocator. Called by the VM once no use is pending."""
        if self.allocated:
            self.backend.allocator.free(*self.detach())
        self.array = None
        self.released = True

    def detach(self) -> tuple:
        """Marks the storage released and returns ``(array, nbytes, owned)`` for the
        allocator's ``free_many``."""
        out = (self.array, self.nbytes, self.owned)
        self.allocated = False
        self.array = None
        self.released = True
        return out

    def __repr__(self) -> str:
        return f"Blob({self.device}, {self.nbytes} B{', allocated' if self.allocated else ''})"
