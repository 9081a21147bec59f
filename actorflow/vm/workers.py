"""CPU worker threads: a minimal pool on a SimpleQueue. Kernels report completion themselves
(via the loop's ``call_soon_threadsafe``), so no futures are made per task."""

from __future__ import annotations

import queue
import threading

_STOP = object()


class Countdown:
    """Counts the slices of split work still running (thread-safe): ``finish_one()`` is True
    for the slice that finishes last."""

    __slots__ = ("left", "lock")

    def __init__(self, n: int):
        self.left = n
        self.lock = threading.Lock()

    def finish_one(self) -> bool:
        with self.lock:
            self.left -= 1
            return self.left == 0


class Workers:
    """``n`` daemon threads running ``fn(*args)`` submitted with ``submit``, in order of
    submission. ``fn`` must not raise (the VM's tasks catch their own errors)."""

    def __init__(self, n: int, name: str = "actorflow-cpu"):
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn, *args) -> None:
        self._queue.put((fn, args))

    def _run(self) -> None:
        get = self._queue.get
        while True:
            task = get()
            if task is _STOP:
                return
            fn, args = task
            fn(*args)
            del task, fn, args  # hold nothing of a finished task while waiting

    def spawn(self, fn, *args) -> None:
        """Runs ``fn(*args)`` on a new daemon thread of its own (for long work: the OS puts a
        new thread on an idle CPU, see vm/runs.py)."""
        threading.Thread(target=fn, args=args, name=f"{self._name}-run", daemon=True).start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join(timeout)

    @property
    def threads(self) -> list:
        return list(self._threads)
