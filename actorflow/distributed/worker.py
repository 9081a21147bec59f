"""What runs inside a Ray actor process: one replica of one stage of an actor graph.

``Worker.act(first, *inputs)`` calls the stage's function on a batch of pieces (per
input, a list of numpy arrays read zero-copy from Ray's object store: read-only, as a
local stage's inputs are) and returns two objects: the outputs (stored in the object store
by Ray, where the consumers read them) and a small record of the act (its times, process
and node), which the coordinator on the driver waits for. Nothing here imports Ray at module import: the
coordinator wraps ``Worker`` with ``ray.remote`` when a run starts.
"""

from __future__ import annotations

import os
import socket
import time
import traceback

import numpy as np


class Worker:
    """One replica of a stage: ``fn`` and the shapes and dtypes its output must have
    (``leaves``: ``[(shape, numpy dtype)]`` of the flattened piece, or None: unchecked)."""

    def __init__(self, name: str, fn, leaves=None, structure=None):
        self.name = name
        self.fn = fn
        self.leaves = leaves
        self.structure = structure      # the piece's nesting (spec.flatten's), or None
        self.pid = os.getpid()
        self.host = socket.gethostname()
        try:
            import ray
            self.node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray (tests of the class itself)
            self.node = None

    def where(self) -> tuple:
        return self.pid, self.node, self.host

    def act(self, first: int, *ins):
        """Acts on a batch: ``ins`` has per input the list of its pieces ``first``,
        ``first + 1``, ...; returns their outputs (a list) and the act's record: per
        piece its start and end (wall-clock seconds), then the process and node."""
        out, times = [], []
        for k, args in enumerate(zip(*ins)):
            piece = first + k
            t0 = time.time()
            try:
                value = self.fn(*args)
                if self.leaves is not None:
                    value = self._check(value, piece)
            except BaseException as e:  # noqa: BLE001 - carried to the driver as the cause
                raise StageFailed(self.name, piece, self.where(), e,
                                  traceback.format_exc()) from None
            times.append((t0, time.time()))
            out.append(value)
        return out, (times, self.pid, self.node)

    def _check(self, value, piece: int):
        """The value with its leaves as arrays, as a local register holds them (a Python
        float is float32, as locally); refused when they do not match the registers."""
        from ..runtime.spec import as_array, flatten, unflatten
        leaves, structure = flatten(value)
        arrays = [as_array(x, f"actor {self.name!r} (piece {piece}) output") for x in leaves]
        if self.structure is not None and structure != self.structure:
            raise TypeError(f"actor {self.name!r} (piece {piece}) returned a piece nested "
                            f"as {structure!r}, but its registers hold one nested as "
                            f"{self.structure!r} (sized by piece 0); return the same "
                            f"structure for every piece")
        want = self.leaves
        got = [(tuple(x.shape), x.dtype) for x in arrays]
        if len(got) != len(want) or any(g[0] != w[0] or g[1] != w[1]
                                        for g, w in zip(got, want)):
            raise TypeError(f"actor {self.name!r} (piece {piece}) returned "
                            f"{_say(got)}, but its registers hold {_say(want)} (sized by "
                            f"piece 0); return the same shapes and dtypes for every piece")
        return unflatten(structure, arrays)


class StageFailed(Exception):
    """A stage raised inside its Ray actor: what the driver turns into ActorError (the
    original exception is kept when it pickles; its traceback always travels as text)."""

    def __init__(self, name, piece, where, original, tb: str):
        super().__init__(f"{name} failed on piece {piece}")
        self.name, self.piece, self.where, self.tb = name, piece, where, tb
        try:
            import pickle
            pickle.dumps(original)
            self.original = original
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            self.original = RuntimeError(f"{type(original).__name__}: {original}")

    def __reduce__(self):
        return (StageFailed, (self.name, self.piece, self.where, self.original, self.tb))


def leaves_of(value) -> list:
    """``[(shape, dtype)]`` of a piece's arrays (in ``flatten``'s order): what every later
    piece must match."""
    from ..runtime.spec import flatten
    return [(tuple(np.shape(x)), np.asarray(x).dtype) for x in flatten(value)[0]]


def _say(leaves) -> str:
    return ", ".join(f"{d}{list(s)}" for s, d in leaves) or "nothing"
