"""What a sync point reports: the kernel errors kept between two ``synchronize`` calls
(``KeptErrors``, owned by the VM as ``vm.errors``). The waits themselves are the VM's
(``scheduler.py``): they wait on its instructions under its lock."""

from __future__ import annotations

import threading
from collections import deque

# Kernel errors kept between two synchronize calls. Further ones are only counted: a loop
# of failing ops whose outputs nobody reads must not grow memory without bound.
MAX_KEPT_ERRORS = 100


class Dropped:
    """The kernel errors past ``MAX_KEPT_ERRORS`` since the last synchronize: a count (less
    those reported since, by reading a tensor they poisoned) and the latest one."""

    __slots__ = ("count", "last", "lock")

    def __init__(self, lock):
        self.count = 0
        self.last = None
        self.lock = lock  # the KeptErrors' lock

    def reported_one(self) -> None:
        with self.lock:
            self.count -= 1


class KeptErrors:
    """The kernel errors not raised to the user yet: the first ``MAX_KEPT_ERRORS`` since the
    last synchronize, and a count of the rest. Called from any thread, with or without the
    VM's lock held: it has a lock of its own."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kept: deque = deque()
        self.dropped = Dropped(self.lock)

    def keep(self, err) -> None:
        """Keeps ``err`` for the next synchronize, or counts it once ``MAX_KEPT_ERRORS`` are
        kept (errors already reported on a read make room first)."""
        with self.lock:
            errors = self.kept
            if len(errors) >= MAX_KEPT_ERRORS:
                kept = [e for e in errors if not e._reported]
                if len(kept) < len(errors):
                    errors.clear()
                    errors.extend(kept)
            if len(errors) < MAX_KEPT_ERRORS:
                errors.append(err)
                return
            dropped = self.dropped
            dropped.count += 1
            dropped.last = err
            err._dropped_in = dropped

    def unreported(self) -> int:
        """Kernel errors not raised to the user yet, kept or only counted."""
        with self.lock:
            return sum(1 for e in self.kept if not e._reported) + self.dropped.count

    def raise_unreported(self) -> None:
        """Raises the first kernel error not reported yet (its ``more_errors`` and
        ``dropped_errors`` count the others) and forgets them all."""
        with self.lock:
            errs = [e for e in self.kept if not e._reported]
            self.kept.clear()
            dropped, self.dropped = self.dropped, Dropped(self.lock)
        for e in errs:
            e._reported = True
        n = dropped.count
        if errs:
            raise errs[0].to_raise(len(errs) - 1 + n, n, MAX_KEPT_ERRORS)
        if n > 0:  # every kept error was reported on a read: the latest dropped one
            raise dropped.last.to_raise(n - 1, n - 1, MAX_KEPT_ERRORS)
