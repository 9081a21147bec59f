"""Registers, credits and device memory budgets of the actor runtime.

A ``Register`` holds one piece of an actor's output. An actor owns ``buffers`` registers
(its ``OutPort``); the free ones are its credits. A register sent to consumers is free again
once every consumer has returned it. A consumer's ``InPort`` queues the registers (and the
end-of-stream mark) it has been sent, in piece order.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections import deque

import numpy as np

from ...backends import get_backend
from ...device import device as as_device
from ...errors import OutOfMemoryError, PlanError, format_bytes, parse_bytes

EOS = "end of stream"  # the mark queued on an InPort after the last piece


class Register:
    """One buffer of an actor's output: ``arrays`` (one per array of the piece; None on a
    device without data), the ``piece`` it holds, and ``pending``: consumers that have not
    handed it back yet."""

    __slots__ = ("owner", "index", "arrays", "nbytes", "piece", "pending", "view", "key", "at")

    def __init__(self, owner, index: int, arrays: list, nbytes: int, view=None, key=None):
        self.owner = owner  # the OutPort it belongs to
        self.key = (owner.actor.name, index) if key is None else key  # what its memory is
        # filed under in the graph's MemoryBudget (registers sharing an arena: the arena's)
        self.index = index
        self.arrays = arrays
        self.nbytes = nbytes
        self.view = view  # the piece as consumers read it (read-only views), made once
        self.piece = None
        self.pending = 0
        self.at = None  # inside a chain of piped actors: the actor writing or
        # reading it now (None: free), kept by their threads for the watchdog (pipes.py)

    def __repr__(self) -> str:
        return (
            f"Register({self.owner.actor.name}#{self.index}, piece {self.piece}, "
            f"{format_bytes(self.nbytes)})"
        )


class OutPort:
    """An actor's output: its registers, the free ones (credits) and its consumers."""

    __slots__ = ("actor", "spec", "buffers", "registers", "free", "consumers", "pipe")

    def __init__(self, actor, spec, buffers: int):
        self.actor = actor
        self.spec = spec  # PieceSpec
        self.buffers = buffers
        self.registers: list = []
        self.free: deque = deque()
        self.consumers: list = []  # InPorts
        self.pipe = None  # a piped actor's free registers (a SimpleQueue): its
        # thread takes its credits there, and they come home there (see state.PipedThread)

    def home(self) -> bool:
        """Every register is back (none is out at a consumer or being written)."""
        if self.pipe is not None:
            return self.pipe.qsize() >= len(self.registers)
        return len(self.free) == len(self.registers)


class InPort:
    """One input of an actor: the registers its producer sent, oldest first."""

    __slots__ = ("actor", "producer", "queue", "closed", "pipe")

    def __init__(self, actor, producer: OutPort):
        self.actor = actor
        self.producer = producer
        self.queue: deque = deque()
        self.closed = False
        self.pipe = None  # a piped actor's input: registers go to its thread here


class MemoryBudget:
    """Byte budgets per device for one graph, and the registers allocated under them.

    ``budgets`` maps a device name to an int or a string such as "64MiB" (None: no budget).
    Allocation goes through the device's allocator, so ``lowlevel.memory_stats`` sees it.
    """

    def __init__(self, budgets: dict | None = None):
        self.budgets: dict = {}
        if budgets is not None and not isinstance(budgets, dict):
            raise PlanError(
                f"memory={budgets!r}: memory takes a budget per device, e.g. {{'cpu': {budgets!r}}}"
            )
        for dev, value in (budgets or {}).items():
            d = as_device(dev)
            try:
                self.budgets[d] = None if value is None else parse_bytes(value)
            except (TypeError, ValueError) as e:
                raise PlanError(f"memory={{{dev!r}: {value!r}}}: {e}") from None
        self.in_use: dict = {}
        self.peak: dict = {}
        self._blocks: dict = {}  # key -> [(device, array, nbytes, owned)]
        self._lock = threading.Lock()  # frees may come from an abandoned act's thread

    def budget(self, device):
        return self.budgets.get(device)

    def allocate(self, spec, what: str, key=None, pinned=None) -> tuple[list, int]:
        """Arrays for one register of ``spec`` (a PieceSpec), filed under ``key`` (what
        ``free(key)`` gives back; by default ``what``). ``pinned``: a device backend whose
        copies read or write the register: its host arrays are that driver's pinned
        buffers (counted by the host's allocator all the same). Raises OutOfMemoryError if
        a budget would be exceeded (the plan checks first, so this means the device's own
        budget or the system refused); nothing stays allocated then."""
        key = what if key is None else key
        arrays, total, blocks = [], 0, []
        try:
            for s in spec.specs:
                dev = s.device
                nbytes = s.nbytes
                budget = self.budgets.get(dev)
                used = self.in_use.get(dev, 0)
                if budget is not None and used + nbytes > budget:
                    raise OutOfMemoryError(str(dev), nbytes, used, budget, what)
                allocator = get_backend(dev).allocator
                owned = pinned is None or dev.type != "cpu"
                if owned:
                    arr = allocator.empty(s.shape, s.dtype.np, nbytes, what)
                else:
                    allocator.adopt(nbytes, what)
                    try:
                        arr = pinned.driver().pinned(s.shape, s.dtype.np)
                    except BaseException:
                        allocator.free(None, nbytes, False)
                        raise
                blocks.append((dev, arr, nbytes, owned))
                with self._lock:
                    self.in_use[dev] = used + nbytes
                    self.peak[dev] = max(self.peak.get(dev, 0), used + nbytes)
                arrays.append(arr)
                total += nbytes
        except BaseException:
            self._free_blocks(blocks)  # the arrays of this register made so far
            raise
        with self._lock:
            self._blocks.setdefault(key, []).extend(blocks)
        return arrays, total

    def free(self, key) -> None:
        """Frees what was allocated under ``key`` (from any thread)."""
        with self._lock:
            blocks = self._blocks.pop(key, [])
        self._free_blocks(blocks)

    def _free_blocks(self, blocks) -> None:
        with self._lock:
            for dev, _, nbytes, _ in blocks:
                self.in_use[dev] -= nbytes
        for dev, arr, nbytes, owned in blocks:
            get_backend(dev).allocator.free(arr, nbytes, owned)

    def release_all(self, keep=()) -> None:
        """Frees everything allocated under this budget but the keys in ``keep`` (what an
        abandoned act still uses: it frees that itself when it returns)."""
        with self._lock:
            keys = [k for k in self._blocks if k not in keep]
        for k in keys:
            self.free(k)

    def stats(self) -> dict:
        """``{device name: {"in_use", "peak", "budget"}}`` in bytes."""
        devs = set(self.in_use) | set(self.budgets)
        return {
            str(d): {
                "in_use": self.in_use.get(d, 0),
                "peak": self.peak.get(d, 0),
                "budget": self.budgets.get(d),
            }
            for d in sorted(devs, key=str)
        }


class RegisterArrays(list):
    """The arrays of one register kept in a ``SharedBlock``: a list as any register's,
    which also says where it lives (``block``, ``index``), so that a worker process told
    the index writes it in place."""

    __slots__ = ("block", "index")


_BLOCK_IDS = itertools.count(1)
ALIGN = 64  # each array of a shared register starts on a cache line


class SharedBlock:
    """The registers of one actor output in one block of shared memory
    (``multiprocessing.shared_memory``), for a stage whose worker processes write them
    (``sched/processes.py``). The block's name is unlinked the moment it is made: its
    memory lives while a mapping or the descriptor ``fd`` holds it (this process's arrays,
    the workers' maps), so nothing is left in ``/dev/shm`` after a run, an error, or a
    crash. ``layout``: per register, ``(offset, shape, dtype string)`` per array; ``fd``
    is what a worker maps (sent over its pipe), closed by ``release()`` at the run's end."""

    stage: tuple  # (actor name, out spec, declared): set by the pool that made it (processes.py)

    def __init__(self, spec, buffers: int, what: str):
        from multiprocessing import shared_memory

        for s in spec.specs:
            if s.device.type != "cpu":
                raise PlanError(
                    f"{what}: a stage in worker processes (processes=) writes "
                    f"registers on the host, but its output has an array on "
                    f"{s.device}; copy it to the device after the stage "
                    f"(g.copy(stage, {str(s.device)!r}))"
                )
        self.id = next(_BLOCK_IDS)
        self.spec = spec
        self.layout, at = [], 0
        for _ in range(buffers):
            reg = []
            for s in spec.specs:
                reg.append((at, tuple(s.shape), s.dtype.np.str))
                at += -(-s.nbytes // ALIGN) * ALIGN
            self.layout.append(reg)
        self.size = max(at, ALIGN)
        shm = shared_memory.SharedMemory(create=True, size=self.size)
        try:
            # (SharedMemory's descriptor: private, on POSIX only, so not in typeshed)
            self.fd: int | None = os.dup(shm._fd)  # type: ignore[attr-defined]
        finally:
            shm.close()
            shm.unlink()  # (the memory stays while mapped or fd is open)
        self.registers = []
        for i, arrays in enumerate(mapped(self.fd, self.size, self.layout)):
            arrays.block, arrays.index = self, i
            self.registers.append(arrays)

    def release(self) -> None:
        """The run is over: no new worker maps it now (the memory goes with the last
        array and map)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def mapped(fd: int, size: int, layout: list) -> list:
    """The registers of a shared block (its descriptor ``fd``, ``size`` bytes, ``layout``
    as ``SharedBlock``'s), mapped into this process: per register, its arrays (a
    ``RegisterArrays``). The mapping lives as long as one of them."""
    m = mmap.mmap(fd, size)
    return [
        RegisterArrays(
            np.ndarray(shape, np.dtype(dt), buffer=m, offset=off) for off, shape, dt in reg
        )
        for reg in layout
    ]
